"""The statistics of one trace as plain text, for `python -m engine stats TRACE.jsonl`.

The same numbers the app's statistics page shows (engine/stats/analysis.py computes both); a tree
trace goes to engine/stats/tree_report.py.
"""
from engine.stats.analysis import (
    DEFINITIONS,
    NO_CALIBRATION,
    CycleTimes,
    TraceStats,
    advice_sentence,
    best_k,
    explain_speed,
    predicted_per_position,
    trace_stats,
)
from engine.stats.layouts import layout_lines, layout_stats
from engine.stats.paths import calibration_words, decoder_words, forward_words, path_lines, path_rows, weights_words
from engine.stats.tree_report import format_tree_stats, summary_lines
from engine.stats.trees import is_tree_trace
from engine.trace import Trace


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def acceptance_lines(st: TraceStats) -> list[str]:
    a = st.acceptance
    return [
        "ACCEPTANCE (vLLM V1 definitions)",
        f"  cycles: {st.num_cycles}   K: {st.k}",
        f"  draft acceptance rate: {a['acceptance_rate']:.3f}   {DEFINITIONS['acceptance_rate']}",
        f"  mean acceptance length: {a['mean_acceptance_length']:.3f}   {DEFINITIONS['mean_acceptance_length']}",
        "  per-position acceptance: " + " ".join(f"{p:.3f}" for p in a["per_position_acceptance"]),
        f"      {DEFINITIONS['per_position_acceptance']}",
        "  i.i.d. prediction alpha^i: " + " ".join(f"{p:.3f}" for p in predicted_per_position(st.alpha, st.k)),
        f"  alpha: {st.alpha:.3f}   {DEFINITIONS['alpha']}",
        "  mean beta by position: " + " ".join(f"{b:.3f}" for b in st.beta_by_position),
    ]


def histogram_lines(st: TraceStats) -> list[str]:
    lines = ["TOKENS COMMITTED PER DRAFT (accepted + 1, cycles that drafted) against the truncated geometric at alpha",
             "  tokens  drafts  measured  predicted"]
    total = max(1, sum(st.tokens_per_cycle))  # the drafts: a cycle that drafted nothing is not in it
    for n, (count, p) in enumerate(zip(st.tokens_per_cycle, st.pmf), start=1):
        lines.append(f"  {n:>6}  {count:>6}  {count / total:>8.3f}  {p:>9.3f}")
    return lines


def profile_lines(t: CycleTimes) -> list[str]:
    parts = {"draft steps": t.draft_s, "verify": t.verify_s, "draft catch-up": t.catch_up_s,
             "other (test, resample, rollback, Python)": t.other_s}
    lines = [f"WHERE A CYCLE'S TIME GOES (median cycle {ms(t.cycle_s)}, middle half "
             f"{ms(t.cycle.low)}-{ms(t.cycle.high)}; catch-up averaged over cycles)"]
    lines += [f"  {name}: {ms(v)} ({v / t.cycle_s:.0%})" for name, v in parts.items() if t.cycle_s > 0]
    return lines


def cost_lines(st: TraceStats) -> list[str]:
    cal, r = st.calibration, st.speed
    widths = "  ".join(f"{n}: {ms(v)}" for n, v in zip(cal.verify_positions, cal.verify_s))
    return [
        f"COST (calibrated at cache length {cal.cache_len})",
        f"  t_step, one target decode step: {ms(r.target_step_s)}",
        f"  t_draft, one draft step (trace median): {ms(r.draft_step_s)}",
        f"  c = t_draft / t_step: {r.c_spread.words('.3f')}   {DEFINITIONS['c']}",
        f"  t_verify({r.k + 1}): {r.verify_in_steps:.2f} target steps (Leviathan's formula assumes 1); "
        f"this trace's median verify pass: {ms(r.verify_s)}",
        f"  verify time by positions (calibration): {widths}",
    ]


def speed_lines(st: TraceStats) -> list[str]:
    r = st.speed
    return [
        "SPEED relative to plain target decoding",
        f"  measured: {r.measured:.3f}x (middle half {r.measured_spread.low:.3f}x-{r.measured_spread.high:.3f}x)   "
        f"{DEFINITIONS['measured']}",
        f"  Leviathan prediction: {r.leviathan:.3f}x   {DEFINITIONS['leviathan']}",
        f"  refined prediction: {r.refined:.3f}x   {DEFINITIONS['refined']}",
        f"  E[tokens per cycle] at alpha: {r.expected_tokens:.3f}",
        f"  {explain_speed(r)}",
    ]


def advisor_lines(st: TraceStats) -> list[str]:
    lines = ["K ADVISOR (alpha, draft step and verify costs held fixed)",
             "     K  E[tokens]  Leviathan  refined  t_verify(K+1)"]
    best = best_k(st.advice).k
    for a in st.advice:
        mark = "  <- best" if a.k == best else ""
        fit = " (fitted)" if a.extrapolated else ""
        lines.append(f"  {a.k:>4}  {a.expected_tokens:>9.3f}  {a.leviathan:>8.3f}x  {a.refined:>6.3f}x  "
                     f"{ms(a.verify_s)}{fit}{mark}")
    lines.append(f"  {advice_sentence(st.advice)}")
    return lines


def ngram_lines(st: TraceStats) -> list[str]:
    lines = ["PROMPT LOOKUP: acceptance by matched n-gram size",
             "  n-gram  cycles  proposed  accepted  acceptance rate"]
    for r in st.by_ngram:
        name = "none" if r.value is None else str(r.value)
        lines.append(f"  {name:>6}  {r.cycles:>6}  {r.proposed:>8}  {r.accepted:>8}  {r.acceptance_rate:>15.3f}")
    return lines


def source_lines(st: TraceStats) -> list[str]:
    lines = ["SUFFIX DECODING: acceptance by the tree that proposed",
             "  tree     cycles  proposed  accepted  acceptance rate"]
    for r in st.by_source:
        lines.append(f"  {r.value or 'none':<7}  {r.cycles:>6}  {r.proposed:>8}  {r.accepted:>8}  {r.acceptance_rate:>15.3f}")
    return lines


def format_stats(trace: Trace) -> str:
    if is_tree_trace(trace):  # a tree cycle has no per-position fields: engine/stats/trees.py reads it
        return format_tree_stats(trace)
    st = trace_stats(trace)
    decoder, forwards = decoder_words(trace.header), forward_words(trace.header)
    timed_on = calibration_words(trace.header)
    sections = [[f"DRAFTER: {st.drafter}", f"TARGET WEIGHTS: {weights_words(trace.header)}",
                 *([f"DECODER: {decoder}"] if decoder else []), *([f"FORWARDS: {forwards}"] if forwards else []),
                 *([f"STEP TIMES: timed on {timed_on}"] if timed_on else [])],
                acceptance_lines(st), histogram_lines(st)]
    if st.by_ngram:
        sections.append(ngram_lines(st))
    if st.by_source:
        sections.append(source_lines(st))
    if st.times:
        sections.append(profile_lines(st.times))
    if st.speed:
        sections += [cost_lines(st), speed_lines(st), advisor_lines(st)]
        if path_rows(trace.header):
            sections.append(path_lines(trace.header))
    else:
        sections.append([f"COST AND SPEED: {st.calibration_error or NO_CALIBRATION}"])
    sections.append(layout_lines(layout_stats(trace)))
    sections.append(summary_lines(trace))
    return "\n\n".join("\n".join(lines) for lines in sections)
