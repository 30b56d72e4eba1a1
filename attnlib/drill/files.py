"""The interview drill on a file: load the reader's FILE, choose the class to check, check it apart.

`check_file` loads FILE as a fresh module (under the time limit, in the state guard: a file that loops,
calls sys.exit() or changes torch's global state while it loads gets a failed verdict that says so),
chooses the class (--name; else the one nn.Module class that can be built as (d_model, num_heads) and
that no other class of the file uses; several such classes are a usage problem: exit 2, asking for
--name) and checks it; child.check_in_child does the same in a forked child process.
"""

from __future__ import annotations

import ast
import inspect
import sys
import traceback
import types
from pathlib import Path

from torch import nn

from attnlib.drill.build import _arguments
from attnlib.drill.checks import check_multi_head_attention
from attnlib.exercises._core import CandidateError, CheckResult
from attnlib.exercises._guard import TimeLimit, changed_state, time_limit
from attnlib.exercises._state import ExitCalled

__all__ = ["UsageError", "load", "choose", "check_file", "LIMIT", "NAME"]

LIMIT = 10.0  # seconds per run of the reader's code, loading the file included
NAME = "multi-head attention (the interview drill)"


class UsageError(Exception):
    """No such file, no class to check, several, or a syntax error: exit status 2."""


def load(path: Path, seconds: float = LIMIT) -> types.ModuleType:
    """Execute the reader's FILE as a fresh module (so that inspect finds its source); UsageError if it cannot
    be compiled; CandidateError if running it loops, exits, raises or changes torch's global state."""
    if not path.is_file():
        raise UsageError(f"no such file: {path}")
    try:
        code = compile(path.read_text(), str(path), "exec")
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        raise UsageError(f"{path}, line {exc.lineno}: SyntaxError: {exc.msg}" + (f"\n    {line}" if line else "")) from None
    module = types.ModuleType(f"_drill_answer_{path.stem}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module  # inspect.getsource looks the class's module up here
    try:
        with changed_state(f"loading {path}") as changes, time_limit(seconds, f"loading {path}"):
            exec(code, module.__dict__)  # the reader's own file, run as the reader asked
    except (Exception, SystemExit, TimeLimit) as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
        where = f" at line {frames[-1].lineno}: `{(frames[-1].line or '').strip()}`" if frames else ""
        if isinstance(exc, TimeLimit):
            raise CandidateError(f"loading {path} did not finish within {seconds:g} s and was stopped{where}: an "
                                 f"infinite loop at the top level of the file?") from None
        if isinstance(exc, SystemExit):
            call = exc.call if isinstance(exc, ExitCalled) else f"sys.exit({'' if exc.code is None else repr(exc.code)})"
            raise CandidateError(f"{path} called {call}{where} while "
                                 f"it was loaded, so no class could be checked: keep test code under "
                                 f"`if __name__ == \"__main__\":`") from None
        raise CandidateError(f"{path} raised {type(exc).__name__}: {exc}{where}") from None
    if changes:
        raise CandidateError("; and ".join(changes))
    return module


def _referenced(path: Path) -> dict[str, set[str]]:
    """For each class of FILE, the names used inside its body (its bases included)."""
    tree = ast.parse(path.read_text())
    return {node.name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def _buildable(cls: type) -> bool:
    """Whether cls takes (d_model, num_heads): an __init__ of its own (or a base's) that binds them."""
    if cls.__init__ is nn.Module.__init__:
        return False
    try:
        _arguments(cls, cls.__name__, 12, 3)
        return True
    except CandidateError:
        return False


def choose(module: types.ModuleType, path: Path, name: str | None) -> tuple[object, str]:
    """(the class to check, a note saying which when FILE defines several); UsageError if none or unclear."""
    own = {k: v for k, v in vars(module).items() if getattr(v, "__module__", None) == module.__name__}
    classes = {k: v for k, v in own.items() if inspect.isclass(v) and issubclass(v, nn.Module)}
    if name is not None:
        if name not in own:
            raise UsageError(f"no class {name} in {path}; it defines: {', '.join(own) or 'nothing'}")
        return own[name], ""
    if not classes:
        functions = [v for v in own.values() if inspect.isfunction(v)]
        if len(functions) == 1:
            return functions[0], ""  # the checker says the drill asks for a class, and why
        raise UsageError(f"no nn.Module class in {path}: the drill asks for class MultiHeadAttention(nn.Module)")
    uses = _referenced(path)
    top = [k for k in classes if not any(k in names for other, names in uses.items() if other != k)]
    pool = [k for k in top if _buildable(classes[k])] or top
    if len(pool) != 1:
        raise UsageError(f"{path} defines {len(pool) or len(classes)} classes that could be the answer "
                         f"({', '.join(pool or classes)}): choose one with --name, e.g. --name {(pool or list(classes))[0]}")
    others = [k for k in classes if k != pool[0]]
    return classes[pool[0]], (f"checked {pool[0]}; the file's other classes, {', '.join(others)}, are used by another "
                              f"class or cannot be built as (d_model, num_heads)" if others else "")


def check_file(path: Path, name: str | None = None, seconds: float | None = None) -> tuple[CheckResult, str]:
    """(the verdict on FILE, a note on which class was checked); UsageError for a usage problem."""
    limit = LIMIT if seconds is None else seconds
    try:
        module = load(path, limit)
    except CandidateError as exc:
        return CheckResult(NAME, False, str(exc)), ""
    candidate, note = choose(module, path, name)
    return check_multi_head_attention(candidate, seconds=limit), note
