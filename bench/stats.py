"""How the benchmarks report repeated measurements: median, min and max of at least 5 runs."""

from __future__ import annotations

import statistics
from typing import Sequence

from attrs import frozen

MIN_RUNS = 5
"""Fewer runs than this are flagged in the report (a median of 1-2 runs says little)."""


@frozen
class Spread:
    """The runs of one measurement."""

    runs: tuple[float, ...]

    @classmethod
    def of(cls, runs: Sequence[float]) -> "Spread":
        return cls(tuple(runs))

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def low(self) -> float:
        return min(self.runs)

    @property
    def high(self) -> float:
        return max(self.runs)

    def show(self, fmt: str = ".2f", unit: str = "") -> str:
        """``1.23 (1.20-1.31, n=5)``; ``n=2!`` when there were fewer than :data:`MIN_RUNS`."""
        n = f"n={len(self.runs)}" + ("!" if len(self.runs) < MIN_RUNS else "")
        return (f"{self.median:{fmt}}{unit} ({self.low:{fmt}}-{self.high:{fmt}}{unit}, {n})")
