"""Sphinx extension: the English book and its Chinese edition link to each other, page by page.

The English book is built into _build/html and the Chinese edition (language = 'zh_CN', from the
message catalogues in locale/) into _build/html/zh. Every page gets, above its content, a link to
the same page in the other edition; the landing page also says, in a sentence, that the other
edition exists. In the Chinese edition the captions of the table of contents are translated too. Links are relative, so the book works from file:// and holds no build path.
"""

from __future__ import annotations

import html
from os import path

from sphinx import addnodes
from sphinx.locale import init as init_locale
from sphinx.util.i18n import docname_to_domain

ZH = "zh"  # the Chinese edition's folder inside the English book's output

_BANNER = {
    "en": ("中文版", "Read this page in Chinese"),
    "zh": ("English", "阅读本页的英文版"),
}
_LANDING = {
    "en": "This course also exists in Chinese, built from the same notebooks: ",
    "zh": "本课程也有英文版，由同一份笔记本构建：",
}


def _edition(language: str | None) -> str:
    return "zh" if (language or "en").startswith("zh") else "en"


def other_edition_href(pagename: str, language: str | None) -> str:
    """The relative link from page `pagename` (e.g. 'chapters/01_x') to the same page in the other edition."""
    up = "../" * pagename.count("/")
    return f"{up}{ZH}/{pagename}.html" if _edition(language) == "en" else f"{up}../{pagename}.html"


def _add_link(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    if doctree is None or "body" not in context:  # genindex, search: no page of their own to pair
        return
    edition = _edition(app.config.language)
    label, title = _BANNER[edition]
    href = html.escape(other_edition_href(pagename, app.config.language))
    lang = "zh-CN" if edition == "en" else "en"
    link = f'<a class="edition-link" href="{href}" hreflang="{lang}" lang="{lang}" title="{title}">{label}</a>'
    banner = f'<p class="edition-switch">{link}</p>'
    if pagename == app.config.root_doc:
        banner = f'<p class="edition-switch edition-landing">{html.escape(_LANDING[edition])}{link}</p>'
    context["body"] = banner + context["body"]


def _translate_toc_captions(app, doctree) -> None:
    """Translate the captions of a page's toctrees (_toc.yml's parts), which Sphinx's i18n leaves as they are."""
    if _edition(app.config.language) == "en":
        return
    domain = docname_to_domain(app.env.docname, app.config.gettext_compact)
    dirs = [path.join(app.srcdir, d) for d in app.config.locale_dirs]
    catalog, _ = init_locale(dirs, app.config.language, domain)
    for toctree in doctree.findall(addnodes.toctree):
        if toctree.get("caption"):
            toctree["caption"] = catalog.gettext(toctree["caption"])


def setup(app):
    app.connect("doctree-read", _translate_toc_captions)
    app.connect("html-page-context", _add_link)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
