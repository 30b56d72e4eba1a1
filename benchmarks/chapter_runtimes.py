"""How long each chapter takes to run, for the course map on the landing page, and which cells take it.

    python -m benchmarks.chapter_runtimes                 # every chapter
    python -m benchmarks.chapter_runtimes 10 11           # only the chapters whose names start so
    python -m benchmarks.chapter_runtimes --busy 2 11     # with two matrix-multiplying torch processes beside it
    python -m benchmarks.chapter_runtimes --cells 5 12    # also list every cell that took 5 s or more

Executes the notebooks in chapters/ in a fresh kernel (as a reader's "Run all" would) and prints
a Markdown table of wall-clock seconds and of the kernel's CPU seconds (user + system, its child
processes included), with the date and the machine's 1-minute load average before each chapter, then
the slowest cells by either measure. Other work on the machine stretches the wall-clock times; the
CPU times change much less, so they are what to compare between runs on a shared machine. `--busy N`
keeps N CPU-bound torch processes running the whole time (`busy_machine`), as on a reader's laptop
where something else always runs: a cell made of many small multi-threaded operations then thrashes,
and shows up here as a cell that takes many times its idle time. tests/test_busy_build.py uses the same
load. Unlike the other benchmarks this is a bare time, on purpose: it tells a reader how long to
wait, not how attnlib compares with a reference.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import nbformat
import psutil
import yaml
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
# Seconds a cell may run in the book build (_config.yml's execute.timeout)
CELL_TIMEOUT = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["execute"]["timeout"]

# One CPU-bound program on torch's default threads: a 1024 x 1024 product, again and again, until its
# parent process is gone (so that a killed test or benchmark leaves no such program behind)
HOG = ("import os\n"
       "import torch\n"
       "parent = os.getppid()\n"
       "a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)\n"
       "a @ b\n"
       "print('busy', flush=True)\n"
       "while os.getppid() == parent:\n"
       "    a @ b\n")


@contextlib.contextmanager
def busy_machine(processes: int = 2) -> Iterator[list[subprocess.Popen]]:
    """Keep `processes` torch programs multiplying 1024 x 1024 matrices (on torch's default threads)
    running for the duration of the block; each has started multiplying when the block begins, and
    each is killed when it ends, however it ends."""
    hogs: list[subprocess.Popen] = []
    try:
        for _ in range(processes):
            hogs.append(subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.PIPE, text=True))
        for hog in hogs:
            if hog.stdout.readline().strip() != "busy":
                raise RuntimeError(f"a busy-machine process exited with code {hog.wait()} before it started")
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
            hog.stdout.close()


def cell_seconds(cell: nbformat.NotebookNode) -> float:
    """Seconds one executed code cell took, from the timestamps nbclient records in its metadata."""
    stamps = cell.metadata.get("execution", {})
    start, end = stamps.get("iopub.execute_input"), stamps.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    parse = datetime.datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def kernel_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far by the kernel process `pid`, its finished children
    (those it waited for) and its live descendants. Unlike wall time this hardly grows when other
    programs share the cores; it still grows somewhat (threads that spin while they wait, a busier
    memory bus), so it is a steadier measure on a shared machine, not an exact one."""
    try:
        kernel = psutil.Process(pid)
        total = sum(kernel.cpu_times()[:4])  # user, system, children_user, children_system
        for child in kernel.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += sum(child.cpu_times()[:2])
    except psutil.Error:
        return 0.0
    return total


class Run(NamedTuple):
    """One execution of a notebook: wall-clock and CPU seconds, in total and per cell (indexed as the
    notebook's cells are; 0 for a Markdown cell or one not reached), and None or what stopped it."""
    seconds: float
    cells: list[float]
    error: str | None
    cpu: float
    cpu_cells: list[float]


def run(path: Path, timeout: int = CELL_TIMEOUT) -> Run:
    """Execute one notebook from a fresh kernel, run from the chapters folder, as the book build does
    (a cell that runs over `timeout` seconds fails), timing each cell by the wall clock and by the
    kernel's CPU time (`kernel_cpu_seconds`, read just before and just after the cell)."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # the stored run's timestamps, not this one's
    cpu_cells = [0.0] * len(nb.cells)
    client = NotebookClient(nb, timeout=timeout, record_timing=True,
                            resources={"metadata": {"path": str(path.parent)}})

    def kernel_cpu() -> float:
        return kernel_cpu_seconds(client.km.provisioner.pid)

    def before(cell, cell_index, **_):
        cpu_cells[cell_index] = -kernel_cpu()

    def after(cell, cell_index, **_):
        cpu_cells[cell_index] += kernel_cpu()

    client.on_cell_execute, client.on_cell_executed = before, after
    start, error = time.perf_counter(), None
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError) as failure:
        reached = max((i for i, c in enumerate(nb.cells) if "execution" in c.metadata), default=0)
        error = f"cell {reached}: {type(failure).__name__}: {str(failure).strip().splitlines()[0]}"
        cpu_cells = [max(s, 0.0) for s in cpu_cells]  # a cell that never finished: not counted
    seconds = time.perf_counter() - start
    return Run(seconds, [cell_seconds(c) if c.cell_type == "code" else 0.0 for c in nb.cells], error,
               sum(cpu_cells), cpu_cells)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chapter_runtimes", description=__doc__.split("\n")[0])
    parser.add_argument("prefixes", nargs="*", help="only the chapters whose names start with one of these")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="keep N matrix-multiplying torch processes running beside the chapters")
    parser.add_argument("--cells", type=float, default=10.0, metavar="SECONDS",
                        help="list the cells that took at least this long (default 10)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ.pop("MPLBACKEND", None)
    prefixes = tuple(args.prefixes) or ("",)
    paths = [p for p in sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb")) if p.stem.startswith(prefixes)]
    with busy_machine(args.busy):
        print(f"{os.cpu_count()} CPU cores, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
              f"{args.busy} busy torch processes beside each chapter\n\n"
              f"| chapter | seconds | CPU seconds | load before | cells of {args.cells:g} s or more "
              "(index from 0: seconds, CPU seconds) |\n"
              "| --- | ---: | ---: | ---: | --- |")
        for path in paths:
            load = os.getloadavg()[0]
            result = run(path)
            slow = ", ".join([f"{i}: {s:.1f}, {c:.1f}" for i, (s, c) in enumerate(zip(result.cells, result.cpu_cells))
                              if max(s, c) >= args.cells] +
                             ([f"stopped at {result.error}"] if result.error else []))
            print(f"| {path.stem} | {result.seconds:.0f} | {result.cpu:.0f} | {load:.1f} | {slow} |", flush=True)

if __name__ == "__main__":
    main()
