"""Chapter 5's fourth checker: the permutation behind a shuffled sentence (attention without positions is
permutation-equivariant, so the shuffled outputs are the outputs shuffled). Re-exported by ch05."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, as_tensor, checker, run

__all__ = ["check_find_permutation"]


def _permutation_example() -> tuple[torch.Tensor, torch.Tensor]:
    """out (T, D) and the shuffle `truth` (T,): rows that only a whole-row comparison tells apart."""
    T, D = 8, 6
    out = torch.randn(T, D) * torch.linspace(0.3, 3.0, T)[:, None]  # rows of different lengths
    out[5] = out[2]      # a repeated token: either copy is a right answer
    out[6] = 2 * out[1]  # the same direction as row 1: cosine similarity cannot tell them apart
    out[7] = -out[3]     # the same length as row 3: norms cannot tell them apart
    return out, torch.tensor([7, 0, 6, 2, 3, 1, 5, 4])  # row 7 before row 3, row 6 before row 1


def _like_rows(a: torch.Tensor, b: torch.Tensor) -> dict[str, bool]:
    """Which weaker comparisons say that every row of a is its row of b."""
    return {"norms": torch.allclose(a.norm(dim=-1), b.norm(dim=-1)),
            "cosine": torch.allclose(torch.nn.functional.cosine_similarity(a, b, dim=-1), torch.ones(len(a)))}


@checker("find the permutation")
def check_find_permutation(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> str:
    """fn(out, shuffled), both (T, D), returns perm (T,) of integers with shuffled[i] = out[perm[i]]."""
    out, truth = _permutation_example()
    T, D = out.shape
    shuffled = out[truth]
    what = f"find_permutation(out, shuffled) with out and shuffled of shape {(T, D)}"
    perm = as_tensor(run(fn, out.clone(), shuffled.clone(), what=what), what, shape=(T,))
    if perm.is_floating_point() or perm.is_complex() or perm.dtype == torch.bool:
        raise CandidateError(f"{what} returned a {perm.dtype} tensor: indices must be integers (torch.long)")
    perm = perm.long()
    if bool((perm >= 1).all()) and int(perm.max()) == T and torch.equal(out[perm - 1], shuffled):
        raise CandidateError(f"{what} counts from 1: Python and torch index from 0")
    if bool(((perm < 0) | (perm >= T)).any()):
        raise CandidateError(f"{what} returned {perm.tolist()}: indices must be in 0..{T - 1}")
    if torch.equal(shuffled[perm], out) and not torch.equal(out[perm], shuffled):
        raise CandidateError(f"{what} returned the inverse permutation (out[i] = shuffled[perm[i]]): "
                             f"match each row of shuffled to a row of out, not the other way round")
    if not torch.equal(out[perm], shuffled):
        alike = _like_rows(out[perm], shuffled)
        if torch.equal(perm, (shuffled @ out.T).argmax(-1)):
            detail = ("the row with the largest dot product, which is not the same row (a longer row "
                      "pointing the same way wins)")
        elif alike["cosine"]:
            detail = ("rows matched by direction (cosine similarity): row 6 of out is twice row 1, so both "
                      "point the same way")
        elif alike["norms"]:
            detail = "rows matched by their norms: row 7 of out is minus row 3, so both have the same length"
        else:
            raise CandidateError(f"{what} returned {perm.tolist()}, and out[perm] is not shuffled")
        raise CandidateError(f"{what} returned {perm.tolist()}, and out[perm] is not shuffled: {detail}. "
                             f"Compare whole rows: the nearest by distance (torch.cdist) or the equal one")
    return "out[perm] equals shuffled, rows matched exactly (and a repeated token may match either copy)"
