"""attnlib.Transformer against torch.nn.Transformer on the same weights; causality, caches, bad input; the toy task."""

import datetime

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlib import Transformer, masks
from attnlib.seq2seq import (SRC_VOCAB, TGT_VOCAB, Seq2Seq, date_split, date_words, encode_dates, exact_match,
                             greedy_decode, lr_factor, shift_right, train)
from attnlib.cross_attention import DecoderCache

D, H, B, S, T = 16, 4, 3, 7, 5
SRC_LEN, TGT_LEN = torch.tensor([7, 4, 2]), torch.tensor([5, 3, 1])


def pair(norm_first=False, activation="relu", dropout=0.0, **kwargs):
    torch.manual_seed(0)
    ref = nn.Transformer(D, H, 2, 2, 24, dropout, activation=activation, norm_first=norm_first,
                         batch_first=True, **kwargs).double()
    return ref, Transformer.from_torch(ref)


def inputs(requires_grad=False):
    gen = torch.Generator().manual_seed(1)
    src = torch.randn(B, S, D, dtype=torch.double, generator=gen, requires_grad=requires_grad)
    tgt = torch.randn(B, T, D, dtype=torch.double, generator=gen, requires_grad=requires_grad)
    return src, tgt


def ignore(lengths, L):
    """nn.Transformer's key padding mask (B, L): True = padding."""
    return torch.arange(L)[None] >= lengths[:, None]


def run_both(ref, ours, src, tgt):
    src_pad, tgt_pad = ignore(SRC_LEN, S), ignore(TGT_LEN, T)
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.double)
    want = ref(src, tgt, tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=src_pad,
               tgt_key_padding_mask=tgt_pad.double().masked_fill(tgt_pad, float("-inf")),
               memory_key_padding_mask=src_pad)
    src_mask = masks.from_key_padding_mask(src_pad)
    got = ours(src, tgt, src_mask=src_mask, tgt_mask=masks.from_key_padding_mask(tgt_pad), memory_mask=src_mask)
    return got, want, ~tgt_pad


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("train_mode", [False, True])
def test_equals_nn_transformer_at_real_target_positions(norm_first, activation, train_mode):
    ref, ours = pair(norm_first, activation)
    ref.train(train_mode), ours.train(train_mode)
    with torch.no_grad():
        got, want, real = run_both(ref, ours, *inputs())
    assert got.shape == (B, T, D)
    assert (got - want)[real].abs().max() < 1e-10


def test_encode_decode_split_equals_nn_transformer_and_forward():
    ref, ours = pair(norm_first=True, activation="gelu")
    src, tgt = inputs()
    src_pad = ignore(SRC_LEN, S)
    with torch.no_grad():
        memory = ours.encode(src, masks.from_key_padding_mask(src_pad))
        want_memory = ref.encoder(src, src_key_padding_mask=src_pad)
        assert (memory - want_memory)[~src_pad].abs().max() < 1e-10
        got = ours.decode(tgt, want_memory, memory_mask=masks.from_key_padding_mask(src_pad))
        want = ref.decoder(tgt, want_memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(T).double(),
                           tgt_is_causal=True, memory_key_padding_mask=src_pad)
        assert (got - want).abs().max() < 1e-10
        assert torch.equal(ours(src, tgt), ours.decode(tgt, ours.encode(src)))


@pytest.mark.parametrize("norm_first", [False, True])
def test_gradients_equal_nn_transformers(norm_first):
    ref, ours = pair(norm_first, "gelu")
    src, tgt = inputs(requires_grad=True)
    got, want, real = run_both(ref, ours, src, tgt)
    (want[real] ** 2).sum().backward()
    want_grads = [src.grad.clone(), tgt.grad.clone()]
    src.grad = tgt.grad = None
    got, _, _ = run_both(ref, ours, src, tgt)
    (got[real] ** 2).sum().backward()
    for g, w in zip([src.grad, tgt.grad], want_grads):
        assert (g - w).abs().max() < 1e-10
    for theirs, mine in [(ref.encoder.layers[0].self_attn.in_proj_weight, ours.encoder[0].attn.qkv.weight),
                         (ref.decoder.layers[1].multihead_attn.in_proj_weight, ours.decoder[1].cross_attn.qkv.weight),
                         (ref.decoder.layers[1].multihead_attn.out_proj.bias, ours.decoder[1].cross_attn.out.bias),
                         (ref.decoder.layers[0].linear1.weight, ours.decoder[0].ffn[0].weight),
                         (ref.decoder.layers[0].norm3.weight, ours.decoder[0].norm3.weight),
                         (ref.encoder.norm.bias, ours.encoder_norm.bias),
                         (ref.decoder.norm.weight, ours.decoder_norm.weight)]:
        assert (mine.grad - theirs.grad).abs().max() < 1e-10


def test_causal_a_later_target_position_changes_nothing_before_it():
    _, ours = pair()
    src, tgt = inputs()
    with torch.no_grad():
        before = ours(src, tgt)
        changed = tgt.clone()
        changed[:, 3] += 1.0
        after = ours(src, changed)
    assert torch.equal(before[:, :3], after[:, :3])
    assert (before[:, 3:] - after[:, 3:]).abs().max() > 1e-3


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decode_equals_uncached(norm_first):
    _, ours = pair(norm_first)
    src, tgt = inputs()
    mask = masks.padding_mask(~ignore(SRC_LEN, S))
    with torch.no_grad():
        memory = ours.encode(src, mask)
        full = ours.decode(tgt, memory, memory_mask=mask)
        cache = DecoderCache()
        steps = [ours.decode(tgt[:, :2], memory, memory_mask=mask, cache=cache)]  # two at once, then one by one
        steps += [ours.decode(tgt[:, t:t + 1], memory, memory_mask=mask, cache=cache) for t in range(2, T)]
    assert cache.seq_len == T and len(cache.cross) == 2
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-10


def test_cached_greedy_decoding_gives_the_same_tokens():
    torch.manual_seed(0)
    model = Seq2Seq(d_model=32, dim_feedforward=64).eval()
    src, _ = encode_dates(date_split(16, 0, seed=3)[0])
    cached, uncached = greedy_decode(model, src), greedy_decode(model, src, use_cache=False)
    assert cached.shape == (16, 10)
    assert torch.equal(cached, uncached)


def test_teacher_forcing_logits_equal_step_by_step_decoding_of_the_true_prefix():
    torch.manual_seed(0)
    model = Seq2Seq(d_model=32, dim_feedforward=64).double().eval()
    src, tgt = encode_dates(date_split(4, 0, seed=5)[0])
    tgt_in = shift_right(tgt)
    assert torch.equal(tgt_in[:, 0], torch.full((4,), TGT_VOCAB.index("<bos>")))
    assert torch.equal(tgt_in[:, 1:], tgt[:, :-1])
    with torch.no_grad():
        forced = model(src, tgt_in)                                    # all positions at once, causal mask
        memory, mask = model.encode(src)
        cache = DecoderCache()
        steps = [model.project(model.transformer.decode(model.embed(model.tgt_embed, tgt_in[:, t:t + 1], t),
                                                        memory, memory_mask=mask, cache=cache))
                 for t in range(tgt.shape[1])]
    assert (forced - torch.cat(steps, dim=1)).abs().max() < 1e-10


def test_cross_attention_weights_are_returned_per_layer_and_respect_the_memory_mask():
    _, ours = pair()
    src, tgt = inputs()
    mask = masks.padding_mask(~ignore(SRC_LEN, S))
    with torch.no_grad():
        memory = ours.encode(src, mask)
        y, weights = ours.decode(tgt, memory, memory_mask=mask, need_weights=True)
    assert (y - ours.decode(tgt, memory, memory_mask=mask)).abs().max() < 1e-12
    assert len(weights) == 2 and weights[0].shape == (B, H, T, S)
    assert torch.allclose(weights[1].sum(-1), torch.ones(B, H, T, dtype=torch.double))
    assert weights[0][2, :, :, 2:].abs().max() == 0  # the third source has 2 real words


# --- from_torch refuses what it does not model ---------------------------------------------------

def test_from_torch_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match="batch_first=False"):
        Transformer.from_torch(nn.Transformer(D, H, 1, 1, 24, batch_first=False))
    layer = nn.TransformerEncoderLayer(D, H, 24, batch_first=True)
    with pytest.raises(ValueError, match="custom encoder \\(MyEncoder\\)"):
        Transformer.from_torch(nn.Transformer(D, H, custom_encoder=type("MyEncoder", (nn.Module,), {})(),
                                              batch_first=True))
    with pytest.raises(ValueError, match="custom decoder \\(TransformerEncoder\\)"):
        Transformer.from_torch(nn.Transformer(D, H, custom_decoder=nn.TransformerEncoder(layer, 1),
                                              batch_first=True))
    with pytest.raises(ValueError, match="activation <function silu"):
        Transformer.from_torch(nn.Transformer(D, H, 1, 1, 24, activation=F.silu, batch_first=True))
    with pytest.raises(ValueError, match="bias=False"):
        Transformer.from_torch(nn.Transformer(D, H, 1, 1, 24, bias=False, batch_first=True))
    ref = nn.Transformer(D, H, 1, 1, 24, batch_first=True)
    ref.decoder.layers[0].dropout2.p = 0.3
    with pytest.raises(ValueError, match="the layers differ in dropout"):
        Transformer.from_torch(ref)
    ref = nn.Transformer(D, H, 1, 1, 24, batch_first=True)
    ref.decoder.norm = None
    with pytest.raises(ValueError, match="decoder.norm is None"):
        Transformer.from_torch(ref)
    with pytest.raises(TypeError, match="must be an nn.Transformer, got TransformerEncoderLayer"):
        Transformer.from_torch(layer)


def test_from_torch_keeps_dtype_training_mode_and_gelu_module():
    ref = nn.Transformer(D, H, 1, 1, 24, activation=nn.GELU(), batch_first=True).double().eval()
    with pytest.raises(ValueError, match=r"the layers differ in activation \(\['gelu', 'relu'\]\)"):
        Transformer.from_torch(ref)  # torch 2.13 gives its decoder layers F.relu for an activation module
    ref.decoder.layers[0].activation = nn.GELU()
    ours = Transformer.from_torch(ref)
    assert ours.encoder_norm.weight.dtype == torch.double and not ours.training
    assert isinstance(ours.decoder[0].ffn[1], nn.GELU)


# --- bad input is named ---------------------------------------------------------------------------

@pytest.mark.parametrize("call, error, message", [
    (lambda m, s, t: m(s[0], t), ValueError, "src of shape (7, 16) is not (B, L, D) with D=16"),
    (lambda m, s, t: m(s[..., :8], t), ValueError, "src of shape (3, 7, 8) is not (B, L, D) with D=16"),
    (lambda m, s, t: m(s, t[:2]), ValueError, "memory of shape (3, 7, 16) is not (B, L, D) with D=16 and B=2"),
    (lambda m, s, t: m(s.long(), t), TypeError, "src must be a floating-point tensor"),
    (lambda m, s, t: m(s, t, src_mask=torch.ones(3, 7, dtype=torch.bool)), ValueError,
     "src_mask: mask of shape (3, 7) does not broadcast to scores (3, 4, 7, 7); a padding mask (B, S)"),
    (lambda m, s, t: m(s, t, tgt_mask=torch.ones(3, 1, 1, 7, dtype=torch.bool)), ValueError,
     "tgt_mask: mask of shape (3, 1, 1, 7) does not broadcast to scores (3, 4, 5, 5)"),
    (lambda m, s, t: m(s, t, memory_mask=torch.ones(3, 1, 1, 5, dtype=torch.bool)), ValueError,
     "memory_mask: mask of shape (3, 1, 1, 5) does not broadcast to scores (3, 4, 5, 7)"),
    (lambda m, s, t: m(s, t, memory_mask=torch.ones(3, 1, 1, 7)), TypeError,
     "memory_mask: mask must be a bool tensor (True = may attend), got torch.float32"),
    (lambda m, s, t: m.decode(t, s, cache=object()), TypeError, "cache must be an attnlib.cross_attention.DecoderCache"),
])
def test_bad_input_names_the_argument_and_shapes(call, error, message):
    _, ours = pair()
    with pytest.raises(error) as info:
        call(ours, *inputs())
    assert message in str(info.value)


def test_a_cache_belongs_to_one_source():
    _, ours = pair()
    src, tgt = inputs()
    cache = DecoderCache()
    with torch.no_grad():
        ours.decode(tgt[:, :1], ours.encode(src), cache=cache)
        with pytest.raises(ValueError, match=r"memory of shape \(3, 4, 16\) is not the source this cache was "
                                             r"started with, \(B, S\) = \(3, 7\)"):
            ours.decode(tgt[:, 1:2], src[:, :4], cache=cache)


@pytest.mark.parametrize("kwargs, message", [
    (dict(activation="swish"), "activation must be one of ['gelu', 'relu'], got 'swish'"),
    (dict(num_decoder_layers=0), "num_decoder_layers must be a positive int, got 0"),
])
def test_bad_constructor_arguments(kwargs, message):
    args = dict(d_model=D, num_heads=H, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=24)
    with pytest.raises(ValueError) as info:
        Transformer(**(args | kwargs))
    assert message in str(info.value)


# --- the toy task -------------------------------------------------------------------------------

def test_dates_in_words():
    assert date_words(datetime.date(1999, 3, 23)) == ["twenty", "third", "of", "march", "nineteen", "ninety", "nine"]
    assert date_words(datetime.date(1905, 12, 1)) == ["first", "of", "december", "nineteen", "oh", "five"]
    assert date_words(datetime.date(1900, 7, 30)) == ["thirtieth", "of", "july", "nineteen", "hundred"]
    assert date_words(datetime.date(2000, 1, 31)) == ["thirty", "first", "of", "january", "two", "thousand"]
    assert date_words(datetime.date(2014, 5, 11)) == ["eleventh", "of", "may", "two", "thousand", "fourteen"]
    train_dates, test_dates = date_split(500, 100, seed=0)
    assert not set(train_dates) & set(test_dates) and len(set(train_dates)) == 500
    assert date_split(500, 100, seed=0) == (train_dates, test_dates)
    src, tgt = encode_dates(train_dates)
    assert src.shape == (500, 8) and tgt.shape == (500, 10)
    assert "".join(TGT_VOCAB[i] for i in tgt[0]) == train_dates[0].isoformat()
    words = [SRC_VOCAB[i] for i in src[0] if i]
    assert words == date_words(train_dates[0])
    with pytest.raises(ValueError, match="is more than the 73049 dates there are"):
        date_split(73000, 100)


def test_a_short_training_lowers_the_loss_and_exact_match_counts_whole_rows():
    torch.manual_seed(0)
    model = Seq2Seq(d_model=32, dim_feedforward=64)
    src, tgt = encode_dates(date_split(512, 0, seed=1)[0])
    losses = train(model, src, tgt, steps=60, batch_size=32, warmup=10)
    assert len(losses) == 60 and sum(losses[-10:]) < 0.7 * sum(losses[:10])
    assert exact_match(torch.tensor([[1, 2], [1, 3]]), torch.tensor([[1, 2], [1, 2]])) == 0.5


def test_embeddings_start_with_tensor2tensors_std_so_that_sqrt_d_keeps_word_and_position_alike():
    torch.manual_seed(0)
    model = Seq2Seq(d_model=64)
    for table in (model.src_embed, model.tgt_embed):
        assert abs(table.weight.std().item() * 64 ** 0.5 - 1) < 0.2          # std D^-1/2, not nn.Embedding's 1
    src = torch.tensor([[SRC_VOCAB.index(w) for w in date_words(datetime.date(1999, 3, 23))]])  # (1, S)
    word = model.src_embed(src) * 64 ** 0.5                                   # what embed adds to the positions
    ratio = (word.norm(dim=-1) / model.positions[:src.shape[1]].norm(dim=-1)).mean().item()
    assert 1.0 < ratio < 2.0                                                  # about sqrt(2), never sqrt(2D) = 11


def test_lr_factor_is_the_smaller_of_the_warm_up_and_a_cosine_from_step_0():
    factors = [lr_factor(s, 600, 100) for s in range(600)]
    assert factors[0] == 1 / 100 and factors[49] == 50 / 100                 # the warm-up, linear
    peak = max(range(600), key=factors.__getitem__)
    assert 80 < peak < 100 and factors[peak] < 1                              # meets the cosine before step 100
    assert factors[300] == pytest.approx(0.5) and factors[-1] < 1e-4         # the cosine started at step 0


def test_the_models_bad_input_is_named():
    model = Seq2Seq(d_model=32, dim_feedforward=64)
    src, tgt = encode_dates(date_split(4, 0, seed=1)[0])
    with pytest.raises(ValueError, match=r"src of shape \(7,\) is not \(B, T\)"):
        model.encode(src[0, :7])
    with pytest.raises(ValueError, match=r"src holds 65, outside the source vocabulary \[0, 65\)"):
        model.encode(src.clamp(max=0) + 65)
    with pytest.raises(ValueError, match=r"tgt_in holds 13, outside the target vocabulary \[0, 13\)"):
        model(src, tgt.clamp(max=0) + 13)
    with pytest.raises(ValueError, match=r"tgt_in of shape \(3, 10\) is not \(B, T\) with B=4"):
        model(src, tgt[:3])
    with pytest.raises(ValueError, match=r"length must be an int in \[1, 63\] \(max_len - 1\), got 64"):
        greedy_decode(model, src, 64)
