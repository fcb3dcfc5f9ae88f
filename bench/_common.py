"""What every benchmark script shares: a result row, paired measurement, the table, the command line."""
from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass, field
from typing import Callable, Iterable


@dataclass
class Row:
    """One printed figure: its median, target, ratio and the raw per-repeat samples."""

    figure: str
    median: float
    unit: str  # "ptr/s", "samples/s", "rows/s", "tok/s", "1/s", "s", "B", "MB", "n", "samples" or "x"
    target: str = ""
    ratio: float | None = None
    ok: bool | None = None
    samples: list[float] = field(default_factory=list)


def paired(repeats: int, *measures: Callable[[], float]) -> list[list[float]]:
    """Run the measures back to back ``repeats`` times after one untimed warm-up round, in an
    order drawn anew every other round (seeded) and reversed in the round after it, so that no
    measure always runs first, last or after the same one (with two, they alternate).

    Returns one list of samples per measure, in round order.
    """
    for measure in measures:
        measure()
    samples: list[list[float]] = [[] for _ in measures]
    n = len(measures)
    for r in range(repeats):
        order = random.Random(r // 2).sample(range(n), n)
        for k in order if r % 2 == 0 else order[::-1]:
            samples[k].append(measures[k]())
    return samples


def median_ratio(numerators: list[float], denominators: list[float]) -> float:
    """Median of the per-repeat ratios."""
    return statistics.median(n / d for n, d in zip(numerators, denominators))


def show(value: float, unit: str) -> str:
    """A value with a readable unit."""
    if unit in ("ptr/s", "samples/s", "rows/s", "tok/s"):
        return f"{value / 1e6:.2f} M {unit}"
    if unit == "1/s":
        return f"{value / 1e3:,.0f} k/s"
    if unit == "s":
        return f"{value * 1e3:.2f} ms" if value >= 1e-3 else f"{value * 1e6:.1f} us"
    if unit == "B":
        return f"{value:,.1f} B"
    if unit == "n":
        return f"{value:,.0f}"
    if unit == "samples":
        return f"{value:,.2f} samples"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.1f} MB"


def table(rows: list[Row]) -> str:
    """The rows as an aligned text table."""
    marks = {True: "PASS", False: "MISS", None: ""}
    lines = [f"{'figure':<48} {'median':>18}  {'target':<20} {'ratio':>8}  ok", "-" * 104]
    for row in rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.1%}"
        lines.append(f"{row.figure:<48} {show(row.median, row.unit):>18}  {row.target:<20} {ratio:>8}  "
                     f"{marks[row.ok]}")
    return "\n".join(lines)


def arguments(doc: str, sections: Iterable[str]) -> argparse.Namespace:
    """``--quick``, ``--only SECTION`` (repeatable) and ``--json PATH``, described by ``doc``'s first line."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--only", choices=list(sections), action="append", help="run only this section (repeatable)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return parser.parse_args()
