"""Checkers for chapter 14 (attention in 2025's models): per-head QK-norm and the softmax with a learned sink
(differential attention's checker lives in ch14_diff, the output gate's in ch14_gate).

Inputs have distinct sizes on every axis (B, H, H_kv, T, S, Dh), so that a norm or a softmax over the wrong
axis, a transposed result or a sink broadcast along the wrong axis cannot pass for the right one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, checker, run
from attnlib.exercises._differ import expect_or_differences
from attnlib.exercises.ch14_diff import check_differential_attention, tensor_of
from attnlib.exercises.ch14_gate import check_output_gate

__all__ = ["check_qk_norm", "check_sink_softmax", "check_differential_attention", "check_output_gate"]

B, H, H_KV, T, DH = 3, 4, 2, 5, 6


def _rms(u: torch.Tensor, g: torch.Tensor | float, dims: int | tuple[int, ...] = -1, eps: float = 1e-6) -> torch.Tensor:
    return u * torch.rsqrt(u.pow(2).mean(dims, keepdim=True) + eps) * g


def _projection(u: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """OLMo 2's placement with a per-head weight: one rms over all heads' features of a token."""
    return _rms(u, g, dims=(1, 3))


def _norm_mistakes(u: torch.Tensor, g: torch.Tensor, other_g: torch.Tensor) -> dict[str, torch.Tensor]:
    centred = u - u.mean(-1, keepdim=True)
    return {
        "the rms taken over all heads of a token (OLMo 2's placement, over the projection): per head, the mean "
        "runs over one head's Dh features (dim=-1) only": _projection(u, g),
        "the rms taken over the positions (dim=-2), not over a head's features (dim=-1)": _rms(u, g, dims=-2),
        "the rms taken over the heads (dim=1), not over a head's features (dim=-1)": _rms(u, g, dims=1),
        "LayerNorm, not RMSNorm: QK-norm does not subtract the mean": centred * torch.rsqrt(
            centred.pow(2).mean(-1, keepdim=True) + 1e-6) * g,
        "the vector divided by its length (L2 norm), not by its rms: the rms is ‖u‖ / sqrt(Dh), so the result "
        "is sqrt(Dh) times too small": u / u.norm(dim=-1, keepdim=True) * g,
        "the weight not applied (multiply the normalised vector by its weight, one number per feature)": _rms(u, 1.0),
        "the other weight used (q_weight on the keys, k_weight on the queries)": _rms(u, other_g),
        "the weight used as 1 + w (Gemma 3 and Qwen3.5 store it that way; Qwen3 multiplies by w itself)":
            _rms(u, 1 + g),
        "the weight applied before the norm (the rms of u ⊙ g): normalise first, then multiply": _rms(u * g, 1.0),
        "ε added outside the square root (u / (rms + ε)): it goes inside, u / sqrt(mean(u²) + ε)":
            u / (u.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6) * g,
        "ε left out (u / sqrt(mean(u²))): the exercise's norm adds ε = 1e-6 inside the square root":
            _rms(u, g, eps=0.0),
        "ε = 1e-5: the exercise's (and Qwen3's) ε is 1e-6": _rms(u, g, eps=1e-5),
        "divided by the mean square, without its square root": u / (u.pow(2).mean(-1, keepdim=True) + 1e-6) * g,
        "multiplied by the rms instead of divided by it": u * u.pow(2).mean(-1, keepdim=True).sqrt() * g,
        "not normalised at all": u,
        "only multiplied by the weight, not normalised": u * g,
    }


def _pair(result: object, what: str, q_shape: tuple[int, ...], k_shape: tuple[int, ...]) -> tuple[object, object]:
    """(q, k) from the reader's result: a pair in that order."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        kind = type(result).__name__ + (f" of shape {tuple(result.shape)}" if hasattr(result, "shape") else "")
        raise CandidateError(f"{what} should return the pair (q, k), got {kind}")
    a, b = result
    shapes = tuple(getattr(a, "shape", ())), tuple(getattr(b, "shape", ()))
    if shapes == (k_shape, q_shape):
        raise CandidateError(f"{what} returned (k, q): return the queries first, (q, k)")
    if shapes[1] == q_shape != k_shape:
        raise CandidateError(f"{what} returned keys of shape {q_shape}, the queries' heads: the keys were repeated to H "
                             f"heads (repeat_kv); QK-norm runs on the {k_shape[1]} key heads as they are, shape {k_shape}")
    return a, b


@checker("per-head QK-norm")
def check_qk_norm(fn: Callable) -> str:
    """fn(q, k, q_weight, k_weight) with q (B, H, T, Dh), k (B, H_kv, T, Dh) and weights (Dh,) returns (q, k), each
    head's Dh features u replaced by u / sqrt(mean(u²) + eps) ⊙ weight (Qwen3's QK-norm)."""
    gen = torch.Generator().manual_seed(14)
    for dtype, about in ((torch.float64, "float64"), (torch.float32, "float32")):
        sizes = torch.exp(torch.randn(B, H, T, 1, generator=gen, dtype=torch.float64))       # heads of unequal size
        q = (sizes * torch.randn(B, H, T, DH, generator=gen, dtype=torch.float64)).to(dtype)
        k = (3 * torch.randn(B, H_KV, T, DH, generator=gen, dtype=torch.float64) + 1).to(dtype)  # a nonzero mean
        q_w, k_w = ((0.5 + torch.rand(DH, generator=gen, dtype=torch.float64)).to(dtype) for _ in range(2))
        what = f"qk_norm(q {(B, H, T, DH)}, k {(B, H_KV, T, DH)}, q_weight {(DH,)}, k_weight {(DH,)}) in {about}"
        got_q, got_k = _pair(run(fn, q.clone(), k.clone(), q_w.clone(), k_w.clone(), what=what), what,
                             tuple(q.shape), tuple(k.shape))
        qd, kd, qwd, kwd = (t.double() for t in (q, k, q_w, k_w))
        for name, got, u, g, other in (("q", got_q, qd, qwd, kwd), ("k", got_k, kd, kwd, qwd)):
            out = tensor_of(got, f"{what}: the returned {name}", tuple(u.shape))
            expect_or_differences(out, _rms(u, g), f"{what}: the returned {name}", lambda: _norm_mistakes(u, g, other),
                                  ("batch", "head", "position", "feature"), atol=1e-4 if dtype == torch.float32 else 1e-6)
    return ("each head's query and key divided by its rms over its Dh features and multiplied by its weight, "
            "in float64 and float32; heads of different sizes stay independent")


def _sink(scores: torch.Tensor, sinks: torch.Tensor, *, exp_sink: bool = True) -> torch.Tensor:
    """The weights exp(a) / (exp(s_h) + Σ exp(a)), computed safely (the row max includes the sink)."""
    s = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    if not exp_sink:  # denominator + s_h itself, not exp(s_h)
        m = scores.amax(-1, keepdim=True).clamp_min(0)
        e = torch.exp(scores - m)
        return e / (s * torch.exp(-m) + e.sum(-1, keepdim=True))
    return torch.cat([scores, s], -1).softmax(-1)[..., :-1]


def _sink_mistakes(scores: torch.Tensor, sinks: torch.Tensor) -> dict[str, torch.Tensor]:
    plain = scores.softmax(-1)
    m = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - m)
    s = sinks.view(1, -1, 1, 1)
    return {
        "rows that sum to 1: the sink is missing from the denominator (adding s_h to every score, or dropping "
        "the sink's column and renormalising, gives the plain softmax)": plain,
        "rows that sum to 1 (the sink missing from the denominator), NaN replaced by 0": plain.nan_to_num(0.0),
        "the row maximum taken over the scores only: a row whose keys are all hidden has max -inf, and "
        "exp(-inf - (-inf)) is NaN; include the sink in the maximum (or softmax over the appended column)":
            e / (torch.exp(s - m) + e.sum(-1, keepdim=True)),
        "exp without subtracting the row's maximum: large scores overflow to inf, and inf / inf is NaN":
            torch.exp(scores) / (torch.exp(s) + torch.exp(scores).sum(-1, keepdim=True)),
        "s_h added to the denominator as it is: the sink joins the sum as exp(s_h), like any logit":
            _sink(scores, sinks, exp_sink=False),
        "the sink logit taken as 0 for every head (an extra 1 in the denominator): use each head's exp(s_h)":
            _sink(scores, torch.zeros_like(sinks)),
        "the sink logit negated (exp(-s_h))": _sink(scores, -sinks),
        "the sink logits indexed by the batch (sinks.view(-1, 1, 1, 1)): there is one per head, along dim 1":
            torch.cat([scores, sinks[: scores.shape[0]].view(-1, 1, 1, 1).expand(*scores.shape[:-1], 1)],
                      -1).softmax(-1)[..., :-1],
        "the sink's column returned as the last key, and the last key dropped": torch.cat(
            [scores, s.expand(*scores.shape[:-1], 1)], -1).softmax(-1)[..., 1:],
        "the softmax taken over the queries (dim=-2), not over the keys (dim=-1)":
            torch.cat([scores, s.expand(*scores.shape[:-2], 1, scores.shape[-1])], -2).softmax(-2)[..., :-1, :],
        "the sink's share returned, 1 - the weights' sum, in every column": (1 - _sink(scores, sinks).sum(
            -1, keepdim=True)).expand_as(scores),
    }


@checker("softmax with a learned sink")
def check_sink_softmax(fn: Callable) -> str:
    """fn(scores, sinks) with scores (B, H, T, S) (-inf where hidden) and sinks (H,) returns the weights
    exp(a_ij) / (exp(s_h) + Σ_j' exp(a_ij')) of shape (B, H, T, S): rows sum to less than 1, a fully hidden row
    gives zeros, and large logits do not overflow."""
    gen = torch.Generator().manual_seed(14)
    S = 7
    sinks = torch.tensor([-1.0, 0.5, 2.0, 4.0], dtype=torch.float64)
    scores = 2 * torch.randn(B, H, T, S, generator=gen, dtype=torch.float64)
    hidden = torch.ones(T, S, dtype=torch.bool).tril(S - T).logical_not()               # causal over S keys
    scores = scores.masked_fill(hidden, -torch.inf)
    scores[1, 2, 0] = -torch.inf                                                         # a row with every key hidden
    loud = scores.clone()
    loud[:, 1] += 1000.0                                                                 # head 1: logits near 1000
    for inputs, about in ((scores, "causal scores with one fully hidden row"), (loud, "scores near 1000 in head 1")):
        what = f"sink_softmax(scores {tuple(inputs.shape)}, sinks {tuple(sinks.shape)}) on {about}"
        got = run(fn, inputs.clone(), sinks.clone(), what=what)
        if getattr(got, "shape", None) is not None and tuple(got.shape) == (*inputs.shape[:-1], S + 1):
            raise CandidateError(f"{what} returned {tuple(got.shape)}: the sink's column is still there; drop it "
                                 f"(the sink takes mass but has no value), without renormalising the rest")
        got = tensor_of(got, what, tuple(inputs.shape))
        want = _sink(inputs, sinks)
        expect_or_differences(got, want, what, lambda: _sink_mistakes(inputs, sinks),
                              ("batch", "head", "query", "key"), atol=1e-6)
    return ("exp(a) / (exp(s_h) + Σ exp(a)) per head: rows sum to less than 1, a fully hidden row is all zeros, and "
            "logits near 1000 do not overflow")
