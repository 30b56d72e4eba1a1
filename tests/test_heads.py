"""attnlib.heads: each score on attention patterns built by hand, whose answer is known."""

import pytest
import torch

from attnlib import heads


def pattern(T: int, key_of) -> torch.Tensor:
    """(T, T) weights: query i puts all its attention on key key_of(i)."""
    w = torch.zeros(T, T)
    for i in range(T):
        w[i, key_of(i)] = 1.0
    return w


def test_scores_of_pure_patterns():
    T, period = 9, 4                                   # one prefix token, then two blocks of 4
    previous = pattern(T, lambda i: max(i - 1, 0))
    sink = pattern(T, lambda i: 0)
    induction = pattern(T, lambda i: i - period + 1 if i >= T - period else 0)
    assert heads.previous_token_score(previous) == 1.0 and heads.sink_share(previous) == pytest.approx(1 / 8)
    assert heads.sink_share(sink) == 1.0 and heads.previous_token_score(sink) == pytest.approx(1 / 8)
    assert heads.induction_score(induction, period) == 1.0 and heads.induction_score(previous, period) == 0.0
    assert heads.attention_distance(previous) == pytest.approx(8 / 9)            # query 0 looks 0 back
    assert heads.attention_distance(sink) == pytest.approx(sum(range(T)) / T)
    assert heads.pattern_distance(sink, sink) == 0.0
    assert heads.pattern_distance(previous, sink) == pytest.approx(7 / 9)         # rows 0 and 1 agree


def test_leading_axes_and_queries_after_a_cache():
    w = torch.rand(2, 3, 5, 5).tril().softmax(-1)       # any leading axes: (L, H) here
    assert heads.sink_share(w).shape == heads.attention_distance(w).shape == (2, 3)
    full = pattern(8, lambda i: max(i - 1, 0))
    last3 = full[5:]                                     # 3 queries after 5 cached keys: (T, S) = (3, 8)
    assert heads.previous_token_score(last3) == 1.0
    assert heads.attention_distance(last3) == pytest.approx(1.0)
    induction = pattern(10, lambda i: i - 4 if i >= 5 else 0)[5:]   # period 5: the second block's 5 queries
    assert heads.induction_score(induction, 4) == 0.0 and heads.induction_score(induction, 5) == 1.0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"weights of shape \(5, 3\) is not \(..., T, S\) with T <= S"):
        heads.sink_share(torch.rand(5, 3))
    with pytest.raises(ValueError, match=r"period=5 must be an int with period <= T=8"):
        heads.induction_score(torch.rand(8, 8), 5)
    with pytest.raises(ValueError, match=r"a of shape \(4, 4\) and b of shape \(5, 5\) differ"):
        heads.pattern_distance(torch.rand(4, 4), torch.rand(5, 5))
