"""Checkers for chapter 15 (linear and sparse attention): the recurrent step of linear attention and the
gated delta-rule update of the state (the top-k selection checker lives in ch15_topk)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.delta_rule import l2_normalize
from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, matching, run
from attnlib.exercises.ch15_topk import check_topk_selection
from attnlib.linear_attention import elu_feature_map

__all__ = ["check_linear_attention_step", "check_delta_rule_update", "check_topk_selection"]

B, H, DK, DV = 2, 3, 5, 4  # Dk != Dv: a transposed state cannot pass for the right one


def _shaped(got: torch.Tensor, what: str, shape: tuple[int, ...], transposed: torch.Tensor) -> torch.Tensor:
    """got of `shape`; the (Dv, Dk) transpose of the right state is named, any other shape is a CandidateError."""
    if tuple(got.shape) == tuple(transposed.shape) and matching(got, {"": transposed}):
        raise CandidateError(f"{what} is the transpose of the state: S is (Dk, Dv), keys along the rows, so a "
                             f"write is the outer product φ(k) vᵀ = k[..., :, None] * v[..., None, :] and a read "
                             f"is Sᵀ q")
    return as_tensor(got, what, shape=shape)


def _unpack_linear(result: object, what: str) -> tuple[object, object, object]:
    """(out, S, z) from (out, S, z), (out, (S, z)) or (out, a LinearAttentionState / anything with .S and .z)."""
    if isinstance(result, (tuple, list)) and len(result) == 3:
        dims = [getattr(x, "ndim", 0) for x in result]
        if dims[1] != 4 and 4 in dims:
            raise CandidateError(f"{what} returned the state S_new as item {dims.index(4)}, not 1: return (out, "
                                 f"S_new, z_new), in that order")
        return tuple(result)
    if isinstance(result, (tuple, list)) and len(result) == 2:
        out, state = result
        if isinstance(state, (tuple, list)) and len(state) == 2:
            return out, state[0], state[1]
        if hasattr(state, "S") and hasattr(state, "z"):
            return out, state.S, state.z
    raise CandidateError(f"{what} should return (out, S, z), or (out, (S, z)), got {type(result).__name__}"
                         + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""))


def _step(S, z, q, k, v, phi=elu_feature_map, *, read_old=False, norm_old=False, normalise=True):
    """One step of linear attention, and its usual variants: out (B, H, Dv), S (B, H, Dk, Dv), z (B, H, Dk)."""
    fq, fk = phi(q), phi(k)                                              # (B, H, Dk)
    S_new, z_new = S + fk[..., :, None] * v[..., None, :], z + fk        # (B, H, Dk, Dv), (B, H, Dk)
    read = (fq[..., None, :] @ (S if read_old else S_new)).squeeze(-2)   # (B, H, Dv) = Sᵀ φ(q)
    if not normalise:
        return read, S_new, z_new
    return read / (fq * (z if norm_old else z_new)).sum(-1, keepdim=True), S_new, z_new


@checker("linear attention, one step")
def check_linear_attention_step(fn: Callable) -> str:
    """fn(S, z, q, k, v) with S (B, H, Dk, Dv), z (B, H, Dk), q, k (B, H, Dk), v (B, H, Dv) returns
    (out (B, H, Dv), S_new, z_new): φ = elu + 1, S_new = S + φ(k) vᵀ, z_new = z + φ(k),
    out = φ(q)ᵀ S_new / (φ(q) · z_new)."""
    S, z = torch.zeros(B, H, DK, DV, dtype=torch.float64), torch.zeros(B, H, DK, dtype=torch.float64)
    for _ in range(3):  # a state that has seen 3 tokens: with z = 0 a wrong normaliser would divide by 0
        q, k, v = (torch.randn(B, H, d, dtype=torch.float64) for d in (DK, DK, DV))
        _, S, z = _step(S, z, q, k, v)
    for t in range(4):
        q, k, v = (torch.randn(B, H, d, dtype=torch.float64) for d in (DK, DK, DV))
        what = f"step {t} of linear attention (S {(B, H, DK, DV)}, z {(B, H, DK)}, q, k {(B, H, DK)}, v {(B, H, DV)})"
        out, S_got, z_got = _unpack_linear(run(fn, S.clone(), z.clone(), q.clone(), k.clone(), v.clone(), what=what),
                                           what)
        want_out, want_S, want_z = _step(S, z, q, k, v)
        S_got = _shaped(as_tensor(S_got, f"{what}: S_new"), f"{what}: S_new", want_S.shape, want_S.transpose(-1, -2))
        expect_close(S_got, want_S, f"{what}: S_new", atol=1e-4, mistakes={
            "the raw key written (k vᵀ): apply the feature map first, φ(k) = elu(k) + 1":
                _step(S, z, q, k, v, lambda x: x)[1],
            "φ(k) = exp(k), softmax's kernel: linear attention's φ here is elu(x) + 1":
                _step(S, z, q, k, v, torch.exp)[1],
            "the state not carried over: S_new = φ(k) vᵀ forgets every earlier token": _step(S * 0, z, q, k, v)[1],
            "φ applied to v as well: values are stored as they are": S + elu_feature_map(k)[..., :, None]
            * elu_feature_map(v)[..., None, :],
            "φ = elu(x) without the + 1: elu is negative below 0, and φ must be positive (elu(x) + 1)":
                _step(S, z, q, k, v, torch.nn.functional.elu)[1],
            "φ = relu(x) + 1: the feature map here is elu(x) + 1 (exp(x) below 0, not 1)":
                _step(S, z, q, k, v, lambda x: torch.relu(x) + 1)[1],
            "φ = relu(x): the feature map here is elu(x) + 1, positive everywhere": _step(S, z, q, k, v, torch.relu)[1],
        })
        z_got = as_tensor(z_got, f"{what}: z_new", shape=want_z.shape)
        expect_close(z_got, want_z, f"{what}: z_new", atol=1e-4, mistakes={
            "z_new = z + k: the normaliser sums φ(k), the same features the state stores": z + k,
            "z not carried over: z_new = φ(k) forgets every earlier key": elu_feature_map(k),
        })
        out = as_tensor(out, f"{what}: out", shape=want_out.shape)
        expect_close(out, want_out, f"{what}: out", atol=1e-4, mistakes={
            "no normaliser: divide φ(q)ᵀ S_new by φ(q) · z_new": _step(S, z, q, k, v, normalise=False)[0],
            "the state read before the token's own write (φ(q)ᵀ S, not φ(q)ᵀ S_new): a query sees its own key":
                _step(S, z, q, k, v, read_old=True)[0],
            "the normaliser from z before the write: use z_new": _step(S, z, q, k, v, norm_old=True)[0],
            "the output read from the state before this token's write, S and z both (φ(q)ᵀ S / φ(q) · z): update "
            "first, then read S_new and z_new": _step(S, z, q, k, v, read_old=True, norm_old=True)[0],
            "the key read instead of the query: out = φ(k)ᵀ S_new / (φ(k) · z_new)": _step(S, z, k, k, v)[0],
            "the key read instead of the query (φ(k)ᵀ S_new, over φ(q) · z_new)":
                _step(S, z, k, k, v, normalise=False)[0] / (elu_feature_map(q) * want_z).sum(-1, keepdim=True),
            "the raw query and key (no feature map)": _step(S, z, q, k, v, lambda x: x)[0],
            "φ = exp (softmax's kernel) instead of elu + 1": _step(S, z, q, k, v, torch.exp)[0],
            "the normaliser φ(k) · z_new: the query reads, so divide by φ(q) · z_new": _step(
                S, z, q, k, v, normalise=False)[0] / (elu_feature_map(k) * want_z).sum(-1, keepdim=True),
            "the normaliser Σ z_new, without φ(q): divide by the dot product φ(q) · z_new": _step(
                S, z, q, k, v, normalise=False)[0] / want_z.sum(-1, keepdim=True),
        })
        S, z = want_S, want_z
    return ("φ(k) vᵀ added to S, φ(k) to z, and φ(q)ᵀ S_new / φ(q)·z_new read out, for 4 steps: a (Dk × Dv) "
            "state per head whatever the length")


def _delta(S, k, v, beta, alpha, *, norm=True, decay="before", predict_from="decayed", beta_on=True, subtract=True):
    """The gated delta-rule update S (B, H, Dk, Dv) -> S_new, and its usual variants."""
    k = l2_normalize(k) if norm else k                                       # (B, H, Dk)
    a, b = alpha[..., None, None], beta[..., None] if beta_on else 1.0       # (B, H, 1, 1), (B, H, 1)
    decayed = a * S if decay == "before" else S                              # (B, H, Dk, Dv)
    source = decayed if predict_from == "decayed" else S
    predicted = (k[..., None, :] @ source).squeeze(-2)                       # (B, H, Dv) = Sᵀ k
    delta = b * (v - predicted) if subtract else b * v                       # (B, H, Dv)
    new = decayed + k[..., :, None] * delta[..., None, :]                    # + k δᵀ
    return a * new if decay == "after" else new


@checker("delta-rule update")
def check_delta_rule_update(fn: Callable) -> str:
    """fn(S, k, v, beta, alpha) with S (B, H, Dk, Dv), k (B, H, Dk) raw (to be L2-normalised), v (B, H, Dv),
    beta and alpha (B, H) returns S_new = α S + k̂ β (v - α Sᵀ k̂)ᵀ, k̂ = k / ‖k‖."""
    gen = torch.Generator().manual_seed(15)
    S = torch.zeros(B, H, DK, DV, dtype=torch.float64)
    for t in range(4):
        k = 3 * torch.randn(B, H, DK, dtype=torch.float64, generator=gen)  # far from unit length
        v = torch.randn(B, H, DV, dtype=torch.float64, generator=gen)
        beta = 0.2 + 0.6 * torch.rand(B, H, dtype=torch.float64, generator=gen)
        alpha = 0.5 + 0.4 * torch.rand(B, H, dtype=torch.float64, generator=gen)
        what = f"delta_update at step {t} (S {(B, H, DK, DV)}, k {(B, H, DK)}, v {(B, H, DV)}, beta and alpha {(B, H)})"
        got = run(fn, S.clone(), k.clone(), v.clone(), beta.clone(), alpha.clone(), what=what)
        want = _delta(S, k, v, beta, alpha)
        got = _shaped(as_tensor(got, what), what, want.shape, want.transpose(-1, -2))
        mistakes = {
            "k not normalised: Gated DeltaNet writes along k / ‖k‖ (with ‖k‖ ≠ 1, I - β k kᵀ no longer "
            "only "
            "replaces the value stored along k)": _delta(S, k, v, beta, alpha, norm=False),
            "the state not decayed: α never multiplies S": _delta(S, k, v, beta, torch.ones_like(alpha)),
            "the gate applied after the write (α (S + k̂ δᵀ)): the old state decays, then the new value is "
            "written": _delta(S, k, v, beta, alpha, decay="after"),
            "the prediction read from the undecayed state (v - Sᵀ k̂ instead of v - α Sᵀ k̂)":
                _delta(S, k, v, beta, alpha, predict_from="old"),
            "β missing: the correction is written at full strength": _delta(S, k, v, beta, alpha, beta_on=False),
            "the additive rule (S + k̂ β vᵀ): the delta rule writes the difference v - Sᵀ k̂":
                _delta(S, k, v, beta, alpha, subtract=False),
            "the gate used as 1 - α": _delta(S, k, v, beta, 1 - alpha),
            "α taken as a log-gate (exp(alpha)): alpha is the gate itself, in (0, 1]":
                _delta(S, k, v, beta, alpha.exp()),
            "the prediction added, not subtracted (v + α Sᵀ k̂): the write is the error v - α Sᵀ k̂":
                _delta(-S, k, v, beta, alpha) + 2 * alpha[..., None, None] * S,
            "v normalised too: only the key is L2-normalised": _delta(S, k, l2_normalize(v), beta, alpha),
            "k divided by ‖k‖² instead of ‖k‖: k̂ = k / ‖k‖ has unit length":
                _delta(S, k / (k * k).sum(-1, keepdim=True), v, beta, alpha, norm=False),
            "k normalised along the heads axis (dim=1), not along its features (dim=-1)":
                _delta(S, k / k.norm(dim=1, keepdim=True), v, beta, alpha, norm=False),
            "k normalised along the batch axis (dim=0), not along its features (dim=-1)":
                _delta(S, k / k.norm(dim=0, keepdim=True), v, beta, alpha, norm=False),
            "the correction subtracted (α S - k̂ δᵀ): the write adds k̂ δᵀ, δ = β (v - α Sᵀ k̂)":
                2 * alpha[..., None, None] * S - want,
            "β on v only (k̂ (β v - α Sᵀ k̂)ᵀ): β scales the whole error, β (v - α Sᵀ k̂)":
                want - l2_normalize(k)[..., :, None] * ((1 - beta[..., None]) * (alpha[..., None] * (
                    l2_normalize(k)[..., None, :] @ S).squeeze(-2)))[..., None, :],
        }
        expect_close(got, want, what, atol=1e-6, mistakes=mistakes)
        S = want
    return "S_new = α S + k̂ β (v - α Sᵀ k̂)ᵀ with k̂ = k / ‖k‖, for 4 steps from the empty state"

