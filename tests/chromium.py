"""Debian's Chromium driven by the `playwright` package, for the tests that look at pages as a reader.

playwright never downloads a browser here (never `playwright install`); it drives /usr/bin/chromium.
  ATTNBOOK_CHROMIUM           the browser (default /usr/bin/chromium)
  ATTNBOOK_REQUIRE_BROWSER=1  a missing browser or playwright fails instead of skipping (CI sets it)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("ATTNBOOK_CHROMIUM", "/usr/bin/chromium")
# As on this machine's other browser checks; without the background-networking flags Chromium
# tries Google's hosts at every start.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _unavailable() -> str | None:
    """Why a browser test cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} not found (apt-get install -y --no-install-recommends chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    return None


def require_browser() -> None:
    """Skip the calling test without a browser (fail under ATTNBOOK_REQUIRE_BROWSER=1)."""
    reason = _unavailable()
    if reason:
        if os.environ.get("ATTNBOOK_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser test required (ATTNBOOK_REQUIRE_BROWSER=1) but {reason}")
        pytest.skip(f"browser test skipped: {reason}")
