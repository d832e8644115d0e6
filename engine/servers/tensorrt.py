"""TensorRT-LLM's /metrics JSON (trtllm-serve, v1.0): a list of iteration stats, each with
iterLatencyMS and, when drafting ran, specDecodingStats:
- numDraftTokens, numAcceptedTokens: drafted and accepted draft tokens in that iteration;
- numRequestsWithDraftTokens: the requests that drafted, one cycle each;
- acceptanceLength: (accepted + requests) / requests, the bonus token included;
- iterLatencyMS: the drafting part of the iteration; draftOverhead: that part / the iteration.
"""
from statistics import fmean

from engine.servers.server_metrics import (
    MAX_RECORDS,
    ServerMetrics,
    ServerMetricsError,
    check_counts,
    count,
    fraction,
    number,
    short,
)

SPEC = "specDecodingStats"


def iterations(data) -> list[dict]:
    items = data if isinstance(data, list) else [data]
    if len(items) > MAX_RECORDS:
        raise ServerMetricsError(f"{len(items):,} iterations; at most {MAX_RECORDS:,} are read")
    if not all(isinstance(i, dict) for i in items):
        raise ServerMetricsError("TensorRT-LLM's /metrics is a list of iteration objects")
    return items


def from_iterations(data) -> ServerMetrics:
    """Every iteration that drafted, added up; the window is the sum of their latencies."""
    drafts = drafted = accepted = 0
    seconds, overheads = 0.0, []
    for n, it in enumerate(iterations(data)):
        spec = it.get(SPEC)
        if spec is None:
            continue  # an iteration without drafting (prefill only, or speculation off)
        if not isinstance(spec, dict):
            raise ServerMetricsError(f"iteration {n}: {SPEC} is {short(spec)}, not an object")
        d, a = count(spec.get("numDraftTokens", 0), "numDraftTokens"), count(spec.get("numAcceptedTokens", 0),
                                                                            "numAcceptedTokens")
        requests = requests_of(spec, a, n)
        check_counts(requests, d, a)
        drafts, drafted, accepted = drafts + requests, drafted + d, accepted + a
        if "iterLatencyMS" in it:
            seconds += number(it["iterLatencyMS"], "iterLatencyMS") / 1000
        if spec.get("draftOverhead") is not None:
            overheads.append(fraction(spec["draftOverhead"], "draftOverhead"))
    if drafts == 0:
        raise ServerMetricsError(f"no iteration has {SPEC} with drafted requests: is speculative decoding on?")
    k = -(-drafted // drafts)  # drafted per request, rounded up: TensorRT-LLM reports no K of its own
    return ServerMetrics("TensorRT-LLM /metrics (iteration stats)", k=k, drafts=drafts, draft_tokens=drafted,
                         accepted_tokens=accepted, window_s=seconds or None,
                         draft_overhead=fmean(overheads) if overheads else None,
                         notes=[f"K = drafted tokens per drafting request, rounded up ({k})"])


def requests_of(spec: dict, accepted: int, n: int) -> int:
    """numRequestsWithDraftTokens, else what acceptanceLength = (accepted + requests) / requests implies."""
    if "numRequestsWithDraftTokens" in spec:
        return count(spec["numRequestsWithDraftTokens"], "numRequestsWithDraftTokens")
    length = number(spec.get("acceptanceLength", 0), "acceptanceLength")
    if length <= 1:
        raise ServerMetricsError(f"iteration {n} gives neither numRequestsWithDraftTokens nor an "
                                 "acceptanceLength above 1 to count its requests by")
    return max(1, round(accepted / (length - 1)))
