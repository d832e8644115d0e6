"""A server workload's statistics (server_stats.py's dict) as plain text, for `python -m engine stats FOLDER`.

The per-request report of `engine metrics` (engine/servers/report.py), then the sections an engine
workload's report prints that a server's answers can fill (engine/workload/report.py: conditional
acceptance by position, the histogram, context length), then both totals side by side.

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


def totals_lines(stats: dict) -> list[str]:
    t = stats["totals"]
    ours, counters = t["requests"], t["counters"] or {}
    lines = ["TOTALS: THE REQUESTS' SUM AGAINST THE SERVER'S COUNTERS (vllm:spec_decode_*, after - before)",
             f"  {'':<24} {'requests':>14} {'counters':>14}"]
    lines += [f"  {COUNT_NAMES[key]:<24} {count_text(ours[key]):>14} {count_text(counters.get(key)):>14}"
              for key in COUNT_NAMES]
    if t["equal"] is None:
        lines.append(f"  not compared: {t['counters_note'] or 'a request gives no count'}")
    elif t["equal"]:
        lines.append("  equal: every drafted and accepted token the server counted is in these answers")
    else:
        lines.append("  NOT equal: another client used the server between the scrapes, or its counters and its "
                     "answers disagree")
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
    sections += [prompt_length_lines(stats), totals_lines(stats)]
    return "\n\n".join("\n".join(line.rstrip() for line in lines) for lines in sections) + "\n"
