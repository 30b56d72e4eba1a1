"""Where a token stands: sinusoidal and learned position encodings, and rotary embeddings (RoPE).

Attention alone is permutation-equivariant: it sees a set, not a sequence. The encodings here
put the order back. Sinusoidal and learned encodings are *added* to the token embeddings (T, D);
RoPE instead *rotates* each query and key by an angle proportional to its position, so that the
score q_m · k_n depends on the offset m - n only.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlib._checks import fmt_shape, require_float_tensor, require_tensor

__all__ = ["sinusoidal", "LearnedPositional", "RotaryEmbedding", "apply_rope", "rotate_half"]


def _positive_int(n: object, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive int, got {n!r}")
    return n


def _check_positions(positions: object, limit: int, limit_name: str) -> int:
    """Check that positions is an integer tensor (T,) or (B, T) with values in [0, limit); return max + 1."""
    require_tensor(positions, "positions")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"positions must be an integer tensor, got {positions.dtype}; "
                        f"build it with torch.arange(T)")
    if positions.dim() not in (1, 2):
        raise ValueError(f"positions of shape {fmt_shape(positions.shape)} is not (T,) or (B, T)")
    if not positions.numel():
        return 0
    lo, hi = (int(m) for m in torch.aminmax(positions))
    if lo < 0:
        raise ValueError(f"positions must be >= 0, got {lo}")
    if hi >= limit:
        raise ValueError(f"position {hi} is beyond {limit_name}={limit} "
                         f"(positions must be < {limit})")
    return hi + 1


def sinusoidal(T: int, D: int, base: float = 10000.0) -> torch.Tensor:
    """The fixed encoding of Vaswani et al. (2017), (T, D) float32:

        PE[pos, 2i] = sin(pos · ω_i),  PE[pos, 2i+1] = cos(pos · ω_i),  ω_i = base^(-2i / D).

    Each pair (2i, 2i+1) is a point on a circle turning at frequency ω_i, so PE[pos + k] is a
    rotation of PE[pos] by the angles k · ω_i: a fixed linear map that depends on k only.
    """
    _positive_int(T, "T")
    if _positive_int(D, "D") % 2:
        raise ValueError(f"D must be even (sin/cos pairs), got {D}")
    omega = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)         # (D/2,)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * omega[None, :]   # (T, D/2)
    pe = torch.stack((angles.sin(), angles.cos()), dim=-1)                    # (T, D/2, 2)
    return pe.reshape(T, D).float()                                           # interleave: (T, D)


class LearnedPositional(nn.Module):
    """A learned table of max_len position vectors (as BERT and GPT-2): forward(positions) -> (..., D)."""

    def __init__(self, max_len: int, D: int) -> None:
        super().__init__()
        self.max_len, self.D = _positive_int(max_len, "max_len"), _positive_int(D, "D")
        self.table = nn.Embedding(max_len, D)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """positions (T,) or (B, T), integers in [0, max_len) -> (T, D) or (B, T, D)."""
        _check_positions(positions, self.max_len, "max_len")
        return self.table(positions)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim: a 90° turn of each pair (j, j + Dh/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (..., T, Dh) by the angles whose cos and sin are given: x·cos + rotate_half(x)·sin.

    cos, sin (T, Dh) broadcast over x's leading dims; (B, T, Dh) with a 4-D x (B, H, T, Dh) gets a
    head axis inserted. They are cast to x's dtype (as transformers' Llama does). cos, sin of width
    R < Dh rotate the first R dims of each head only (partial RoPE, as Qwen3.5 and GPT-NeoX).
    """
    if cos.shape != sin.shape or cos.shape[-2] != x.shape[-2] or not cos.shape[-1] <= x.shape[-1] or (
            x.dim() == 4 and cos.dim() == 3 and cos.shape[0] not in (1, x.shape[0])):
        T, Dh = x.shape[-2:]
        batched = f" or (B, T, Dh) = ({x.shape[0]}, {T}, {Dh})" if x.dim() == 4 else ""
        raise ValueError(f"cos of shape {fmt_shape(cos.shape)} and sin of shape {fmt_shape(sin.shape)} do "
                         f"not fit x of shape {fmt_shape(x.shape)}: expected (T, Dh) = ({T}, {Dh}){batched}")
    if x.dim() == 4 and cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, T, Dh) -> (B, 1, T, Dh): same for every head
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if cos.shape[-1] < x.shape[-1]:  # partial RoPE: the first R dims turn, the other Dh - R pass unchanged
        turned, kept = x.split([cos.shape[-1], x.shape[-1] - cos.shape[-1]], dim=-1)  # (..., T, R), (..., T, Dh - R)
        return torch.cat((turned * cos + rotate_half(turned) * sin, kept), dim=-1)
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al., 2021) in the Llama / transformers "rotate_half" layout.

    Dimension j of a head and dimension j + Dh/2 form a pair rotated by the angle pos · θ_j,
    θ_j = base^(-2j / Dh), j < Dh/2. Rotating q at position m and k at position n gives
    q_m · k_n = q · R((n - m) θ) k: the score sees only the offset.

    `inv_freq` replaces θ (Dh/2,) by a scaled set (YaRN, linear interpolation: attnlib.variants.rope), and
    `attention_scaling` multiplies cos and sin (YaRN's attention factor). head_dim may be less than the
    attention heads' width (partial RoPE): then only their first head_dim dims turn.
    """

    def __init__(self, head_dim: int, max_position_embeddings: int = 2048, base: float = 10000.0, *,
                 inv_freq: torch.Tensor | None = None, attention_scaling: float = 1.0) -> None:
        super().__init__()
        if _positive_int(head_dim, "head_dim") % 2:
            raise ValueError(f"head_dim must be even (dimensions are rotated in pairs), got {head_dim}")
        self.head_dim = head_dim
        self.max_position_embeddings = _positive_int(max_position_embeddings, "max_position_embeddings")
        self.base = base
        # θ_j (Dh/2,), computed as transformers does so that the angles match bit for bit. A plain
        # float32 attribute, not a buffer: model.half() or .to(bfloat16) must not round the angles.
        self.inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)) \
            if inv_freq is None else inv_freq.float()
        if self.inv_freq.shape != (head_dim // 2,):
            raise ValueError(f"inv_freq of shape {fmt_shape(self.inv_freq.shape)} is not (head_dim / 2,) = ({head_dim // 2},)")
        self.attention_scaling = attention_scaling
        self._cos = self._sin = torch.empty(0, head_dim)  # the table _cos_sin grows, float32 as well

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (T,) or (B, T) -> cos, sin float32 of shape (T, Dh) or (B, T, Dh)."""
        n = _check_positions(positions, self.max_position_embeddings, "max_position_embeddings")
        return self._cos_sin(positions, n)

    def _cos_sin(self, positions: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos_sin without the checks (n = max(positions) + 1): rows of a table of cos and sin of pos · θ_j.

        The table covers positions 0..n-1 and doubles when a larger position comes, so a decode step
        reads one row instead of recomputing angles in every layer. Its entries are computed as
        transformers computes them (float32 pos · θ_j, then cos and sin), so they are bit-identical.
        """
        if n > self._cos.shape[0] or self._cos.device != positions.device:
            size = min(max(n, 2 * self._cos.shape[0], 64), self.max_position_embeddings)
            pos = torch.arange(size, device=positions.device, dtype=torch.float)
            freqs = pos[:, None] * self.inv_freq.to(positions.device)  # (size, Dh/2)
            angles = torch.cat((freqs, freqs), dim=-1)                 # (size, Dh)
            self._cos, self._sin = angles.cos(), angles.sin()
            if self.attention_scaling != 1.0:  # YaRN's attention factor, applied to cos and sin as transformers does
                self._cos, self._sin = self._cos * self.attention_scaling, self._sin * self.attention_scaling
        return self._cos[positions], self._sin[positions]           # (..., T, Dh) each

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, H, T, Dh) rotated by positions (T,) or (B, T) (the same for every head)."""
        require_float_tensor(x, "x")
        if x.dim() != 4 or x.shape[-1] < self.head_dim:
            raise ValueError(f"x of shape {fmt_shape(x.shape)} is not (B, H, T, Dh) with Dh={self.head_dim} "
                             f"(or more: partial RoPE turns the first {self.head_dim})")
        n = _check_positions(positions, self.max_position_embeddings, "max_position_embeddings")
        B, _, T, _ = x.shape
        if positions.shape[-1] != T or (positions.dim() == 2 and positions.shape[0] != B):
            raise ValueError(f"positions of shape {fmt_shape(positions.shape)} does not fit x of shape "
                             f"{fmt_shape(x.shape)}: expected (T,) = ({T},) or (B, T) = ({B}, {T})")
        cos, sin = self._cos_sin(positions, n)
        return apply_rope(x, cos, sin)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_position_embeddings={self.max_position_embeddings}, base={self.base:g}"
