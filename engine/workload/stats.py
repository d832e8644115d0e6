"""A workload's statistics: many requests, one trace each, read as a whole.

`workload_stats(runs)` returns one JSON-serialisable dict (the shape other tools read):
{"requests", "k", "median_acceptance_rate", "categories": {name: GROUP}, "overall": GROUP,
 "per_request": [ROW], "context_length": [BIN], "context_edges", "loss", "bootstrap"}.

Every rate is a ratio of sums over cycles, as vLLM V1 reports it (acceptance rate = accepted /
drafted, mean acceptance length = 1 + accepted / drafts, a draft being a cycle that proposed at
least one token: engine/trace/metrics.py), never a mean of per-request rates: a long request weighs
by its cycles. A rate with nothing under it (no drafted token, no draft) is None, not 0, so "never
measured" does not read as "never accepted". "cycles" counts every cycle, "drafts" those that drafted. Intervals resample requests
(engine/workload/intervals.py); where the loss is comes from engine/workload/loss.py.

May import: engine.trace, engine.stats and the standard library. Never torch or streamlit.
"""
from statistics import median

from engine.stats.analysis import (
    advise_k,
    advised_k,
    advisor_ks,
    best_k,
    measured_alpha,
    overhead_of,
    speed_report,
)
from engine.stats.timings import calibration_of, cycle_times
from engine.trace.metrics import drafted, mean_acceptance_length
from engine.workload.intervals import CONFIDENCE, request_intervals
from engine.workload.loss import loss_stats
from engine.workload.requests import UNCATEGORISED, RequestRun

# Context-length bin edges (tokens before a cycle's first draft position). Doubling widths: the
# target's attention over a longer context changes acceptance slowly, so equal steps on a log
# scale resolve the short contexts where most cycles fall and still keep the rarer long ones in
# a few well-filled bins; fixed (not quantile) edges so that two workloads' tables line up row
# for row. The first bin is 0-127 (a chat template alone is tens of tokens); the last is open.
CONTEXT_EDGES = (0,) + tuple(128 * 2 ** i for i in range(11))  # 0, 128, 256, ..., 131072


def rate(part: int, whole: int) -> float | None:
    """part / whole; None when there is no whole (nothing drafted, no cycle) to measure against."""
    return part / whole if whole else None


def rates(accepted: int, drafted_tokens: int, drafts: int) -> dict:
    """vLLM V1's two acceptance figures from the sums."""
    return {"acceptance_rate": rate(accepted, drafted_tokens),
            "mean_acceptance_length": mean_acceptance_length(accepted, drafts)}


def drafted_depth(cycle: dict) -> int:
    """The deepest draft position a cycle proposed: a chain's length, or a tree's deepest node.
    Positions beyond it were not drafted (prompt lookup may propose fewer than K): unobserved."""
    if "tree" in cycle:
        return max((n["depth"] for n in cycle["tree"]["nodes"]), default=0)
    return len(cycle["draft_token_ids"])


def conditional_acceptance(cycles: list[dict], k: int) -> list[dict]:
    """Per position i = 1..k: of the cycles that drafted position i and accepted every position
    before it (reached), how many accepted i too. Unlike vLLM's per-position acceptance (over all
    cycles) this is the chance a token passes given that it was tested, the alpha at depth i."""
    rows = []
    for i in range(1, k + 1):
        reached = [c for c in cycles if drafted_depth(c) >= i and c["num_accepted"] >= i - 1]
        accepted = sum(c["num_accepted"] >= i for c in reached)
        rows.append({"position": i, "accepted": accepted, "reached": len(reached),
                     "rate": rate(accepted, len(reached))})
    return rows


def accepted_histogram(cycles: list[dict], k: int) -> list[int]:
    """counts[j] = drafts (cycles that drafted) that accepted exactly j draft tokens, j = 0..k. A cycle
    that drafted nothing accepted nothing by necessity: vLLM leaves it out, and so does this."""
    counts = [0] * (max([k, *(c["num_accepted"] for c in cycles)]) + 1)
    for c in cycles:
        if drafted(c):
            counts[c["num_accepted"]] += 1
    return counts


def generated_tokens(run: RequestRun) -> int:
    """The summary's count (cut at EOS and the budget); the committed tokens for an unfinished trace."""
    summary = run.trace.summary
    if summary is not None:
        return summary["num_generated"]
    return sum(len(c["committed_token_ids"]) for c in run.trace.cycles)


def tokens_per_s(runs: list[RequestRun]) -> float | None:
    """Generated tokens / summed wall time (each summary's end to end, prefill included) of the
    requests with a summary: what the workload took, not its median cycle."""
    done = [r.trace.summary for r in runs if r.trace.summary is not None]
    seconds = sum(s["wall_time_s"] for s in done)
    return sum(s["num_generated"] for s in done) / seconds if seconds > 0 else None


def request_counts(run: RequestRun) -> tuple[int, int, int]:
    """(drafts, drafted tokens, accepted tokens) of one request; a tree drafts all its nodes."""
    cycles = run.trace.cycles
    return sum(drafted(c) > 0 for c in cycles), sum(drafted(c) for c in cycles), sum(c["num_accepted"] for c in cycles)


def group_speed(runs: list[RequestRun], k: int) -> dict:
    """The speedup and the advisor's K for a calibrated chain workload, as trace_stats computes
    them for one trace, from the group's pooled cycles (alpha = mean beta over all of them) and
    the first calibration among its traces (a workload runs on one machine). None otherwise."""
    none = {"speedup": None, "best_k": None, "advised_k": None}
    if not runs or any(r.trace.is_tree for r in runs):
        return none  # a tree has no K to advise and no chain speed model
    try:
        cal = next((c for c in (calibration_of(r.trace.header) for r in runs) if c), None)
    except ValueError as err:
        return none | {"calibration_error": str(err)}
    if cal is None:
        return none
    cycles = [c for r in runs for c in r.trace.cycles]
    times = cycle_times(cycles)
    if times is None:
        return none
    alpha, overhead = measured_alpha(cycles), overhead_of(cycles, times)
    speed = speed_report(k, alpha, times, cal, overhead)
    advice = advise_k(alpha, times.draft_step_s, cal, advisor_ks(cal, k), overhead)
    return {"speedup": {"k": k, "alpha": alpha, "c": speed.c, "measured": speed.measured,
                        "leviathan": speed.leviathan, "refined": speed.refined, "closer": speed.closer,
                        "verify_in_steps": speed.verify_in_steps,
                        "verify_measured": speed.verify_s / speed.target_step_s},  # the group's median pass
            "best_k": best_k(advice).k, "advised_k": advised_k(advice).k}


def group_stats(runs: list[RequestRun], bootstrap_samples: int, seed: int) -> dict:
    """GROUP: the pooled figures of some requests (a category, or the whole workload)."""
    counts = [request_counts(r) for r in runs]
    drafts, drafted_tokens, accepted = (sum(col) for col in zip(*counts)) if counts else (0, 0, 0)
    all_cycles = [c for r in runs for c in r.trace.cycles]
    k = max((r.trace.k for r in runs), default=0)  # one workload, one K; max keeps a mixed group safe
    return {
        "requests": len(runs), "k": k, "cycles": len(all_cycles), "drafts": drafts, "draft_tokens": drafted_tokens,
        "accepted_tokens": accepted, **rates(accepted, drafted_tokens, drafts),
        "conditional_acceptance": conditional_acceptance(all_cycles, k),
        "accepted_histogram": accepted_histogram(all_cycles, k),
        "generated_tokens": sum(generated_tokens(r) for r in runs), "tokens_per_s": tokens_per_s(runs),
        "intervals": request_intervals(counts, bootstrap_samples, seed),
        **group_speed(runs, k),
    }


def request_row(run: RequestRun, median_rate: float | None) -> dict:
    """ROW: one request's figures; below_median = workload median - its rate (positive: below)."""
    drafts, drafted_tokens, accepted = request_counts(run)
    row = {"id": run.id, "category": category_of(run), "file": run.file, "cycles": len(run.trace.cycles),
           "drafts": drafts, "draft_tokens": drafted_tokens, "accepted_tokens": accepted,
           **rates(accepted, drafted_tokens, drafts),
           "tokens_per_s": tokens_per_s([run]), "generated_tokens": generated_tokens(run),
           "prompt_tokens": len(run.trace.header.get("prompt_token_ids", [])),
           "accepted_per_cycle": [c["num_accepted"] for c in run.trace.cycles]}
    own = row["acceptance_rate"]
    row["below_median"] = median_rate - own if own is not None and median_rate is not None else None
    return row


def category_of(run: RequestRun) -> str:
    return run.category or UNCATEGORISED


def median_acceptance_rate(runs: list[RequestRun]) -> float | None:
    """The median of the per-request rates (requests that drafted something): the typical request,
    which one long request cannot move, unlike the pooled rate."""
    own = [rate(a, d) for _, d, a in map(request_counts, runs)]
    own = [r for r in own if r is not None]
    return median(own) if own else None


def context_bin(length: int) -> int:
    """Index of the CONTEXT_EDGES bin holding `length`."""
    return max(i for i, edge in enumerate(CONTEXT_EDGES) if length >= edge)


def context_length(runs: list[RequestRun]) -> list[dict]:
    """Acceptance by the cycle's context length (committed_len_before); the non-empty bins, in order."""
    bins: dict[int, list] = {}
    for run in runs:
        for c in run.trace.cycles:
            b = bins.setdefault(context_bin(c["committed_len_before"]), [0, 0, 0, 0, set()])
            b[0], b[1], b[2], b[3] = b[0] + 1, b[1] + (drafted(c) > 0), b[2] + drafted(c), b[3] + c["num_accepted"]
            b[4].add(run.id)
    rows = []
    for i in sorted(bins):
        cycles, drafts, drafted_tokens, accepted, requests = bins[i]
        high = CONTEXT_EDGES[i + 1] if i + 1 < len(CONTEXT_EDGES) else None
        rows.append({"low": CONTEXT_EDGES[i], "high": high, "cycles": cycles, "drafts": drafts,
                     "draft_tokens": drafted_tokens, "accepted_tokens": accepted, **rates(accepted, drafted_tokens, drafts),
                     "requests": len(requests)})
    return rows


def workload_stats(runs: list[RequestRun], *, bootstrap_samples: int = 1000, seed: int = 0) -> dict:
    """Everything a workload's statistics page and `python -m engine stats FOLDER` show (module
    docstring: the shape). Deterministic given `seed`; bootstrap_samples=0 skips the intervals."""
    by_category: dict[str, list[RequestRun]] = {}
    for run in runs:
        by_category.setdefault(category_of(run), []).append(run)
    median_rate = median_acceptance_rate(runs)
    rows = [request_row(run, median_rate) for run in runs]
    return {
        "requests": len(runs),
        "k": max((r.trace.k for r in runs), default=0),
        "median_acceptance_rate": median_rate,
        "categories": {name: group_stats(group, bootstrap_samples, seed) for name, group in sorted(by_category.items())},
        "overall": group_stats(runs, bootstrap_samples, seed),
        "per_request": rows,
        "context_length": context_length(runs),
        "context_edges": list(CONTEXT_EDGES),
        "loss": loss_stats(runs, rows),
        "bootstrap": {"samples": bootstrap_samples, "seed": seed, "confidence": CONFIDENCE, "resamples": "requests"},
    }
