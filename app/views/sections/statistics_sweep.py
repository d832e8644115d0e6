"""The statistics page's K sweep tab and its Race and explorer tab: the trace's prompt run again at
several K, the trace's cycles raced against plain decoding, and the speedup formula to explore.

Numbers: engine/stats/sweep.py and engine/trace/metrics.py; figures: app/figures/stats.py.
"""
import streamlit as st

from app.figures import stats as figs
from app.ui import jobs
from app.ui.safe import md
from app.ui.widgets import chart
from app.views.sections.statistics_speed import trace_pair, trace_settings
from app.views.sections.statistics_widgets import start_at
from engine.config import SettingsError
from engine.stats import sweep as sweeps
from engine.stats.analysis import SpeedReport, TraceStats, whole_run_speedup
from engine.stats.sweep import SweepResult
from engine.trace import Trace
from engine.trace.metrics import TOKENS_PER_S, predicted_speedup
from engine.trace.schema import MAX_K

SWEEPS = "k_sweeps"  # session_state: {trace key: SweepResult}
ALPHA_MAX, C_MAX = 0.99, 1.0  # the explorer's sliders' ranges (α = 1 would divide by zero)
# Engine work is looked up on its module when it runs (sweeps.k_sweep), as a page script's fresh import
# would: this module is imported once, and a test holds the sweep by patching engine.stats.sweep.

# ---------------------------------------------------------------- the K sweep


def sweep_section(trace: Trace, key: str) -> None:
    st.write("Run this trace's prompt and settings again at several K, then compare measured speed and "
             "acceptance with what the formulas predict from the same run.")
    default_ks = sorted({1, 2, 4, 6, trace.k} & set(range(1, MAX_K + 1)))
    cols = st.columns([3, 1])
    start_at("sweep_ks", default_ks)
    start_at("sweep_max_new", min(64, trace.header["settings"]["max_new_tokens"]))
    ks = cols[0].multiselect("K values", list(range(1, MAX_K + 1)), key="sweep_ks")
    max_new = cols[1].number_input("Max new tokens", 1, 512, key="sweep_max_new")
    if st.button("Run the K sweep", key="sweep_run", type="primary", disabled=not ks):
        start_sweep(trace, key, sorted(ks), int(max_new))
    jobs.show(f"sweep:{key}")
    result = st.session_state.get(SWEEPS, {}).get(key)
    if result is not None:
        show_sweep(result)


def start_sweep(trace: Trace, key: str, ks: list[int], max_new: int) -> None:
    try:
        settings = trace_settings(trace.header, max_new_tokens=max_new)
    except SettingsError as err:
        st.error(md(str(err)))
        return
    pair = trace_pair(trace.header)
    if pair is None:
        return
    prompt = trace.header["prompt_token_ids"]
    jobs.start(f"sweep:{key}", f"K sweep over K = {', '.join(map(str, ks))}",
               lambda report: sweeps.k_sweep(pair, prompt, settings, ks, on_progress=report),
               lambda result: keep_sweep(key, result), alone=True, kind="sweep")


def keep_sweep(key: str, result: SweepResult) -> None:
    st.session_state.setdefault(SWEEPS, {})[key] = result


def show_sweep(result: SweepResult) -> None:
    chart(figs.sweep_figure(result), key="fig_sweep")
    predicted = result.predicted_tokens_per_s()
    st.dataframe([{"K": p.k, "tokens/s": round(p.tokens_per_s, 2), "Leviathan tokens/s": round(lev, 2),
                   "refined tokens/s": round(ref, 2), "speedup": round(p.tokens_per_s / result.plain_tokens_per_s, 3),
                   "acceptance rate": round(p.acceptance_rate, 3),
                   "mean acceptance length": round(p.mean_acceptance_length, 3), "alpha": round(p.alpha, 3)}
                  for p, lev, ref in zip(result.points, predicted["leviathan"], predicted["refined"])],
                 hide_index=True, height="content", key="sweep_table")
    st.caption(f"Plain target decoding: {result.plain_tokens_per_s:.2f} tokens/s ({TOKENS_PER_S}). Predictions use alpha "
               f"{result.alpha:.3f} pooled over the sweep and its own step-time calibration.")


# ---------------------------------------------------------------- the race and the explorer

def race_section(trace: Trace, st_: TraceStats) -> None:
    if st_.speed is None:
        st.info("The race needs the time of one plain target step: see **Cost and speed**.")
        return
    st.markdown("Both decoders produce the same number of tokens. Speculative: this trace's own cycles, each "
                "as long as it took. Plain: one calibrated target step per token. Prefill is left out of both.")
    chart(figs.race_figure(trace.cycles, st_.speed.target_step_s), key="fig_race")
    st.markdown(race_words(trace.cycles, st_.speed))


def race_words(cycles: list[dict], r: SpeedReport) -> str:
    """The race's result, beside the page's other measured speedup and why the two differ."""
    spec_t, _, plain_t, _ = figs.race_series(cycles, r.target_step_s)
    whole = whole_run_speedup(cycles, r.target_step_s)
    return (f"Speculative finishes after {spec_t[-1]:.2f} s, plain after {plain_t[-1]:.2f} s: **{whole:.2f}×** over "
            f"the whole run, every cycle counted in full. The headline's measured speedup, **{r.measured:.2f}×**, "
            f"divides by the median cycle's time instead, which a cycle slowed by something else on the machine "
            f"moves little.")


def explored(alpha: float, c: float, trace_alpha: float, trace_c: float) -> tuple[float, float]:
    """The α and c the explorer computes with: the trace's own where a slider still sits at the value it
    started from (the trace's, rounded to the slider's 0.01 steps). The rounded value gave the formula a
    second answer, a hundredth off, beside the trace's own prediction at the same α and c as printed."""
    alpha = trace_alpha if alpha == slider_start(trace_alpha, ALPHA_MAX) else alpha
    return alpha, trace_c if c == slider_start(trace_c, C_MAX) else c


def slider_start(value: float, top: float) -> float:
    """Where the α or c slider starts for a trace: its value, on the sliders' 0.01 grid, at most `top`."""
    return round(min(value, top), 2)


def explorer_section(trace: Trace, st_: TraceStats) -> None:
    r = st_.speed
    trace_c = r.c if r else 0.3
    cols = st.columns(3)
    start_at("ex_alpha", slider_start(st_.alpha, ALPHA_MAX))
    start_at("ex_c", slider_start(trace_c, C_MAX))
    start_at("ex_k", min(trace.k, 16))
    alpha = cols[0].slider("α (acceptance per draft token)", 0.0, ALPHA_MAX, step=0.01, key="ex_alpha",
                           help="Starts at this trace's α.")
    c = cols[1].slider("c (draft step / target step)", 0.0, C_MAX, step=0.01, key="ex_c",
                       help="Starts at this trace's c." if r else "This trace has no step times; 0.3 to start.")
    k = cols[2].slider("K", 1, 16, key="ex_k")
    alpha, c = explored(alpha, c, st_.alpha, trace_c)
    point = (trace.k, r.measured) if r else None
    chart(figs.explorer_figure(alpha, c, k, 16, point, st_.alpha, trace_c), key="fig_explorer")
    predicted = predicted_speedup(alpha, k, c)
    text = f"At α = {alpha:.2f}, c = {c:.2f} and K = {k} the formula predicts **{predicted:.2f}×**."
    if (alpha, c) == (st_.alpha, trace_c):
        text += f" These are this trace's own α = {alpha:.3f} and c = {c:.3f}, unrounded."
    if r:
        text += (f" This trace measured **{r.measured:.2f}×** at K = {trace.k} (its own α and c predict "
                 f"{r.leviathan:.2f}×; the gap is what the formula leaves out, such as a verify pass costing "
                 f"{r.verify_in_steps:.2f} target steps instead of 1).")
    st.markdown(text)
