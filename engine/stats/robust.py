"""Medians and their spread: the statistics a speed figure is built from.

One stalled cycle (another process took the core for a second) moves a mean over forty
cycles by tens of percent and a median not at all, so every time-based number the app
and the CLI show (c, verify cost, the measured speedup) is a median over cycles, shown
with the middle half of the values around it.
"""
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """A median and the quartiles around it (low: 25th percentile, high: 75th)."""

    median: float
    low: float
    high: float

    def scaled(self, factor: float) -> "Spread":
        """The same spread in other units (factor > 0 keeps low <= high)."""
        return Spread(self.median * factor, self.low * factor, self.high * factor)

    def words(self, fmt: str = ".2f", unit: str = "") -> str:
        """'1.23x (middle half 1.10x-1.31x)': how a page shows a median with its spread."""
        return f"{self.median:{fmt}}{unit} (middle half {self.low:{fmt}}{unit}–{self.high:{fmt}}{unit})"


def spread_of(values: list[float]) -> Spread:
    """Median and quartiles of `values` (at least one). The inclusive method keeps the
    quartiles inside the observed range, which matters for the few cycles of a short trace."""
    if len(values) == 1:
        return Spread(values[0], values[0], values[0])
    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return Spread(median, low, high)
