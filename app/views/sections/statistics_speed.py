"""The statistics page's Cost and speed tab and its K advisor: step times, c, the measured speedup beside
the two predictions, the linear path per width, and K advice; for a trace without step times, a
calibration measured now on this machine (several rounds, refused when they disagree).

Numbers: engine/stats/analysis.py, calibrate.py and paths.py; figures: app/figures/stats.py.
"""
import dataclasses
import hashlib
import json
import os
from pathlib import Path

import streamlit as st

from app.figures import stats as figs
from app.runs import live
from app.ui import jobs, state
from app.ui.safe import md
from app.ui.widgets import chart
from app.views.sections.statistics_widgets import chart_pair, metric_row
from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.drafters.registry import DRAFTERS, options_from_header
from engine.models.presets import PRESETS
from engine.stats.analysis import (
    DEFINITIONS,
    NO_CALIBRATION,
    TraceStats,
    advice_sentence,
    best_k,
    explain_speed,
    whole_run_speedup,
)
from engine.stats.calibrate import calibrate_repeated
from engine.stats.paths import (
    absent_words,
    calibration_words,
    forward_words,
    machine_words,
    noisy_words,
    path_rows,
    ran_compiled,
    target_weights,
    weights_words,
)
from engine.stats.repeats import MAX_SPREAD, Repeated, disagreeing, disagreement_words, widest_spread
from engine.trace import Trace

NOW_CALIBRATION = "now_calibration"  # session_state: {trace key: calibration measured on this machine}
REFUSED = "refused_calibration"  # session_state: {trace key: why a calibration was not shown}
NOW_SPREAD = "now_calibration_spread"  # session_state: {trace key: worst spread of the accepted calibration}
CALIBRATION_ROUNDS = 3  # whole calibrations; their spread says whether the machine was quiet enough
MEASURE_PAIR = "SPECLAB_MEASURE_PAIR"  # a folder with target/ and draft/ the server's operator offers


# ---------------------------------------------------------------- data (cached per trace)

def with_calibration(trace: Trace, key: str) -> tuple[Trace, str, bool]:
    """The trace, with a calibration measured on this machine if it has none and one was taken."""
    measured_now = st.session_state.get(NOW_CALIBRATION, {}).get(key)
    if measured_now is None or trace.header.get("calibration") is not None:
        return trace, key, False
    # the key names the calibration itself: the stats cache is shared by every session of the server
    now_key = f"{key}+now:{hashlib.sha256(json.dumps(measured_now, sort_keys=True).encode()).hexdigest()[:16]}"
    return Trace({**trace.header, "calibration": measured_now}, trace.cycles, trace.summary), now_key, True


def trace_pair(header: dict) -> Pair | None:
    """The pair to measure with: the trace's preset, else the pair the server's operator configured.

    A trace is untrusted input: the model names in its header are never opened as paths
    or ids, or an upload could make the server load (or probe) any folder it names.
    """
    preset = header.get("preset")
    configured = os.environ.get(MEASURE_PAIR)
    if not (isinstance(preset, str) and preset in PRESETS) and not configured:
        st.error("This trace was not recorded with one of this server's presets, and the server never loads "
                 "models a trace names. Record the step times with `python -m engine run --calibrate ...`, or "
                 f"start the server with {MEASURE_PAIR}=<folder holding target/ and draft/>.",
                 icon=":material/block:")
        return None
    drafter = options_from_header(header)  # the same drafter the trace was written with
    weights = target_weights(header)  # and the same target weights: another path is another target
    if isinstance(preset, str) and preset in PRESETS:
        return live.load_or_error(preset, drafter=drafter, target_weights=weights)
    st.info(f"Measuring on the pair this server offers for traces without a preset "
            f"({md(Path(configured).name)}), not on models the trace names.")
    target, draft = str(Path(configured) / "target"), str(Path(configured) / "draft")
    needs = DRAFTERS[drafter.kind].needs
    if needs.own_draft and needs.model:  # a draft model of its own: the offered pair's (an EAGLE head is none)
        drafter = dataclasses.replace(drafter, draft_model=draft)
    return live.load_or_error(None, target, draft, drafter=drafter, target_weights=weights)


def trace_settings(header: dict, **changes) -> SpecSettings:
    known = {f.name for f in dataclasses.fields(SpecSettings)}
    return SpecSettings(**{**{k: v for k, v in header["settings"].items() if k in known}, **changes})


# ---------------------------------------------------------------- a calibration measured now

def calibrate_rounds(pair: Pair, trace: Trace, report: jobs.Report) -> tuple[dict, dict[str, Repeated]]:
    """CALIBRATION_ROUNDS calibrations: the per-quantity median, and each quantity's repeats (runs on a worker thread)."""
    return calibrate_repeated(pair, trace.header["prompt_token_ids"], trace_settings(trace.header), CALIBRATION_ROUNDS,
                              lambda i: report(i / CALIBRATION_ROUNDS, f"calibration {i + 1} of {CALIBRATION_ROUNDS}"))


def keep_calibration(key: str, measured: tuple[dict, dict[str, Repeated]]) -> None:
    """Store a finished calibration for the page, or why it is not shown (its repeats disagree)."""
    result, spread = measured
    shaky = disagreeing(spread)
    if shaky:  # refuse to show numbers whose repeats disagree
        worst, worst_spread = widest_spread(shaky)
        st.session_state.setdefault(REFUSED, {})[key] = (
            f"Not shown: the {CALIBRATION_ROUNDS} calibrations disagreed by up to {worst_spread:.0%} "
            f"({worst}; {len(shaky)} of {len(spread)} quantities over {MAX_SPREAD:.0%}). The machine is busy; "
            "numbers this noisy would contradict each other. Measure again when it is quieter.")
    else:
        st.session_state.setdefault(REFUSED, {}).pop(key, None)
        st.session_state.setdefault(NOW_CALIBRATION, {})[key] = result
        st.session_state.setdefault(NOW_SPREAD, {})[key] = widest_spread(spread)[1]


def calibrate_now(trace: Trace, key: str) -> None:
    if ran_compiled(trace.header):
        st.info(f"This trace's cycles ran {md(forward_words(trace.header))}. Step times measured here would time "
                "eager forwards, and a speedup built on them would mix two ways of running the models, so none is "
                "measured. To see costs and speedups, record the run with `--k auto`, which times these same "
                "compiled forwards and records them, or record a calibrated run without `--capture compile`.",
                icon=":material/timer_off:")
        return
    st.info(NO_CALIBRATION, icon=":material/timer_off:")  # our own text: its `code` should render
    if st.session_state.get(REFUSED, {}).get(key):
        st.warning(st.session_state[REFUSED][key], icon=":material/timer_off:")
    name = f"calibrate:{key}"
    if st.button("Measure step times now (on this machine)", key="calibrate_now"):
        pair = trace_pair(trace.header)
        if pair is not None:
            jobs.start(name, f"Timing single steps and verify widths, {CALIBRATION_ROUNDS} times",
                       lambda report: calibrate_rounds(pair, trace, report),
                       lambda measured: keep_calibration(key, measured), alone=True, kind="calibrate")
    jobs.show(name)


# ---------------------------------------------------------------- sections

def cost_section(st_: TraceStats, measured_now: bool) -> None:
    r, cal, t = st_.speed, st_.calibration, st_.times
    if measured_now:
        spread = st.session_state.get(NOW_SPREAD, {}).get(state.current_key())
        st.warning("Step times measured now on this machine, not when the trace was recorded: "
                   "if the machines differ, so do c and the speedups."
                   + (f" The {CALIBRATION_ROUNDS} calibrations agreed within {spread:.0%}." if spread is not None else ""),
                   icon=":material/timer:")
    metric_row([("t_step (target, 1 token)", f"{r.target_step_s * 1000:.2f} ms", None),
                ("t_draft (one draft step)", f"{r.draft_step_s * 1000:.2f} ms", None),
                ("c = t_draft / t_step", f"{r.c:.3f}", f"middle half {r.c_spread.low:.3f}–{r.c_spread.high:.3f}"),
                (f"t_verify({st_.k + 1}) in target steps", f"{r.verify_in_steps:.2f}", None)])
    st.caption(f"c: {DEFINITIONS['c']} t_verify: {DEFINITIONS['verify_steps']} Leviathan's formula takes a verify "
               f"pass over K+1 positions to cost one target step. This trace's own verify passes took "
               f"{r.verify_s * 1000:.2f} ms (median).")
    chart_pair((figs.verify_cost_figure(cal, st_.k, t.verify_s), "fig_verify_cost"),
               (figs.cycle_profile_figure(t), "fig_profile"))


def speed_section(st_: TraceStats, cycles: list[dict]) -> None:
    r = st_.speed
    whole = whole_run_speedup(cycles, r.target_step_s)
    metric_row([("Measured speedup", f"{r.measured:.2f}x",
                 f"Middle half of cycles: {r.measured_spread.low:.2f}x–{r.measured_spread.high:.2f}x. "
                 f"{DEFINITIONS['measured']} Over the whole run: {whole:.2f}x ({DEFINITIONS['whole_run']})"),
                ("Leviathan prediction", f"{r.leviathan:.2f}x", DEFINITIONS["leviathan"]),
                ("Refined prediction", f"{r.refined:.2f}x", DEFINITIONS["refined"])])
    st.info(md(explain_speed(r)), icon=":material/lightbulb:")
    gap = disagreement_words("Refined prediction vs measured speedup", r.refined, r.measured, MAX_SPREAD)
    if gap:
        st.warning(gap, icon=":material/compare_arrows:")
    chart(figs.speed_figure(r), key="fig_speed")


def paths_section(header: dict) -> None:
    """The target's weights, and which linear path ran each forward width on the machine of the run
    (calibrated CPU runs only)."""
    forwards, timed_on = forward_words(header), calibration_words(header)
    st.caption(f"Target weights: {md(weights_words(header))}. The step times above are of these weights"
               + (f", timed on {md(timed_on)}." if timed_on else ".")
               + (f" The cycles ran {md(forwards)}." if forwards else ""))
    rows = path_rows(header)
    if not rows:
        return
    st.markdown("##### Linear path per forward width")
    st.dataframe([{"model": r.model, "width": r.width, "as loaded (ms)": round(r.as_loaded_s * 1000, 3),
                   "packed oneDNN (ms)": None if r.packed_s is None else round(r.packed_s * 1000, 3),
                   "rows kernel (ms)": None if r.rows_s is None else round(r.rows_s * 1000, 3),
                   "rows kernel variant": r.rows_variant, "runs": r.runs,
                   "faster than the slowest by": f"{r.saving:.0%}"} for r in rows],
                 hide_index=True, key="paths_table")
    st.caption(f"Measured once on {md(machine_words(header))}, then kept on disk for that machine. "
               "Each width runs on the fastest path (the rows kernel, the engine's own C code, where it was "
               "built), so a verify over K+1 positions is never slower than "
               "the model as loaded; the calibration above timed the chosen paths. The rows kernel's variant "
               "(its vector instructions, and whether it prefetches the weights into the L1 or the L2 cache) was "
               "timed the same way, on the model's own products, and the fastest runs each width.")
    noisy = noisy_words(header)
    if noisy:
        st.warning(noisy, icon=":material/timer:")
    absent = absent_words(header)
    if absent:
        st.caption(md(absent))


def advisor_section(st_: TraceStats) -> None:
    sentence = advice_sentence(st_.advice)
    if best_k(st_.advice).refined < 1.0:
        st.warning(md(sentence), icon=":material/trending_down:")
    else:
        st.success(md(sentence), icon=":material/trending_up:")
    chart(figs.advisor_figure(st_.advice, st_.k), key="fig_advisor")
    chart(figs.verify_steps_figure(st_.calibration, st_.advice), key="fig_verify_steps")
    st.dataframe([{"K": a.k, "E[tokens per cycle]": round(a.expected_tokens, 3),
                   "Leviathan": round(a.leviathan, 3), "refined": round(a.refined, 3),
                   "t_verify(K+1) ms": round(a.verify_s * 1000, 3),
                   "cycle (target steps)": round(a.cost_steps, 3),
                   "verify time": "fitted line" if a.extrapolated else "measured"} for a in st_.advice],
                 hide_index=True, height="content", key="advisor_table")
    st.caption("Alpha, the draft step time, the verify-cost curve and what a cycle costs beyond its forwards "
               "(the draft's catch-up after a full accept, alpha^K of the cycles, and the bookkeeping) are held "
               "at this trace's values; only K changes. The advisor picks K among the measured widths; beyond "
               "them, verify time follows a fitted straight line, shown but never picked.")
