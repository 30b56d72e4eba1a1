"""Chapter 5's checkers: a correct answer passes, each classic mistake is named, stubs and crashes are handled."""

import pytest
import torch

from attnlib.exercises.ch05 import (check_find_permutation, check_rope, check_rope_offset_score, check_sinusoidal,
                                    rope_variant)
from attnlib.positional import RotaryEmbedding, apply_rope, rotate_half, sinusoidal
from exercise_helpers import assert_names, stub


def test_rope_variant_defaults_are_attnlib():
    torch.manual_seed(0)
    x, pos = torch.randn(2, 3, 5, 8, dtype=torch.float64), torch.arange(5) + 40
    torch.testing.assert_close(rope_variant(x, pos), RotaryEmbedding(8, 64)(x, pos), rtol=0, atol=1e-6)


# --- sinusoidal ----------------------------------------------------------------------------------

def table(T, D, *, base=10000.0, two=2.0, start=0, swap=False, halves=False):
    """A reader's sinusoidal encoding, written independently of the checker, with switchable bugs."""
    i = torch.arange(D // 2, dtype=torch.float64)
    angle = torch.arange(start, start + T, dtype=torch.float64)[:, None] / base ** (two * i / D)  # (T, D/2)
    a, b = (angle.cos(), angle.sin()) if swap else (angle.sin(), angle.cos())
    pe = torch.empty(T, D)
    if halves:
        pe[:, :D // 2], pe[:, D // 2:] = a, b
    else:
        pe[:, 0::2], pe[:, 1::2] = a, b
    return pe


def test_sinusoidal_accepts_correct_ones():
    assert check_sinusoidal(table).passed
    assert check_sinusoidal(sinusoidal).passed


@pytest.mark.parametrize("kwargs, phrase", [
    ({"swap": True}, "sin and cos swapped"),
    ({"halves": True}, "the half layout"),
    ({"start": 1}, "positions counted from 1"),
    ({"base": 1000.0}, "the wrong frequency base: 1000 instead of 10000"),
    ({"two": 1.0}, "the exponent i/D instead of 2i/D"),
    ({"two": 4.0}, "the exponent 4i/D"),
    ({"two": -2.0}, "a positive exponent"),
])
def test_sinusoidal_names_the_mistake(kwargs, phrase):
    assert_names(check_sinusoidal(lambda T, D: table(T, D, **kwargs)), phrase)


def test_sinusoidal_stub_crash_and_shape():
    assert check_sinusoidal(stub).status == "not attempted yet"
    assert_names(check_sinusoidal(lambda T, D: table(T, D).T), "transposed")
    assert_names(check_sinusoidal(lambda T, D: torch.zeros(T, D // 2)), "has shape (40, 12), expected (T, D) = (40, 24)")
    assert_names(check_sinusoidal(lambda T, D: torch.arange(T) / 0 + [1]), "raised TypeError")
    assert_names(check_sinusoidal(lambda T, D: table(T, D) + 0.1), "it is the expected result plus 0.1 everywhere")


# --- RoPE on a query -----------------------------------------------------------------------------

def my_rope(x, positions, *, base=10000.0, sign=1.0, offset=0, layout="half"):
    """A reader's RoPE, written with complex numbers (independent of attnlib), with switchable bugs."""
    Dh = x.shape[-1]
    theta = base ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)              # (Dh/2,)
    angles = (positions + offset).double()[:, None] * theta * sign                   # (T, Dh/2)
    rot = torch.polar(torch.ones_like(angles), angles)                                 # (T, Dh/2)
    if layout == "half":
        z = torch.complex(x[..., :Dh // 2].double(), x[..., Dh // 2:].double()) * rot  # pairs (j, j + Dh/2)
        return torch.cat((z.real, z.imag), dim=-1).to(x.dtype)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], Dh // 2, 2).contiguous()) * rot  # (2j, 2j+1)
    return torch.view_as_real(z).flatten(-2).to(x.dtype)


def test_rope_accepts_correct_ones():
    assert check_rope(my_rope).passed
    rope = RotaryEmbedding(8, 32)
    assert check_rope(lambda x, pos: rope(x, pos)).passed


@pytest.mark.parametrize("candidate, phrase", [
    (lambda x, p: my_rope(x, p, layout="interleaved"), "the interleaved layout"),
    (lambda x, p: my_rope(x, p, sign=-1.0), "a rotation the wrong way"),
    (lambda x, p: my_rope(x, p, offset=1), "position + 1"),
    (lambda x, p: my_rope(x, p, offset=-1), "position - 1"),
    (lambda x, p: my_rope(x, torch.arange(len(p))), "the positions given ignored"),
    (lambda x, p: my_rope(x, p, base=500000.0), "the wrong frequency base: 500000"),
])
def test_rope_names_the_mistake(candidate, phrase):
    assert_names(check_rope(candidate), phrase)


def test_rope_names_swapped_and_repeat_interleaved_angles():
    def swapped(x, pos):
        theta = 10000.0 ** (-torch.arange(0, 8, 2) / 8)
        angles = torch.cat((pos[:, None] * theta,) * 2, dim=-1)
        return x * angles.sin() + rotate_half(x) * angles.cos()

    def repeated(x, pos):
        angles = (pos[:, None] * 10000.0 ** (-torch.arange(0, 8, 2) / 8)).repeat_interleave(2, dim=-1)
        return apply_rope(x, angles.cos(), angles.sin())
    assert_names(check_rope(swapped), "cos and sin swapped")
    assert_names(check_rope(repeated), "repeat_interleave")


def test_rope_stub_and_crash():
    assert check_rope(stub).status == "not attempted yet"
    assert_names(check_rope(lambda x, p: x @ p), "raised RuntimeError")
    assert_names(check_rope(lambda x, p: x[0]), "has shape (3, 5, 8), expected (B, H, T, Dh) = (2, 3, 5, 8)")


# --- the score from the offset -------------------------------------------------------------------

def offset_score(q, k, delta, *, flip=False, interleave=False, scale=1.0):
    """RoPE's q_m · k_n from delta = m - n alone: rotate q by delta (the rotations compose)."""
    d = -delta if flip else delta
    return (my_rope(q[None], torch.tensor([d]), layout="interleaved" if interleave else "half")[0] @ k).item() * scale


def test_offset_score_accepts_correct_ones():
    assert check_rope_offset_score(offset_score).passed
    rope = RotaryEmbedding(16, 1000)

    def via_positions(q, k, delta):  # rotate both at real positions, as a model does
        m, n = max(delta, 0), max(-delta, 0)
        return (rope(q.view(1, 1, 1, -1), torch.tensor([m])) * rope(k.view(1, 1, 1, -1), torch.tensor([n]))).sum()
    assert check_rope_offset_score(via_positions).passed


@pytest.mark.parametrize("kwargs, phrase", [
    ({"flip": True}, "the offset the wrong way round"),
    ({"interleave": True}, "the interleaved layout"),
    ({"scale": 0.25}, "divided by sqrt(Dh)"),
])
def test_offset_score_names_the_mistake(kwargs, phrase):
    assert_names(check_rope_offset_score(lambda q, k, d: offset_score(q, k, d, **kwargs)), phrase)


def test_offset_score_names_cancelled_rotations_stub_and_crash():
    assert_names(check_rope_offset_score(lambda q, k, d: (my_rope(q[None], torch.tensor([abs(d)]))[0]
                                                          @ my_rope(k[None], torch.tensor([abs(d)]))[0]).item()),
                 "both rotated by the same angle")
    assert check_rope_offset_score(stub).status == "not attempted yet"
    assert_names(check_rope_offset_score(lambda q, k, d: [1.0, 2.0]), "should return one number")
    assert_names(check_rope_offset_score(lambda q, k, d: 1 / 0), "raised ZeroDivisionError")


# --- find the permutation ------------------------------------------------------------------------

def find_permutation(out, shuffled):
    return torch.cdist(shuffled, out).argmin(dim=-1)  # (T,): the row of out nearest each shuffled row


def match_by_sorted_norms(out, shuffled):
    """Pairs rows by sorting their lengths: wrong when two different rows have the same length."""
    perm = torch.empty(len(out), dtype=torch.long)
    perm[shuffled.norm(dim=-1).argsort(stable=True)] = out.norm(dim=-1).argsort(stable=True)
    return perm


@pytest.mark.parametrize("candidate", [
    find_permutation,
    lambda o, s: torch.tensor([next(j for j in range(len(o)) if torch.equal(o[j], row)) for row in s]),
    lambda o, s: (s[:, None] == o[None]).all(dim=-1).int().argmax(dim=-1),        # exact equality, first copy
    lambda o, s: ((s[:, None] - o[None]) ** 2).sum(-1).argmin(-1).int(),            # squared distance, int32
    lambda o, s: torch.tensor([[tuple(r) for r in o.tolist()].index(tuple(r)) for r in s.tolist()]),
    lambda o, s: torch.stack([torch.isclose(o, row).all(-1).nonzero()[-1, 0] for row in s]),  # the last copy
])
def test_find_permutation_accepts_correct_ones(candidate):
    assert check_find_permutation(candidate).passed


@pytest.mark.parametrize("candidate, phrase", [
    (lambda o, s: torch.cdist(o, s).argmin(dim=-1), "the inverse permutation"),
    (lambda o, s: find_permutation(o, s) + 1, "counts from 1"),
    (lambda o, s: (s @ o.T).argmax(dim=-1), "the largest dot product"),
    (lambda o, s: find_permutation(o, s).float(), "indices must be integers"),
    (lambda o, s: torch.nn.functional.cosine_similarity(s[:, None], o[None], dim=-1).argmax(-1),
     "matched by direction (cosine similarity)"),
    (lambda o, s: (torch.nn.functional.normalize(s, dim=-1) @ torch.nn.functional.normalize(o, dim=-1).T).argmax(-1),
     "matched by direction"),
    (lambda o, s: (s.norm(dim=-1)[:, None] - o.norm(dim=-1)).abs().argmin(-1), "matched by their norms"),
    (match_by_sorted_norms, "matched by their norms"),
    (lambda o, s: torch.arange(len(o)), "out[perm] is not shuffled"),
])
def test_find_permutation_names_the_mistake(candidate, phrase):
    assert_names(check_find_permutation(candidate), phrase)


def test_find_permutation_stub_and_crash():
    assert check_find_permutation(stub).status == "not attempted yet"
    assert_names(check_find_permutation(lambda o, s: torch.cdist(o, s[0])), "raised RuntimeError")
    assert_names(check_find_permutation(lambda o, s: list(range(len(o)))), "should be a torch.Tensor", "got a list of")


def test_half_precision_results_are_named():
    assert_names(check_sinusoidal(lambda T, D: table(T, D).half()), "returned torch.float16", "half precision")
    assert_names(check_rope(lambda x, p: my_rope(x, p).to(torch.bfloat16)), "returned torch.bfloat16")
    assert_names(check_rope_offset_score(lambda q, k, d: torch.tensor(offset_score(q, k, d)).half()),
                 "returned torch.float16")
    assert check_rope_offset_score(lambda q, k, d: torch.tensor([offset_score(q, k, d)])).passed  # (1,) is a number


def test_complex_and_non_scalar_results_are_named():
    assert_names(check_sinusoidal(lambda T, D: torch.zeros(T, D, dtype=torch.complex64)), "complex tensor")
    assert_names(check_rope(lambda x, p: torch.view_as_complex(x.reshape(2, 3, 5, 4, 2))), "complex tensor")
    assert_names(check_rope_offset_score(lambda q, k, d: q * k), "got a tensor of shape (16,)")
