"""The interview drill (chapter 10): write multi-head attention from memory, and have it checked.

One package for the whole drill. The checkers (checks.py) build the reader's class, probe what its
weights do to the output to find q, k, v and the output projection whatever their names or split
(probes, layers, roles), compare with multi-head attention rebuilt from those weights (variants), and
name the mistake from the catalogue (mistakes) or say what differs (diagnosis, differ). The command line
(`python -m attnlib.drill check|practice FILE`, cli) checks a file in a child process (files, child).
attnlib.exercises re-exports the four checkers, so a notebook writes
`from attnlib.exercises import check_multi_head_attention`.
"""

from attnlib.drill.checks import (check_causal_multi_head_attention, check_cross_attention,
                                  check_multi_head_attention, check_multi_head_weights)
from attnlib.drill.cli import main
from attnlib.drill.files import UsageError, check_file, load

__all__ = ["check_multi_head_attention", "check_causal_multi_head_attention", "check_cross_attention",
           "check_multi_head_weights", "main", "check_file", "load", "UsageError"]
