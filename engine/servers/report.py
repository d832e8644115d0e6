"""A server's metrics explained, as plain text for `python -m engine metrics FILE...`.

The same numbers the statistics page's "Your server" tab shows (explain.py computes both).
"""
from engine.servers.explain import ServerReport, advice_words, comparison_rows, predicted_curve
from engine.stats.analysis import DEFINITIONS, TraceStats


def fmt(x, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def curve(values: list[float] | None) -> str:
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
