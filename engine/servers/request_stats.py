"""A server's per-request metrics in the shape of a workload's statistics (engine/workload/stats.py).

`requests_stats(reqs)` returns one JSON-serialisable dict:
{"source", "requests", "k", "median_acceptance_rate", "categories": {NAME: GROUP}, "overall": GROUP,
 "per_request": [ROW], "notes": [str], "what_a_trace_adds": [str]}, where GROUP is
{"requests", "k", "cycles", "draft_tokens", "accepted_tokens", "acceptance_rate",
 "mean_acceptance_length", "conditional_acceptance", "accepted_histogram"} and ROW is
{"id", "category", "cycles", "draft_tokens", "accepted_tokens", "acceptance_rate",
 "mean_acceptance_length", "accepted_histogram", "accepted_per_cycle", "below_median"}.

The definitions are vLLM V1's, as the workload's (engine/trace/metrics.py): acceptance rate = accepted /
drafted, mean acceptance length = 1 + accepted / drafts, ratios of sums (a long request weighs by its
steps). A server's steps are its drafts: vLLM counts no step that drafted nothing ("cycles" here).
Whatever the input does not carry is None, never 0; no probability is ever here (servers report
counts only). Conditional acceptance by position comes from the step counts: of the steps that
drafted position i and accepted every position before it, the share that accepted i too; with
only a histogram, every step is taken to have drafted K positions (a note says so).

May import: engine.servers and the standard library (never engine.workload: it reads traces).
"""
from collections import Counter
from statistics import median

from engine.servers.server_metrics import ServerMetrics, ServerRequest, ServerRequests, per_position_rates
from engine.trace.metrics import mean_acceptance_length

GROUP_KEYS = ("requests", "k", "cycles", "draft_tokens", "accepted_tokens", "acceptance_rate",
              "mean_acceptance_length", "conditional_acceptance", "accepted_histogram")
UNCATEGORISED = "uncategorised"  # engine/workload's word for a request whose input names no category

WHAT_A_TRACE_ADDS = [
    "per-token probabilities (p_target and p_draft of every drafted token): alpha measured as "
    "E[min(1, p_target / p_draft)] instead of fitted to counts, and where acceptance is lost told token by token",
    "the uniform draws u each test compared with p_target / p_draft, so every accept or reject can be replayed",
    "the rejected draft tokens and the target's resampled replacements: what the drafter got wrong, not just how often",
    "the context (KV cache) length at every cycle, so acceptance can be read against context length",
    "timings per cycle (each draft step, the verify pass), so the cost ratio c and the speedup are "
    "measured on the same run instead of entered",
    "which positions every cycle drafted, where a server gives only a histogram of accepted counts",
]


def rate(part: int | None, whole: int | None) -> float | None:
    return part / whole if part is not None and whole else None


def total(values: list[int | None]) -> int | None:
    """The sum, or None when any request leaves the count out (a partial sum would mislead)."""
    return None if not values or any(v is None for v in values) else sum(values)


def step_counts(r: ServerRequest) -> Counter | None:
    """(positions drafted, accepted) -> steps, as exactly as the request allows; None without a histogram."""
    if r.accepted_per_step is not None and r.drafted_per_step is not None:
        return Counter(zip(r.drafted_per_step, r.accepted_per_step))
    if r.histogram_by_draft_length is not None:
        return Counter({(d, a): n for d, row in r.histogram_by_draft_length.items() for a, n in enumerate(row) if n})
    if r.accepted_histogram is not None and r.k is not None:  # assumed: every step drafted K positions
        return Counter({(r.k, a): n for a, n in enumerate(r.accepted_histogram) if n})
    return None


def pooled_steps(reqs: list[ServerRequest]) -> Counter | None:
    pooled = Counter()
    for r in reqs:
        counts = step_counts(r)
        if counts is None:
            return None  # a histogram of some requests only would misstate the group
        pooled.update(counts)
    return pooled if reqs else None


def conditional_acceptance(steps: Counter, k: int) -> list[dict]:
    """Per position i = 1..k: steps that drafted i and accepted i - 1 (reached), and those that accepted i."""
    rows = []
    for i in range(1, k + 1):
        reached = sum(n for (d, a), n in steps.items() if d >= i and a >= i - 1)
        accepted = sum(n for (d, a), n in steps.items() if d >= i and a >= i)
        rows.append({"position": i, "accepted": accepted, "reached": reached, "rate": rate(accepted, reached)})
    return rows


def histogram(steps: Counter, k: int) -> list[int]:
    counts = [0] * (k + 1)
    for (d, a), n in steps.items():
        if d:  # a step that drafted nothing is no draft (engine/trace/metrics.py), as vLLM counts
            counts[a] += n
    return counts


def group_k(reqs: list[ServerRequest]) -> int | None:
    ks = [r.k for r in reqs if r.k is not None]
    return max(ks) if ks else None


def mean_length(reqs: list[ServerRequest], accepted: int | None, cycles: int | None) -> float | None:
    """1 + accepted / drafts (a server's steps); without accepted counts, the servers' own lengths weighted by steps."""
    if accepted is not None:
        return mean_acceptance_length(accepted, cycles or 0)
    if cycles and all(r.mean_acceptance_length is not None and r.steps is not None for r in reqs):
        return sum(r.mean_acceptance_length * r.steps for r in reqs) / cycles
    return None


def group_stats(reqs: list[ServerRequest]) -> dict:
    """GROUP: the pooled figures of some requests (a category, or all of them)."""
    cycles = total([r.steps for r in reqs])
    drafted, accepted = total([r.drafted for r in reqs]), total([r.accepted for r in reqs])
    k, steps = group_k(reqs), pooled_steps(reqs)
    if steps is not None:  # each step keeps its own drafted length, so requests of different K pool safely
        k = max([k or 0, *(d for d, _ in steps)]) or None
    usable = steps is not None and k is not None
    return {"requests": len(reqs), "k": k, "cycles": cycles, "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": rate(accepted, drafted), "mean_acceptance_length": mean_length(reqs, accepted, cycles),
            "conditional_acceptance": conditional_acceptance(steps, k) if usable else None,
            "accepted_histogram": histogram(steps, k) if usable else None}


def request_row(r: ServerRequest) -> dict:
    """ROW: one request; rates from its counts where it has them, else as the server reported them."""
    own_rate = rate(r.accepted, r.drafted)
    counted = r.accepted is not None and r.steps is not None  # then 0 steps is nothing drafted, whatever the server wrote
    own_length = mean_acceptance_length(r.accepted, r.steps) if counted else r.mean_acceptance_length
    return {"id": r.id, "category": r.category or UNCATEGORISED, "cycles": r.steps, "draft_tokens": r.drafted,
            "accepted_tokens": r.accepted,
            "acceptance_rate": own_rate if r.drafted is not None and r.accepted is not None else r.acceptance_rate,
            "mean_acceptance_length": own_length,
            "accepted_histogram": r.accepted_histogram, "accepted_per_cycle": r.accepted_per_step}


def notes_of(reqs: ServerRequests) -> list[str]:
    notes = list(reqs.notes)
    rs = reqs.requests
    if any(r.accepted_histogram is not None and step_counts(r) is not None and r.drafted_per_step is None
           and r.histogram_by_draft_length is None for r in rs):
        notes.append("conditional acceptance from histograms takes every step to have drafted K positions "
                     "(a drafter that proposes fewer, as n-gram lookup may, reads lower at late positions)")
    if any(r.accepted is None for r in rs):
        notes.append("some requests give no accepted-token count: their totals and acceptance rate are n/a")
    if any(r.source == "SGLang" for r in rs):
        notes.append("SGLang's own accept length is completion tokens / verify passes (it counts the first, "
                     "prefill token too); lengths here are 1 + accepted / steps where the counts are given")
    return notes


def requests_stats(reqs: ServerRequests) -> dict:
    """Everything the per-request report and the app show (module docstring: the shape)."""
    by_category: dict[str, list[ServerRequest]] = {}
    for r in reqs.requests:
        by_category.setdefault(r.category or UNCATEGORISED, []).append(r)
    rows = [request_row(r) for r in reqs.requests]
    rates = [row["acceptance_rate"] for row in rows if row["acceptance_rate"] is not None]
    middle = median(rates) if rates else None
    for row in rows:
        own = row["acceptance_rate"]
        row["below_median"] = middle - own if own is not None and middle is not None else None
    return {"source": reqs.source, "requests": len(rows), "k": reqs.k, "median_acceptance_rate": middle,
            "categories": {name: group_stats(group) for name, group in sorted(by_category.items())},
            "overall": group_stats(reqs.requests), "per_request": rows, "notes": notes_of(reqs),
            "what_a_trace_adds": list(WHAT_A_TRACE_ADDS)}


def to_server_metrics(reqs: ServerRequests) -> ServerMetrics:
    """The requests added up as one server's counts, for explain.py (alpha, K advisor, limits)."""
    g = group_stats(reqs.requests)
    hist, cycles = g["accepted_histogram"], g["cycles"]
    per_position = None
    if hist is not None and cycles:  # vLLM's per-position count: steps that accepted position i (0-based)
        per_position = per_position_rates([sum(hist[i + 1:]) for i in range(len(hist) - 1)], cycles)
    length = g["mean_acceptance_length"] if g["accepted_tokens"] is None else None
    return ServerMetrics(f"{reqs.source}, added up", k=reqs.k or g["k"], drafts=cycles, draft_tokens=g["draft_tokens"],
                         accepted_tokens=g["accepted_tokens"], per_position=per_position, acceptance_length=length,
                         notes=list(reqs.notes))
