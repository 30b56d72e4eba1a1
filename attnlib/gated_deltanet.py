"""Gated DeltaNet as a layer (Yang, Kautz & Hatamizadeh, ICLR 2025; the linear layers of Qwen3-Next and Qwen3.5).

For x (B, T, D), per token t:

    [q; k; v] = SiLU(causal depthwise conv_K(x W_qkv))     (a short convolution over the last K tokens)
    β_t = sigmoid(x_t W_b),   g_t = -exp(A_log) · softplus(x_t W_a + dt_bias)   (α_t = exp(g_t), one per value head)
    q, k ← q / ‖q‖, k / ‖k‖; each of the H_k query/key heads serves H_v / H_k consecutive value heads
    o = the gated delta rule (attnlib.delta_rule) with scale Dk^-0.5
    y = W_out [RMSNorm(o_h) · w ⊙ SiLU(z_h)]_h,   z = x W_z                (a gated RMSNorm per value head)

Decoding needs only a fixed-size state: the last K - 1 inputs of the convolution (B, C, K - 1) and the
delta-rule state (B, H_v, Dk, Dv), however long the sequence (`GatedDeltaNetState`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlib._checks import fmt_shape, require_count, require_float_tensor
from attnlib.delta_rule import gated_delta_rule_chunked, gated_delta_rule_recurrent, l2_normalize
from attnlib.mla import LatentRMSNorm

__all__ = ["GatedDeltaNet", "GatedDeltaNetState"]


@dataclass
class GatedDeltaNetState:
    """One layer's decoding state: conv (B, C, K - 1), the convolution's last K - 1 inputs (C = 2 H_k Dk + H_v Dv),
    and recurrent (B, H_v, Dk, Dv), the delta-rule state S. Updated in place by `GatedDeltaNet.forward`."""

    conv: torch.Tensor
    recurrent: torch.Tensor
    seq_len: int = 0  # tokens seen so far

    @property
    def nbytes(self) -> int:
        """The bytes held, B · (C (K - 1) + H_v Dk Dv) numbers whatever seq_len is."""
        return sum(t.numel() * t.element_size() for t in (self.conv, self.recurrent))


class GatedDeltaNet(nn.Module):
    """A Gated DeltaNet layer: (B, T, D) -> (B, T, D), causal, with an optional fixed-size decoding state.

    Parameter names follow transformers' Qwen3_5GatedDeltaNet (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a,
    conv1d, A_log, dt_bias, norm, out_proj), so `from_hf` copies its state dict as it is.
    """

    def __init__(self, d_model: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int, *,
                 conv_kernel: int = 4, eps: float = 1e-6, chunk_size: int = 64, layer_idx: int = 0) -> None:
        super().__init__()
        for name, n in (("d_model", d_model), ("num_k_heads", num_k_heads), ("num_v_heads", num_v_heads),
                        ("head_k_dim", head_k_dim), ("head_v_dim", head_v_dim), ("conv_kernel", conv_kernel),
                        ("chunk_size", chunk_size)):
            require_count(n, name, 1, "a size")
        if num_v_heads % num_k_heads:
            raise ValueError(f"num_v_heads={num_v_heads} is not a multiple of num_k_heads={num_k_heads}: each "
                             f"query/key head serves num_v_heads / num_k_heads value heads")
        self.d_model, self.num_k_heads, self.num_v_heads = d_model, num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.chunk_size, self.layer_idx = chunk_size, layer_idx
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim                # C: channels of q, k and v
        self.in_proj_qkv = nn.Linear(d_model, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(d_model, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(d_model, num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(d_model, num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(num_v_heads))              # A = exp(A_log) = 1
        self.norm = LatentRMSNorm(head_v_dim, eps)
        self.out_proj = nn.Linear(self.value_dim, d_model, bias=False)

    def empty_state(self, batch_size: int) -> GatedDeltaNetState:
        """The state before any token (zeros), in this module's dtype and device."""
        w = self.out_proj.weight
        K = self.conv1d.kernel_size[0]
        return GatedDeltaNetState(w.new_zeros(batch_size, self.conv_dim, K - 1),
                                  w.new_zeros(batch_size, self.num_v_heads, self.head_k_dim, self.head_v_dim))

    def _check_state(self, state: GatedDeltaNetState, B: int) -> None:
        if not isinstance(state, GatedDeltaNetState):
            raise TypeError(f"state must be a GatedDeltaNetState (from empty_state), got {type(state).__name__}")
        K = self.conv1d.kernel_size[0]
        expected = {"conv": (B, self.conv_dim, K - 1),
                    "recurrent": (B, self.num_v_heads, self.head_k_dim, self.head_v_dim)}
        for name, want in expected.items():
            got = getattr(state, name).shape
            if got != want:
                raise ValueError(f"state.{name} of shape {fmt_shape(got)} does not fit this layer: expected "
                                 f"{fmt_shape(want)} (a state from another model or batch size?)")

    def _conv(self, x: torch.Tensor, state: GatedDeltaNetState) -> torch.Tensor:
        """x (B, T, D) -> SiLU(causal depthwise conv of x W_qkv) (B, T, C); the inputs before x come from
        state.conv, which then keeps the last K - 1 inputs."""
        mixed = torch.cat((state.conv, self.in_proj_qkv(x).transpose(1, 2)), dim=-1)  # (B, C, K - 1 + T)
        state.conv = mixed[..., mixed.shape[-1] - state.conv.shape[-1]:]              # (B, C, K - 1)
        return F.silu(self.conv1d(mixed)).transpose(1, 2)                            # (B, C, T) -> (B, T, C)

    def forward(self, x: torch.Tensor, state: GatedDeltaNetState | None = None, *,
                valid: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D) for positions state.seq_len.. (0.. without a state); the state is updated
        in place. One token with a state takes the recurrent form, anything else the chunked form.
        valid (B, T), 1/True = real token: padding is zeroed first (as transformers does), so left padding
        leaves the state at zero."""
        require_float_tensor(x, "x")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x of shape {fmt_shape(x.shape)} is not (B, T, D) with D={self.d_model}")
        B, T, _ = x.shape
        if valid is not None:
            if valid.shape != (B, T):
                raise ValueError(f"valid of shape {fmt_shape(valid.shape)} is not (B, T) = {(B, T)}")
            x = x * valid[..., None].to(x.dtype)                                         # (B, T, D)
        stepping = state is not None and T == 1
        if state is None:
            state = self.empty_state(B)
        self._check_state(state, B)
        q, k, v = self._conv(x, state).split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        group = self.num_v_heads // self.num_k_heads
        q, k = (l2_normalize(t.unflatten(-1, (self.num_k_heads, self.head_k_dim)))        # (B, T, H_k, Dk)
                .repeat_interleave(group, dim=2).transpose(1, 2) for t in (q, k))         # (B, H_v, T, Dk)
        v = v.unflatten(-1, (self.num_v_heads, self.head_v_dim)).transpose(1, 2)         # (B, H_v, T, Dv)
        beta = self.in_proj_b(x).sigmoid().transpose(1, 2)                               # (B, H_v, T)
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)  # (B, T, H_v)
        g = g.to(x.dtype).transpose(1, 2)                                                # (B, H_v, T)
        if stepping:
            o, state.recurrent = gated_delta_rule_recurrent(q, k, v, beta, g, initial_state=state.recurrent)
        else:
            o, state.recurrent = gated_delta_rule_chunked(q, k, v, beta, g, chunk_size=self.chunk_size,
                                                          initial_state=state.recurrent)
        state.seq_len += T
        z = self.in_proj_z(x).unflatten(-1, (self.num_v_heads, self.head_v_dim))         # (B, T, H_v, Dv)
        o = (self.norm(o.transpose(1, 2)) * F.silu(z.float())).to(x.dtype)               # (B, T, H_v, Dv)
        return self.out_proj(o.flatten(2))                                               # (B, T, H_v Dv) -> (B, T, D)

    @classmethod
    def from_hf(cls, layer: nn.Module) -> GatedDeltaNet:
        """A copy of a transformers Qwen3_5GatedDeltaNet (same weights, dtype and device)."""
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

        if not isinstance(layer, Qwen3_5GatedDeltaNet):
            raise TypeError(f"layer must be a transformers Qwen3_5GatedDeltaNet, got {type(layer).__name__}")
        if layer.activation not in ("silu", "swish") or layer.conv1d.bias is not None:
            raise ValueError(f"only a bias-free convolution followed by SiLU is modelled, got hidden_act="
                             f"{layer.activation!r} and bias={layer.conv1d.bias is not None}")
        ours = cls(layer.hidden_size, layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim,
                   conv_kernel=layer.conv_kernel_size, eps=layer.norm.variance_epsilon, layer_idx=layer.layer_idx)
        weight = layer.out_proj.weight
        ours.to(device=weight.device, dtype=weight.dtype)
        ours.load_state_dict(layer.state_dict())
        return ours.train(layer.training)
