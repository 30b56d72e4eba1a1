"""The built HTML book that test_book_offline and test_browser check: where it is, and its pages.

ATTNBOOK_HTML points at another build (default: _build/html of this repository), which holds the
Chinese edition in its zh/ folder: `page_in_edition` gives a page's path inside its own edition. Without a build
the calling module is skipped with the reason; `make test` sets ATTNBOOK_REQUIRE_BUILD=1 so that a
missing build fails instead.
"""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("ATTNBOOK_HTML") or ROOT / "_build" / "html").resolve()


def require_build() -> None:
    """Skip the calling test module if there is no built book (fail under ATTNBOOK_REQUIRE_BUILD=1)."""
    if not (HTML / "index.html").exists():
        if os.environ.get("ATTNBOOK_REQUIRE_BUILD") == "1":
            raise RuntimeError(f"{HTML} has no index.html: build the book before these tests")
        pytest.skip(f"no built book in {HTML}: run `make book` first", allow_module_level=True)


def rel(page: Path) -> str:
    """A page's path inside the book, e.g. chapters/01_attention_from_scratch.html (the test id)."""
    return page.relative_to(HTML).as_posix()


ZH = "zh/"  # the Chinese edition's folder in the built book (_ext/editions.py)


def page_in_edition(page: Path) -> str:
    """A page's path inside its edition: zh/chapters/01_x.html -> chapters/01_x.html; English unchanged."""
    path = rel(page)
    return path[len(ZH):] if path.startswith(ZH) else path
