"""Checkers for every exercise in the book: `check_<name>(candidate) -> CheckResult`.

Each chapter's checkers live in their own module (ch01.py, ch02.py, ...) and are re-exported here,
so a notebook writes `from attnlib.exercises import check_softmax`.
"""

from attnlib.exercises._core import CheckResult

__all__ = ["CheckResult"]
