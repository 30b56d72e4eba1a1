"""The Chinese edition (_build/html/zh) beside the English book: paired pages, and Chinese drawn in a real font.

test_browser.py already opens every page of both editions (math, images, no outside request, no
sideways scroll at 390 px, error messages read whole). Here: every page links to the same page in
the other edition and back; each landing page says the other edition exists; the theme speaks
Chinese; and Chromium draws the Chinese text with a CJK font (Debian's fonts-noto-cjk), not as
missing-glyph boxes: it reports, through the DevTools protocol, which platform font drew each
element's glyphs.
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
from babel.messages.pofile import read_po
from built_book import HTML, ROOT, ZH, page_in_edition, rel, require_build
from test_browser import DESKTOP, PHONE, _pages, browser, server, visit  # noqa: F401 - fixtures

require_build()
GENERATED = {"genindex.html", "search.html", "py-modindex.html"}


class _EditionLink(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a" and "edition-link" in (a.get("class") or ""):
            self.hrefs.append(a.get("href") or "")


def _edition_links(page: Path) -> list[str]:
    parser = _EditionLink()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.hrefs


def test_both_editions_were_built():
    assert (HTML / ZH / "intro.html").is_file(), f"no Chinese edition in {HTML / ZH}: run `make book`"


@pytest.mark.parametrize("page", [p for p in _pages() if page_in_edition(p) not in GENERATED], ids=rel)
def test_every_page_links_to_the_same_page_of_the_other_edition(page):
    hrefs = _edition_links(page)
    assert len(hrefs) == 1, f"{rel(page)} has {len(hrefs)} links to the other edition"
    target = (page.parent / hrefs[0]).resolve()
    assert target.is_file(), f"{rel(page)}: {hrefs[0]} does not exist"
    assert page_in_edition(target) == page_in_edition(page), f"{rel(page)} links to {rel(target)}"
    assert rel(target).startswith(ZH) != rel(page).startswith(ZH), f"{rel(page)} links into its own edition"


@pytest.mark.parametrize("landing, sentence", [("intro.html", "also exists in Chinese"),
                                               (f"{ZH}intro.html", "本课程也有英文版")])
def test_each_landing_page_says_the_other_edition_exists(landing, sentence):
    assert sentence in (HTML / landing).read_text(encoding="utf-8")


def test_the_theme_and_the_contents_speak_chinese_in_the_chinese_edition():
    text = (HTML / ZH / "chapters" / "01_attention_from_scratch.html").read_text(encoding="utf-8")
    assert '<html lang="zh-CN"' in text and "搜索" in text and "下载" in text  # the theme's own labels
    with (ROOT / "locale" / "zh_CN" / "LC_MESSAGES" / "intro.po").open("rb") as f:
        captions = {m.id: m.string for m in read_po(f) if m.id in ("The course", "Reference")}
    for english, chinese in captions.items():  # _toc.yml's part captions, in the sidebar of every page
        assert f'caption-text">{chinese}<' in text and f'caption-text">{english}<' not in text, english


# The platform fonts that drew the text of the first elements matching a selector (DevTools protocol).
def _fonts_drawing(v, selector: str, count: int = 3) -> list[dict]:
    cdp = v.page.context.new_cdp_session(v.page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument")["root"]["nodeId"]
    nodes = cdp.send("DOM.querySelectorAll", {"nodeId": root, "selector": selector})["nodeIds"][:count]
    return [f for n in nodes for f in cdp.send("CSS.getPlatformFontsForNode", {"nodeId": n})["fonts"]]


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
@pytest.mark.parametrize("path", ["intro.html", "chapters/02_why_sqrt_dk.html", "glossary.html"])
def test_chinese_is_drawn_with_a_cjk_font(visit, path, viewport):
    v = visit(f"{ZH}{path}", viewport)
    fonts = _fonts_drawing(v, "article h1, article p")
    cjk = [f for f in fonts if "CJK" in f["familyName"] or f["familyName"].startswith(("WenQuanYi", "AR PL"))]
    assert cjk and sum(f["glyphCount"] for f in cjk) > 10, \
        f"{ZH}{path}: no CJK font drew the Chinese text (missing-glyph boxes?); fonts used: {fonts} " \
        f"(apt-get install fonts-noto-cjk)"
