"""Chapter 10, the interview drill: check a reader's multi-head attention class and name each classic mistake.

The drill: a class `(d_model, num_heads)`, a torch.nn.Module with `forward(x, mask=None)` (or
`forward(q, k, v, mask=None)`): x (B, T, D); mask None or a bool tensor that broadcasts to the scores
(B, H, T, T), True = may attend. It returns out (B, T, D), or a tuple holding it (with the weights).
Its projections are nn.Linear layers of any names and any split: they are found by what they do.

The checker builds the module twice alike (build), checks that forward keeps no state between calls and
is deterministic in eval() mode (probes.history), calls forward without a mask, with a (B, 1, T, T), a
(T, T) and a per-head (B, H, T, T) mask and on a second x, checks what it returned (output), learns from
the weights which layers are q, k, v and the output projection (probes.find, layers, roles), compares
each output with multi-head attention rebuilt from those weights (variants), runs one backward to check
that every projection gets its gradient, and on a mismatch says why (diagnosis). Every call of the
reader's code runs under a time limit, and torch's global state is put back as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parametrize

from attnlib.drill.build import build
from attnlib.drill.forward import Forward
from attnlib.drill.diagnosis import B, D, H, S, T, call, diagnose
from attnlib.drill.fit import options_for, shapes_note
from attnlib.drill.output import check_weights, finite
from attnlib.drill.behaviour import history, later
from attnlib.drill.probes import find, gradients
from attnlib.drill.roles import names_note, ranked
from attnlib.drill.variants import Case, reproduces, simulate
from attnlib.exercises._core import CandidateError, checker
from attnlib.exercises._guard import limited_to, one_thread
from attnlib.masks import causal_mask, lengths_to_valid, padding_mask

__all__ = ["check_multi_head_attention", "check_causal_multi_head_attention", "check_cross_attention",
           "check_multi_head_weights"]


@dataclass(frozen=True)
class Drill:
    signature: str  # forward's signature, as the exercise states it
    cases: Callable[[torch.Tensor, torch.Tensor], list[Case]]  # the calls to make on x, x2 (B, T, D)
    summary: str  # what a pass covered
    need_weights: bool = False


def _per_head_mask() -> torch.Tensor:
    """(B, H, T, T), different in every head; each row (and its inverse) allows some key, never all."""
    g = torch.Generator().manual_seed(11)
    allowed = (torch.rand(B, H, T, T, generator=g) > 0.5) | torch.eye(T, dtype=torch.bool)  # the diagonal allowed
    hidden = (torch.arange(T)[:, None] + 1 + torch.arange(H)[:, None, None]) % T  # (H, T, 1): one key per row hidden
    return allowed.scatter(-1, hidden.expand(B, H, T, 1), False)


def _drill_cases(x: torch.Tensor, x2: torch.Tensor) -> list[Case]:
    """forward(x); with a padding-and-causal mask (B, 1, T, T) whose rows and inverse rows all allow some
    key (so that an inverted mask gives no empty row); with a causal mask (T, T); with a per-head mask; x2."""
    mask = padding_mask(lengths_to_valid([3, 4], T)) & causal_mask(T)  # (B, 1, 1, T) & (T, T) -> (B, 1, T, T)
    heads = _per_head_mask()
    return [Case("forward(x)"),
            Case("forward(x, mask=mask) with mask (B, 1, T, T)", {"mask": mask}, mask=mask),
            Case("forward(x, mask=mask) with a causal mask (T, T)", {"mask": causal_mask(T)}, mask=causal_mask(T)),
            Case("forward(x, mask=mask) with a per-head mask (B, H, T, T)", {"mask": heads}, mask=heads),
            Case("forward(x2) on a second, different x", x=x2)]


def _causal_cases(x: torch.Tensor, x2: torch.Tensor) -> list[Case]:
    pad = padding_mask(lengths_to_valid([3, 4], T))  # (B, 1, 1, T)
    return _drill_cases(x, x2)[:3] + [
        Case("forward(x, is_causal=True)", {"is_causal": True}, is_causal=True),
        Case("forward(x, mask=mask, is_causal=True) with a padding mask (B, 1, 1, T)",
             {"mask": pad, "is_causal": True}, mask=pad, is_causal=True)]


def _cross_cases(x: torch.Tensor, x2: torch.Tensor) -> list[Case]:
    context, memory = torch.randn(B, S, D), padding_mask(lengths_to_valid([4, 6], S))  # (B, S, D), (B, 1, 1, S)
    return _drill_cases(x, x2)[:2] + [
        Case("forward(x, context=context) with context (B, S, D)", {"context": context}, context=context),
        Case("forward(x, context=context, mask=mask) with a padding mask (B, 1, 1, S)",
             {"context": context, "mask": memory}, context=context, mask=memory)]


def _contract(model: nn.Module) -> None:
    """CandidateError when the answer is outside the drill's contract: what the rule is, and why."""
    if any(isinstance(m, nn.MultiheadAttention) for m in model.modules()):
        raise CandidateError("your module holds an nn.MultiheadAttention: the drill asks you to write multi-head "
                             "attention yourself, from nn.Linear projections (and nn.MultiheadAttention's masks are "
                             "True = ignore, the opposite of the drill's)")
    bound = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and parametrize.is_parametrized(m)]
    if bound:
        raise CandidateError(f"{', '.join(f'`{n}`' for n in bound)} {'is' if len(bound) == 1 else 'are'} under a "
                             f"parametrization (weight_norm, spectral_norm, ...): the weight is recomputed from other "
                             f"parameters on every call, so the checker cannot rebuild attention from it. The drill's "
                             f"contract: plain nn.Linear projections (a parametrization belongs to training, outside "
                             f"the drill)")
    if not any(isinstance(m, nn.Linear) for m in model.modules()):
        params = ", ".join(f"{n} {tuple(p.shape)}" for n, p in model.named_parameters()) or "none"
        raise CandidateError(f"found no nn.Linear layer, only the parameters {params}. The drill's contract: the "
                             f"projections are nn.Linear layers (any names, any split), so that the checker can "
                             f"rebuild attention from their parameters; write e.g. self.W_q = nn.Linear(d_model, d_model)")


def _twin(model: nn.Module, make: Callable[[], nn.Module]) -> nn.Module:
    """A second module built like the first, with the same parameters."""
    torch.manual_seed(0)
    twin = make()
    try:
        twin.load_state_dict(model.state_dict())
    except (RuntimeError, ValueError):  # lazy layers not built yet: the same seed made them alike
        pass
    return twin


def _check(candidate: object, drill: Drill, seconds: float | None) -> str:
    with limited_to(seconds), one_thread():
        torch.manual_seed(0)
        model, maker = build(candidate, D, H)
        _contract(model)
        twin = _twin(model, maker.make)
        model.eval(), twin.eval()
        fwd, x, x2 = Forward.of(model), torch.randn(B, T, D), torch.randn(B, T, D)
        out_of = lambda m, xi: call(m, fwd, x, Case("forward(x)", x=xi), drill)[0]  # noqa: E731
        try:
            history(model, twin, out_of, x, x2)
        except CandidateError as exc:
            raise CandidateError(str(exc) + shapes_note(model, D)) from None
        got, weights, errors = [], {}, []
        for case in drill.cases(x, x2):
            try:
                out, weights[case.call] = call(model, fwd, x, case, drill)
                got.append((case, out.detach()))
            except CandidateError as exc:
                errors.append((case, str(exc)))
        if not got:
            raise CandidateError(errors[0][1])
        if got[0][0].call == "forward(x)":  # forward(x) again, after every call: a state history() did not reach
            later(model, twin, out_of(model, x).detach(), got[0][1], len(got) + 5)
        finite(got[0][1], fwd.describe(got[0][0].call))
        found = find(model, lambda: out_of(model, x), D, H)
        options, missing = options_for(found, model, D, H)
        options = ranked(options, found.values)
        layers = next((o for o in options if reproduces(o, H, x, got[:1])), None)
        wrong = [case for case, out in got if layers is None or not reproduces(layers, H, x, [(case, out)])]
        if missing or errors or wrong:
            first = [layers] if layers is not None else []  # the layout forward(x) agrees with, when it does
            raise CandidateError(diagnose(model, fwd, drill, first + [o for o in options if o is not layers], missing,
                                          found, x, got, errors, wrong))
        with torch.enable_grad():
            xg = x.clone().requires_grad_()
            gradients(layers, out_of(model, xg), simulate(layers, H, xg, got[0][0], live=True)[0][0], xg)
    checked = [check_weights(weights[case.call], simulate(layers, H, x, case)[0][1], case.call, drill.need_weights,
                             simulate(layers, H, x, Case(case.call, context=case.context, x=case.x))[0][1])
               for case, _ in got]
    given = "; forward(q, k, v) was given x three times" if fwd.inputs == 3 else ""
    return (f"matches multi-head attention rebuilt from your own {layers.described}{given} (B = {B}, T = {T}, "
            f"d_model = {D}, num_heads = {H}) {drill.summary}" + (", the attention weights it returns too" if any(checked) else "")
            + "; gives the same output on every call in eval() mode, keeps no state between calls, and every "
            f"projection gets its gradient{maker.note}{names_note(layers)}")


_SUMMARY = ("without a mask, with (B, 1, T, T), (T, T) and per-head (B, H, T, T) masks, and on a second, "
            "different x")
_MHA = Drill("forward(self, x, mask=None)", _drill_cases, _SUMMARY)


@checker("multi-head attention (the interview drill)")
def check_multi_head_attention(cls: type, seconds: float | None = None) -> str:
    """cls(d_model, num_heads): nn.Linear projections of any names and split (q, k, v, out; a fused qkv; per
    head); forward(x, mask=None) or forward(q, k, v, mask=None) -> out, or a tuple holding out (B, T, D) once.
    `seconds`: the time limit of each call of your code (default 10)."""
    return _check(cls, _MHA, seconds)


@checker("multi-head attention with is_causal")
def check_causal_multi_head_attention(cls: type, seconds: float | None = None) -> str:
    """The drill with forward(x, mask=None, is_causal=False): is_causal=True hides key j > query i (ANDed with mask)."""
    return _check(cls, Drill("forward(self, x, mask=None, is_causal=False)", _causal_cases,
                             "without a mask, with a (B, 1, T, T) and a (T, T) mask, and with is_causal=True alone "
                             "and with a padding mask"), seconds)


@checker("cross-attention")
def check_cross_attention(cls: type, seconds: float | None = None) -> str:
    """The drill with forward(x, context=None, mask=None): queries from x (B, T, D), keys and values from
    context (B, S, D) (x itself when None); mask broadcasts to (B, H, T, S)."""
    return _check(cls, Drill("forward(self, x, context=None, mask=None)", _cross_cases,
                             "as self-attention, without and with a mask, and as cross-attention on a context "
                             "(B, S, D) with S = 7, without and with a padding mask (B, 1, 1, S)"), seconds)


@checker("multi-head attention returning its attention weights")
def check_multi_head_weights(cls: type, seconds: float | None = None) -> str:
    """The drill with forward returning (out (B, T, D), attention weights (B, H, T, T)), the probabilities applied to v."""
    return _check(cls, Drill("forward(self, x, mask=None)", _drill_cases, _SUMMARY, need_weights=True), seconds)
