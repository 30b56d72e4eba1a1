"""The built HTML book that test_book_offline and test_browser check: where it is, its pages, and its build.

ATTNBOOK_HTML points at another build (default: _build/html of this repository), which holds the
Chinese edition in its zh/ folder: `page_in_edition` gives a page's path inside its own edition. Without a build
the calling module is skipped with the reason; `make test` sets ATTNBOOK_REQUIRE_BUILD=1 so that a
missing build fails instead. conftest.py marks every test of a module that imports HTML from here
`built_book`: `make test` runs the other tests and nbval first, then `python tests/built_book.py`
(the English book from the outputs that nbval has just checked), then these.
"""

import os
import sys
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


def build() -> int:
    """Build the English book into _build/html from the outputs stored in the notebooks, executing none.

    It is `jupyter-book build --all -W -n --keep-going .` (warnings are errors) with _config.yml's
    execution turned off (`nb_execution_mode: off`), overridden as _ext/zh_edition.py builds the Chinese
    edition: `make test` runs it only after nbval has re-executed every chapter and found its stored
    outputs reproduced, so the book shows only checked outputs and each chapter executes once.
    `make book` executes every chapter itself (`execute_notebooks: force`). Returns the exit status.
    """
    from jupyter_book.sphinx import build_sphinx

    result = build_sphinx(ROOT, ROOT / "_build" / "html", noconfig=True, path_config=ROOT / "_config.yml",
                          confoverrides={"external_toc_path": (ROOT / "_toc.yml").as_posix(), "nitpicky": True,
                                         "latex_individualpages": False, "nb_execution_mode": "off"},
                          warningiserror=True, keep_going=True, freshenv=True)
    return 1 if isinstance(result, Exception) else int(result or 0)


if __name__ == "__main__":
    sys.exit(build())
