"""The catalogues of chapter 17's checkers (ch17.py): each exercise's usual mistakes, computed on the
checker's inputs, and for the fused projection a reading of which heads' rows the reader's answer holds."""

from __future__ import annotations

import math

import torch

__all__ = ["merge_out_mistakes", "merge_lse_mistakes", "seq_to_heads_mistakes", "qkv_mistakes", "qkv_heads_held"]


def _shifted(o1, l1, o2, l2, m, exp=torch.exp):
    """Each block weighted by exp(lse - m), and the sum of those weights (B, T, 1)."""
    a, b = exp(l1 - m)[..., None], exp(l2 - m)[..., None]
    return o1 * a + o2 * b, a + b


def merge_out_mistakes(o1, l1, o2, l2, lse) -> dict[str, torch.Tensor]:
    """The merged output's usual mistakes; lse is the right merged log-sum-exp."""
    w1, w2 = torch.exp(l1)[..., None], torch.exp(l2)[..., None]
    m = torch.maximum(l1, l2)
    unnormalised, _ = _shifted(o1, l1, o2, l2, m)
    base2, s2 = _shifted(o1, l1, o2, l2, m, torch.exp2)
    by_min, s_min = _shifted(o1, l1, o2, l2, torch.minimum(l1, l2))
    return {
        "averaged the two outputs: (out1 + out2) / 2 ignores how much of the softmax each block holds":
            (o1 + o2) / 2,
        "weighted by exp(lse) without dividing by exp(lse1) + exp(lse2) (and exp overflows): use "
        "exp(lse1 - lse) and exp(lse2 - lse)": o1 * w1 + o2 * w2,
        "you swapped the weights: out1 must take exp(lse1 - lse) and out2 exp(lse2 - lse)":
            o1 * torch.exp(l2 - lse)[..., None] + o2 * torch.exp(l1 - lse)[..., None],
        "computed exp(lse1) + exp(lse2) directly: it overflows for large scores (inf / inf = NaN); "
        "subtract the max first (torch.logaddexp does)": (o1 * w1 + o2 * w2) / (w1 + w2),
        "weighted by exp(lse1 - m) and exp(lse2 - m), m = max(lse1, lse2), without dividing by their sum: the "
        "weights must add up to 1 (divide, or use exp(lse_k - lse) with the merged lse)": unnormalised,
        "read the lse as base 2 (exp2 / log2): the lse here is a natural log; flash-attention's base-2 trick "
        "needs lse · log2(e) first": base2 / s2,
        "subtracted the smaller lse, not the larger: exp(lse - min) overflows (inf / inf = NaN) when the blocks "
        "differ by 800, and is NaN where an lse is -inf; subtract the max": by_min / s_min,
    }


def merge_lse_mistakes(l1, l2) -> dict[str, torch.Tensor]:
    """The merged log-sum-exp's usual mistakes."""
    m = torch.maximum(l1, l2)
    return {
        "lse = max(lse1, lse2): the merged log-sum-exp is log(exp(lse1) + exp(lse2))": m,
        "lse = lse1 + lse2: that is the log of a product, not of a sum": l1 + l2,
        "lse = (lse1 + lse2) / 2, the mean: the merged log-sum-exp is log(exp(lse1) + exp(lse2)), at least the "
        "larger of the two": (l1 + l2) / 2,
        "lse = log(exp(lse1) + exp(lse2)) computed directly: it overflows for large scores; "
        "use torch.logaddexp": torch.log(torch.exp(l1) + torch.exp(l2)),
        "returned lse1 unchanged: the next ring step needs the lse of both blocks together": l1,
        "returned lse2 unchanged: the next ring step needs the lse of both blocks together": l2,
        "read the lse as base 2: m + log2(2^(lse1 - m) + 2^(lse2 - m)); the lse here is a natural log":
            m + torch.log2(torch.exp2(l1 - m) + torch.exp2(l2 - m)),
        "the lse returned in base 2 (lse · log2(e)): the next step reads a natural-log lse; convert back with "
        "· ln(2)": torch.logaddexp(l1, l2) / math.log(2),
        "lse1 - logsigmoid(lse1 - lse2) (ring-flash-attn's update) gives -inf - (-inf) = NaN where lse1 is -inf "
        "(a query that sees no key of block 1); torch.logaddexp handles -inf":
            l1 - torch.nn.functional.logsigmoid(l1 - l2),
    }


def _stacked(full: torch.Tensor, W: int) -> torch.Tensor:
    """(W, B, H/W, T, Dh): rank g's heads g·H/W .. of every position, from the whole (B, H, T, Dh)."""
    return torch.stack(full.chunk(W, dim=1))


def seq_to_heads_mistakes(full: torch.Tensor, blocks: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Ulysses's all-to-all's usual mistakes, each (W, B, H/W, T, Dh) (or the shape the mistake gives)."""
    W, (B, H, T, Dh) = len(blocks), full.shape
    h, right = H // W, _stacked(full, W)
    return {
        "heads dealt round-robin (rank g got heads g, g + W, ...): Ulysses gives each rank a contiguous "
        "group of H/W heads": torch.stack([full[:, g::W] for g in range(W)]),
        "the sequence blocks joined in the wrong order: rank r's block is positions r·T/W ..":
            _stacked(torch.cat(blocks[::-1], dim=2), W),
        "reshaped the stacked blocks without moving the rank axis next to time: (W, B, H, T/W, Dh) "
        "read as (B, H, T, Dh) mixes positions of different ranks": _stacked(torch.stack(blocks).reshape(B, H, T, Dh), W),
        "reshaped the stacked blocks (W, B, H, T/W, Dh) straight to (W, B, H/W, T, Dh): the source rank axis must "
        "move next to time first (permute, then reshape)": torch.stack(blocks).reshape(W, B, h, T, Dh),
        "positions interleaved (stacked the blocks on a new axis after time): rank r's block is the r-th run of "
        "T/W consecutive positions, so concatenate along time": _stacked(torch.stack(blocks, dim=3).reshape(B, H, T, Dh), W),
        "kept the sequence split: rank g holds its heads for all T positions, not only its own T/W":
            torch.stack([blocks[g][:, g * h:(g + 1) * h] for g in range(W)]),
        "every rank got the same head group (group 0): rank g receives head group g": right[:1].expand_as(right),
        "the head groups in reverse order: rank g receives heads g·H/W .. (g+1)·H/W - 1": right.flip(0),
        "rank g joined the head groups of its own block along time: it must receive head group g from every "
        "rank (the g-th chunk of each block)": torch.stack([torch.cat(b.chunk(W, dim=1), dim=2) for b in blocks]),
        "joined the pieces along the heads (dim 1), not along time (dim 2)":
            torch.stack([torch.cat([b.chunk(W, dim=1)[g] for b in blocks], dim=1) for g in range(W)]),
        "a (B, T, H, Dh) tensor reshaped to (B, H, T, Dh) without a transpose: a reshape never swaps axes":
            _stacked(torch.cat(blocks, dim=2).transpose(1, 2).reshape(B, H, T, Dh), W),
        **({"the batch axis (dim 0) chunked instead of the heads (dim 1): rank g receives head group g of every "
            "sequence in the batch, all B of them": torch.stack(torch.cat(blocks, dim=2).chunk(W, dim=0))}
           if B % W == 0 else {}),
    }


def _rows(w: torch.Tensor, Dh: int, ids) -> torch.Tensor:
    return torch.cat([w[i * Dh:(i + 1) * Dh] for i in ids]) if len(ids) else w[:0]


def qkv_mistakes(w: torch.Tensor, H: int, H_kv: int, rank: int, W: int, Dh: int) -> dict[str, torch.Tensor]:
    """The fused projection's usual mistakes, each a (rows, D) tensor."""
    q, k, v = w.split([H * Dh, H_kv * Dh, H_kv * Dh])
    heads, g = range(rank * H // W, (rank + 1) * H // W), H // H_kv
    kv = sorted({i // g for i in heads})
    a, b = heads.start * Dh, heads.stop * Dh
    ka, kb = rank * H_kv // W * Dh, (rank + 1) * H_kv // W * Dh
    n = max(1, H_kv // W)
    wrong_dh = w.shape[0] // (H + H_kv)
    dq, dk = w[:H * wrong_dh], w[H * wrong_dh:(H + H_kv) * wrong_dh]
    dv = w[(H + H_kv) * wrong_dh:]
    per_group = w.view(H_kv, g + 2, Dh, -1)                              # Megatron's [q.. of the group; k; v]
    mq, mk, mv = (x.reshape(-1, w.shape[1]) for x in (per_group[:, :g], per_group[:, g], per_group[:, g + 1]))
    return {
        "cut the fused matrix into world_size equal row blocks: that mixes q, k and v rows; cut each "
        "of W_q, W_k, W_v by heads": w.tensor_split(W)[rank],
        "cut the columns (the input dimension D): tensor parallelism splits W_q, W_k, W_v by rows (output "
        "features, that is heads)": w.tensor_split(W, dim=1)[rank],
        "gave the rank every key/value head: it needs only those its query heads use (GQA: query "
        "head i uses kv head i // (H / H_kv))": torch.cat([q[a:b], k, v]),
        "no key/value rows for this rank (only its query rows): each rank needs the kv heads its query heads "
        "use; when there are fewer kv heads than ranks, rank·H_kv/W .. (rank+1)·H_kv/W is empty for some ranks, "
        "so copy each kv head to the W/H_kv ranks that use it": torch.cat([q[a:b], k[ka:kb], v[ka:kb]]),
        "cut the key/value heads by the query heads' range: with GQA there are fewer kv heads": torch.cat(
            [q[a:b], k[a:b], v[a:b]]),
        "the key/value head picked from the rank number (rank, or rank % H_kv): with fewer kv heads than ranks, "
        "rank r uses kv head r·H_kv // W (its query heads' i // (H / H_kv)), so neighbouring ranks share one": torch.cat(
            [q[a:b], _rows(k, Dh, [rank % H_kv]), _rows(v, Dh, [rank % H_kv])]),
        "the value rows before the key rows: the result is [its q rows; its k rows; its v rows]":
            torch.cat([q[a:b], _rows(v, Dh, kv), _rows(k, Dh, kv)]),
        "Dh taken as rows / (H + H_kv): the fused matrix has H + 2·H_kv heads' rows (K and V one H_kv each)":
            torch.cat([dq[heads.start * wrong_dh:heads.stop * wrong_dh], _rows(dk, wrong_dh, kv), _rows(dv, wrong_dh, kv)]),
        "read the weight as Megatron's per-group layout [q heads of group j; k_j; v_j]: here the rows are "
        "[W_q; W_k; W_v], all query heads first": torch.cat([_rows(mq, Dh, heads), _rows(mk, Dh, kv), _rows(mv, Dh, kv)]),
        "the first n_kv key/value heads for every rank": torch.cat([q[a:b], k[:n * Dh], v[:n * Dh]]),
    }


def qkv_heads_held(got: torch.Tensor, w: torch.Tensor, H: int, H_kv: int, Dh: int) -> str:
    """Which heads' rows got holds, in order ('q2 q3 k1 v1'), '' if some block of Dh rows is no head's."""
    if got.dim() != 2 or got.shape[1] != w.shape[1] or got.shape[0] % Dh:
        return ""
    names = [f"q{i}" for i in range(H)] + [f"k{i}" for i in range(H_kv)] + [f"v{i}" for i in range(H_kv)]
    heads = w.reshape(-1, Dh, w.shape[1])                                 # (H + 2 H_kv, Dh, D)
    held = []
    for block in got.reshape(-1, Dh, w.shape[1]):
        same = [n for n, x in zip(names, heads) if bool(((block.double() - x.double()).abs() <= 1e-6).all())]
        if not same:
            return ""
        held.append(same[0])
    return " ".join(held)
