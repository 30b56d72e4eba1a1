"""The built book as a reader's browser shows it: every page rendered in headless Chromium, offline.

Each page of _build/html is served on 127.0.0.1 by a server this module starts, and opened in
Debian's Chromium driven by the `playwright` package (never `playwright install`: it downloads a
browser). On every page: the bundled MathJax typesets every formula (no TeX error), every image
loads, no request goes to any other host (each one is aborted and reported), nothing the page
needs is missing (HTTP >= 400), and the console shows no error beyond two known benign ones. At a
phone's width no page scrolls sideways as a whole. A cell that raises on purpose shows its message
whole: its last word lies inside the output's box, at a phone's width and at a desktop's. Every "download" link of the theme (.ipynb for
the chapters) points at a file in the built book, and a chapter's .ipynb is the committed notebook.

Environment:
  ATTNBOOK_HTML             the built book to test (default: _build/html of this repository)
  ATTNBOOK_REQUIRE_BUILD=1  a missing build fails instead of skipping (`make test` sets it)
  ATTNBOOK_CHROMIUM, ATTNBOOK_REQUIRE_BROWSER: see tests/chromium.py
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import threading
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest
from built_book import HTML, ROOT, page_in_edition, rel, require_build
from chromium import CHROMIUM, CHROMIUM_FLAGS, require_browser

BENIGN_CONSOLE = [
    re.compile(r"THEBE_JS_URL.*already been declared"),  # sphinx-thebe's inline script, included twice
    re.compile(r"Got invalid theme mode"),  # pydata-sphinx-theme before the mode is stored
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
TIMEOUT_MS = 30_000
GENERATED = {"genindex.html", "search.html", "py-modindex.html"}  # Sphinx's own pages: no source

require_build()


def _pages() -> list[Path]:
    """Every HTML page a reader can open in either edition, except index.html (a redirect, tested on its own)."""
    return sorted(p for p in HTML.rglob("*.html")
                  if not {"_static", "_sources", "_downloads", "_images"} & set(p.relative_to(HTML).parts)
                  and page_in_edition(p) != "index.html")


class _Links(HTMLParser):
    """The download links of a page: the theme's download button and any link into _downloads/."""

    def __init__(self) -> None:
        super().__init__()
        self.downloads: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        href = a.get("href") or ""
        if tag == "a" and ("btn-download-source-button" in (a.get("class") or "")
                           or "/_sources/" in f"/{href}" or "/_downloads/" in f"/{href}"):
            self.downloads.append(href)


def _downloads(page: Path) -> list[str]:
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.downloads


def _target(page: Path, href: str) -> Path:
    return (page.parent / unquote(urlsplit(href).path)).resolve()


# --- download links (no browser needed) ------------------------------------------------------

@pytest.mark.parametrize("page", [p for p in _pages() if page_in_edition(p) not in GENERATED], ids=rel)
def test_download_links_point_into_the_book(page):
    hrefs = _downloads(page)
    assert hrefs, f"{rel(page)} has no download button"
    for href in hrefs:
        assert not urlsplit(href).scheme and not href.startswith("//"), f"{rel(page)} downloads {href} from outside"
        target = _target(page, href)
        assert target.is_relative_to(HTML), f"{rel(page)}: {href} points outside the built book"
        assert target.is_file(), f"{rel(page)}: download {href} is missing ({target})"


@pytest.mark.parametrize("page", [p for p in _pages() if page_in_edition(p).startswith("chapters/")], ids=rel)
def test_chapter_downloads_its_executed_notebook(page):
    notebooks = [h for h in _downloads(page) if urlsplit(h).path.endswith(".ipynb")]
    assert notebooks, f"{rel(page)} offers no .ipynb download"
    target = _target(page, notebooks[0])
    nb = json.loads(target.read_text(encoding="utf-8"))
    assert nb.get("nbformat") == 4 and nb.get("cells"), f"{target} is not a notebook"
    assert any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), \
        f"{target} has no outputs: the reader would download an unexecuted notebook"
    committed = ROOT / Path(page_in_edition(page)).with_suffix(".ipynb")
    if committed.exists():  # the build copies the source: the reader gets what the repository holds
        assert target.read_bytes() == committed.read_bytes(), f"{target} differs from {committed}"


# --- the browser -----------------------------------------------------------------------------

class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def server():
    """The built book on http://127.0.0.1:<free port>/, served from a thread."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(HTML)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A Chromium with a fresh, empty profile; skips (or fails, if required) without one."""
    require_browser()
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS, viewport=DESKTOP,
            service_workers="block")
        context.set_default_timeout(TIMEOUT_MS)
        yield context
        context.close()
    shutil.rmtree(profile, ignore_errors=True)


class _Visit:
    """One page opened in the browser, with what went wrong while it loaded."""

    def __init__(self, browser, base: str, path: str, viewport: dict) -> None:
        self.origin = urlsplit(base).netloc
        self.external: list[str] = []
        self.missing: list[str] = []
        self.console: list[str] = []
        self.page = browser.new_page()
        self.page.set_viewport_size(viewport)
        self.page.route("**/*", self._route)
        self.page.on("response", self._response)
        self.page.on("console", lambda m: m.type == "error" and self.console.append(m.text))
        self.page.on("pageerror", lambda e: self.console.append(f"uncaught: {e}"))
        self.page.goto(urljoin(base, path), wait_until="load")

    def _route(self, route) -> None:
        url = urlsplit(route.request.url)
        if url.scheme in ("data", "blob") or url.netloc == self.origin:
            route.continue_()
        else:
            self.external.append(route.request.url)
            route.abort()

    def _response(self, response) -> None:
        if response.status >= 400 and urlsplit(response.url).netloc == self.origin:
            self.missing.append(f"{response.status} {response.url}")

    def console_errors(self) -> list[str]:
        return [m for m in self.console if not any(b.search(m) for b in BENIGN_CONSOLE)]

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def visit(browser, server):
    opened: list[_Visit] = []

    def open_page(path: str, viewport: dict = DESKTOP) -> _Visit:
        opened.append(_Visit(browser, server, path, viewport))
        return opened[-1]

    yield open_page
    for v in opened:
        v.close()


@pytest.fixture(scope="module")
def loaded(browser, server, page):
    """`page` opened once at a desktop's width and shared by every test of that page.

    The tests below take `page` as a module-scoped parameter, so pytest runs all the tests of one page
    together and only one page is open at a time: each page loads once, not once per test (a page load
    is most of a test's time, ~2 s in Chromium on 2 cores). A test that resizes the page puts it back.
    """
    v = _Visit(browser, server, rel(page), DESKTOP)
    yield v
    v.close()


@contextlib.contextmanager
def _viewport(v: _Visit, viewport: dict):
    """The loaded page at `viewport`'s size for the block, at a desktop's size again after it."""
    v.page.set_viewport_size(viewport)
    try:
        yield v.page
    finally:
        v.page.set_viewport_size(DESKTOP)


# Waits for MathJax to finish, then lists the formulas it left untypeset or in error (a TeX error
# is an mjx-merror; an undefined macro is shown as red text by MathJax's noundefined extension).
MATH_JS = """async () => {
    if (!window.MathJax || !MathJax.startup || !MathJax.startup.promise) return null;
    await MathJax.startup.promise;
    const math = Array.from(document.querySelectorAll('.math'));
    return {
        math: math.length,
        typeset: document.querySelectorAll('mjx-container').length,
        untypeset: math.filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 80)),
        errors: Array.from(document.querySelectorAll('mjx-merror')).map(e =>
            e.getAttribute('data-mjx-error') || e.textContent.slice(0, 80)).concat(
            Array.from(document.querySelectorAll('mjx-assistive-mml mtext[mathcolor="red"]'))
                .map(e => 'undefined macro ' + e.textContent)),
    };
}"""

# Loads every image now (lazy ones too) and lists the ones that did not decode.
IMAGES_JS = """async () => {
    const imgs = Array.from(document.images);
    imgs.forEach(i => { i.loading = 'eager'; });
    await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => {
        i.addEventListener('load', r); i.addEventListener('error', r);
    })));
    return {count: imgs.length, broken: imgs.filter(i => i.naturalWidth === 0).map(i => i.getAttribute('src'))};
}"""


def _has_math(page: Path) -> bool:
    return 'class="math notranslate' in page.read_text(encoding="utf-8")


@pytest.mark.parametrize("page", _pages(), ids=rel, scope="module")
def test_page_renders_offline(loaded, page):
    v = loaded
    math = v.page.evaluate(MATH_JS)
    images = v.page.evaluate(IMAGES_JS)
    for href in _downloads(page):
        response = v.page.request.get(urljoin(v.page.url, href))
        if not response.ok:
            v.missing.append(f"{response.status} download {href}")
    v.page.wait_for_load_state("networkidle")  # late requests (fonts, MathJax parts) are recorded too
    problems = []
    if _has_math(page):
        if math is None:
            problems.append("has math but MathJax did not load")
        elif not math["typeset"] or math["untypeset"] or math["errors"]:
            problems.append(f"math not typeset or in error: {math}")
    if images["broken"]:
        problems.append(f"images that did not load: {images['broken']}")
    if v.external:
        problems.append(f"requests to other hosts (aborted): {sorted(set(v.external))}")
    if v.missing:
        problems.append(f"missing: {v.missing}")
    if v.console_errors():
        problems.append(f"console errors: {v.console_errors()}")
    assert not problems, f"{rel(page)}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("page", _pages(), ids=rel, scope="module")
def test_page_fits_a_phone(loaded, page):
    """At 390 px wide, wide tables, code and figures scroll inside their own box, not the page.

    The page is the one loaded at a desktop's width, narrowed: the theme's layout follows the width
    through CSS media queries, which apply on a resize as on a load."""
    with _viewport(loaded, PHONE) as tab:
        overflow = _overflow(tab)
    assert overflow["scrollWidth"] <= overflow["width"], f"{rel(page)} scrolls sideways on a phone: {overflow}"


def _overflow(tab) -> dict:
    """The page's scroll width against the viewport's, and the first elements that stick out unclipped."""
    tab.evaluate(MATH_JS)  # typeset formulas have their final width
    return tab.evaluate("""() => {
        const width = document.documentElement.clientWidth;
        const clipped = e => { for (let a = e.parentElement; a; a = a.parentElement)
            if (getComputedStyle(a).overflowX !== 'visible') return true; return false; };
        const wide = Array.from(document.querySelectorAll('body *')).filter(e =>
            e.getBoundingClientRect().right > width + 1 && !clipped(e));
        return {scrollWidth: document.documentElement.scrollWidth, width,
                culprits: wide.slice(0, 5).map(e => `${e.tagName.toLowerCase()}.${e.className}`)};
    }""")


@pytest.mark.parametrize("edition", ["", "zh/"], ids=["en", "zh"])
def test_index_redirects_to_the_first_page(visit, edition):
    v = visit(f"{edition}index.html")
    v.page.wait_for_load_state("networkidle")
    assert v.page.url.endswith(f"/{edition}intro.html"), v.page.url
    assert not v.external and not v.missing and not v.console_errors()


@pytest.mark.parametrize("search", ["search.html?q=attention", "zh/search.html?q=softmax"], ids=["en", "zh"])
def test_search_works_offline(visit, search):
    v = visit(search)
    v.page.wait_for_selector("#search-results ul.search li", timeout=TIMEOUT_MS)
    hits = v.page.locator("#search-results ul.search li").count()
    assert hits > 0 and not v.external and not v.console_errors()


# For each error output: where the last word of its message lies, against the box that shows it.
ERROR_JS = """() => Array.from(document.querySelectorAll('div.output.traceback')).map(box => {
    const walker = document.createTreeWalker(box.querySelector('pre'), NodeFilter.SHOW_TEXT);
    let last = null;
    for (let n = walker.nextNode(); n; n = walker.nextNode()) if (n.textContent.trim()) last = n;
    const text = last.textContent.replace(/\\s+$/, '');
    const range = document.createRange();
    range.setStart(last, text.search(/\\S+$/));
    range.setEnd(last, text.length);
    const word = range.getBoundingClientRect(), b = box.getBoundingClientRect();
    return {word: range.toString(), left: word.left, right: word.right, boxLeft: b.left, boxRight: b.right,
            viewport: document.documentElement.clientWidth};
})"""


def _error_pages() -> list[Path]:
    return [p for p in _pages() if 'class="output traceback' in p.read_text(encoding="utf-8")]


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
@pytest.mark.parametrize("page", _error_pages(), ids=rel, scope="module")
def test_error_message_is_read_whole(loaded, page, viewport):
    with _viewport(loaded, viewport) as tab:
        errors = tab.evaluate(ERROR_JS)
    assert errors, f"{rel(page)} has no error output in the browser"
    for e in errors:
        inside = e["boxLeft"] - 1 <= e["left"] and e["right"] <= min(e["boxRight"], e["viewport"]) + 1
        assert inside, f"{rel(page)} at {viewport['width']} px: the message's last word {e['word']!r} " \
                       f"lies outside its box: {e}"
