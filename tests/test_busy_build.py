"""The heaviest chapter builds on a busy machine, within BUDGET seconds.

A reader's laptop always runs something else. Issue 35: beside other CPU-bound programs, chapter 11's
training cell (many small operations on torch's two threads) thrashed past the book build's 300 s
cell limit: 60 of its steps took 1.9 s on an idle machine and 13.9 s with one core busy, against
2.1 s on one thread either way. The chapters now run such work on one thread
(attnlib.timing.one_thread; chapter 11, all small models, as a whole). This test executes a chapter as the book build does (a fresh kernel in
chapters/, _config.yml's execution settings) while two torch programs multiply 1024 x 1024 matrices
on their default threads the whole time (benchmarks.chapter_runtimes.busy_machine, which
`python -m benchmarks.chapter_runtimes --busy 2` uses to find the cells that thrash), and fails if
the chapter takes longer than BUDGET, naming its slowest cells.
"""

from __future__ import annotations

import pytest

from benchmarks.chapter_runtimes import CHAPTERS, busy_machine, run

BUDGET = 150  # seconds for one chapter beside two busy torch programs (issue 35)
# Chapter 12, the heaviest: SmolLM2 (135M parameters) loaded and run on one thread, about 60 s of CPU on an
# idle machine (python -m benchmarks.chapter_runtimes 12 prints it), which two busy programs stretch to about
# twice that. Chapter 11, whose small models thrashed on two threads (434 s under load before, ~60 s after),
# costs half as much and is not built here, to keep this test's share of CI short; run
# `python -m benchmarks.chapter_runtimes --busy 2` to check every chapter under the same load.
CHAPTERS_UNDER_LOAD = ("12_real_language_model",)


@pytest.mark.parametrize("name", CHAPTERS_UNDER_LOAD)
def test_a_chapter_builds_beside_two_busy_programs(name):
    path = CHAPTERS / f"{name}.ipynb"
    with busy_machine(2):
        result = run(path, timeout=BUDGET)
    assert result.error is None, (f"{path.name} beside two busy torch programs (cells may take {BUDGET} s) "
                                  f"stopped at {result.error}")
    slowest = sorted(range(len(result.cells)), key=result.cells.__getitem__, reverse=True)[:3]
    named = ", ".join(f"cell {i} {result.cells[i]:.0f} s ({result.cpu_cells[i]:.0f} s of CPU)" for i in slowest)
    assert result.seconds <= BUDGET, (
        f"{path.name} took {result.seconds:.0f} s ({result.cpu:.0f} s of CPU) beside two busy torch programs, over "
        f"the {BUDGET} s budget; its slowest cells: {named}. Run small operations on one thread "
        "(attnlib.timing.one_thread) or shorten the cell.")
