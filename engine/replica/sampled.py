"""A sampled server workload against its replica, in aggregate.

At temperature > 0 the server and the replica draw from different random generators, so their tokens,
and with them their steps, part at once: nothing is compared step by step. Instead both runs' drafting
steps are pooled and compared per draft position i = 1..K by conditional acceptance, the project's one
definition (engine/servers/request_stats.py `conditional_acceptance`): of the steps that drafted
position i and accepted every position before it (reached), the share that accepted i too. Steps that
drafted nothing are no drafts (vLLM does not count them), so they are in no count.

Each side's rate gets a 95% Wilson score interval, and the two sides a pooled two-proportion z test.
Both treat every step as an independent trial. Steps of one request share its prompt and context, so
they are not: the intervals are too narrow by an unknown factor and the test too eager; read them as
approximate. The overall acceptance rate and mean acceptance length take the workload statistics'
request-level bootstrap instead (engine/workload/intervals.py), which resamples whole requests.

Loads no torch; the app reads what this computes back through comparison.py.
"""
import math
from collections import Counter
from dataclasses import dataclass

from engine.replica.align import Step
from engine.servers.request_stats import conditional_acceptance
from engine.trace.metrics import mean_acceptance_length
from engine.workload.intervals import request_intervals

Z95 = 1.959963984540054  # the standard normal's 0.975 quantile: a two-sided 95% interval
LEVEL = 0.05  # a position's rates "differ" when the two-proportion test's p-value is below this
BOOTSTRAP_SAMPLES = 1000  # as the workload statistics resample (engine/workload/stats.py)
BOOTSTRAP_SEED = 0
SIDES = ("server", "replica")


def wilson(successes: int, trials: int, z: float = Z95) -> list[float] | None:
    """[low, high]: the Wilson score interval of a binomial proportion; None with no trial.

    The proportions p whose score test |p_hat - p| / sqrt(p (1 - p) / n) <= z does not reject, that is
    the roots of (1 + z^2/n) p^2 - (2 p_hat + z^2/n) p + p_hat^2 = 0. Unlike p_hat +- z sqrt(p_hat (1 - p_hat) / n)
    it is never empty at 0/n or n/n and never leaves [0, 1]."""
    if trials <= 0:
        return None
    if not 0 <= successes <= trials:
        raise ValueError(f"{successes} successes in {trials} trials")
    p, zz = successes / trials, z * z / trials
    centre = (p + zz / 2) / (1 + zz)
    half = z * math.sqrt(p * (1 - p) / trials + zz / (4 * trials)) / (1 + zz)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the edges, where rounding would leave 1e-17
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return [low, high]


def two_proportions(x1: int, n1: int, x2: int, n2: int) -> tuple[float, float] | None:
    """(z, two-sided p-value) of the pooled two-proportion z test of x1/n1 against x2/n2; None when a side
    has no trial. Both sides all successes (or none): nothing tells them apart, z 0 and p 1."""
    if n1 <= 0 or n2 <= 0:
        return None
    pooled = (x1 + x2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:
        return 0.0, 1.0
    z = (x1 / n1 - x2 / n2) / se
    return z, math.erfc(abs(z) / math.sqrt(2))


def overlap(a: list[float] | None, b: list[float] | None) -> bool | None:
    return None if a is None or b is None else a[0] <= b[1] and b[0] <= a[1]


def side_cell(accepted: int, reached: int) -> dict:
    return {"accepted": accepted, "reached": reached, "rate": accepted / reached if reached else None,
            "interval": wilson(accepted, reached)}


def position_row(position: int, server: tuple[int, int], replica: tuple[int, int]) -> dict:
    """One position: each side's (accepted, reached), rate and interval, and the two held against each other."""
    s, r = side_cell(*server), side_cell(*replica)
    test = two_proportions(s["accepted"], s["reached"], r["accepted"], r["reached"])
    return {"position": position, "server": s, "replica": r, "intervals_overlap": overlap(s["interval"], r["interval"]),
            "z": None if test is None else test[0], "p_value": None if test is None else test[1],
            "differ": None if test is None else test[1] < LEVEL}


def step_counts(steps: list[Step]) -> Counter:
    """(drafted, accepted) -> steps, the drafting steps only (request_stats.py's shape)."""
    return Counter((s.drafted, s.accepted) for s in steps if s.drafted)


def position_rows(server: list[Step], replica: list[Step], k: int) -> list[dict]:
    s, r = conditional_acceptance(step_counts(server), k), conditional_acceptance(step_counts(replica), k)
    return [position_row(i + 1, (a["accepted"], a["reached"]), (b["accepted"], b["reached"]))
            for i, (a, b) in enumerate(zip(s, r, strict=True))]


@dataclass(frozen=True)
class SampledRequest:
    """One request's drafting steps on each side, counted (the steps themselves part at once)."""

    id: str
    server_steps: int
    server_draft_tokens: int
    server_accepted_tokens: int
    replica_drafting_cycles: int
    replica_draft_tokens: int
    replica_accepted_tokens: int

    def counts(self, side: str) -> tuple[int, int, int]:
        """(drafts, drafted, accepted) of one side, as engine/workload/intervals.py resamples them."""
        if side == "server":
            return self.server_steps, self.server_draft_tokens, self.server_accepted_tokens
        return self.replica_drafting_cycles, self.replica_draft_tokens, self.replica_accepted_tokens


def sampled_request(rid: str, server: list[Step], replica: list[Step]) -> SampledRequest:
    s, r = [x for x in server if x.drafted], [x for x in replica if x.drafted]
    return SampledRequest(rid, len(s), sum(x.drafted for x in s), sum(x.accepted for x in s),
                          len(r), sum(x.drafted for x in r), sum(x.accepted for x in r))


def overall_side(counts: list[tuple[int, int, int]]) -> dict:
    """A side's pooled acceptance rate and mean acceptance length (ratios of sums, engine/trace/metrics.py),
    each with the request-level bootstrap interval."""
    drafts, drafted, accepted = (sum(c[j] for c in counts) for j in range(3))
    iv = request_intervals(counts, BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED) or {}
    return {"requests": len(counts), "drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "acceptance_rate_interval": iv.get("acceptance_rate"),
            "mean_acceptance_length": mean_acceptance_length(accepted, drafts),
            "mean_acceptance_length_interval": iv.get("mean_acceptance_length")}


def overall(requests: list[SampledRequest]) -> dict:
    return {side: overall_side([r.counts(side) for r in requests]) for side in SIDES}


@dataclass(frozen=True)
class SampledComparison:
    """What replica.json holds for a sampled server workload (comparison.py writes and reads it)."""

    sampling: dict  # {"temperature", "top_p", "seed"}: the server's, which the replica ran with
    requests: list[SampledRequest]
    positions: list[dict]  # position_row's, i = 1..K
    overall: dict  # {"server": overall_side, "replica": overall_side}


def compare_sampled(sampling: dict, requests: list[SampledRequest], server: list[Step], replica: list[Step],
                    k: int) -> SampledComparison:
    """`server` and `replica`: every request's steps, pooled."""
    return SampledComparison(sampling, list(requests), position_rows(server, replica, k), overall(requests))
