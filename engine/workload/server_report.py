"""A server workload's statistics (server_stats.py's dict) as plain text, for `python -m engine stats FOLDER`.

The per-request report of `engine metrics` (engine/servers/report.py), then the sections an engine
workload's report prints that a server's answers can fill (engine/workload/report.py: conditional
acceptance by position, the histogram, context length), each request's accepted counts step by step,
then both totals side by side. `totals_verdict` is the one wording of whether the totals agree and why
they may not: the Workload page shows the same words.

May import: engine/servers/report.py and engine/workload/report.py (text only); the standard library.
"""
from engine.servers.report import format_requests
from engine.workload.report import conditional_lines, context_lines, histogram_lines, num

COUNT_NAMES = {"drafts": "drafts (verify steps)", "draft_tokens": "draft tokens", "accepted_tokens": "accepted tokens",
               "accepted_per_position": "accepted per position"}


def server_lines(stats: dict) -> list[str]:
    server, s = stats["server"], stats["settings"]
    config = stats["speculative_config"]
    said = "not told" if config is None else f"{config} (from {stats['speculative_config_source']})"
    done, failed = stats["requests"], len(stats["failed"])
    lines = [f"SERVER WORKLOAD: {done} requests done of {num(stats['planned_requests'], 'd')} planned, {failed} failed",
             f"  server: {server['kind']} {server['version'] or ''} at {stats['url']} ({stats['endpoint']}), "
             f"model {server['model']}",
             f"  speculative config: {said}",
             f"  max_tokens {s['max_tokens']}   temperature {s['temperature']:g}   top_p {s['top_p']:g}   seed {s['seed']}   "
             f"concurrency {s['concurrency']}"]
    lines += [f"  failed {f['id']}: {f['error']}" for f in stats["failed"]]
    return lines


def count_text(value) -> str:
    if value is None:
        return "-"
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


WHY_THEY_MAY_DIFFER = ("the counters are server-wide: another client's requests between the two scrapes count "
                       "there and not here; so does a request that failed or timed out after the server had drafted "
                       "for it (its answer never came back); a scrape taken while a request was still running, or a "
                       "server restarted between the scrapes (its counters start again from 0), differs too")


def totals_verdict(totals: dict) -> tuple[str, str]:
    """("equal" | "differ" | "not compared", the sentence saying what that means)."""
    if totals["equal"] is None:
        return "not compared", totals["counters_note"] or "a request's answer gives no count to add up"
    if totals["equal"]:
        return "equal", "every drafted and accepted token the server counted is in these answers"
    return "differ", WHY_THEY_MAY_DIFFER


def totals_lines(stats: dict) -> list[str]:
    t = stats["totals"]
    ours, counters = t["requests"], t["counters"] or {}
    lines = ["TOTALS: THE REQUESTS' SUM AGAINST THE SERVER'S COUNTERS (vllm:spec_decode_*, after - before)",
             f"  {'':<24} {'requests':>14} {'counters':>14}"]
    lines += [f"  {COUNT_NAMES[key]:<24} {count_text(ours[key]):>14} {count_text(counters.get(key)):>14}"
              for key in COUNT_NAMES]
    word, why = totals_verdict(t)
    lines.append(f"  {word.upper() if word == 'differ' else word}: {why}")
    return lines


def step_text(steps: list[int] | None) -> str:
    """A strip of counts: one digit per step while every count has one digit (K below 10), else spaced."""
    if steps is None:
        return "-"
    return "".join(map(str, steps)) if all(a < 10 for a in steps) else " ".join(map(str, steps))


MAX_STRIP_LINES = 200  # as engine/servers/report.py's per-request lines


def strip_lines(stats: dict) -> list[str]:
    """Each request's accepted draft tokens at every step, in order (vLLM's per_step_accepted), one line each."""
    rows = stats["per_request"]
    width = min(24, max(len(r["id"]) for r in rows))
    lines = ["ACCEPTED PER STEP (each request's drafting steps in order; a request without per-step counts: -)"]
    for r in rows[:MAX_STRIP_LINES]:
        lines.append(f"  {r['id'][:width]:<{width}} {step_text(r['accepted_per_cycle'])}")
    if len(rows) > MAX_STRIP_LINES:
        lines.append(f"  ... and {len(rows) - MAX_STRIP_LINES:,} more requests")
    return lines


def prompt_length_lines(stats: dict) -> list[str]:
    """The engine workload's context-length table, over each request's prompt (a server reports no per-step context)."""
    lines = context_lines(stats)
    lines[0] = "ACCEPTANCE BY PROMPT LENGTH (tokens of each request's prompt; a server reports no context per step)"
    lines[1] = lines[1].replace("context ", "prompt  ")
    return lines


def format_server_workload_stats(stats: dict) -> str:
    overall = stats["overall"]
    sections = [server_lines(stats), format_requests(stats).splitlines()]
    if overall["conditional_acceptance"] is not None:
        sections.append(conditional_lines(overall))
    if overall["accepted_histogram"] is not None and overall["cycles"]:
        sections.append(histogram_lines(overall))
    sections += [prompt_length_lines(stats), strip_lines(stats), totals_lines(stats)]
    return "\n\n".join("\n".join(line.rstrip() for line in lines) for lines in sections) + "\n"
