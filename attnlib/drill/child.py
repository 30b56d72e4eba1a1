"""The interview drill's file check in a child process (the exercises' _child.in_child): whatever the reader's
file does, a verdict comes back. files.check_file runs in the child, its prints discarded; a child still
running after a hard deadline (a loop that swallows the time limit's exception, a computation stuck in C
code) is killed, and a child that ends without a verdict (os._exit(), a crash, the memory cap) is reported
as such.
"""

from __future__ import annotations

from pathlib import Path

from attnlib.drill.files import LIMIT, NAME, check_file
from attnlib.exercises._child import ChildLost, in_child
from attnlib.exercises._core import CheckResult

__all__ = ["check_in_child"]


def check_in_child(path: Path, name: str | None = None, seconds: float | None = None) -> tuple[CheckResult, str]:
    """check_file in a forked child, stopped after a hard deadline; UsageError for a usage problem."""
    limit = LIMIT if seconds is None else seconds
    deadline = 4 * limit + 5  # the child's own limits name a hang; this stops what they cannot
    try:
        return in_child(lambda: check_file(path, name, seconds), deadline, show_printed=False)
    except ChildLost as exc:
        why = str(exc).replace("ended without an answer", "ended without a verdict")
        if why.startswith("did not finish"):
            why = why.replace(" (a loop", f": your code kept running past the time limit of {limit:g} s per call (a loop")
        return CheckResult(NAME, False, f"the check of {path} {why}"), ""
