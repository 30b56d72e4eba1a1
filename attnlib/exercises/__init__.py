"""Checkers for every exercise in the book: `check_<name>(candidate) -> CheckResult`.

Each chapter's checkers live in their own module (ch01.py ... ch09.py, ch11.py ... ch17.py; chapter
10's, the interview drill's, in the package attnlib.drill) and are re-exported here, so a notebook
writes `from attnlib.exercises import check_softmax`.
"""

from attnlib.drill import checks as drill
from attnlib.exercises import ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch11, ch12, ch13, ch14, ch15, ch16, ch17
from attnlib.exercises._core import CheckResult
from attnlib.exercises.ch01 import *  # noqa: F403
from attnlib.exercises.ch02 import *  # noqa: F403
from attnlib.exercises.ch03 import *  # noqa: F403
from attnlib.exercises.ch04 import *  # noqa: F403
from attnlib.exercises.ch05 import *  # noqa: F403
from attnlib.exercises.ch06 import *  # noqa: F403
from attnlib.exercises.ch07 import *  # noqa: F403
from attnlib.exercises.ch08 import *  # noqa: F403
from attnlib.exercises.ch09 import *  # noqa: F403
from attnlib.exercises.ch11 import *  # noqa: F403
from attnlib.drill.checks import *  # noqa: F403
from attnlib.exercises.ch12 import *  # noqa: F403
from attnlib.exercises.ch13 import *  # noqa: F403
from attnlib.exercises.ch14 import *  # noqa: F403
from attnlib.exercises.ch15 import *  # noqa: F403
from attnlib.exercises.ch16 import *  # noqa: F403
from attnlib.exercises.ch17 import *  # noqa: F403

__all__ = ["CheckResult"]
for _module in (ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch11, ch12, ch13, ch14, ch15, ch16, ch17, drill):
    __all__ += _module.__all__
del _module
