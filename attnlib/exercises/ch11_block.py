"""Chapter 11's decoder-block checker (re-exported by ch11): the reader's block against attnlib's DecoderLayer,
and the known mistakes named: every order of its three sublayers with every placement of its three norms,
the residual and norm mistakes, and a float 0/1 mask given to the (already causal) self-attention."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from attnlib.exercises._core import checker, run
from attnlib.exercises._differ import expect_or_differences as _expect
from attnlib.exercises._guard import one_thread
from attnlib.exercises.ch07 import _tensor_or_named
from attnlib.transformer import DecoderLayer

__all__ = ["check_decoder_block"]


def _post(x: torch.Tensor, norm: Callable, f: Callable) -> torch.Tensor:
    return norm(x + f(x))


_SUBLAYERS = ("self-attention", "cross-attention", "the FFN")
_STATES = ("x, the block's input", "h1, the output of the self-attention step", "h2, the output of the cross-attention step")


def _arrangement(order: tuple[int, ...], norms: tuple[int, ...]) -> str:
    """A post-LN block with its sublayers in `order` and norm `norms[i]` after the i-th step, in words."""
    words = []
    if order == (1, 0, 2):
        words.append("cross-attention before self-attention: the decoder first attends to its own tokens (causal "
                     "self-attention), then to the memory, then the FFN")
    elif order != (0, 1, 2):
        words.append(f"the sublayers in the order {', '.join(_SUBLAYERS[i] for i in order)}: a decoder block runs "
                     f"self-attention, cross-attention over the memory, then the FFN")
    if len(set(norms)) == 1:
        words.append(f"norm{norms[0] + 1} after every sublayer: norm1, norm2 and norm3 each follow one sublayer "
                     f"(their learned scales differ)")
    elif norms != tuple(order):
        words.append("the norms in the wrong places (" + ", ".join(
            f"norm{n + 1} after {_SUBLAYERS[i]}" for i, n in zip(order, norms)) + "): norm1 follows self-attention, "
            "norm2 cross-attention, norm3 the FFN")
    return "; and ".join(words)


def _block_mistakes(x, memory, sa, ca, ffn, n1, n2, n3) -> dict[str, torch.Tensor]:
    """Decoder blocks with classic mistakes (the right one is post-LN: self, cross, FFN): every order of the
    sublayers with every placement of the norms, and the residual and norm mistakes."""
    cross = lambda z: ca(z, memory)  # noqa: E731
    pre = lambda z, norm, f: z + f(norm(z))  # noqa: E731
    after = lambda z, norm, f: z + norm(f(z))  # noqa: E731
    sublayers, norms, found = (sa, cross, ffn), (n1, n2, n3), {}
    for order in itertools.permutations(range(3)):
        for placed in itertools.product(range(3), repeat=3):
            if order == (0, 1, 2) and placed == (0, 1, 2):
                continue
            h = x
            for i, n in zip(order, placed):
                h = _post(h, norms[n], sublayers[i])
            found[_arrangement(order, tuple(placed))] = h
    for sources in ((0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1)):   # the residual of each step from another state
        states = [x]
        for f, norm, src in zip((sa, cross, ffn), (n1, n2, n3), sources):
            states.append(norm(states[src] + f(states[-1])))
        wrong = [f"the residual around {_SUBLAYERS[i]} adds {_STATES[src]}" for i, src in enumerate(sources) if src != i]
        found["; and ".join(wrong) + ": each residual adds its own sublayer's input, h = norm(h + f(h))"] = states[-1]
    h = _post(x, n1, sa)
    return found | {
        "pre-LN, x + f(LN(x)), with norm3 applied once more at the end (a pre-LN stack's final norm): this block "
        "is post-LN as in the paper and nn.Transformer, LN(x + f(x))": n3(pre(pre(pre(x, n1, sa), n2, cross), n3, ffn)),
        "pre-LN, x + f(LN(x)): this block is post-LN as in the paper and nn.Transformer, LN(x + f(x))":
            pre(pre(pre(x, n1, sa), n2, cross), n3, ffn),
        "the norm inside the residual, x + LN(f(x)): add first, then normalize, LN(x + f(x))":
            after(after(after(x, n1, sa), n2, cross), n3, ffn),
        "no residual around self-attention": _post(_post(n1(sa(x)), n2, cross), n3, ffn),
        "no residual around cross-attention": _post(n2(cross(h)), n3, ffn),
        "no residual around the FFN": n3(ffn(_post(h, n2, cross))),
        "no residuals at all, LN(f(x)) for each sublayer: each is LN(x + f(x)), the input added back":
            n3(ffn(n2(cross(n1(sa(x)))))),
        "the block's input x added back in every residual (x + cross_attn(h, ...), x + ffn(h)): each residual "
        "adds its own sublayer's input, h = norm(h + f(h))": n3(x + ffn(n2(x + cross(n1(x + sa(x)))))),
        "norm3 applied twice (norm3(norm3(h + ffn(h)))): one norm per sublayer":
            n3(_post(_post(h, n2, cross), n3, ffn)),
        "cross-attention over the decoder's own tokens, cross_attn(h, h): its keys and values come from "
        "the memory, cross_attn(h, memory)": _post(_post(h, n2, lambda z: ca(z, z)), n3, ffn),
        "cross-attention's queries taken from the block's input x, cross_attn(x, memory): they come from the "
        "output of the self-attention step, h = norm1(x + self_attn(x))":
            _post(_post(h, n2, lambda z: ca(x, memory)), n3, ffn),
    }


def _bool_mask(mask: object) -> torch.Tensor | None:
    """A mask the reader passed to self_attn, refused unless bool: SDPA adds a float mask to the scores."""
    if mask is None or (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool):
        return mask
    if isinstance(mask, torch.Tensor) and mask.is_floating_point() and bool(((mask == 0) | (mask <= -1e4)).all()):
        return mask == 0                                     # an additive mask, 0 / -inf: the same rule
    if isinstance(mask, torch.Tensor) and set(mask.unique().tolist()) <= {0, 1}:
        raise ValueError(f"self_attn was given a {mask.dtype} mask of 0s and 1s (torch.tril(torch.ones(T, T))?): a "
                         f"float mask is *added* to the scores, so it hides nothing. self_attn(z) is causal already; "
                         f"a mask, if you pass one, is bool, True = may attend")
    raise ValueError(f"self_attn was given a {type(mask).__name__} mask: self_attn(z) is causal already; a mask, if "
                     f"you pass one, is a bool tensor, True = may attend")


@checker("decoder block")
def check_decoder_block(fn: Callable[..., torch.Tensor]) -> str:
    """fn(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3) -> (B, T, D): one post-LN decoder block.

    x (B, T, D), memory (B, S, D); self_attn(z) is causal self-attention, cross_attn(z, memory) takes
    its queries from z and its keys and values from memory, ffn(z) the feed-forward network.
    """
    B, T, S, D = 2, 5, 7, 16
    layer = DecoderLayer(D, 4, 24).double().eval()
    with torch.no_grad():
        for norm in (layer.norm1, layer.norm2, layer.norm3):  # norms that differ, so misplacing one shows
            norm.weight.uniform_(0.5, 1.5), norm.bias.normal_()
    x, memory = torch.randn(B, T, D, dtype=torch.double), torch.randn(B, S, D, dtype=torch.double)
    def sa(z: torch.Tensor, mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """Causal self-attention; a mask the reader passes too must be bool (a float 0/1 one is named)."""
        mask = kwargs.pop("attn_mask", mask)
        kwargs.pop("is_causal", None)
        if kwargs:
            raise TypeError(f"self_attn(z) takes the sequence (and at most a bool mask), not {sorted(kwargs)}")
        return layer.self_attn(z, mask=_bool_mask(mask), is_causal=True)

    def ca(z: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        if z.shape[1] == S and context.shape[1] == T:
            raise ValueError("cross_attn(memory, h) has the roles swapped: the decoder's tokens ask (the "
                             "queries, first argument), the memory answers: cross_attn(h, memory)")
        return layer.cross_attn(z, context)

    parts = (sa, ca, layer.ffn, layer.norm1, layer.norm2, layer.norm3)
    what = f"decoder_block(x, memory, ...) with x of shape {(B, T, D)} and memory of shape {(B, S, D)}"
    with torch.no_grad(), one_thread():
        got = _tensor_or_named(run(fn, x.clone(), memory.clone(), *parts, what=what), what, (B, T, D), {})
        _expect(got, layer(x, memory), what, atol=1e-9, mistakes=lambda: _block_mistakes(x, memory, *parts),
                axes=("sequence", "position", "feature"))
    return "self-attention, cross-attention over the memory, then the FFN, each LN(x + sublayer(x))"
