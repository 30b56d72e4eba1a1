"""The interview drill's behaviour checks: state kept between calls, and randomness in eval() mode.

`history` calls two modules made alike (the reader's class, built twice with one seed) with different
histories: when their outputs on the same x then differ, forward keeps state between calls (a cache of
k and v, say), and the attributes it stored are named; when one module's outputs differ between two
seeds, forward is random in eval() mode, and what it did is named: dropout left on, a layer created
inside forward (with its line), or random draws.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import random
import textwrap
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.overrides import TorchFunctionMode

from attnlib.drill.probes import differs
from attnlib.exercises._core import CandidateError, matching

__all__ = ["history"]


class _Randomness(TorchFunctionMode):
    """Records what forward does that is random: dropout, layer initialisation, random draws."""

    INITS = ("kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "trunc_normal_")
    DRAWS = ("randn", "rand", "randint", "randperm", "randn_like", "rand_like", "randint_like", "bernoulli",
             "multinomial", "normal", "normal_", "uniform_", "bernoulli_", "random_", "exponential_")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if "dropout" in name and kwargs.get("training", True) and kwargs.get("p", args[1] if len(args) > 1 else 0.5):
            self.seen.append("F.dropout(w, p) without training=self.training")
        elif name == "scaled_dot_product_attention" and kwargs.get("dropout_p", args[4] if len(args) > 4 else 0):
            self.seen.append("scaled_dot_product_attention(dropout_p=...) without `if self.training`")
        elif name in self.INITS:
            self.seen.append("init")
        elif name in self.DRAWS:
            self.seen.append(f"torch.{name}")
        return func(*args, **kwargs)


def _creation_line(model: nn.Module) -> str:
    """' (line N: `W_o = nn.Linear(D, D)`)' for the first layer built inside a forward of the reader's."""
    for cls in dict.fromkeys(type(m) for m in model.modules()):
        try:
            lines, start = inspect.getsourcelines(cls.forward)
            tree = ast.parse(textwrap.dedent("".join(lines)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            f = getattr(node, "func", None) if isinstance(node, ast.Call) else None
            if getattr(f, "attr", getattr(f, "id", "")).endswith(("Linear", "LayerNorm", "Embedding")):
                return f" (line {start + node.lineno - 1}: `{lines[node.lineno - 1].strip()}`)"
    return ""


def _stored(before: dict, model: nn.Module) -> str:
    """The attributes forward set or changed on the module, e.g. '`self.k_cache` (2, 3, 10, 4)'."""
    now = _attributes(model)
    names = [f"`self.{k}`" + (f" {tuple(v)}" if isinstance(v, torch.Size) else "")
             for k, v in now.items() if k not in before or not _same(before[k], v)]
    return ", ".join(names[:3]) or "an object your forward updates"


def _attributes(model: nn.Module) -> dict:
    found = {}
    for prefix, m in model.named_modules():
        for k, v in vars(m).items():
            if not k.startswith("_") and k != "training":
                found[f"{prefix}.{k}".lstrip(".")] = v.shape if isinstance(v, torch.Tensor) else v
    return found


def _same(a: object, b: object) -> bool:
    try:
        return bool(a == b) if not isinstance(a, torch.Tensor) else a is b
    except Exception:  # noqa: BLE001 - a reader's object that cannot be compared: assume it changed
        return False


@contextlib.contextmanager
def _seeded_everywhere() -> Iterator[Callable[[int], None]]:
    """seed(s) seeds torch, numpy and Python's random alike; numpy's and Python's states are put back after
    (torch's is, by the checker), so that randomness of any origin is told from state kept between calls."""
    import numpy
    states = numpy.random.get_state(), random.getstate()

    def seed(s: int) -> None:
        torch.manual_seed(s), numpy.random.seed(s), random.seed(s)
    try:
        yield seed
    finally:
        numpy.random.set_state(states[0])
        random.setstate(states[1])


def history(model: nn.Module, twin: nn.Module, output: Callable[[nn.Module, torch.Tensor], torch.Tensor],
            x: torch.Tensor, x2: torch.Tensor) -> None:
    """CandidateError if forward's output depends on earlier calls (state) or on the random seed (dropout
    left on, a layer created in forward). model and twin are built alike; their histories differ."""
    before = _attributes(model)
    tensors = lambda: [(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()] if not is_lazy(t)]  # noqa: E731
    saved = {n: (t, t.detach().clone()) for n, t in tensors()}
    outs = []
    with _seeded_everywhere() as seed:
        for s, module, xi in ((1, model, x), (1, twin, x2), (2, model, x2), (2, twin, x2)):
            seed(s)
            with _Randomness() as log:
                outs.append(output(module, xi))
    moved = [n for n, t in tensors() if n in saved and t is saved[n][0] and not torch.equal(t.detach(), saved[n][1])]
    if moved:
        raise CandidateError(f"forward changes {', '.join(f'`{n}`' for n in moved[:3])} in place on every call: a "
                             f"module's parameters and buffers change only in an optimizer step, so forward must "
                             f"leave them as they are")
    if not matching(outs[2], {"fresh": outs[3]}):
        diff = float(differs(outs[2], outs[3]).max())
        raise CandidateError(f"forward's output depends on its earlier calls: on a second, different x it differs from "
                             f"a fresh module's output on that x (max abs difference {diff:.2g}). It keeps state "
                             f"between calls in {_stored(before, model)}: an attention module computes k and v from "
                             f"the x it is given, on every call")
    if not matching(outs[1], {"same seed": outs[3]}):
        raise CandidateError(_random_message(log.seen, model))


def later(model: nn.Module, twin: nn.Module, again: torch.Tensor, first: torch.Tensor, calls: int) -> None:
    """CandidateError if forward(x) gave `again` after the check's `calls` calls and `first` on the first one: state
    that `history`'s two calls did not reach (a counter that changes forward after a few calls)."""
    if not matching(again, {"first": first}):
        raise CandidateError(f"forward's output depends on its earlier calls: forward(x) gives other numbers after "
                             f"{calls} calls than the first time (max abs difference {float(differs(again, first).max()):.2g}"
                             f"). It keeps state between calls in {_stored(_attributes(twin), model)}: an attention "
                             f"module computes its output from the x it is given, the same on every call")


def _random_message(seen: list[str], model: nn.Module) -> str:
    head = "forward(x) gives two different outputs for the same x in eval() mode"
    if "init" in seen:
        return (f"{head}: forward creates a new layer on every call{_creation_line(model)}, so its parameters are new "
                f"random numbers each time and no optimizer could ever train them; create every layer once, in __init__")
    dropout = next((s for s in seen if "dropout" in s), None)
    if dropout:
        return (f"{head}: dropout is still on: {dropout} keeps dropping out after model.eval(). Use nn.Dropout "
                f"(eval() turns it off) or F.dropout(w, p, training=self.training)")
    draws = ", ".join(dict.fromkeys(s for s in seen if s.startswith("torch.")))
    if draws:
        return f"{head}: forward draws {draws}; multi-head attention in eval() mode is deterministic"
    return (f"{head}, with no dropout and no random draw of torch's: does forward use numpy's or Python's random "
            f"numbers, or the clock? Multi-head attention in eval() mode is deterministic")
