"""Sphinx extension: the English book and its Chinese edition link to each other, page by page.

The English book is built into _build/html and the Chinese edition (language = 'zh_CN', from the
message catalogues in locale/) into _build/html/zh. Every page gets, above its content, a link to
the same page in the other edition; the landing page also says, in a sentence, that the other
edition exists. In the Chinese edition the captions of the table of contents are translated too,
and so are the labels myst-nb writes on the buttons that show or hide a cell ("Show code cell
source"). Links are relative, so the book works from file:// and holds no build path.
"""

from __future__ import annotations

import html
from os import path

from docutils import nodes
from sphinx import addnodes
from sphinx.locale import init as init_locale
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util.i18n import docname_to_domain

ZH = "zh"  # the Chinese edition's folder inside the English book's output

_BANNER = {
    "en": ("中文版", "Read this page in Chinese"),
    "zh": ("English", "阅读本页的英文版"),
}
# myst-nb's labels for a hidden cell's input ("source"), whole cell ("content") or output, in Chinese
_CELL_PROMPTS = {
    f"{verb} code cell {part}": f"{zh_verb}{zh_part}"
    for verb, zh_verb in (("Show", "显示"), ("Hide", "隐藏"))
    for part, zh_part in (("source", "代码"), ("content", "单元格"), ("output", "输出"), ("outputs", "输出"))
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


class _TranslateCellPrompts(SphinxPostTransform):
    """In the Chinese edition, the labels of the buttons that show or hide a cell."""

    default_priority = 200  # after myst-nb's HideInputCells (199), which writes them
    formats = ("html",)

    def run(self, **kwargs) -> None:
        if _edition(self.config.language) == "en":
            return
        for node in self.document.findall(nodes.Element):
            for key in ("prompt_show", "prompt_hide"):
                if key in node.attributes:
                    node[key] = _CELL_PROMPTS.get(node[key], node[key])


def setup(app):
    app.add_post_transform(_TranslateCellPrompts)
    app.connect("doctree-read", _translate_toc_captions)
    app.connect("html-page-context", _add_link)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
