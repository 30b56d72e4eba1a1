"""`python -m attnlib.drill check|practice FILE`: the interview drill from a terminal (cli.py)."""

import sys

from attnlib.drill.cli import main

sys.exit(main())
