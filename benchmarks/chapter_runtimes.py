"""How long each chapter takes to run, for the course map on the landing page.

    python -m benchmarks.chapter_runtimes

Executes every notebook in chapters/ in a fresh kernel (as a reader's "Run all" would) and prints
a Markdown table of wall-clock seconds. Unlike the other benchmarks this is a bare time, on purpose:
it tells a reader how long to wait, not how attnlib compares with a reference.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

CHAPTERS = Path(__file__).resolve().parent.parent / "chapters"


def run(path: Path) -> float:
    """Seconds to execute one notebook from a fresh kernel, run from the chapters folder."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, resources={"metadata": {"path": str(path.parent)}}).execute()
    return time.perf_counter() - start


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    print(f"{os.cpu_count()} CPU cores\n\n| chapter | seconds |\n| --- | ---: |")
    for path in sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb")):
        print(f"| {path.stem} | {run(path):.0f} |", flush=True)


if __name__ == "__main__":
    main()
