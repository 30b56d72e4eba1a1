"""Checkers for every exercise in the book: `check_<name>(candidate) -> CheckResult`.

Each chapter's checkers live in their own module (ch01.py, ch02.py, ...) and are re-exported here,
so a notebook writes `from attnlib.exercises import check_softmax`.
"""

from attnlib.exercises._core import CheckResult
from attnlib.exercises import ch01, ch02
from attnlib.exercises.ch01 import *  # noqa: F403
from attnlib.exercises.ch02 import *  # noqa: F403

__all__ = ["CheckResult"]
__all__ += ch01.__all__ + ch02.__all__
