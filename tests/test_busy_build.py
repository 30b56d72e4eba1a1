"""The heaviest chapter builds on a busy machine, with room to spare under the book's cell limit.

A reader's laptop always runs something else. Issue 35: beside other CPU-bound programs, chapter 11's
training cell (many small operations on torch's two threads) thrashed past the book build's 300 s
cell limit: 60 of its steps took 1.9 s on an idle machine and 13.9 s with one core busy, against
2.1 s on one thread either way. The chapters now run such work on one thread
(attnlib.timing.one_thread; chapter 11, all small models, as a whole). This test executes a chapter as the
book build does (a fresh kernel in chapters/, _config.yml's execution settings) while two torch programs
multiply 1024 x 1024 matrices on their default threads the whole time (benchmarks.chapter_runtimes.busy_machine,
which `python -m benchmarks.chapter_runtimes --busy 2` uses to find the cells that thrash).

What fails a reader's build is one cell over the cell limit (_config.yml's execute.timeout), so that is
what the test holds with a margin: every cell within a third of the limit (CELL_SHARE), and the whole
chapter within CHAPTER_BUDGET. These are not speed targets (the machine that runs the test may be slower
or busier than this book's): a thrashing cell runs many times its idle time, which a 3x margin catches,
while an ordinary slower host stays well inside it. Measured beside two busy programs: chapter 12 took
157 s in the project's CI (its slowest cell 38 s), against 59 s alone in `make book` on this book's
2-core Xeon.
"""

from __future__ import annotations

import pytest

from benchmarks.chapter_runtimes import CELL_TIMEOUT, CHAPTERS, busy_machine, run

CELL_SHARE = 1 / 3  # every cell within a third of the book's cell limit: room to spare on a busier laptop
CHAPTER_BUDGET = 300  # seconds for the whole chapter beside two busy torch programs
# Chapter 12, the heaviest: SmolLM2 (135M parameters) loaded and run, about 60 s of CPU on an idle machine
# (python -m benchmarks.chapter_runtimes 12 prints it). Chapter 11, whose small models thrashed on two
# threads (434 s under load before, ~60 s after), costs half as much and is not built here, to keep this
# test's share of CI short; run `python -m benchmarks.chapter_runtimes --busy 2` to check every chapter.
CHAPTERS_UNDER_LOAD = ("12_real_language_model",)


@pytest.mark.parametrize("name", CHAPTERS_UNDER_LOAD)
def test_a_chapter_builds_beside_two_busy_programs(name):
    path = CHAPTERS / f"{name}.ipynb"
    with busy_machine(2):
        result = run(path, timeout=CELL_TIMEOUT)
    assert result.error is None, (f"{path.name} beside two busy torch programs (cells may take {CELL_TIMEOUT} s, "
                                  f"as in the book build) stopped at {result.error}")
    slowest = sorted(range(len(result.cells)), key=result.cells.__getitem__, reverse=True)[:3]
    named = ", ".join(f"cell {i} {result.cells[i]:.0f} s ({result.cpu_cells[i]:.0f} s of CPU)" for i in slowest)
    advice = "Run small operations on one thread (attnlib.timing.one_thread) or shorten the cell."
    cell_limit = CELL_TIMEOUT * CELL_SHARE
    assert result.cells[slowest[0]] <= cell_limit, (
        f"{path.name} beside two busy torch programs: a cell took over {cell_limit:.0f} s, a third of the book's "
        f"{CELL_TIMEOUT} s cell limit; its slowest cells: {named}. {advice}")
    assert result.seconds <= CHAPTER_BUDGET, (
        f"{path.name} took {result.seconds:.0f} s ({result.cpu:.0f} s of CPU) beside two busy torch programs, over "
        f"the {CHAPTER_BUDGET} s budget; its slowest cells: {named}. {advice}")
