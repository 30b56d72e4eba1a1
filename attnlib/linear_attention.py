"""Linear attention (Katharopoulos et al., 2020, "Transformers are RNNs"): softmax(q·k) replaced by a
feature map φ with sim(q, k) = φ(q)·φ(k), so that the sum over keys can be regrouped.

    out_t = Σ_{j≤t} (φ(q_t)·φ(k_j)) v_j / Σ_{j≤t} φ(q_t)·φ(k_j)
          = φ(q_t)ᵀ S_t / (φ(q_t)ᵀ z_t),      S_t = Σ_{j≤t} φ(k_j) v_jᵀ  (Dk × Dv),  z_t = Σ_{j≤t} φ(k_j)  (Dk)

The parallel form computes the (T, T) matrix φ(Q) φ(K)ᵀ (masked causally) like softmax attention does;
the recurrent form carries (S_t, z_t) from token to token: S_t = S_{t-1} + φ(k_t) v_tᵀ, z_t = z_{t-1} + φ(k_t),
a state of Dk · (Dv + 1) numbers per head whatever t is, and a constant cost per token. The state's
orientation is (Dk, Dv), keys along the rows, as in transformers' Gated DeltaNet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnlib import masks as _masks
from attnlib._checks import fmt_shape, require_float_tensor

__all__ = ["elu_feature_map", "linear_attention", "linear_attention_step", "linear_attention_recurrent",
           "LinearAttentionState"]

FeatureMap = Callable[[torch.Tensor], torch.Tensor]


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1 (Katharopoulos et al.): positive, so every similarity and the normaliser are > 0."""
    return F.elu(x) + 1


@dataclass
class LinearAttentionState:
    """What the recurrent form carries: S (B, H, Dk, Dv) = Σ φ(k_j) v_jᵀ and z (B, H, Dk) = Σ φ(k_j)."""

    S: torch.Tensor
    z: torch.Tensor

    @classmethod
    def zeros(cls, B: int, H: int, Dk: int, Dv: int, *, dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> LinearAttentionState:
        """The state before any token: S = 0, z = 0."""
        return cls(torch.zeros(B, H, Dk, Dv, dtype=dtype, device=device),
                   torch.zeros(B, H, Dk, dtype=dtype, device=device))

    @property
    def nbytes(self) -> int:
        """The bytes held, B · H · Dk · (Dv + 1) numbers however many tokens have been seen."""
        return self.S.numel() * self.S.element_size() + self.z.numel() * self.z.element_size()


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_dim: bool) -> None:
    """q, k (..., [T,] Dk) and v (..., [T,] Dv) must agree in every leading dim and in Dk."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_float_tensor(t, name)
    expected = "(B, H, T, Dk)" if seq_dim else "(B, H, Dk)"
    if q.shape != k.shape or q.dim() != (4 if seq_dim else 3) or v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"q of shape {fmt_shape(q.shape)}, k of shape {fmt_shape(k.shape)} and v of shape "
                         f"{fmt_shape(v.shape)} do not fit: expected q and k {expected}, v the same but Dv wide")


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, feature_map: FeatureMap = elu_feature_map,
                     causal: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """The parallel form: q, k (B, H, T, Dk), v (B, H, T, Dv) -> (B, H, T, Dv).

    A = φ(Q) φ(K)ᵀ (T, T), zeroed above the diagonal when causal; out = A V / (A 1 + eps). Without the
    causal mask it is computed in the linear order, φ(Q) (φ(K)ᵀ V) / (φ(Q) φ(K)ᵀ 1 + eps): O(T Dk Dv).
    """
    _check_qkv(q, k, v, seq_dim=True)
    fq, fk = feature_map(q), feature_map(k)                         # (B, H, T, Dk)
    if not causal:
        numerator = fq @ (fk.transpose(-2, -1) @ v)                 # (B, H, T, Dk) @ (B, H, Dk, Dv)
        return numerator / (fq @ fk.sum(-2, keepdim=True).transpose(-2, -1) + eps)  # ÷ (B, H, T, 1)
    T = q.shape[-2]
    A = (fq @ fk.transpose(-2, -1)) * _masks.causal_mask(T, device=q.device)  # (B, H, T, T), 0 where j > i
    return (A @ v) / (A.sum(-1, keepdim=True) + eps)


def linear_attention_step(state: LinearAttentionState | None, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor,
                          *, feature_map: FeatureMap = elu_feature_map,
                          eps: float = 1e-6) -> tuple[torch.Tensor, LinearAttentionState]:
    """One token of the recurrent form: q_t, k_t (B, H, Dk), v_t (B, H, Dv) -> (out_t (B, H, Dv), new state).

    S_t = S_{t-1} + φ(k_t) v_tᵀ, z_t = z_{t-1} + φ(k_t), out_t = φ(q_t)ᵀ S_t / (φ(q_t)ᵀ z_t + eps).
    state None is the empty state. The state passed in is not modified.
    """
    _check_qkv(q_t, k_t, v_t, seq_dim=False)
    B, H, Dk = k_t.shape
    if state is None:
        state = LinearAttentionState.zeros(B, H, Dk, v_t.shape[-1], dtype=v_t.dtype, device=v_t.device)
    if state.S.shape != (B, H, Dk, v_t.shape[-1]) or state.z.shape != (B, H, Dk):
        raise ValueError(f"state with S of shape {fmt_shape(state.S.shape)} and z of shape {fmt_shape(state.z.shape)} "
                         f"does not fit these heads: expected S (B, H, Dk, Dv) = {(B, H, Dk, v_t.shape[-1])} "
                         f"and z (B, H, Dk) = {(B, H, Dk)}")
    fq, fk = feature_map(q_t), feature_map(k_t)                     # (B, H, Dk)
    S = state.S + fk[..., :, None] * v_t[..., None, :]             # (B, H, Dk, Dv): outer product φ(k_t) v_tᵀ
    z = state.z + fk                                                # (B, H, Dk)
    out = (fq[..., None, :] @ S).squeeze(-2)                        # (B, H, 1, Dk) @ (B, H, Dk, Dv) -> (B, H, Dv)
    return out / ((fq * z).sum(-1, keepdim=True) + eps), LinearAttentionState(S, z)


def linear_attention_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                               feature_map: FeatureMap = elu_feature_map, eps: float = 1e-6,
                               state: LinearAttentionState | None = None) -> tuple[torch.Tensor, LinearAttentionState]:
    """The recurrent form over a sequence, one `linear_attention_step` per token: q, k (B, H, T, Dk),
    v (B, H, T, Dv) -> (out (B, H, T, Dv), the state after the last token). Equals the causal parallel form."""
    _check_qkv(q, k, v, seq_dim=True)
    outs = []
    for t in range(q.shape[-2]):
        out, state = linear_attention_step(state, q[..., t, :], k[..., t, :], v[..., t, :],
                                           feature_map=feature_map, eps=eps)
        outs.append(out)
    return torch.stack(outs, dim=-2), state                         # (B, H, T, Dv)
