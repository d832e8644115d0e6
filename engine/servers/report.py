"""A server's metrics explained, as plain text for `python -m engine metrics FILE...`.

The same numbers the statistics page's "Your server" tab shows (explain.py computes both).
Per-request input (vLLM's metrics.speculative_decoding, SGLang's meta_info) also gets
format_requests: a line per request, then each category and all of them, from
request_stats.requests_stats.
"""
from engine.servers.explain import ServerReport, advice_words, comparison_rows, predicted_curve
from engine.servers.server_metrics import NothingDrafted, shown
from engine.stats.analysis import DEFINITIONS, TraceStats


def fmt(x, spec: str = ".3f") -> str:
    return shown(x, spec)


def curve(values: list[float] | NothingDrafted | None) -> str:
    if isinstance(values, NothingDrafted):
        return shown(values)
    return "n/a" if not values else " ".join(f"{v:.3f}" for v in values)


def source_lines(r: ServerReport) -> list[str]:
    m = r.metrics
    lines = [f"SOURCE: {m.source}", f"  method: {m.method or 'not in the input'}   K: {fmt(r.k, 'd')}"]
    lines.append(f"  drafts (cycles): {fmt(m.drafts, ',')}   draft tokens: {fmt(m.draft_tokens, ',')}   "
                 f"accepted tokens: {fmt(m.accepted_tokens, ',')}")
    if m.window_s or m.tokens_per_s:
        lines.append(f"  time window: {fmt(m.window_s, '.1f')} s   tokens/s: {fmt(m.tokens_per_s, '.1f')}")
    if m.draft_overhead is not None:
        lines.append(f"  draft overhead: {m.draft_overhead:.3f} of each iteration's time spent drafting")
    lines += [f"  note: {n}" for n in [*m.notes, *r.derived]]
    return lines


def acceptance_lines(r: ServerReport) -> list[str]:
    return ["ACCEPTANCE (vLLM V1 definitions)",
            f"  draft acceptance rate: {fmt(r.acceptance_rate)}   {DEFINITIONS['acceptance_rate']}",
            f"  mean acceptance length: {fmt(r.mean_acceptance_length)}   {DEFINITIONS['mean_acceptance_length']}",
            f"  per-position acceptance: {curve(r.per_position)}",
            f"  conditional (a_i / a_(i-1)): {curve(r.conditional)}",
            f"  alpha: {fmt(r.alpha)}   ({r.alpha_how})",
            f"  i.i.d. prediction alpha^i: {curve(predicted_curve(r))}",
            f"  tokens per cycle: predicted from alpha {fmt(r.expected_tokens)}, "
            f"seen by the server {fmt(r.mean_acceptance_length)}"]


def speed_lines(r: ServerReport) -> list[str]:
    if r.nothing_drafted:
        return [f"SPEED: {shown(r.alpha)}, so there is no acceptance to predict a speedup or a K from"]
    if r.costs is None:
        return ["SPEED: give c (--c) and the verify cost (--verify-steps), or a calibrated trace (--trace), "
                "for the predicted speedups and the K advisor"]
    lines = ["SPEED (predicted; a server's metrics carry no plain-decoding time to measure against)",
             f"  costs: {r.costs.source}",
             f"  Leviathan et al.: {fmt(r.leviathan, '.2f')}x   {DEFINITIONS['leviathan']}",
             f"  refined: {fmt(r.refined, '.2f')}x   {DEFINITIONS['refined']}"]
    words = advice_words(r)
    if words:
        lines.append(f"  K advisor: {words}")
    return lines


def format_report(r: ServerReport, trace: TraceStats | None = None) -> str:
    lines = [*source_lines(r), "", *acceptance_lines(r), "", *speed_lines(r), "", "WHAT LIMITS THIS SERVER"]
    lines += [f"  - {text}" for text in r.limits] or ["  - (needs acceptance and K to say)"]
    if trace is not None:
        lines += ["", "SIDE BY SIDE WITH THE TRACE"]
        lines += [f"  {row['quantity']}: server {row['server'] or 'n/a'}   trace {row['trace'] or 'n/a'}"
                  for row in comparison_rows(r, trace)]
    return "\n".join(lines)


MAX_REQUEST_LINES = 200  # a terminal's worth; the app's table shows every request


def group_lines(name: str, g: dict) -> list[str]:
    lines = [f"  {name}: {g['requests']} request{'s' * (g['requests'] != 1)}   K: {fmt(g['k'], 'd')}   "
             f"steps: {fmt(g['cycles'], ',')}   drafted: {fmt(g['draft_tokens'], ',')}   "
             f"accepted: {fmt(g['accepted_tokens'], ',')}",
             f"    draft acceptance rate: {fmt(g['acceptance_rate'])}   "
             f"mean acceptance length: {fmt(g['mean_acceptance_length'])}"]
    if g["accepted_histogram"] is not None:
        lines.append(f"    steps accepting 0..K draft tokens: {' '.join(map(str, g['accepted_histogram']))}")
    if g["conditional_acceptance"] is not None:
        cells = [f"{c['position']}: {fmt(c['rate'])} ({c['accepted']}/{c['reached']})" for c in g["conditional_acceptance"]]
        lines.append(f"    conditional acceptance by position: {'   '.join(cells)}")
    return lines


def request_line(row: dict) -> str:
    hist = "n/a" if row["accepted_histogram"] is None else " ".join(map(str, row["accepted_histogram"]))
    return (f"  {row['id'][:24]:<24} {row['category'][:14]:<14} {fmt(row['cycles'], ','):>7} "
            f"{fmt(row['draft_tokens'], ','):>8} {fmt(row['accepted_tokens'], ','):>8} "
            f"{fmt(row['acceptance_rate']):>6} {fmt(row['mean_acceptance_length']):>6}  {hist}")


def format_requests(stats: dict) -> str:
    """request_stats.requests_stats' dict as text: a line per request, each category, overall."""
    lines = [f"SOURCE: {stats['source']}",
             f"  K: {fmt(stats['k'], 'd')}   median draft acceptance rate of the requests: "
             f"{fmt(stats['median_acceptance_rate'])}"]
    lines += [f"  note: {n}" for n in stats["notes"]]
    lines += ["", "PER REQUEST (vLLM V1 definitions)",
              f"  rate: {DEFINITIONS['acceptance_rate']}   length: {DEFINITIONS['mean_acceptance_length']}",
              f"  {'id':<24} {'category':<14} {'steps':>7} {'drafted':>8} {'accepted':>8} {'rate':>6} {'length':>6}  "
              "steps accepting 0..K"]
    rows = stats["per_request"]
    lines += [request_line(row) for row in rows[:MAX_REQUEST_LINES]]
    if len(rows) > MAX_REQUEST_LINES:
        lines.append(f"  ... and {len(rows) - MAX_REQUEST_LINES:,} more requests (the categories below count them all)")
    lines += ["", "PER CATEGORY"]
    for name, g in stats["categories"].items():
        lines += group_lines(name, g)
    lines += ["", "OVERALL", *group_lines("all requests", stats["overall"]),
              "", "WHAT A TRACE OF THESE REQUESTS WOULD ADD (python -m engine run --prompts FILE)"]
    lines += [f"  - {text}" for text in stats["what_a_trace_adds"]]
    return "\n".join(lines)
