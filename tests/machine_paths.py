"""Paths of the machine that built the book, as a reader of the built book would find them.

A traceback or a warning printed while a chapter executes names files of the build machine: the
checkout, the Python environment, the home directory. `machine_paths` finds them in what a reader
can see (`reader_text`): text outputs, HTML text and attributes, never the base64 payload of an
image, in which any four letters such as `/usr` may occur by chance.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The checkout, the Python environment (a venv, pyenv's or Debian's /usr), the home directory.
BUILD_PATHS = sorted({str(ROOT), sys.prefix, sys.base_prefix, os.path.expanduser("~")} - {"/", ""})
# Wherever Python lives, its own files sit under one of these: a traceback's frames name them.
PYTHON_DIRS = re.compile(r"(?:site-packages|dist-packages|lib/python3(?:\.\d+)?)[/\\]")
BINARY_OUTPUTS = ("image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf")
DATA_URI = re.compile(r"data:[\w.+-]+/[\w.+-]+;base64,[A-Za-z0-9+/=\s]*")
ANSI = re.compile(r"(?:\x1b|\\u001b)\[[0-9;]*[A-Za-z]")   # raw, or as JSON writes it
JSON_ESCAPE = re.compile(r'\\[nrt"]')                      # \n in a JSON string ends a line


def machine_paths(text: str, paths: list[str] = BUILD_PATHS) -> list[str]:
    """The entries of `paths` that `text` names as paths, and the first Python directory it names.

    A path counts when it is followed by / or \\ and does not continue a longer name: `/usr` is
    found in `File "/usr/lib/python3.11/x.py"`, not in `a/usr/b` or `/usrx`.
    """
    text = JSON_ESCAPE.sub(" ", ANSI.sub("", text.replace("\\/", "/")))
    found = [p for p in paths if re.search(rf"(?<![\w.+/-]){re.escape(p)}(?=[/\\])", text)]
    return found + [m.group() for m in PYTHON_DIRS.finditer(text)][:1]


def reader_text(path: Path) -> str:
    """What a reader can see in a built file: its text, without the base64 payloads of images
    (a notebook's image outputs and attachments, `data:` URIs)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".ipynb":
        notebook = json.loads(text)
        for cell in notebook.get("cells", []):
            for bundle in [o.get("data", {}) for o in cell.get("outputs", [])] \
                    + list(cell.get("attachments", {}).values()):
                for mime in BINARY_OUTPUTS:
                    bundle.pop(mime, None)
        text = json.dumps(notebook, ensure_ascii=False)
    return DATA_URI.sub("data:", text)
