"""Chapter 17's checkers: correct answers in several styles pass, each classic mistake is named."""

import torch

from attnlib.exercises import check_qkv_shard, check_ring_merge, check_seq_to_heads
from exercise_helpers import assert_names, stub


# --- the ring's merge step ----------------------------------------------------------------------

def merge(o1, l1, o2, l2):
    lse = torch.logaddexp(l1, l2)
    return o1 * torch.exp(l1 - lse)[..., None] + o2 * torch.exp(l2 - lse)[..., None], lse


def merge_sigmoid(o1, l1, o2, l2):
    """The form some ring-attention codes use: out = out1 - sigmoid(lse2 - lse1)·(out1 - out2)."""
    w2 = torch.sigmoid(l2 - l1).nan_to_num(0.0)[..., None]
    w2 = torch.where(torch.isneginf(l1)[..., None], torch.ones_like(w2), w2)
    return o1 - w2 * (o1 - o2), torch.logaddexp(l1, l2)


def test_ring_merge_accepts_correct_answers():
    assert check_ring_merge(merge).passed
    assert check_ring_merge(merge_sigmoid).passed
    assert check_ring_merge(lambda a, b, c, d: list(merge(a, b, c, d))).passed


def test_ring_merge_names_mistakes():
    assert_names(check_ring_merge(lambda o1, l1, o2, l2: ((o1 + o2) / 2, torch.logaddexp(l1, l2))), "averaged")
    assert_names(check_ring_merge(lambda o1, l1, o2, l2: (merge(o1, l1, o2, l2)[0], torch.maximum(l1, l2))),
                 "max(lse1, lse2)")
    assert_names(check_ring_merge(lambda o1, l1, o2, l2: (merge(o1, l1, o2, l2)[0], l1 + l2)), "product")
    direct = lambda o1, l1, o2, l2: ((o1 * l1.exp()[..., None] + o2 * l2.exp()[..., None])  # noqa: E731
                                     / (l1.exp() + l2.exp())[..., None], torch.logaddexp(l1, l2))
    assert_names(check_ring_merge(direct), "overflows")
    swapped = lambda o1, l1, o2, l2: (merge(o2, l1, o1, l2)[0], torch.logaddexp(l1, l2))  # noqa: E731
    assert_names(check_ring_merge(swapped), "swapped")
    assert_names(check_ring_merge(lambda o1, l1, o2, l2: merge(o1, l1, o2, l2)[0]), "(out, lse)")


def test_ring_merge_stub_and_crash():
    result = check_ring_merge(stub)
    assert not result.passed and not result.attempted
    assert_names(check_ring_merge(lambda *a: 1 / 0), "ZeroDivisionError")


# --- Ulysses's all-to-all ----------------------------------------------------------------------

def test_seq_to_heads_accepts_correct_answers():
    W = lambda blocks: len(blocks)  # noqa: E731
    assert check_seq_to_heads(lambda bl: list(torch.cat(bl, dim=2).chunk(W(bl), dim=1))).passed
    assert check_seq_to_heads(lambda bl: [torch.cat([b.chunk(W(bl), dim=1)[g] for b in bl], dim=2)
                                          for g in range(W(bl))]).passed

    def with_views(blocks):  # the send buffer of the real all-to-all, then the receive side
        x = torch.stack(blocks)  # (W, B, H, n, Dh): rank r's block
        Wn, B, H, n, Dh = x.shape
        got = x.view(Wn, B, Wn, H // Wn, n, Dh).transpose(0, 2)  # (g, B, r, H/W, n, Dh)
        return list(got.permute(0, 1, 3, 2, 4, 5).reshape(Wn, B, H // Wn, Wn * n, Dh))
    assert check_seq_to_heads(with_views).passed


def test_seq_to_heads_names_mistakes():
    assert_names(check_seq_to_heads(lambda bl: [torch.cat(bl, 2)[:, g::len(bl)] for g in range(len(bl))]),
                 "round-robin")
    assert_names(check_seq_to_heads(lambda bl: list(torch.cat(bl[::-1], 2).chunk(len(bl), 1))), "wrong order")
    no_move = lambda bl: list(torch.stack(bl).reshape(  # noqa: E731
        bl[0].shape[0], bl[0].shape[1], -1, bl[0].shape[3]).chunk(len(bl), 1))
    assert_names(check_seq_to_heads(no_move), "without moving the rank axis")
    assert_names(check_seq_to_heads(lambda bl: [b.chunk(len(bl), 1)[g] for g, b in enumerate(bl)]),
                 "kept the sequence split")
    assert_names(check_seq_to_heads(lambda bl: torch.cat(bl, 2)), "list of")


# --- a rank's rows of a fused GQA projection ----------------------------------------------------

def _split(w, H, H_kv):
    Dh = w.shape[0] // (H + 2 * H_kv)
    return Dh, w.split([H * Dh, H_kv * Dh, H_kv * Dh])


def qkv_shard(w, H, H_kv, rank, W):
    Dh, (q, k, v) = _split(w, H, H_kv)
    heads = range(rank * H // W, (rank + 1) * H // W)
    kv = sorted({h // (H // H_kv) for h in heads})
    pick = lambda m, hs: torch.cat([m[h * Dh:(h + 1) * Dh] for h in hs])  # noqa: E731
    return torch.cat([pick(q, heads), pick(k, kv), pick(v, kv)])


def qkv_shard_views(weight, num_heads, num_kv_heads, rank, world_size):
    Dh, (q, k, v) = _split(weight, num_heads, num_kv_heads)
    k_rep = k.view(num_kv_heads, 1, Dh, -1).expand(-1, max(1, world_size // num_kv_heads), -1, -1)
    v_rep = v.view(num_kv_heads, 1, Dh, -1).expand(-1, max(1, world_size // num_kv_heads), -1, -1)
    ks = k_rep.reshape(-1, k.shape[-1]).chunk(world_size)[rank]  # copied kv heads first, then cut
    vs = v_rep.reshape(-1, v.shape[-1]).chunk(world_size)[rank]
    return torch.cat([q.chunk(world_size)[rank], ks, vs])


def test_qkv_shard_accepts_correct_answers():
    assert check_qkv_shard(qkv_shard).passed
    assert check_qkv_shard(qkv_shard_views).passed


def test_qkv_shard_names_mistakes():
    assert_names(check_qkv_shard(lambda w, H, H_kv, r, W: w.chunk(W)[r]), "equal row blocks")

    def every_kv(w, H, H_kv, r, W):
        Dh, (q, k, v) = _split(w, H, H_kv)
        return torch.cat([q.chunk(W)[r], k, v])
    assert_names(check_qkv_shard(every_kv), "every key/value head")

    def by_query_range(w, H, H_kv, r, W):
        Dh, (q, k, v) = _split(w, H, H_kv)
        a, b = r * H // W * Dh, (r + 1) * H // W * Dh
        return torch.cat([q[a:b], k[a:b], v[a:b]])
    assert_names(check_qkv_shard(by_query_range), "query heads' range")

    def round_robin(w, H, H_kv, r, W):  # query heads r, r + W, ... and the kv heads they use
        Dh, (q, k, v) = _split(w, H, H_kv)
        heads = range(r, H, W)
        kv = sorted({i // (H // H_kv) for i in heads})
        rows = lambda x, ids: torch.cat([x[i * Dh:(i + 1) * Dh] for i in ids])  # noqa: E731
        return torch.cat([rows(q, heads), rows(k, kv), rows(v, kv)])
    assert_names(check_qkv_shard(round_robin), "round-robin")

    def kv_split_only(w, H, H_kv, r, W):
        Dh, (q, k, v) = _split(w, H, H_kv)
        ka, kb = r * H_kv // W * Dh, (r + 1) * H_kv // W * Dh
        return torch.cat([q.chunk(W)[r], k[ka:kb], v[ka:kb]])
    assert_names(check_qkv_shard(kv_split_only), "copy each kv head")


def test_qkv_shard_stub_and_in_place():
    assert not check_qkv_shard(stub).attempted

    def in_place(w, H, H_kv, r, W):
        out = qkv_shard(w, H, H_kv, r, W)
        w.zero_()
        return out
    assert_names(check_qkv_shard(in_place), "in place")
