"""The delta rule (Schlag et al., 2021) and the gated delta rule (Yang, Kautz & Hatamizadeh, ICLR 2025,
"Gated Delta Networks"): linear attention whose state is corrected, not only added to.

The state S is (Dk, Dv) per head, keys along the rows (transformers' orientation; the papers write its
transpose, Sᵀ = (Dv, Dk)). S reads a value for a key as Sᵀ k. At token t, with gate α_t = exp(g_t) in (0, 1]
and writing strength β_t in (0, 1):

    S_t = α_t S_{t-1} + k_t β_t (v_t - α_t S_{t-1}ᵀ k_t)ᵀ        = α_t (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ
    o_t = S_tᵀ q_t · scale

what the decayed state predicts for k_t is replaced by v_t, in proportion β_t (with ‖k_t‖ = 1 and β_t = 1
it is overwritten). g = 0 (α = 1) is the plain delta rule. Recurrent form: one rank-1 update per token.
Chunked form: within a chunk of C tokens the updates are collected in the WY representation,

    S_i = Γ_i S_0 + Σ_{j≤i} (Γ_i / Γ_j) k_j u_jᵀ,     Γ_i = α_1 ⋯ α_i  (from the chunk's start)
    (I + A) U = β ⊙ V - (β Γ ⊙ K) S_0,   A_ij = β_i (Γ_i / Γ_j) k_i·k_j for j < i  (strictly lower),

a unit-lower-triangular solve (the UT transform) that turns C sequential updates into matrix products.
"""

from __future__ import annotations

import torch

from attnlib._checks import fmt_shape, require_count, require_float_tensor

__all__ = ["l2_normalize", "gated_delta_rule_recurrent", "gated_delta_rule_chunked"]


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(‖x‖² + eps) over the last dim (the form of the FLA kernels and transformers)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _check(q, k, v, beta, g, state) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate q, k (B, H, T, Dk), v (B, H, T, Dv), beta, g (B, H, T), state (B, H, Dk, Dv); fill g and state."""
    for name, t in (("q", q), ("k", k), ("v", v), ("beta", beta)):
        require_float_tensor(t, name)
    B, H, T, Dk = k.shape if k.dim() == 4 else (None,) * 4
    if q.shape != k.shape or k.dim() != 4 or v.shape[:-1] != (B, H, T):
        raise ValueError(f"q of shape {fmt_shape(q.shape)}, k of shape {fmt_shape(k.shape)} and v of shape "
                         f"{fmt_shape(v.shape)} do not fit: expected q and k (B, H, T, Dk), v (B, H, T, Dv)")
    g = torch.zeros_like(beta) if g is None else require_float_tensor(g, "g")
    for name, t in (("beta", beta), ("g", g)):
        if t.shape != (B, H, T):
            raise ValueError(f"{name} of shape {fmt_shape(t.shape)} is not (B, H, T) = {(B, H, T)}")
    expected = (B, H, Dk, v.shape[-1])
    if state is None:
        state = v.new_zeros(expected)
    elif state.shape != expected:
        raise ValueError(f"initial_state of shape {fmt_shape(state.shape)} is not (B, H, Dk, Dv) = {expected}")
    return g, state


def gated_delta_rule_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                               g: torch.Tensor | None = None, *, scale: float | None = None,
                               initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent form, one token at a time: q, k (B, H, T, Dk), v (B, H, T, Dv), beta and g (log α, ≤ 0)
    (B, H, T); g None is the ungated delta rule. scale defaults to Dk^-0.5. Returns (o (B, H, T, Dv),
    S_T (B, H, Dk, Dv)). q and k are used as given (Gated DeltaNet L2-normalises them first)."""
    g, S = _check(q, k, v, beta, g, initial_state)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    outs = []
    for t in range(q.shape[2]):
        k_t, v_t = k[:, :, t], v[:, :, t]                             # (B, H, Dk), (B, H, Dv)
        S = S * g[:, :, t, None, None].exp()                          # α_t S_{t-1}
        predicted = (k_t[..., None, :] @ S).squeeze(-2)               # (B, H, Dv) = Sᵀ k_t
        delta = beta[:, :, t, None] * (v_t - predicted)               # (B, H, Dv)
        S = S + k_t[..., :, None] * delta[..., None, :]               # + k_t δᵀ: (B, H, Dk, Dv)
        outs.append((q[:, :, t, None, :] @ S).squeeze(-2) * scale)    # (B, H, Dv) = Sᵀ q_t
    return torch.stack(outs, dim=2), S                                # (B, H, T, Dv)


def gated_delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                             g: torch.Tensor | None = None, *, scale: float | None = None, chunk_size: int = 64,
                             initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked form (WY representation, see the module docstring): the same arguments and results as
    `gated_delta_rule_recurrent`, C = chunk_size tokens per step of the scan over chunks. The sequence is
    padded with tokens of k = v = 0, β = 0, g = 0, which leave the state unchanged."""
    g, S = _check(q, k, v, beta, g, initial_state)
    require_count(chunk_size, "chunk_size", 1, "tokens per chunk")
    B, H, T, Dk = k.shape
    C, scale = chunk_size, Dk ** -0.5 if scale is None else scale
    pad = -T % C
    q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (torch.nn.functional.pad(x, (0, pad)) for x in (beta, g))
    q, k, v = (x.unflatten(2, (-1, C)) for x in (q, k, v))           # (B, H, N, C, ·): N chunks of C tokens
    beta, g = beta.unflatten(2, (-1, C)), g.unflatten(2, (-1, C))    # (B, H, N, C)
    log_gamma = g.cumsum(-1)                                         # (B, H, N, C): log Γ_i within each chunk
    later = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)  # j > i
    ratio = (log_gamma[..., :, None] - log_gamma[..., None, :]).masked_fill(later, -torch.inf)
    ratio = ratio.exp()                                              # (B, H, N, C, C): Γ_i/Γ_j, 0 for j > i
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    A = (beta[..., None] * (k @ k.transpose(-1, -2)) * ratio).tril(-1)   # (B, H, N, C, C) strictly lower
    rhs = torch.cat((beta[..., None] * v, (beta * log_gamma.exp())[..., None] * k), dim=-1)  # [βV | βΓK]
    W = torch.linalg.solve_triangular(A + eye, rhs, upper=False, unitriangular=True)  # (B, H, N, C, Dv + Dk)
    u_v, u_k = W.split([v.shape[-1], Dk], dim=-1)                     # U = u_v - u_k S_0
    scores = (q @ k.transpose(-1, -2)) * ratio * scale                # (B, H, N, C, C): (Γ_i/Γ_j) q_i·k_j, j ≤ i
    q_decayed = q * log_gamma.exp()[..., None] * scale                # Γ_i q_i: reads S_0
    k_to_end = k * (log_gamma[..., -1:] - log_gamma).exp()[..., None]  # (Γ_C/Γ_j) k_j: writes S_C
    outs = []
    for n in range(q.shape[2]):
        U = u_v[:, :, n] - u_k[:, :, n] @ S                           # (B, H, C, Dv)
        outs.append(q_decayed[:, :, n] @ S + scores[:, :, n] @ U)     # (B, H, C, Dv)
        S = S * log_gamma[:, :, n, -1, None, None].exp() + k_to_end[:, :, n].transpose(-1, -2) @ U  # (B, H, Dk, Dv)
    return torch.cat(outs, dim=2)[:, :, :T], S                        # (B, H, N·C, Dv) -> (B, H, T, Dv)
