"""What differs between a reader's result and the expected one, in words: for the mistakes no catalogue names.

`differences(got, want, axes)` is the one fallback of every checker (expect_close) and of the drill
(drill.differ re-exports it). It looks, by structure only, for: the expected result under a known change
(times a factor, plus a constant, negated, its log, exp, square or square root, one minus it; transposed;
flipped, rolled or shifted by one along an axis; each row scaled by its own factor), a bool mask that is
another diagonal's triangle, entries that are right but in the wrong places, which indices along each
axis are right and which are not, and the size of the difference.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

__all__ = ["differences", "spans", "fitted"]

_FACTORS = {2.0: "2", 0.5: "1/2", 1 / math.log(2): "1/ln 2 = log2(e) (a log in base 2 where the natural log belongs?)",
            math.log(2): "ln 2 (a log in base 2, or exp2, where base e belongs?)"}


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.double(), b.double()
    same = (a == b) | (a.isnan() & b.isnan())
    return a.shape == b.shape and bool(((a - b).abs() <= 1e-5 * (1 + b.abs())).logical_or(same).all())


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


def fitted(produce: Callable[[float], torch.Tensor], got: torch.Tensor, lo: float = 1e-4, hi: float = 1e2,
           atol: float = 1e-4) -> float | None:
    """The c in [lo, hi] for which produce(c) equals got, if one does: the best of a log grid, then refined by a
    golden-section search; None when even the best does not match (within atol). For "your output is the
    reference with the scale / temperature / position factor c" by structure, whatever c the reader used."""
    err = lambda c: float((produce(c).double() - got.double()).abs().max())  # noqa: E731
    steps = max(2, round(20 * math.log10(hi / lo)))
    best = min((lo * (hi / lo) ** (k / steps) for k in range(steps + 1)), key=err)
    a, b = best / 10 ** 0.05, best * 10 ** 0.05
    for _ in range(40):
        x, y = b - (b - a) / 1.618, a + (b - a) / 1.618
        a, b = (a, y) if err(x) < err(y) else (x, b)
    c = (a + b) / 2
    return c if err(c) <= atol * (1 + float(got.double().abs().max())) else None


def _moved(got: torch.Tensor, want: torch.Tensor, axis: int) -> dict[int, int] | None:
    """{i: j} when every slice i of got along `axis` is slice j != i of want (some moved), else None."""
    n, found = got.shape[axis], {}
    for i in range(n):
        j = next((j for j in range(n) if _close(got.select(axis, i), want.select(axis, j))), None)
        if j is None:
            return None
        found[i] = j
    return found if any(i != j for i, j in found.items()) else None


def _transform(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """'it is the expected result <change>' when one elementwise change of want gives got."""
    finite = want.isfinite() & got.isfinite()
    if not finite.any() or want[finite].abs().max() == 0:
        return None
    g, w = got[finite], want[finite]  # a factor or an offset is read off the finite entries
    factor = float((g * w).sum() / (w * w).sum().clamp_min(1e-30))
    if _close(got, factor * want):
        known = next((w for f, w in _FACTORS.items() if abs(factor - f) < 1e-4 * f), None)
        return ("it is the expected result with the sign flipped (times -1)" if abs(factor + 1) < 1e-6 else
                f"it is the expected result times {known or f'{factor:.6g}'}")
    offset = float((g - w).mean())
    if abs(offset) > 1e-6 and _close(got, want + offset):
        return f"it is the expected result plus {offset:.4g} everywhere"
    with torch.no_grad():
        changes = {"1 minus the expected result": 1 - want, "the expected result squared": want ** 2,
                   "the log of the expected result": want.log(), "the exp of the expected result": want.exp(),
                   "the square root of the expected result": want.clamp_min(0).sqrt()}
    return next((f"it is {name}" for name, c in changes.items() if _close(got, c)), None)


def _rearranged(got: torch.Tensor, want: torch.Tensor, axes: Sequence[str]) -> str | None:
    """Transposed (the last two axes), flipped, rolled or shifted by one along one axis."""
    if got.dim() >= 2 and got.shape[-1] == got.shape[-2] and _close(got, want.transpose(-2, -1)):
        return f"it is the expected result transposed: ({axes[-2]}, {axes[-1]}) swapped"
    for a, name in enumerate(axes):
        n = got.shape[a]
        if n < 3:
            continue
        if _close(got, want.flip(a)):
            return f"it is the expected result reversed along the {name} axis"
        for k in (1, -1):
            inner = got.narrow(a, max(k, 0), n - 1), want.narrow(a, max(-k, 0), n - 1)
            if _close(*inner):
                return (f"it is the expected result shifted by one {name}: {name} i holds what belongs at "
                        f"{name} i {'-' if k > 0 else '+'} 1 (an off-by-one in an index or a slice)")
    return None


def _row_scaled(got: torch.Tensor, want: torch.Tensor, axes: Sequence[str]) -> str | None:
    """Every row (the last axis) is the expected row times its own factor: normalised differently."""
    if got.dim() < 2 or got.shape[-1] < 2:
        return None
    scale = (got * want).sum(-1, keepdim=True) / (want * want).sum(-1, keepdim=True).clamp_min(1e-30)
    if not _close(got, scale * want) or _close(scale, scale.flatten()[:1].expand_as(scale)):
        return None
    sums = got.sum(-1)
    return (f"each {axes[-2]}'s row is the expected one times its own factor ({float(scale.min()):.3g} to "
            f"{float(scale.max()):.3g}): the rows are normalised differently; yours sum to {float(sums.min()):.3g} "
            f"to {float(sums.max()):.3g}")


def _mask_facts(got: torch.Tensor, want: torch.Tensor, axes: Sequence[str]) -> list[str]:
    """For bool masks: another diagonal's triangle, and where True and False are wrong."""
    T, S = got.shape[-2:]
    if not got.any() or got.all():
        return [f"every entry is {bool(got.all())}: " + (f"no {axes[-2]} may see any {axes[-1]}" if not got.any() else
                                                       f"every {axes[-2]} sees every {axes[-1]}")]
    facts, ones = [], torch.ones(T, S, dtype=torch.bool)
    for name, tri in (("torch.tril", ones.tril), ("torch.triu", ones.triu)):
        k = next((k for k in sorted(range(-max(T, S), max(T, S) + 1), key=abs)
                  if torch.equal(got, tri(k).expand_as(got))), None)
        if k is not None:
            facts.append(f"it is {name}(ones({T}, {S}), diagonal={k}): {axes[-2]} i sees {axes[-1]}s j "
                         f"{'<=' if name == 'torch.tril' else '>='} i + ({k})")
            break
    if T == S and not facts:
        future = torch.ones(T, T, dtype=torch.bool).triu(1)  # key j > query i
        seen, allowed = (got & future).any(), (want & future).any()
        if seen and not allowed:
            facts.append(f"it lets {axes[-2]} i see {axes[-1]}s j > i, its future, at {int((got & future).sum())} "
                         f"entries" + (" and hides every j < i: torch.triu where torch.tril belongs" if
                                       not (got & ~future & ~torch.eye(T, dtype=torch.bool)).any() else ""))
    for shown, where in (("True where it should be False", got & ~want), ("False where it should be True", ~got & want)):
        idx = where.nonzero().tolist()
        if idx:
            first = ", ".join("(" + ", ".join(f"{a} {i}" for a, i in zip(axes, p)) + ")" for p in idx[:3])
            facts.append(f"{len(idx)} entr{'y is' if len(idx) == 1 else 'ies are'} {shown}: {first}"
                         + (", ..." if len(idx) > 3 else ""))
    return facts


def differences(got: torch.Tensor, want: torch.Tensor, axes: Sequence[str] | None = None) -> list[str]:
    """Facts about how got differs from want (same shape; axes names each dimension, default 'axis 0', ...),
    most telling first."""
    axes = list(axes) if axes is not None else [f"dim {a}" for a in range(got.dim())]
    if got.dtype == torch.bool and want.dtype == torch.bool and got.dim() >= 2:
        return _mask_facts(got, want, axes)
    got, want = got.detach().double(), want.detach().double()
    if torch.isnan(got).any() and not torch.isnan(want).any():
        where = torch.isnan(got).nonzero()[0].tolist()
        return [f"it contains NaN (first at {', '.join(f'{a} {i}' for a, i in zip(axes, where))}), where the expected "
                f"result has none: 0/0, inf - inf, or a softmax row whose every score is -inf"]
    facts = [f for f in (_transform(got, want), _rearranged(got, want, axes), _row_scaled(got, want, axes)) if f][:1]
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
            named = lambda ids: (f"{'index' if len(ids) == 1 else 'indices'} {spans(ids)} along {name}"  # noqa: E731
                                 if name.startswith("dim ") else f"{name}{'' if len(ids) == 1 else 's'} {spans(ids)}")
            facts.append(f"{named(right)} {'is' if len(right) == 1 else 'are'} right, {named(wrong)} "
                         f"{'is' if len(wrong) == 1 else 'are'} not")
    diff = float((got - want).abs().max())
    facts.append(f"max abs difference {diff:.3g}, where the expected values reach {float(want.abs().max()):.3g}")
    return facts
