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


# --- held-out answers (issue 36's standard): other libraries' styles pass, each subtle mistake is named -----

def _merge_shifted(o1, l1, o2, l2, m, exp=torch.exp, divide=True, log=torch.log):
    a, b = exp(l1 - m)[..., None], exp(l2 - m)[..., None]
    out = o1 * a + o2 * b
    return (out / (a + b) if divide else out), m + log((a + b).squeeze(-1))


def _merge_base2(o1, l1, o2, l2):
    """flash-attention's base-2 form, with the natural-log lse converted in and out."""
    out, lse2 = _merge_shifted(o1, l1 * LOG2E, o2, l2 * LOG2E, torch.maximum(l1, l2) * LOG2E, torch.exp2,
                               log=torch.log2)
    return out, lse2 / LOG2E


LOG2E = 1.4426950408889634


def test_ring_merge_held_out_styles_pass():
    stacked = lambda o1, l1, o2, l2: (  # noqa: E731
        torch.softmax(torch.stack([l1, l2]), 0)[0][..., None] * o1
        + torch.softmax(torch.stack([l1, l2]), 0)[1][..., None] * o2, torch.logsumexp(torch.stack([l1, l2]), 0))
    for fn in (lambda o1, l1, o2, l2: _merge_shifted(o1, l1, o2, l2, torch.maximum(l1, l2)), _merge_base2, stacked,
               lambda o1, l1, o2, l2: merge(o1, l1.nan_to_num(), o2, l2.nan_to_num())):
        assert check_ring_merge(fn).passed


def test_ring_merge_held_out_mistakes_named():
    mx = torch.maximum
    assert_names(check_ring_merge(lambda o1, l1, o2, l2: _merge_shifted(o1, l1, o2, l2, mx(l1, l2), divide=False)),
                 "without dividing by their sum")
    assert_names(check_ring_merge(lambda o1, l1, o2, l2: _merge_shifted(o1, l1, o2, l2, mx(l1, l2), torch.exp2,
                                                                        log=torch.log2)), "base 2")
    assert_names(check_ring_merge(lambda o1, l1, o2, l2: _merge_shifted(o1, l1, o2, l2, torch.minimum(l1, l2))),
                 "smaller lse")
    ring_flash = lambda o1, l1, o2, l2: (o1 - torch.sigmoid(l2 - l1)[..., None] * (o1 - o2),  # noqa: E731
                                         l1 - torch.nn.functional.logsigmoid(l1 - l2))
    assert_names(check_ring_merge(ring_flash), "logsigmoid")
    assert_names(check_ring_merge(lambda o1, l1, o2, l2: (merge(o1, l1, o2, l2)[0], l1)), "lse1 unchanged")


def test_seq_to_heads_held_out_mistakes_named():
    def a2a(join):
        return lambda blocks: [join(blocks, g, len(blocks)) for g in range(len(blocks))]
    cases = {
        "positions interleaved": lambda bl: list(torch.stack(bl, dim=3).flatten(2, 3).chunk(len(bl), dim=1)),
        "permute, then reshape": lambda bl: list(torch.stack(bl).reshape(
            len(bl), bl[0].shape[0], bl[0].shape[1] // len(bl), -1, bl[0].shape[-1]).unbind(0)),
        "same head group": a2a(lambda bl, g, W: torch.cat([b.chunk(W, dim=1)[0] for b in bl], dim=2)),
        "its own block": a2a(lambda bl, g, W: torch.cat(bl[g].chunk(W, dim=1), dim=2)),
        "along the heads": a2a(lambda bl, g, W: torch.cat([b.chunk(W, dim=1)[g] for b in bl], dim=1)),
        "reverse order": a2a(lambda bl, g, W: torch.cat([b.chunk(W, dim=1)[W - 1 - g] for b in bl], dim=2)),
        "without a transpose": lambda bl: list(torch.cat(bl, dim=2).transpose(1, 2).reshape(
            torch.cat(bl, dim=2).shape).chunk(len(bl), dim=1)),
    }
    for name, fn in cases.items():
        assert_names(check_seq_to_heads(fn), name)


def test_qkv_shard_held_out():
    def vllm(weight, num_heads, num_kv_heads, rank, world_size):
        Dh = weight.shape[0] // (num_heads + 2 * num_kv_heads)
        q, k, v = weight.split([num_heads * Dh, num_kv_heads * Dh, num_kv_heads * Dh])
        n, j = ((num_kv_heads // world_size, rank) if num_kv_heads >= world_size
                else (1, rank // (world_size // num_kv_heads)))
        h = num_heads // world_size
        return torch.cat([q.narrow(0, rank * h * Dh, h * Dh), k.narrow(0, j * n * Dh, n * Dh),
                          v.narrow(0, j * n * Dh, n * Dh)])
    assert check_qkv_shard(vllm).passed

    def kv_by_rank(weight, H, H_kv, rank, W):  # right when W divides H_kv; rank 1 of (8, 2, 4) is wrong
        Dh = weight.shape[0] // (H + 2 * H_kv)
        q, k, v = weight.split([H * Dh, H_kv * Dh, H_kv * Dh])
        n = max(1, H_kv // W)
        j = rank * n if H_kv >= W else min(rank, H_kv - 1)
        return torch.cat([q[rank * H // W * Dh:(rank + 1) * H // W * Dh], k[j * Dh:(j + n) * Dh], v[j * Dh:(j + n) * Dh]])
    assert_names(check_qkv_shard(kv_by_rank), "rank number")
    kv_swapped = lambda w, H, H_kv, r, W: torch.cat(  # noqa: E731
        [qkv_shard(w, H, H_kv, r, W)[:H // W * (w.shape[0] // (H + 2 * H_kv))]]
        + list(qkv_shard(w, H, H_kv, r, W)[H // W * (w.shape[0] // (H + 2 * H_kv)):].chunk(2))[::-1])
    assert_names(check_qkv_shard(kv_swapped), "value rows before the key rows")
    assert_names(check_qkv_shard(lambda w, H, H_kv, r, W: w.tensor_split(W, dim=1)[r]), "columns")

    def strided_q(w, H, H_kv, r, W):
        Dh = w.shape[0] // (H + 2 * H_kv)
        mine = qkv_shard(w, H, H_kv, r, W)
        q = torch.cat([w[i * Dh:(i + 1) * Dh] for i in range(r, H, W)])
        return torch.cat([q, mine[H // W * Dh:]])
    assert_names(check_qkv_shard(strided_q), "holds the rows of heads")


def test_held_out_layouts_pass_and_base2_lse_named():
    assert check_seq_to_heads(lambda bl: torch.stack(torch.cat(bl, 2).chunk(len(bl), 1))).passed  # stacked
    assert_names(check_seq_to_heads(lambda bl: [c.numpy() for c in torch.cat(bl, 2).chunk(len(bl), 1)]),
                 "[0] should be a torch.Tensor, got a numpy.ndarray of shape (2, 2, 6, 3)")  # tensors only (issue 36)
    assert_names(check_qkv_shard(lambda *a: qkv_shard(*a).numpy()), "got a numpy.ndarray of shape (")
    assert_names(check_ring_merge(lambda o1, l1, o2, l2: (merge(o1, l1, o2, l2)[0], merge(o1, l1, o2, l2)[1] * LOG2E)),
                 "returned in base 2")
