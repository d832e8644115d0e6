"""Timings a user can trust: warm up, repeat, report the middle and the spread.

One timing on a shared CPU says little: another process can take the core for a few
milliseconds at any moment. So every time the app shows is the median of several
repeats after a warm-up, and it carries its spread. When the repeats disagree by more
than MAX_SPREAD the number is flagged (`trustworthy` is False) and the app says so in
words instead of presenting it as a measurement.
"""
import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from engine.models.device import timed

MAX_SPREAD = 0.30  # repeats whose interquartile range exceeds 30% of their median are not trusted


@dataclass(frozen=True)
class Repeated:
    """Seconds of one measured thing over several repeats (warm-up excluded)."""

    times_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def low_s(self) -> float:
        """Lower quartile (the fastest repeat when there are fewer than 4)."""
        return _quartiles(self.times_s)[0]

    @property
    def high_s(self) -> float:
        return _quartiles(self.times_s)[1]

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median: 0.1 means the middle half of the repeats
        lies within 10% of the median's size."""
        return (self.high_s - self.low_s) / self.median_s if self.median_s > 0 else float("inf")

    @property
    def trustworthy(self) -> bool:
        return len(self.times_s) >= 3 and self.spread <= MAX_SPREAD

    def describe(self, unit: float = 1e3, suffix: str = "ms") -> str:
        """'4.21 ms (middle half 4.0-4.4, spread 9%, 7 repeats)'."""
        return (f"{self.median_s * unit:.2f} {suffix} (middle half {self.low_s * unit:.2f}-{self.high_s * unit:.2f}, "
                f"spread {self.spread:.0%}, {len(self.times_s)} repeats)")


def _quartiles(times: tuple[float, ...]) -> tuple[float, float]:
    if len(times) < 4:
        return min(times), max(times)
    q = statistics.quantiles(times, n=4, method="inclusive")
    return q[0], q[2]


def repeat_timed(fn: Callable[[], None], repeats: int = 7, warmup: int = 1,
                 device: torch.device | None = None) -> Repeated:
    """Run `fn` warmup times untimed, then `repeats` times, each timed by engine.models.device.timed
    (which waits for `device`'s queued work, e.g. CUDA kernels, before reading the clock)."""
    for _ in range(warmup):
        fn()
    return Repeated(tuple(timed(fn, device)[1] for _ in range(repeats)))


def repeated_values(values: list[float]) -> Repeated:
    """The same summary over values measured elsewhere (e.g. one calibration per repeat)."""
    return Repeated(tuple(values))


def disagreement_words(name: str, predicted: float, measured: float, noise: float) -> str | None:
    """A sentence when a prediction and a measurement differ by more than the measurement's
    relative noise (at least 5%); None when they agree within it."""
    if measured <= 0:
        return None
    gap = abs(predicted - measured) / measured
    allowed = max(noise, 0.05)
    if gap <= allowed:
        return None
    direction = "above" if predicted > measured else "below"
    return (f"{name}: the prediction ({predicted:.2f}) is {gap:.0%} {direction} the measurement ({measured:.2f}), "
            f"more than the measurement's noise ({allowed:.0%}). Something the prediction leaves out matters "
            "on this machine (overheads outside the draft steps and the verify pass, or a busy CPU).")


def disagreeing(measured: dict[str, Repeated], limit: float = MAX_SPREAD) -> dict[str, Repeated]:
    """The named measurements whose repeats disagree by more than `limit`: too noisy to show."""
    return {name: r for name, r in measured.items() if r.spread > limit}


def widest_spread(measured: dict[str, Repeated]) -> tuple[str, float]:
    """The measurement whose repeats disagree most (the first such, in order), and its spread."""
    name = max(measured, key=lambda n: measured[n].spread)
    return name, measured[name].spread


def untrustworthy_widths(times: list[Repeated]) -> list[int]:
    """The widths (1, 2, ...: times[n - 1] timed a pass over n positions) whose repeats are not trustworthy."""
    return [n for n, t in enumerate(times, start=1) if not t.trustworthy]


def width_cost_ratio(times: list[Repeated], positions: int) -> float:
    """A pass over `positions` positions in passes over one, from the medians (times[n - 1]: n positions)."""
    return times[positions - 1].median_s / times[0].median_s
