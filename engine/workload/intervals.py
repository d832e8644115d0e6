"""95% bootstrap intervals over a workload's requests, for its pooled acceptance figures.

The unit resampled is the request, not the cycle: cycles of one request share a prompt and a
context, so they are not independent draws, and resampling them would give intervals far too
narrow. Each resample draws as many requests as the group has, with replacement, and recomputes
the ratio of sums (accepted / drafted, 1 + accepted / drafts) exactly as the point estimate is
computed. Percentile intervals; a seeded random.Random keeps them reproducible.

May import: engine.trace.metrics (the one definition of each figure) and the standard library
(no numpy: 1000 resamples of 100 requests take milliseconds in plain Python).
"""
import random

from engine.trace.metrics import mean_acceptance_length

CONFIDENCE = 0.95


def quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the two nearest ranks of sorted `ordered` (numpy's default).
    Equal neighbours give that value exactly, so one request's interval is [x, x]."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def interval(samples: list[float]) -> list[float] | None:
    """The central CONFIDENCE range of the resampled values; None when none could be computed."""
    if not samples:
        return None
    ordered = sorted(samples)
    tail = (1 - CONFIDENCE) / 2
    return [quantile(ordered, tail), quantile(ordered, 1 - tail)]


def request_intervals(counts: list[tuple[int, int, int]], samples: int, seed: int) -> dict | None:
    """Intervals for acceptance_rate and mean_acceptance_length from each request's
    (drafts, drafted, accepted), drafts being its cycles that drafted. None with no request or no
    resample asked for."""
    if not counts or samples <= 0:
        return None
    rng = random.Random(seed)  # one generator per group: a category's interval does not depend on the others
    rates, lengths = [], []
    for _ in range(samples):
        drawn = rng.choices(counts, k=len(counts))
        drafts = sum(c for c, _, _ in drawn)
        drafted = sum(d for _, d, _ in drawn)
        accepted = sum(a for _, _, a in drawn)
        if drafted:  # a resample of requests that drafted nothing has no rate: left out, not 0
            rates.append(accepted / drafted)
        if drafts:
            lengths.append(mean_acceptance_length(accepted, drafts))
    return {"confidence": CONFIDENCE, "samples": samples,
            "acceptance_rate": interval(rates), "mean_acceptance_length": interval(lengths)}
