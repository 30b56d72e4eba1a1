"""Chapter 10, the interview drill: check a reader's multi-head attention class and name each classic mistake.

The drill: a class `(d_model, num_heads)`, a torch.nn.Module with `forward(x, mask=None)` (or
`forward(q, k, v, mask=None)`): x (B, T, D); mask None or a bool tensor that broadcasts to the scores
(B, H, T, T), True = may attend. It returns out (B, T, D), or a tuple holding it (with the weights).
Its layers may have any names, separate or fused: they are found by what they do.

The checker builds the module and learns how to call it (drill_build), finds the nn.Linear layers its
forward applies to x and to the merged heads (drill_layers) and which of them is q, k and v
(drill_roles), calls forward in eval() mode without a mask, with a (B, 1, T, T) padding-and-causal
mask and with a (T, T) causal mask, checks what it returned (drill_output), and compares each output
with multi-head attention rebuilt from the module's own weights (drill_variants). On a mismatch it
names the known mistakes (drill_mistakes), alone or two at once, that reproduce every output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from attnlib._checks import fmt_shape
from attnlib.exercises._core import CandidateError, checker, matching
from attnlib.exercises.drill_build import Forward, build, with_hints
from attnlib.exercises.drill_layers import Layers, layouts, trace
from attnlib.exercises.drill_output import check_weights, unpack
from attnlib.exercises.drill_mistakes import describe
from attnlib.exercises.drill_roles import choose
from attnlib.exercises.drill_variants import Case, explain, simulate
from attnlib.masks import causal_mask, lengths_to_valid, padding_mask

__all__ = ["check_multi_head_attention", "check_causal_multi_head_attention", "check_cross_attention",
           "check_multi_head_weights"]

B, T, S, D, H = 2, 5, 7, 12, 3  # all different (and Dh = 4), so that no axis can stand in for another

@dataclass(frozen=True)
class _Drill:
    signature: str  # forward's signature, as the exercise states it
    cases: Callable[[torch.Tensor], list[Case]]  # the calls to make on x (B, T, D)
    summary: str  # what a pass covered
    need_weights: bool = False


def _drill_cases(x: torch.Tensor) -> list[Case]:
    """forward(x); with a padding-and-causal mask (B, 1, T, T) whose rows and inverse rows all allow
    some key (so that an inverted mask gives no empty row); with a causal mask (T, T)."""
    mask = padding_mask(lengths_to_valid([3, 4], T)) & causal_mask(T)  # (B, 1, 1, T) & (T, T) -> (B, 1, T, T)
    return [Case("forward(x)"),
            Case("forward(x, mask=mask) with mask (B, 1, T, T)", {"mask": mask}, mask=mask),
            Case("forward(x, mask=mask) with a causal mask (T, T)", {"mask": causal_mask(T)}, mask=causal_mask(T))]


def _causal_cases(x: torch.Tensor) -> list[Case]:
    pad = padding_mask(lengths_to_valid([3, 4], T))  # (B, 1, 1, T)
    return _drill_cases(x) + [
        Case("forward(x, is_causal=True)", {"is_causal": True}, is_causal=True),
        Case("forward(x, mask=mask, is_causal=True) with a padding mask (B, 1, 1, T)",
             {"mask": pad, "is_causal": True}, mask=pad, is_causal=True)]


def _cross_cases(x: torch.Tensor) -> list[Case]:
    context, memory = torch.randn(B, S, D), padding_mask(lengths_to_valid([4, 6], S))  # (B, S, D), (B, 1, 1, S)
    return _drill_cases(x)[:2] + [
        Case("forward(x, context=context) with context (B, S, D)", {"context": context}, context=context),
        Case("forward(x, context=context, mask=mask) with a padding mask (B, 1, 1, S)",
             {"context": context, "mask": memory}, context=context, mask=memory)]


def _call(model: nn.Module, fwd: Forward, x: torch.Tensor, case: Case, drill: _Drill) -> tuple[torch.Tensor, object]:
    """Run forward for one case on copies of its inputs; (out, weights or None), checked."""
    x_in = x.clone()
    kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.kwargs.items()}
    try:
        value = fwd.call(model, x_in, kwargs, case.call)
    except CandidateError as exc:
        raise CandidateError(with_hints(str(exc), drill.signature)) from None
    if not torch.equal(x_in, x):
        raise CandidateError(f"{fwd.describe(case.call)} changed x in place (an in-place op such as x += ... "
                             f"or x.mul_()): "
                             f"forward must leave its input alone")
    S_case = T if case.context is None else case.context.shape[1]
    return unpack(value, fwd.describe(case.call), x, S_case, H, drill.need_weights)


def _mask_hint(model: nn.Module, fwd: Forward, layers: Layers, x: torch.Tensor, case: Case, drill: _Drill) -> str:
    """For a call with a (B, 1, T, T) mask that failed: the drill's mask shape, and whether (B, T, T) works."""
    if case.mask is None:
        return ""
    if case.mask.dim() == 4:
        squeezed = Case(case.call, {**case.kwargs, "mask": case.mask.squeeze(1)}, case.context, case.mask,
                        case.is_causal)
        try:
            out, _ = _call(model, fwd, x, squeezed, drill)
        except CandidateError:
            out = None
        if out is not None and matching(out, {"": simulate(layers, H, x, case)[0][0]}):
            return (". Given the same mask as (B, T, T), your forward is right: the drill's masks already "
                    "broadcast over the heads, (B, 1, T, T) or (T, T), so do not add a head axis")
    return (f". The checker passes mask as a bool tensor of shape {fmt_shape(case.mask.shape)}, "
            f"True = may attend")


def _diagnose(options: list[Layers], fwd: Forward, x: torch.Tensor, got: list[tuple[Case, torch.Tensor]],
              wrong: list[Case]) -> str:
    """Say which call is wrong and which known mistakes, alone or two at once, reproduce every output
    (for the most plausible roles of the reader's layers first, then for the others)."""
    first, layers = wrong[0], options[0]
    right = [case for case, _ in got[:[case for case, _ in got].index(first)]]  # the calls before it, all right
    head = (f"{fwd.describe(right[-1].call)} is right, but {fwd.describe(first.call)} is wrong" if right
            else f"{fwd.describe(first.call)} is wrong")
    for option in options:
        found = explain(option, H, x, got)
        if found:
            kind = "a known mistake" if len(found[0]) == 1 else "two mistakes at once"
            return f"{head}: it matches {kind} — " + " — or, just as well, ".join(
                describe(c, D, H, option.names) for c in found)
    out = next(o for case, o in got if case is first)
    diff = (out.detach().double() - simulate(layers, H, x, first)[0][0].double()).abs().max().item()
    nan = " It contains NaN." if torch.isnan(out).any() else ""
    return (f"{head} (max abs difference {diff:.2g} from multi-head attention rebuilt from your "
            f"{layers.described}), and it matches none of the known mistakes, alone or two at once.{nan} "
            f"Print your shapes: q, k, v should be (B, H, T, Dh) = {fmt_shape((B, H, T, D // H))}, "
            f"the scores (B, H, T, T) = {fmt_shape((B, H, T, T))}, the output (B, T, D) = {fmt_shape((B, T, D))}")


def _check(candidate: object, drill: _Drill) -> str:
    model = build(candidate, D, H)
    model.eval()
    fwd, x = Forward.of(model), torch.randn(B, T, D)
    cases = drill.cases(x)
    options = layouts(trace(model, x, lambda: _call(model, fwd, x, cases[0], drill)), model, D, H)
    got, weights, errors = [], {}, []
    for case in cases:
        try:
            out, weights[case.call] = _call(model, fwd, x, case, drill)
            got.append((case, out))
        except CandidateError as exc:
            errors.append(str(exc) + ("" if errors else _mask_hint(model, fwd, options[0], x, case, drill)))
    if not got:
        raise CandidateError(errors[0])
    layers, others = choose(options, H, x, *got[0])
    again, _ = _call(model, fwd, x, got[0][0], drill)
    if not matching(again, {"first call": got[0][1]}):
        raise CandidateError(f"{got[0][0].call} gave two different outputs for the same x in eval() mode: is "
                             f"dropout still on? Use nn.Dropout (eval() turns it off) or F.dropout(w, p, "
                             f"training=self.training); F.dropout(w, p) and scaled_dot_product_attention("
                             f"dropout_p=p) keep dropping out in eval() mode")
    wrong = [case for case, out in got if not matching(out, {"": simulate(layers, H, x, case)[0][0]})]
    if errors or wrong:
        raise CandidateError(". Also, ".join(errors[:1] + ([_diagnose([layers] + others, fwd, x, got, wrong)]
                                                           if wrong else [])))
    checked = [check_weights(weights[case.call], simulate(layers, H, x, case)[0][1], case.call, drill.need_weights)
               for case, _ in got]
    given = "; forward(q, k, v) was given x three times" if fwd.inputs == 3 else ""
    return (f"matches multi-head attention rebuilt from your own {layers.described}{given} (B = {B}, T = {T}, "
            f"d_model = {D}, num_heads = {H}) {drill.summary}"
            + (", the weights it returns too" if any(checked) else "")
            + ", and gives the same output on every call in eval() mode")


_SUMMARY = "without a mask, with a (B, 1, T, T) mask and with a (T, T) causal mask"
_MHA = _Drill("forward(self, x, mask=None)", _drill_cases, _SUMMARY)


@checker("multi-head attention (the interview drill)")
def check_multi_head_attention(cls: type) -> str:
    """cls(d_model, num_heads): nn.Linear projections of any names (q, k, v, out; or a fused qkv and out);
    forward(x, mask=None) or forward(q, k, v, mask=None) -> out, or a tuple holding out (B, T, D) once."""
    return _check(cls, _MHA)


@checker("multi-head attention with is_causal")
def check_causal_multi_head_attention(cls: type) -> str:
    """The drill with forward(x, mask=None, is_causal=False): is_causal=True hides key j > query i (ANDed with mask)."""
    return _check(cls, _Drill("forward(self, x, mask=None, is_causal=False)", _causal_cases,
                              _SUMMARY + ", and with is_causal=True alone and with a padding mask"))


@checker("cross-attention")
def check_cross_attention(cls: type) -> str:
    """The drill with forward(x, context=None, mask=None): queries from x (B, T, D), keys and values from
    context (B, S, D) (x itself when None); mask broadcasts to (B, H, T, S)."""
    return _check(cls, _Drill("forward(self, x, context=None, mask=None)", _cross_cases,
                              "as self-attention, without and with a mask, and as cross-attention on a context "
                              "(B, S, D) with S = 7, without and with a padding mask (B, 1, 1, S)"))


@checker("multi-head attention returning its weights")
def check_multi_head_weights(cls: type) -> str:
    """The drill with forward returning (out (B, T, D), weights (B, H, T, T)), the probabilities applied to v."""
    return _check(cls, _Drill("forward(self, x, mask=None)", _drill_cases, _SUMMARY, need_weights=True))
