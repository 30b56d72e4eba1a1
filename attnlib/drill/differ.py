"""What differs between a reader's result and the expected one, in words: for the mistakes no catalogue names.

`differences(got, want, axes)` looks for a common factor, one offset repeated at every position, entries
that are right but in the wrong places, which indices along each axis are right and which are not, and
the size of the difference. The drill and the chapter 11 checkers end their messages with these facts
instead of a bare "wrong".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["differences", "spans"]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.double(), b.double()
    return a.shape == b.shape and bool(((a - b).abs() <= 1e-5 * (1 + b.abs())).all())


def spans(indices: Sequence[int]) -> str:
    """[0, 1, 2, 4] -> '0-2 and 4'."""
    parts, run = [], []
    for i in indices:
        if run and i != run[-1] + 1:
            parts.append(run)
            run = []
        run.append(i)
    parts += [run] if run else []
    words = [f"{r[0]}-{r[-1]}" if len(r) > 2 else w for r in parts for w in ([f"{r[0]}-{r[-1]}"] if len(r) > 2 else
                                                                         [str(i) for i in r])]
    words = list(dict.fromkeys(words))
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _moved(got: torch.Tensor, want: torch.Tensor, axis: int) -> dict[int, int] | None:
    """{i: j} when every slice i of got along `axis` is slice j != i of want (some moved), else None."""
    n, found = got.shape[axis], {}
    for i in range(n):
        j = next((j for j in range(n) if _close(got.select(axis, i), want.select(axis, j))), None)
        if j is None:
            return None
        found[i] = j
    return found if any(i != j for i, j in found.items()) else None


def differences(got: torch.Tensor, want: torch.Tensor, axes: Sequence[str]) -> list[str]:
    """Facts about how got differs from want (same shape; axes names each dimension), most telling first."""
    got, want = got.detach().double(), want.detach().double()
    if torch.isnan(got).any() and not torch.isnan(want).any():
        where = torch.isnan(got).nonzero()[0].tolist()
        return [f"it contains NaN (first at {', '.join(f'{a} {i}' for a, i in zip(axes, where))}), where the expected "
                f"result has none: 0/0, inf - inf, or a softmax row whose every score is -inf"]
    facts = []
    factor = float((got * want).sum() / (want * want).sum().clamp_min(1e-30))
    if _close(got, factor * want):
        facts.append(f"it is the expected result times {factor:.4g}")
    d = got - want
    same = [name for a, name in enumerate(axes[:-1]) if got.shape[a] > 1 and _close(d, d.narrow(a, 0, 1).expand_as(d))]
    if same and not facts:
        facts.append(f"the difference is the same at every {' and every '.join(same)} (something added that does "
                     f"not depend on the {same[0]}?)")
    if len(axes) > 2 and not facts and not any(_moved(got, want, a) for a in range(len(axes) - 1)):
        rows = _moved(got.flatten(0, 1), want.flatten(0, 1), 0)  # rows moved across both leading axes at once
        if rows:
            n = got.shape[1]
            shown = ", ".join(f"({i // n}, {i % n}) holds ({j // n}, {j % n})" for i, j in
                              [(i, j) for i, j in rows.items() if i != j][:4])
            facts.append(f"its ({axes[0]}, {axes[1]}) rows are the expected ones in other places ({shown}, ...): a "
                         f"reshape where a transpose belongs?")
    for a, name in enumerate(axes[:-1]):
        moved = _moved(got, want, a)
        if moved and not facts:
            shown = ", ".join(f"{i}→{j}" for i, j in moved.items() if i != j)
            facts.append(f"its {name} entries are the expected ones in other places ({name} i holds what belongs "
                         f"at j: {shown})")
    for a, name in enumerate(axes):
        right = [i for i in range(got.shape[a]) if _close(got.select(a, i), want.select(a, i))]
        if 0 < len(right) < got.shape[a] and got.shape[a] > 1:
            wrong = [i for i in range(got.shape[a]) if i not in right]
            named = lambda ids: f"{name}{'' if len(ids) == 1 else 's'} {spans(ids)}"  # noqa: E731
            facts.append(f"{named(right)} {'is' if len(right) == 1 else 'are'} right, {named(wrong)} "
                         f"{'is' if len(wrong) == 1 else 'are'} not")
    diff = float((got - want).abs().max())
    facts.append(f"max abs difference {diff:.3g}, where the expected values reach {float(want.abs().max()):.3g}")
    return facts
