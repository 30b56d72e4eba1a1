"""The `make bench` table: one Row per measure, ours / reference, printed as one Markdown table.

The ratios come from attnlib.timing.time_ratio (side by side, alternating rounds, median), which
chapter 9 uses too.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Row", "print_table"]


@dataclass(frozen=True)
class Row:
    """One line of the `make bench` table. `ratio` is ours / reference (lower is better unless
    `higher_is_better`); `target` is the bound the issue asks for, None for a ratio measured to be
    reported, with no bound asked of it."""

    measure: str
    ours: str
    reference: str
    ratio: float
    target: float | None
    higher_is_better: bool = False

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.ratio >= self.target if self.higher_is_better else self.ratio <= self.target


def print_table(rows: list[Row]) -> None:
    """Print rows as a Markdown table: measure, ours, reference, ratio, target, met."""
    print("| measure | ours | reference | ratio | target | met |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        bound = "none" if row.target is None else f"{'>=' if row.higher_is_better else '<='} {row.target:g}"
        met = "n/a" if row.met is None else "yes" if row.met else "NO"
        print(f"| {row.measure} | {row.ours} | {row.reference} | {row.ratio:.2f} | {bound} | {met} |")
