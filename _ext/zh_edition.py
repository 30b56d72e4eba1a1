"""Build the Chinese edition, or refresh its message catalogues, from the English sources.

    python _ext/zh_edition.py html        # _build/html/zh, warnings as errors (after the English build)
    python _ext/zh_edition.py catalogues  # locale/zh_CN/LC_MESSAGES/*.po from the current English text

Both read _config.yml as `jupyter-book build` does (jupyter_book.sphinx.build_sphinx), with a few
settings overridden. The Chinese edition does not execute the notebooks again: it renders the
outputs committed in them, which nbval proves reproduce, while the English build executes every
chapter. The catalogues keep every existing translation; a message whose English changed becomes
fuzzy (tests/test_zh_catalogues.py then fails until it is translated again).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jupyter_book.sphinx import build_sphinx

ROOT = Path(__file__).resolve().parents[1]
LANGUAGE = "zh_CN"
LOCALE = ROOT / "locale"
TITLE = "注意力机制：从第一性原理出发"  # _config.yml's title, which no catalogue holds
GETTEXT = {"gettext_compact": False, "gettext_location": False, "gettext_uuid": False}


def _build(builder: str, out: Path, overrides: dict) -> int:
    result = build_sphinx(ROOT, out, noconfig=True, path_config=ROOT / "_config.yml", builder=builder,
                          doctreedir=out.parent / f".doctrees-{builder}-{LANGUAGE}",
                          confoverrides={"nb_execution_mode": "off", "latex_individualpages": False, **overrides},
                          warningiserror=True, keep_going=True, freshenv=True, quiet=True)
    return 1 if isinstance(result, Exception) else int(result or 0)


def html() -> int:
    """The Chinese edition, into _build/html/zh."""
    return _build("html", ROOT / "_build" / "html" / "zh",
                  {"language": LANGUAGE, "locale_dirs": [str(LOCALE)], "nitpicky": True,
                   "html_title": TITLE, **GETTEXT})


def extract(pot: Path) -> int:
    """Every message of the English sources, as one .pot file per page under `pot` (gettext builder)."""
    return _build("gettext", pot, GETTEXT)


def catalogues() -> int:
    """Extract every message and merge it into locale/zh_CN (sphinx-intl update)."""
    pot = ROOT / "_build" / "gettext"
    status = extract(pot)
    if status:
        return status
    return subprocess.call([sys.executable, "-m", "sphinx_intl", "update", "-p", str(pot), "-l", LANGUAGE,
                            "-d", str(LOCALE), "--line-width", "100"])


if __name__ == "__main__":
    commands = {"html": html, "catalogues": catalogues}
    if sys.argv[1:2] not in ([c] for c in commands):
        sys.exit(f"usage: python {sys.argv[0]} {{{' | '.join(commands)}}}")
    sys.exit(commands[sys.argv[1]]())
