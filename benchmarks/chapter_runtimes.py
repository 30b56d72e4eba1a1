"""How long each chapter takes to run, for the course map on the landing page.

    python -m benchmarks.chapter_runtimes            # every chapter
    python -m benchmarks.chapter_runtimes 10 11      # only the chapters whose names start so

Executes the notebooks in chapters/ in a fresh kernel (as a reader's "Run all" would) and prints
a Markdown table of wall-clock seconds, with the date and the machine's 1-minute load average before
each chapter (other work on the machine stretches the times). Unlike the other benchmarks this is a
bare time, on purpose: it tells a reader how long to wait, not how attnlib compares with a reference.
"""

from __future__ import annotations

import datetime
import os
import sys
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
    prefixes = tuple(sys.argv[1:]) or ("",)
    paths = [p for p in sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb")) if p.stem.startswith(prefixes)]
    print(f"{os.cpu_count()} CPU cores, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n\n"
          "| chapter | seconds | load before |\n| --- | ---: | ---: |")
    for path in paths:
        load = os.getloadavg()[0]
        print(f"| {path.stem} | {run(path):.0f} | {load:.1f} |", flush=True)


if __name__ == "__main__":
    main()
