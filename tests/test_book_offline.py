"""The built HTML book loads nothing from outside itself, and typesets math with the bundled MathJax.

Runs over _build/html. `make test` builds the book first and sets ATTNBOOK_REQUIRE_BUILD=1, so a
missing build fails there; a bare `pytest` without a build skips these tests and says why.
"""

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from built_book import HTML, rel, require_build
from machine_paths import machine_paths, reader_text

EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)  # http://, https://, //host
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)""")

require_build()


class _Loads(HTMLParser):
    """Collects every URL a page makes the browser load (not the links a reader may click)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "img", "iframe", "source", "audio", "video", "embed") and a.get("src"):
            self.urls.append(a["src"])
        if tag == "link" and a.get("href") and a.get("rel") not in ("canonical", "next", "prev", "search", "index"):
            self.urls.append(a["href"])
        if tag == "object" and a.get("data"):
            self.urls.append(a["data"])
        for url in CSS_URL.findall(a.get("style", "")):
            self.urls.append(url)


def _pages():
    return sorted(HTML.rglob("*.html"))


def _loads(page: Path) -> list[str]:
    parser = _Loads()
    text = page.read_text(encoding="utf-8")
    parser.feed(text)
    inline_css = "".join(re.findall(r"<style[^>]*>(.*?)</style>", text, re.DOTALL))
    return parser.urls + CSS_URL.findall(inline_css)


def test_pages_exist():
    names = {p.name for p in _pages()}
    assert {"intro.html", "glossary.html"} <= names


@pytest.mark.parametrize("page", _pages(), ids=rel)
def test_page_loads_nothing_external(page):
    external = [u for u in _loads(page) if EXTERNAL.match(u)]
    assert not external, f"{page.name} loads {external}"


def test_stylesheets_load_nothing_external():
    for css in HTML.rglob("*.css"):
        text = css.read_text(encoding="utf-8", errors="replace")
        external = [u for u in CSS_URL.findall(text) if EXTERNAL.match(u)]
        external += [u for u in re.findall(r"""@import\s+['"]([^'"]+)""", text) if EXTERNAL.match(u)]
        assert not external, f"{rel(css)} loads {external}"


def test_math_uses_the_bundled_mathjax():
    intro = (HTML / "intro.html").read_text(encoding="utf-8")
    mathjax = [u for u in _loads(HTML / "intro.html") if "mathjax" in u.lower()]
    assert mathjax, "intro.html has math but loads no MathJax"
    for url in mathjax:
        target = (HTML / "intro.html").parent / url.split("?")[0]
        assert target.exists(), f"MathJax at {url} is not in the built book"
    assert r"\(" in intro or "math notranslate" in intro


TEXT_FILES = ("*.html", "*.txt", "*.ipynb", "*.js", "*.json")


def _text_files():
    return sorted({f for pattern in TEXT_FILES for f in HTML.rglob(pattern)
                   if not rel(f).startswith("_static/")})  # the theme's own assets hold no output


@pytest.mark.parametrize("path", _text_files(), ids=rel)
def test_no_path_of_the_build_machine(path):
    found = machine_paths(reader_text(path))
    assert not found, f"{rel(path)} shows {found} (a traceback or a warning of the build?)"


class _Tracebacks(HTMLParser):
    """The text of each error output (myst-nb's div.output.traceback) of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[str] = []
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        if self._depth:
            self._depth += tag == "div"
        elif tag == "div" and {"output", "traceback"} <= set((dict(attrs).get("class") or "").split()):
            self._depth = 1
            self.outputs.append("")

    def handle_endtag(self, tag):
        if self._depth and tag == "div":
            self._depth -= 1

    def handle_data(self, data):
        if self._depth:
            self.outputs[-1] += data


def _error_outputs(page: Path) -> list[str]:
    parser = _Tracebacks()
    parser.feed(page.read_text(encoding="utf-8"))
    return [t.strip() for t in parser.outputs]


ERROR_PAGES = [p for p in _pages() if _error_outputs(p)]
FRAME = re.compile(r"Traceback \(most recent call last\)|^\s*File \S|Cell In\[|^-+>", re.MULTILINE)


def test_the_chapters_that_raise_on_purpose_are_checked():
    assert {p.stem[:2] for p in ERROR_PAGES} >= {"03", "05", "07", "08"}, [rel(p) for p in ERROR_PAGES]


@pytest.mark.parametrize("page", ERROR_PAGES, ids=rel)
def test_errors_show_type_and_message_without_frames(page):
    for text in _error_outputs(page):
        assert re.match(r"[A-Za-z_][\w.]*(Error|Exception|Warning): \S", text), \
            f"{rel(page)}: an error output does not start with `Type: message`: {text[:200]!r}"
        assert not FRAME.search(text), f"{rel(page)}: an error output shows traceback frames: {text[:300]!r}"
