"""A server's metrics in this project's terms, computed with engine/stats/analysis.py's functions.

Alpha from the per-position curve: under the i.i.d. model each draft token passes with alpha,
so position i is accepted with a_i = alpha^i and log a_i = i log alpha, a line through the
origin (a_0 = 1: every cycle reaches position 0). alpha is the least-squares slope of that
line, exp(sum(i log a_i) / sum(i^2)), over the positions before the first a_i of 0. This uses
every position, where alpha = a_1 would use one, and weighs later positions more, which
matters because those decide whether a large K pays. Without a curve, alpha is the value at
which (1 - alpha^(K+1)) / (1 - alpha) equals the server's mean acceptance length.

A record of zero drafts has no acceptance at all: its rates are NothingDrafted (0/0), not 0, and
the report says why a server drafts nothing instead of advising on an alpha of 0.
"""
import math
from dataclasses import dataclass, field

from engine.servers.server_metrics import (
    NOTHING_DRAFTED,
    NothingDrafted,
    ServerMetrics,
    ServerMetricsError,
    drafted_nothing,
    shown,
)
from engine.stats.analysis import (
    Calibration,
    KAdvice,
    TraceStats,
    advice_sentence,
    advise_k,
    advisor_ks,
    best_k,
    cost_ratio,
    predicted_per_position,
    refined_speedup,
    verify_in_steps,
)
from engine.trace.metrics import expected_tokens_per_cycle, predicted_speedup
from engine.trace.schema import MAX_K

COLLAPSE = 0.5  # a position whose conditional acceptance falls below half the first one's "collapses"
LOW_ALPHA = 0.5
NOTHING_WHY = ("the server drafted nothing in this window (0 drafts), so there is no acceptance to explain and "
               "no K to advise: no requests reached it, speculative decoding is off, or the same scrape was given "
               "twice; take the second scrape after the server has served requests")


@dataclass(frozen=True)
class Costs:
    """What a cycle costs, in target decode steps: c per draft step, verify_steps per verify pass."""

    c: float
    verify_steps: float  # one verify pass over K+1 positions / one target step
    source: str  # where c and the verify cost came from, in words
    calibration: Calibration  # the curve the K advisor reads (a flat one for entered costs)


def entered_costs(c: float, verify_steps: float = 1.0) -> Costs:
    """Costs the user enters: verify taken as verify_steps at every width (flat, as a GPU's verify
    of a few positions, memory-bound, nearly is), so the advisor may consider every K."""
    if not (math.isfinite(c) and c > 0 and math.isfinite(verify_steps) and verify_steps > 0):
        raise ServerMetricsError("c and the verify cost must be positive numbers")
    widths = list(range(2, MAX_K + 2))
    cal = Calibration(0, 1.0, c, widths, [verify_steps] * len(widths))
    return Costs(c, verify_steps, f"entered: c = {c:g}, verify = {verify_steps:g} target steps at every K", cal)


def calibrated_costs(cal: Calibration, k: int) -> Costs:
    """A calibrated trace's step times: this machine's c and verify curve, not the server's."""
    return Costs(cost_ratio(cal.draft_step_s, cal.target_step_s), verify_in_steps(cal, k + 1),
                 "from the open trace's calibration (this project's pair on its machine)", cal)


def overhead_costs(draft_overhead: float, k: int, verify_steps: float = 1.0) -> Costs | None:
    """TensorRT-LLM's draftOverhead f is K c / (K c + verify): so c = f verify / (K (1 - f))."""
    if not 0 < draft_overhead < 1:
        return None
    c = draft_overhead * verify_steps / (k * (1 - draft_overhead))
    costs = entered_costs(c, verify_steps)
    return Costs(c, verify_steps, f"from TensorRT-LLM's draftOverhead {draft_overhead:.3f}, verify taken as "
                 f"{verify_steps:g} target steps", costs.calibration)


@dataclass(frozen=True)
class ServerReport:
    """The record in our terms; the rates, the curves and alpha are NOTHING_DRAFTED when it holds no draft."""

    metrics: ServerMetrics
    k: int | None
    acceptance_rate: float | NothingDrafted | None
    mean_acceptance_length: float | NothingDrafted | None
    per_position: list[float] | NothingDrafted | None
    conditional: list[float] | NothingDrafted | None  # a_i / a_(i-1): the chance position i passes once i-1 has
    alpha: float | NothingDrafted | None
    alpha_how: str
    expected_tokens: float | NothingDrafted | None  # what alpha predicts a cycle commits
    costs: Costs | None
    leviathan: float | None
    refined: float | None
    advice: list[KAdvice]
    limits: list[str]
    derived: list[str] = field(default_factory=list)  # numbers computed from others, not read

    @property
    def nothing_drafted(self) -> bool:
        return self.acceptance_rate is NOTHING_DRAFTED


def alpha_from_curve(per_position: list[float]) -> float | None:
    """Least-squares slope of log a_i on i through the origin (module docstring); None without a curve."""
    points = []
    for i, a in enumerate(per_position, start=1):
        if a <= 0:
            break
        points.append((i, math.log(min(a, 1.0))))
    if not per_position:
        return None
    if not points:
        return 0.0
    return math.exp(sum(i * y for i, y in points) / sum(i * i for i, _ in points))


def alpha_from_length(length: float, k: int) -> float:
    """The alpha at which expected_tokens_per_cycle(alpha, K) = length (bisection: it rises with alpha)."""
    if length >= k + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens_per_cycle(mid, k) < length else (low, mid)
    return (low + high) / 2


def conditional_rates(per_position: list[float]) -> list[float]:
    out, before = [], 1.0
    for a in per_position:
        out.append(a / before if before > 0 else 0.0)
        before = a
    return out


def acceptance_of(m: ServerMetrics, k: int | None) -> tuple[float | None, float | None, list[str]]:
    """Acceptance rate and mean acceptance length: from the counts, else as reported, else one from the other."""
    derived = []
    rate = m.accepted_tokens / m.draft_tokens if m.accepted_tokens is not None and m.draft_tokens else m.acceptance_rate
    length = 1 + m.accepted_tokens / m.drafts if m.accepted_tokens is not None and m.drafts else m.acceptance_length
    if rate is None and length is not None and k:
        rate = min(1.0, (length - 1) / k)
        derived.append("acceptance rate = (mean acceptance length - 1) / K")
    if length is None and rate is not None and k:
        length = 1 + rate * k
        derived.append("mean acceptance length = 1 + acceptance rate x K")
    return rate, length, derived


def explain(m: ServerMetrics, k: int | None = None, costs: Costs | None = None,
            verify_steps: float = 1.0) -> ServerReport:
    """The record in our terms; `k` overrides the record's K (the gauges give none)."""
    k = k or m.k
    if drafted_nothing(m):
        return nothing_drafted_report(m, k)
    rate, length, derived = acceptance_of(m, k)
    alpha, how = None, "needs per-position acceptance, or a mean acceptance length and K"
    if m.per_position:
        alpha, how = alpha_from_curve(m.per_position), "least-squares fit of log a_i = i log alpha (per-position curve)"
    elif length is not None and k:
        alpha, how = alpha_from_length(length, k), "the alpha whose expected tokens per cycle equal the mean acceptance length"
    if costs is None and m.draft_overhead is not None and k:
        costs = overhead_costs(m.draft_overhead, k, verify_steps)
    ready = alpha is not None and k
    lev = predicted_speedup(alpha, k, costs.c) if ready and costs else None
    ref = refined_speedup(alpha, k, 1.0, costs.c, costs.verify_steps) if ready and costs else None
    advice = advise_k(alpha, costs.c * costs.calibration.target_step_s, costs.calibration,
                      advisor_ks(costs.calibration, k)) if ready and costs else []
    conditional = conditional_rates(m.per_position) if m.per_position else None
    report = ServerReport(m, k, rate, length, m.per_position, conditional, alpha, how,
                          expected_tokens_per_cycle(alpha, k) if ready else None, costs, lev, ref, advice, [], derived)
    return ServerReport(**{**report.__dict__, "limits": limits_of(report)})


def nothing_drafted_report(m: ServerMetrics, k: int | None) -> ServerReport:
    """Zero drafts: every rate is 0/0, so no alpha, no prediction, no advice; only why that may be."""
    nothing = NOTHING_DRAFTED
    return ServerReport(m, k, nothing, nothing, nothing, nothing, nothing,
                        "nothing drafted: alpha needs drafts the server verified", nothing, None, None, None, [],
                        [NOTHING_WHY])


def limits_of(r: ServerReport) -> list[str]:
    """Plain words on what limits this server: alpha, c, K too high, acceptance collapsing."""
    out = []
    if r.alpha is not None and r.alpha < LOW_ALPHA:
        out.append(f"alpha: each draft token passes with about {r.alpha:.2f}, so most cycles end within the first "
                   "position or two; a draft that agrees better with the target (or one trained on this traffic) "
                   "is what would help.")
    if r.costs and r.k and r.alpha is not None:
        if r.k * r.costs.c >= r.costs.verify_steps:
            out.append(f"c: drafting K={r.k} tokens costs {r.k * r.costs.c:.2f} target steps, as much as the verify "
                       f"pass ({r.costs.verify_steps:.2f}); a cheaper draft would pay.")
        elif r.alpha <= r.costs.c:
            out.append(f"c: alpha {r.alpha:.2f} is not above c {r.costs.c:.2f}, and at K=1 speculation pays only "
                       "when alpha > c.")
    if r.advice and r.k:
        best = best_k(r.advice)
        if best.k < r.k:
            at = f" position {best.k + 1} is accepted in {r.per_position[best.k]:.0%} of cycles, and" \
                if r.per_position and len(r.per_position) > best.k else ""
            out.append(f"K too high: the advisor would pick K={best.k}, not {r.k};{at} each position beyond it "
                       "costs a draft step and rarely commits a token.")
        if best.refined < 1:
            out.append(f"no K pays off at these costs: the best, K={best.k}, is predicted at {best.refined:.2f}x "
                       "plain decoding.")
    collapse = collapse_position(r.conditional)
    if collapse is not None:
        out.append(f"acceptance collapses after position {collapse}: a token past it passes in only "
                   f"{r.conditional[collapse]:.0%} of the cycles that reach it, against {r.conditional[0]:.0%} "
                   "at position 1, so alpha^i overstates the later positions (the draft drifts as it runs ahead).")
    if not out and r.alpha is not None:
        out.append("nothing stands out: alpha, c and K fit together" if r.costs else
                   "acceptance alone shows no limit; enter c (or open a calibrated trace) to weigh the cost side")
    return out


def collapse_position(conditional: list[float] | None) -> int | None:
    """The last position before the first whose conditional rate falls below COLLAPSE x position 1's."""
    if not conditional or conditional[0] <= 0:
        return None
    for i, rate in enumerate(conditional[1:], start=1):
        if rate < COLLAPSE * conditional[0]:
            return i
    return None


def advice_words(r: ServerReport) -> str | None:
    return advice_sentence(r.advice) if r.advice else None


def predicted_curve(r: ServerReport) -> list[float] | NothingDrafted | None:
    if r.nothing_drafted:
        return NOTHING_DRAFTED
    return predicted_per_position(r.alpha, r.k) if r.alpha is not None and r.k else None


def comparison_rows(r: ServerReport, trace: TraceStats | None) -> list[dict]:
    """The server's numbers beside one trace's, quantity by quantity (None where one side has none)."""
    def fmt(x, spec=".3f"):
        return None if x is None else shown(x, spec)
    t = trace.acceptance if trace else {}
    rows = [("K", r.k, trace.k if trace else None, "d"),
            ("draft acceptance rate", r.acceptance_rate, t.get("acceptance_rate"), ".3f"),
            ("mean acceptance length", r.mean_acceptance_length, t.get("mean_acceptance_length"), ".3f"),
            (f"alpha ({r.alpha_how})", r.alpha,
             alpha_from_curve(t["per_position_acceptance"]) if trace and isinstance(r.per_position, list) else None,
             ".3f"),
            ("alpha: mean beta (a trace records it; a server cannot)", None, trace.alpha if trace else None, ".3f"),
            ("expected tokens per cycle (from alpha)", r.expected_tokens,
             expected_tokens_per_cycle(trace.alpha, trace.k) if trace else None, ".3f")]
    return [{"quantity": name, "server": fmt(s, spec), "trace": fmt(tr, spec)} for name, s, tr, spec in rows]
