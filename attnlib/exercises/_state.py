"""Global state a reader's code may change and leave changed, each put back and named (_guard uses it).

torch's default dtype, grad mode, inference mode, default device and random seed; deterministic mode, anomaly
detection, flush-denormal mode and the thread count; print options, the recursion limit and the warnings
filters that turn every warning into an error (or hide them all); and torch's own functions: an answer that
replaces `torch.equal` or `torch.Tensor.__eq__` gets the original back and is told so. The originals are
captured when attnlib.exercises is imported, so a replacement made earlier in the session is found too
(`restore_torch`). os._exit, os.abort, os.kill of this process and signal.raise_signal are replaced for the
call by functions that raise SystemExit, so that an answer calling them cannot end the notebook's kernel.
"""

from __future__ import annotations

import contextlib
import os
import signal
import site
import sys
import sysconfig
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import _tensor_str  # torch.set_printoptions has no public getter

from attnlib.exercises._state_modes import flush_denormal, restore_modes
from attnlib.exercises._state_text import describe, modes_text

__all__ = ["changed_state", "restore_torch", "ExitCalled"]

_WATCHED = {"torch": torch, "torch.nn.functional": F, "torch.Tensor": torch.Tensor, "torch.linalg": torch.linalg,
            "torch.testing": torch.testing}


def _spaces() -> dict[str, object]:
    """The namespaces watched: torch's, and every attnlib module loaded (the references the checkers compare
    with, and the names a checker module imported them under)."""
    return {**_WATCHED, **{name: module for name, module in list(sys.modules.items())
                           if (name == "attnlib" or name.startswith("attnlib.")) and module is not None}}


def _functions() -> dict[tuple[str, str], object]:
    """(namespace, name) -> the callable, for torch's and attnlib's public functions and torch.Tensor's methods."""
    return {(space, name): value for space, obj in _spaces().items() for name, value in vars(obj).items()
            if callable(value) and (space == "torch.Tensor" or not name.startswith("_"))
            and (space, name) != ("torch", "Storage")}  # torch.set_default_dtype rebinds it: named as that


_ORIGINAL = _functions()
_LIBS = ("stdlib", "platstdlib", "purelib", "platlib")
LIBRARY_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                     for m in (torch, sys.modules["attnlib"]) if getattr(m, "__file__", None))
LIBRARY_DIRS += tuple({os.path.join(p, "lib") for p in (sys.prefix, sys.base_prefix)} |
                      {os.path.abspath(p) + os.sep for p in (*site.getsitepackages(), site.getusersitepackages(),
                                                             *(sysconfig.get_paths()[k] for k in _LIBS))})


def library_file(filename: str) -> bool:
    """Whether code in `filename` belongs to torch, attnlib, an installed library (in a venv, the system's
    site-packages or the user's) or Python itself: the frames a message never calls the reader's code."""
    return filename.startswith("<frozen") or os.path.abspath(filename).startswith(LIBRARY_DIRS)


def _by_library(value: object, saved: dict) -> bool:
    """A new function a library made (torch._dynamo wraps torch.manual_seed when it is first imported), not
    the reader's lambda, nor one of torch's functions put in another's place."""
    code = getattr(value, "__code__", None)
    return code is not None and library_file(code.co_filename) and all(value is not v for v in saved.values())


def restore_torch(saved: dict | None = None) -> list[str]:
    """Put back every function of `saved` (default: as at import) that the reader's code replaced or deleted,
    and remove methods it added to torch.Tensor that shadow torch's own (torch.Tensor.equal = ...: the C base
    class defines equal); the names of what was put back. A new method of the reader's own name is left alone.
    A replacement made by a library is kept, and becomes the saved one."""
    saved = _ORIGINAL if saved is None else saved
    now, found = _functions(), []
    for (space, name), value in saved.items():
        new = now.get((space, name))
        if new is value:
            continue
        if new is not None and _by_library(new, saved):
            saved[space, name] = _ORIGINAL[space, name] = new
            continue
        setattr(_spaces()[space], name, value)
        found.append(f"{space}.{name}")
    for space, name in now.keys() - saved.keys():
        if space == "torch.Tensor" and any(hasattr(base, name) for base in torch.Tensor.__bases__):  # shadows one
            delattr(torch.Tensor, name)
            found.append(f"torch.Tensor.{name}")
    return found


def _snapshot() -> tuple:
    return torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_default_device()


_SWITCHES = (("torch.use_deterministic_algorithms", torch.are_deterministic_algorithms_enabled,
              torch.use_deterministic_algorithms),
             ("torch.autograd.set_detect_anomaly", torch.is_anomaly_enabled, torch.autograd.set_detect_anomaly),
             ("torch.set_flush_denormal", flush_denormal, torch.set_flush_denormal),
             ("torch.set_num_threads", torch.get_num_threads, torch.set_num_threads),
             ("torch.set_printoptions", _tensor_str.get_printoptions, lambda old: torch.set_printoptions(**old)),
             ("sys.setrecursionlimit", sys.getrecursionlimit, sys.setrecursionlimit))


@contextlib.contextmanager
def _restore_switches(what: str) -> Iterator[list[str]]:
    """Global switches a reader's code may flip and leave flipped; each is put back and named."""
    before, found = [get() for _, get, _ in _SWITCHES], []
    try:
        yield found
    finally:
        for (name, get, put_back), old in zip(_SWITCHES, before):
            new = get()
            if new != old:
                put_back(old)
                shown = ", ".join(f"{k}={v!r}" for k, v in new.items() if old.get(k) != v) if isinstance(new, dict) \
                    else new
                found.append(f"{what} called {name}({shown}) and left it set: a global setting that changes the rest "
                             f"of your session. The checker set it back"
                             + ("" if isinstance(old, dict) else f" to {old}"))


class ExitCalled(SystemExit):
    """Raised in place of os._exit(status) or os.abort() during a reader's call."""

    def __init__(self, call: str) -> None:
        super().__init__(call)
        self.call = call


def _no_exit(name: str, original=None):
    """A stand-in for a call that ends this process; with `original`, os.kill: only a signal to this process
    (or its group) is refused, one to another process is sent."""
    def refuse(*args) -> None:
        if original is not None and args and args[0] not in (0, os.getpid(), -os.getpgid(0)):
            return original(*args)
        raise ExitCalled(f"{name}({', '.join(map(repr, args))})")
    return refuse


_ENDERS = ((os, "_exit"), (os, "abort"), (os, "kill"), (signal, "raise_signal"))


@contextlib.contextmanager
def changed_state(what: str) -> Iterator[list[str]]:
    """Yield a list that, after the block, holds what `what` changed in global state (see the module's
    docstring), each already put back."""
    before, seeded, found, saved = _snapshot(), [], [], _functions()
    original, enders = torch.manual_seed, [getattr(module, name) for module, name in _ENDERS]

    def manual_seed(seed: int):  # the reader's call is recorded, then done as asked
        seeded.append(seed)
        return original(seed)

    torch.manual_seed = torch.random.manual_seed = manual_seed
    for (module, name), function in zip(_ENDERS, enders):
        setattr(module, name, _no_exit(f"{module.__name__.replace('posix', 'os')}.{name}",
                                       function if name == "kill" else None))
    try:
        with restore_modes() as modes, _restore_switches(what) as flipped:
            yield found
    finally:
        for (module, name), function in zip(_ENDERS, enders):
            setattr(module, name, function)
        torch.manual_seed = torch.random.manual_seed = original
        dtype, grad, device = _snapshot()
        if dtype != before[0]:
            torch.set_default_dtype(before[0])
        if grad != before[1]:
            torch.set_grad_enabled(before[1])
        if device != before[2]:  # None: no default-device mode at all, as before
            torch.set_default_device(None if before[2] == torch.device("cpu") else before[2])
        replaced = restore_torch(saved)
        found += modes_text(what, modes) + describe(what, before, (dtype, grad, device), seeded, replaced) + flipped
