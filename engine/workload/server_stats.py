"""A server workload's statistics (`engine client`'s folder): the per-request views, and both totals.

`server_workload_stats(w)` returns request_stats.requests_stats' dict (per request, per category,
overall, conditional acceptance by position, histogram) plus:
 "server", "url", "endpoint", "speculative_config", "speculative_config_source", "settings",
 "planned_requests", "failed": [{"id", "error"}],
 "context_length": [BIN] over each request's prompt tokens (CONTEXT_EDGES, as an engine workload's
   bins; a server reports no context per step, so a request counts whole in its prompt's bin),
 "totals": {"requests": COUNTS, "counters": COUNTS | None, "counters_note": str | None, "equal": bool | None},
   COUNTS = {"drafts", "draft_tokens", "accepted_tokens", "accepted_per_position"}: the sum over the
   requests' answers, and the difference of vLLM's /metrics counters after - before. On a quiet
   server (no other client between the scrapes) the two are equal; `equal` is None where one side is missing.
Each per-request row also gets "prompt_tokens", "completion_tokens" and "elapsed_s".

May import: engine.servers and engine/workload/stats.py's bin edges; the standard library.
"""
from engine.servers import vllm
from engine.servers.prometheus import difference, parse_scrape
from engine.servers.request_stats import requests_stats
from engine.servers.server_metrics import ServerMetricsError
from engine.servers.server_workload import AFTER, BEFORE, FAILED, ServerWorkload, ServerWorkloadError
from engine.workload.stats import CONTEXT_EDGES

COUNT_KEYS = ("drafts", "draft_tokens", "accepted_tokens", "accepted_per_position")


def prompt_tokens(answer: dict, endpoint: str) -> int | None:
    usage = answer.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        return usage["prompt_tokens"]
    ids = answer.get("prompt_token_ids") if endpoint == "chat" else answer["choices"][0].get("prompt_token_ids")
    return len(ids) if isinstance(ids, list) else None


def request_counts(overall: dict) -> dict:
    """The requests' sums, in the counters' terms: vLLM's per-position counter counts the steps that
    accepted position i (0-based), i.e. accepted more than i draft tokens."""
    hist = overall["accepted_histogram"]
    per_position = None if hist is None else [sum(hist[i + 1:]) for i in range(len(hist) - 1)]
    return {"drafts": overall["cycles"], "draft_tokens": overall["draft_tokens"],
            "accepted_tokens": overall["accepted_tokens"], "accepted_per_position": per_position}


def scrapes_of(w: ServerWorkload):
    """Both scrapes parsed; a file that is not Prometheus text refuses the folder (it is not what the client wrote)."""
    parsed = []
    for name, text in ((BEFORE, w.before), (AFTER, w.after)):
        try:
            parsed.append(parse_scrape(text))
        except ServerMetricsError as err:
            raise ServerWorkloadError(f"{w.folder / name}: {err}") from None
    return parsed


def counter_counts(w: ServerWorkload) -> tuple[dict | None, str | None]:
    """vLLM's counters after - before, or None and why not."""
    if w.before is None or w.after is None:
        missing = "metrics-before.prom" if w.before is None else "metrics-after.prom"
        return None, f"no {missing} (the server has no /metrics, or the run did not finish: --resume finishes it)"
    before, after = scrapes_of(w)
    if vllm.DRAFTS not in after.series:
        return None, "the scrapes hold no vllm:spec_decode_* counters (SGLang's /metrics are gauges, not counts)"
    try:
        d = difference(before, after, vllm.COUNTERS)
    except ServerMetricsError as err:
        return None, str(err)
    per_pos = d.by_position.get(vllm.PER_POS, {})
    return {"drafts": round(d.values.get(vllm.DRAFTS, 0)), "draft_tokens": round(d.values.get(vllm.DRAFT_TOKENS, 0)),
            "accepted_tokens": round(d.values.get(vllm.ACCEPTED, 0)),
            "accepted_per_position": [round(per_pos[p]) for p in sorted(per_pos)] or None}, None


def totals(w: ServerWorkload, overall: dict) -> dict:
    ours = request_counts(overall)
    counters, note = counter_counts(w)
    equal = None
    if counters is not None and all(ours[k] is not None for k in COUNT_KEYS):
        equal = all(ours[k] == counters[k] for k in COUNT_KEYS)
    return {"requests": ours, "counters": counters, "counters_note": note, "equal": equal}


def context_bins(rows: list[dict]) -> list[dict]:
    """Requests binned by their prompt's length in tokens, with the pooled counts of each bin."""
    bins = []
    for low, high in zip(CONTEXT_EDGES, (*CONTEXT_EDGES[1:], None)):
        inside = [r for r in rows if r["prompt_tokens"] is not None and r["prompt_tokens"] >= low
                  and (high is None or r["prompt_tokens"] < high)]
        if not inside:
            continue
        cycles = sum_of(inside, "cycles")
        drafted, accepted = sum_of(inside, "draft_tokens"), sum_of(inside, "accepted_tokens")
        bins.append({"low": low, "high": high, "requests": len(inside), "cycles": cycles, "draft_tokens": drafted,
                     "accepted_tokens": accepted,
                     "acceptance_rate": accepted / drafted if accepted is not None and drafted else None,
                     "mean_acceptance_length": 1 + accepted / cycles if accepted is not None and cycles else None})
    return bins


def sum_of(rows: list[dict], key: str) -> int | None:
    values = [r[key] for r in rows]
    return None if any(v is None for v in values) else sum(values)


def server_workload_stats(w: ServerWorkload) -> dict:
    """Everything `engine stats FOLDER` prints for a server workload (module docstring: the shape)."""
    m = w.manifest
    stats = requests_stats(w.requests)
    for row, record, completion in zip(stats["per_request"], w.answers, w.completion_tokens):  # one row per answer, in order
        row |= {"prompt_tokens": prompt_tokens(record["answer"], m["endpoint"]), "completion_tokens": completion,
                "elapsed_s": record["elapsed_s"]}
    stats |= {"server": m["server"], "url": m["url"], "endpoint": m["endpoint"],
              "speculative_config": m["speculative_config"],
              "speculative_config_source": m["speculative_config_source"], "settings": m["settings"],
              "planned_requests": m.get("planned_requests"),
              "failed": [{"id": e["id"], "error": e["error"]} for e in m["requests"] if e["status"] == FAILED],
              "context_length": context_bins(stats["per_request"]), "context_edges": list(CONTEXT_EDGES),
              "totals": totals(w, stats["overall"])}
    return stats
