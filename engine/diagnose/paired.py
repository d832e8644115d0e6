"""Paired comparisons of two runs of the same requests: the effect of one change, with a 95% interval
that treats the request as the independent unit.

Both arms ran the same requests with the same seeds, so request i of one arm and request i of the
other differ only by the change. A bootstrap draws requests with replacement, the same draw for both
arms, and recomputes each arm's ratio of sums on it; the effect's interval is the 2.5th to 97.5th
percentile of the differences (further out for a joint interval: `paired_effect`). Pairing removes
what the requests themselves contribute (a hard prompt is hard in both arms), so a small effect shows
where two unpaired intervals would overlap.
"""
from dataclasses import dataclass

import numpy as np

from engine.stats.timings import calibration_of, cycle_times
from engine.trace.metrics import drafted
from engine.workload.requests import RequestRun

CONFIDENCE = 0.95
SAMPLES = 4000  # enough draws for the tails of a joint interval (0.3% each for eight comparisons)


@dataclass(frozen=True)
class RequestCounts:
    """What one request's trace gives an arm's totals."""

    id: str
    category: str
    file: str
    drafted: int
    accepted: int
    cycles: int
    generated: int
    seconds: float  # the run's wall time (prefill included), from its summary
    committed: int = 0  # tokens the cycles committed
    step_seconds: float | None = None  # the cycles' time on the calibrated step times (`step_seconds`)


def step_seconds(trace) -> float | None:
    """The cycles' time rebuilt from the header's calibration: per cycle, its draft steps, a verify
    of its width, the catch-up step after a full accept, and the run's median per-cycle overhead.
    Step times measured once, in a short quiet burst, do not carry the load the machine had while
    this run went on, so two arms with different K compare on them where wall clocks may not.
    None without a calibration."""
    cal = calibration_of(trace.header)
    if cal is None:  # only the baseline and the depth arm are calibrated: the other arms need no timing here
        return None
    times = cycle_times(trace.cycles)
    if times is None:
        return None
    total = 0.0
    for c in trace.cycles:
        n = drafted(c)
        catch_up = cal.draft_step_s if n and c["num_accepted"] == n else 0.0
        total += n * cal.draft_step_s + cal.verify_time(n + 1) + catch_up + times.other_s
    return total


def counts_of(run: RequestRun) -> RequestCounts:
    cycles = run.trace.cycles
    summary = run.trace.summary or {}
    return RequestCounts(run.id, run.category, run.file, sum(drafted(c) for c in cycles),
                         sum(c["num_accepted"] for c in cycles), len(cycles), summary.get("num_generated", 0),
                         summary.get("wall_time_s", 0.0), sum(len(c["committed_token_ids"]) for c in cycles),
                         step_seconds(run.trace))


def acceptance_rate(rows: list[RequestCounts]) -> float | None:
    drafted_tokens = sum(r.drafted for r in rows)
    return sum(r.accepted for r in rows) / drafted_tokens if drafted_tokens else None


def tokens_per_s(rows: list[RequestCounts]) -> float | None:
    seconds = sum(r.seconds for r in rows)
    return sum(r.generated for r in rows) / seconds if seconds > 0 else None


def step_tokens_per_s(rows: list[RequestCounts]) -> float | None:
    """Committed tokens per second of the cycles on the calibrated step times (None if any lacks them)."""
    if any(r.step_seconds is None for r in rows):
        return None
    seconds = sum(r.step_seconds for r in rows)
    return sum(r.committed for r in rows) / seconds if seconds > 0 else None


MEASURES = {"acceptance_rate": acceptance_rate, "tokens_per_s": tokens_per_s, "step_tokens_per_s": step_tokens_per_s}


# Each measure is a ratio of two per-request sums: (numerator, denominator) fields of RequestCounts.
RATIOS = {"acceptance_rate": ("accepted", "drafted"), "tokens_per_s": ("generated", "seconds"),
          "step_tokens_per_s": ("committed", "step_seconds")}


@dataclass(frozen=True)
class Effect:
    """One measure in both arms, their difference (variant - baseline) and its interval."""

    measure: str
    baseline: float | None
    variant: float | None
    difference: float | None
    interval: tuple[float, float] | None
    joint: int = 1  # comparisons whose intervals hold together 95% of the time (each at 1 - 0.05 / joint)

    @property
    def found(self) -> bool:
        """The interval excludes zero: the change made a difference these requests can tell."""
        return self.interval is not None and (self.interval[0] > 0 or self.interval[1] < 0)

    def interval_words(self, digits: int) -> str:
        name = "95% joint interval" if self.joint > 1 else "95% interval"
        return f"{name} {self.interval[0]:+.{digits}f} to {self.interval[1]:+.{digits}f}"


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (what numpy's default does)."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def resampled_ratios(rows: list[RequestCounts], measure: str, picks: np.ndarray) -> np.ndarray:
    """The measure on each bootstrap draw of requests; NaN where a draw's denominator is 0."""
    top, bottom = RATIOS[measure]
    num = np.array([getattr(r, top) for r in rows], dtype=np.float64)[picks].sum(axis=1)  # (samples,)
    den = np.array([getattr(r, bottom) for r in rows], dtype=np.float64)[picks].sum(axis=1)
    return np.divide(num, den, out=np.full_like(num, np.nan), where=den > 0)


def paired_effect(measure: str, baseline: list[RequestCounts], variant: list[RequestCounts],
                  samples: int = SAMPLES, seed: int = 0, joint: int = 1) -> Effect:
    """The effect of the change on `measure`, the requests matched by id (both arms must hold the same).
    With `joint` comparisons in one report, each interval is at 1 - 0.05 / joint (Bonferroni), so
    that all of them hold together at 95%: a report of eight experiments would otherwise show an
    effect that is not there about one time in three."""
    if [r.id for r in baseline] != [r.id for r in variant]:
        raise ValueError("a paired comparison needs the same requests, in the same order, in both arms")
    f = MEASURES[measure]
    a, b = f(baseline), f(variant)
    if a is None or b is None:
        return Effect(measure, a, b, None, None, joint)
    # the same draw of requests for both arms: that is what pairs them
    picks = np.random.default_rng(seed).integers(0, len(baseline), size=(samples, len(baseline)))  # (samples, n)
    draws = resampled_ratios(variant, measure, picks) - resampled_ratios(baseline, measure, picks)
    draws = draws[~np.isnan(draws)].tolist()
    tail = (1 - CONFIDENCE) / joint / 2
    interval = (percentile(draws, tail), percentile(draws, 1 - tail)) if draws else None
    return Effect(measure, a, b, b - a, interval, joint)
