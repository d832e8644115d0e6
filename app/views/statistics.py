"""Statistics: acceptance, cost and measured speed of the open trace, and why speculation pays off or not.

Every number comes from engine/stats/analysis.py (the same code as `python -m engine stats`);
this page lays them out, draws them (app/figures/stats.py) and runs the K sweep. A tree trace
gets its own statistics and a comparison with a chain of the same pair (app/ui/tree_stats_view.py).
"""
import dataclasses
import hashlib
import json
import os
from pathlib import Path

import streamlit as st

from app.figures import stats as figs
from app.figures.derive import draft_cache_name
from app.figures.layouts import LAYOUT_WORDS, memory_figure
from app.figures.tree import is_tree_header
from app.runs import live
from app.ui import jobs, state, tree_stats_view
from app.ui.first_result import first_result
from app.ui.safe import md
from app.ui.widgets import chart
from engine.config import SettingsError, SpecSettings
from engine.cycle.reference import Pair
from engine.drafters.registry import DRAFTERS, options_from_header
from engine.models.presets import PRESETS
from engine.stats.analysis import DEFINITIONS, NO_CALIBRATION, TraceStats, advice_sentence, best_k, explain_speed
from engine.stats.calibrate import calibrate
from engine.stats.layouts import LayoutStats, layout_stats
from engine.stats.paths import machine_words, noisy_words, path_rows, target_weights, weights_words
from engine.stats.repeats import MAX_SPREAD, Repeated, disagreement_words, repeated_values
from engine.stats.sweep import SweepResult, k_sweep
from engine.trace import Trace, TraceError, model_name
from engine.trace.metrics import TOKENS_PER_S, decoding_tokens_per_s, predicted_speedup
from engine.trace.schema import DRAFT_MODEL, MAX_K

NOW_CALIBRATION = "now_calibration"  # session_state: {trace key: calibration measured on this machine}
SWEEPS = "k_sweeps"  # session_state: {trace key: SweepResult}
REFUSED = "refused_calibration"  # session_state: {trace key: why a calibration was not shown}
NOW_SPREAD = "now_calibration_spread"  # session_state: {trace key: worst spread of the accepted calibration}
TAB = "stats_tab"  # session_state: the open tab's label
TABS = ["Acceptance", "Cost and speed", "K advisor", "K sweep", "Race and explorer", "Compare two traces",
        "KV-cache layout", "Your server"]


# ---------------------------------------------------------------- data (cached per trace)


def with_calibration(trace: Trace, key: str) -> tuple[Trace, str, bool]:
    """The trace, with a calibration measured on this machine if it has none and one was taken."""
    measured_now = st.session_state.get(NOW_CALIBRATION, {}).get(key)
    if measured_now is None or trace.header.get("calibration") is not None:
        return trace, key, False
    # the key names the calibration itself: the stats cache is shared by every session of the server
    now_key = f"{key}+now:{hashlib.sha256(json.dumps(measured_now, sort_keys=True).encode()).hexdigest()[:16]}"
    return Trace({**trace.header, "calibration": measured_now}, trace.cycles, trace.summary), now_key, True


MEASURE_PAIR = "SPECLAB_MEASURE_PAIR"  # a folder with target/ and draft/ the server's operator offers


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


# ---------------------------------------------------------------- sections

def acceptance_section(st_: TraceStats) -> None:
    a = st_.acceptance
    cols = st.columns(4)
    cols[0].metric("Draft acceptance rate", f"{a['acceptance_rate']:.3f}")
    cols[0].caption(DEFINITIONS["acceptance_rate"])
    cols[1].metric("Mean acceptance length", f"{a['mean_acceptance_length']:.3f}")
    cols[1].caption(DEFINITIONS["mean_acceptance_length"])
    cols[2].metric("alpha (mean beta)", f"{st_.alpha:.3f}")
    cols[2].caption(DEFINITIONS["alpha"])
    cols[3].metric("Cycles", f"{st_.num_cycles}")
    cols[3].caption(f"K = {st_.k} draft tokens each.")
    st.markdown("**Per-position acceptance**: " + " · ".join(
        f"{i}: {p:.3f}" for i, p in enumerate(a["per_position_acceptance"], start=1)))
    st.caption(DEFINITIONS["per_position_acceptance"])
    left, right = st.columns(2)
    with left:
        chart(figs.per_position_figure(st_), key="fig_per_position")
    with right:
        chart(figs.tokens_per_cycle_figure(st_), key="fig_tokens_per_cycle")
    st.caption("The prediction assumes every draft token passes independently with probability alpha "
               "(Leviathan et al. 2023): then a cycle commits n ≤ K tokens with probability "
               "alpha^(n-1)(1 - alpha), and K+1 with probability alpha^K.")
    if st_.by_ngram:
        ngram_section(st_)


def ngram_section(st_: TraceStats) -> None:
    """Prompt lookup: does a longer matched n-gram predict the continuation better?"""
    st.markdown("**Prompt lookup: acceptance by matched n-gram size**")
    st.dataframe([{"n-gram size": "no match" if r.ngram_size is None else str(r.ngram_size), "cycles": r.cycles,
                   "proposed": r.proposed, "accepted": r.accepted, "acceptance rate": round(r.acceptance_rate, 3)}
                  for r in st_.by_ngram], hide_index=True, key="ngram_table")
    st.caption("A cycle without a match proposes nothing: it is a plain target step. Prompt lookup runs no "
               "model, so its draft step costs almost nothing and c is close to 0.")


CALIBRATION_ROUNDS = 3  # whole calibrations; their spread says whether the machine was quiet enough


def calibrate_repeated(pair: Pair, trace: Trace, report: jobs.Report) -> tuple[dict, dict[str, Repeated]]:
    """Calibrate several times; the per-quantity median, and each quantity's repeats (runs on a worker thread)."""
    rounds = []
    for i in range(CALIBRATION_ROUNDS):
        report(i / CALIBRATION_ROUNDS, f"calibration {i + 1} of {CALIBRATION_ROUNDS}")
        rounds.append(calibrate(pair, trace.header["prompt_token_ids"], trace_settings(trace.header)))
    spread = {"target step": repeated_values([r["target_step_s"] for r in rounds]),
              "draft step": repeated_values([r["draft_step_s"] for r in rounds])}
    widths = rounds[0]["verify_positions"]
    for i, w in enumerate(widths):
        spread[f"verify over {w}"] = repeated_values([r["verify_s"][i] for r in rounds])
    median = {**rounds[0], "repeats": rounds[0]["repeats"] * CALIBRATION_ROUNDS,
              "target_step_s": spread["target step"].median_s, "draft_step_s": spread["draft step"].median_s,
              "verify_s": [spread[f"verify over {w}"].median_s for w in widths]}
    return median, spread


def keep_calibration(key: str, measured: tuple[dict, dict[str, Repeated]]) -> None:
    """Store a finished calibration for the page, or why it is not shown (its repeats disagree)."""
    result, spread = measured
    shaky = {name: r for name, r in spread.items() if r.spread > MAX_SPREAD}
    if shaky:  # refuse to show numbers whose repeats disagree
        worst = max(shaky, key=lambda n: shaky[n].spread)
        st.session_state.setdefault(REFUSED, {})[key] = (
            f"Not shown: the {CALIBRATION_ROUNDS} calibrations disagreed by up to {shaky[worst].spread:.0%} "
            f"({worst}; {len(shaky)} of {len(spread)} quantities over {MAX_SPREAD:.0%}). The machine is busy; "
            "numbers this noisy would contradict each other. Measure again when it is quieter.")
    else:
        st.session_state.setdefault(REFUSED, {}).pop(key, None)
        st.session_state.setdefault(NOW_CALIBRATION, {})[key] = result
        st.session_state.setdefault(NOW_SPREAD, {})[key] = max(r.spread for r in spread.values())


def calibrate_now(trace: Trace, key: str) -> None:
    st.info(NO_CALIBRATION, icon=":material/timer_off:")  # our own text: its `code` should render
    if st.session_state.get(REFUSED, {}).get(key):
        st.warning(st.session_state[REFUSED][key], icon=":material/timer_off:")
    name = f"calibrate:{key}"
    if st.button("Measure step times now (on this machine)", key="calibrate_now"):
        pair = trace_pair(trace.header)
        if pair is not None:
            jobs.start(name, f"Timing single steps and verify widths, {CALIBRATION_ROUNDS} times",
                       lambda report: calibrate_repeated(pair, trace, report),
                       lambda measured: keep_calibration(key, measured), alone=True, kind="calibrate")
    jobs.show(name)


def cost_section(st_: TraceStats, measured_now: bool) -> None:
    r, cal, t = st_.speed, st_.calibration, st_.times
    if measured_now:
        spread = st.session_state.get(NOW_SPREAD, {}).get(state.current_key())
        st.warning("Step times measured now on this machine, not when the trace was recorded: "
                   "if the machines differ, so do c and the speedups."
                   + (f" The {CALIBRATION_ROUNDS} calibrations agreed within {spread:.0%}." if spread is not None else ""),
                   icon=":material/timer:")
    cols = st.columns(4)
    cols[0].metric("t_step (target, 1 token)", f"{r.target_step_s * 1000:.2f} ms")
    cols[1].metric("t_draft (one draft step)", f"{r.draft_step_s * 1000:.2f} ms")
    cols[2].metric("c = t_draft / t_step", f"{r.c:.3f}")
    cols[2].caption(f"middle half {r.c_spread.low:.3f}–{r.c_spread.high:.3f}")
    cols[3].metric(f"t_verify({st_.k + 1}) in target steps", f"{r.verify_in_steps:.2f}")
    st.caption(f"c: {DEFINITIONS['c']} t_verify: {DEFINITIONS['verify_steps']} Leviathan's formula takes a verify "
               f"pass over K+1 positions to cost one target step. This trace's own verify passes took "
               f"{r.verify_s * 1000:.2f} ms (median).")
    left, right = st.columns(2)
    with left:
        chart(figs.verify_cost_figure(cal, st_.k, t.verify_s), key="fig_verify_cost")
    with right:
        chart(figs.cycle_profile_figure(t), key="fig_profile")


def speed_section(st_: TraceStats) -> None:
    r = st_.speed
    cols = st.columns(3)
    cols[0].metric("Measured speedup", f"{r.measured:.2f}x")
    cols[0].caption(f"Middle half of cycles: {r.measured_spread.low:.2f}x–{r.measured_spread.high:.2f}x. "
                    f"{DEFINITIONS['measured']}")
    cols[1].metric("Leviathan prediction", f"{r.leviathan:.2f}x")
    cols[1].caption(DEFINITIONS["leviathan"])
    cols[2].metric("Refined prediction", f"{r.refined:.2f}x")
    cols[2].caption(DEFINITIONS["refined"])
    st.info(md(explain_speed(r)), icon=":material/lightbulb:")
    gap = disagreement_words("Refined prediction vs measured speedup", r.refined, r.measured, MAX_SPREAD)
    if gap:
        st.warning(gap, icon=":material/compare_arrows:")
    chart(figs.speed_figure(r), key="fig_speed")


def paths_section(header: dict) -> None:
    """The target's weights, and which linear path ran each forward width on the machine of the run
    (calibrated CPU runs only)."""
    st.caption(f"Target weights: {md(weights_words(header))}. The step times above are of this path.")
    rows = path_rows(header)
    if not rows:
        return
    st.markdown("##### Linear path per forward width")
    st.dataframe([{"model": r.model, "width": r.width, "as loaded (ms)": round(r.as_loaded_s * 1000, 3),
                   "packed oneDNN (ms)": round(r.packed_s * 1000, 3), "runs": r.runs,
                   "faster by": f"{r.saving:.0%}"} for r in rows],
                 hide_index=True, key="paths_table")
    st.caption(f"Measured once on {md(machine_words(header))}, then kept on disk for that machine. "
               "Each width runs on the faster path, so a verify over K+1 positions is never slower than "
               "the model as loaded; the calibration above timed the chosen paths.")
    noisy = noisy_words(header)
    if noisy:
        st.warning(noisy, icon=":material/timer:")


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
               lambda report: k_sweep(pair, prompt, settings, ks, on_progress=report),
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


def explorer_section(trace: Trace, st_: TraceStats) -> None:
    r = st_.speed
    trace_c = r.c if r else 0.3
    cols = st.columns(3)
    start_at("ex_alpha", round(min(st_.alpha, 0.99), 2))
    start_at("ex_c", round(min(trace_c, 1.0), 2))
    start_at("ex_k", min(trace.k, 16))
    alpha = cols[0].slider("α (acceptance per draft token)", 0.0, 0.99, step=0.01, key="ex_alpha",
                           help="Starts at this trace's α.")
    c = cols[1].slider("c (draft step / target step)", 0.0, 1.0, step=0.01, key="ex_c",
                       help="Starts at this trace's c." if r else "This trace has no step times; 0.3 to start.")
    k = cols[2].slider("K", 1, 16, key="ex_k")
    point = (trace.k, r.measured) if r else None
    chart(figs.explorer_figure(alpha, c, k, 16, point, st_.alpha, trace_c), key="fig_explorer")
    predicted = predicted_speedup(alpha, k, c)
    text = f"At α = {alpha:.2f}, c = {c:.2f} and K = {k} the formula predicts **{predicted:.2f}×**."
    if r:
        text += (f" This trace measured **{r.measured:.2f}×** at K = {trace.k} (its own α and c predict "
                 f"{r.leviathan:.2f}×; the gap is what the formula leaves out, such as a verify pass costing "
                 f"{r.verify_in_steps:.2f} target steps instead of 1).")
    st.markdown(text)


# ---------------------------------------------------------------- comparing two traces

def summary_rows(trace: Trace, st_: TraceStats) -> dict[str, str]:
    """One column of the comparison table: every value as text."""
    s, r, a = trace.header["settings"], st_.speed, st_.acceptance
    na = "no calibration"
    return {
        "target": model_name(trace.header, "target"),  # one row each: both in one cell ran off the table
        "draft": model_name(trace.header, "draft"),
        "K · temperature": f"{s['k']} · {s['temperature']}",
        "cycles": f"{st_.num_cycles}",
        "draft acceptance rate": f"{a['acceptance_rate']:.3f}",
        "mean acceptance length": f"{a['mean_acceptance_length']:.3f}",
        "alpha": f"{st_.alpha:.3f}",
        "c": f"{r.c:.3f}" if r else na,
        "measured speedup": f"{r.measured:.2f}x" if r else na,
        "Leviathan prediction": f"{r.leviathan:.2f}x" if r else na,
        "refined prediction": f"{r.refined:.2f}x" if r else na,
        "best K (refined)": f"{best_k(st_.advice).k}" if st_.advice else na,
        "tokens/s (decoding)": f"{decoding_tokens_per_s(trace.cycles):.1f}",
    }


def other_refs() -> list[state.TraceRef]:
    refs = [state.TraceRef("bundled", n) for n in state.bundled_traces()]
    runs = state.runs_dir()
    if runs.is_dir():
        refs += [state.TraceRef("run", p.name) for p in sorted(runs.glob("*.jsonl"))]
    return refs


def compare_section(trace: Trace, st_: TraceStats) -> None:
    refs = [r for r in other_refs() if r != state.current_ref()]
    if not refs:
        st.info("There is no other trace to compare with: open **Choose a trace** to run or upload one.")
        return
    if st.session_state.get("compare_with") not in refs:  # a kept choice that is now the open trace
        st.session_state.pop("compare_with", None)
    ref = st.selectbox("Compare with", refs, format_func=lambda r: r.label, key="compare_with")
    try:
        other, other_key = state.load_ref(ref)
    except (TraceError, OSError) as err:
        st.error(f"Could not open {md(ref.label)}: {md(state.shown_paths(str(err)))}")
        return
    if is_tree_header(other.header):  # a tree of the same pair: the tree view's comparison, this trace the chain
        tree_compare(trace, ref, other, other_key)
        return
    other_stats = state.stats_of(other_key, other)
    mine, theirs = summary_rows(trace, st_), summary_rows(other, other_stats)
    st.dataframe([{"": name, "this trace": mine[name], ref.label: theirs[name]} for name in mine],
                 hide_index=True, height="content", key="compare_table")
    st.caption(TOKENS_PER_S[0].upper() + TOKENS_PER_S[1:] + ", the same definition as the K sweep's.")
    chart(figs.compare_acceptance_figure(["this trace", ref.label], [st_, other_stats]), key="fig_compare")


def tree_compare(chain: Trace, ref: state.TraceRef, tree: Trace, tree_key: str) -> None:
    try:
        cmp = tree_stats_view.comparison_of(state.current_key(), tree_key, chain, tree)
    except ValueError as err:
        st.warning(f"{md(ref.label)} drafts a tree, and it cannot be set beside this chain: {md(str(err))}",
                   icon=":material/account_tree:")
        return
    tree_stats_view.comparison_section(cmp, cmp.tree_stats, "this trace")


# ---------------------------------------------------------------- KV-cache layout

def layout_section(ls: LayoutStats, drafter: str = DRAFT_MODEL) -> None:
    st.markdown(f"Both caches used the **{LAYOUT_WORDS[ls.name]}** layout"
                + (f", blocks of **{ls.block_size}** slots." if ls.block_size else ".")
                + " Attended slots are what the model reads; held slots are what memory keeps for this sequence.")
    rows = []
    for model in ("target", "draft"):
        m = getattr(ls, model)
        if m is None:
            continue  # a drafter without a cache over the target's positions
        row = {"model": model if model == "target" else draft_cache_name(drafter),
               "peak K/V slots attended": m.peak_slots_attended, "peak K/V slots held": m.peak_slots_held}
        if ls.name == "static":
            row.update({"stale slots, max": m.stale_slots_max, "stale slots, mean": round(m.stale_slots_mean, 2)})
        if ls.name == "paged":
            row.update({"blocks allocated": m.blocks_allocated, "blocks freed": m.blocks_freed,
                        "peak pool use": f"{m.peak_pool_occupancy:.0%}",
                        "unused slots in held blocks, mean": round(m.unused_slots_mean, 2)})
        rows.append(row)
    st.dataframe(rows, hide_index=True)
    chart(memory_figure(ls), key="layout_memory")


# ---------------------------------------------------------------- the page

def headline(trace: Trace, st_: TraceStats) -> str:
    """The page's point in one line of Markdown, above the tabs (app/ui/first_result.py): no chart needed."""
    a, r = st_.acceptance, st_.speed
    parts = [f"α = **{st_.alpha:.3f}**", f"draft acceptance rate **{a['acceptance_rate']:.3f}**",
             f"mean acceptance length **{a['mean_acceptance_length']:.3f}**"]
    if r is not None:
        parts.append(f"measured speedup **{r.measured:.2f}×** (middle half of cycles {r.measured_spread.low:.2f}–"
                     f"{r.measured_spread.high:.2f}×; Leviathan predicts {r.leviathan:.2f}×, "
                     f"refined {r.refined:.2f}×)")
    else:
        parts.append("no step times, so no speedup (see **Cost and speed**)")
    rate = decoding_tokens_per_s(trace.cycles)
    if rate > 0:  # 0: the cycles carry no times
        parts.append(f"**{rate:.1f}** tokens/s decoding")
    return "This run: " + " · ".join(parts)


TAB_WIDGETS = ("sweep_ks", "sweep_max_new", "ex_alpha", "ex_c", "ex_k", "compare_with")  # widgets inside tabs


def keep_tab_widgets() -> None:
    """Only the open tab runs, and Streamlit forgets a widget's value after a run that did not
    draw it. Storing every value back at the top of each run keeps what the user chose when
    they switch tabs and back (Streamlit's documented way). The widgets take their starting
    values from start_at, not from a default argument, which Streamlit would warn about.
    Leaving the page still resets them, as on every page."""
    for key in TAB_WIDGETS:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def start_at(key: str, value) -> None:
    """A tab widget's starting value, unless the user already chose one."""
    if key not in st.session_state:
        st.session_state[key] = value


def main() -> None:
    st.title("Why speculation pays off, or doesn't")
    trace = state.current_trace()
    if trace is None:
        st.warning("No trace is open. Open **Choose a trace** first.", icon=":material/folder_open:")
        return
    state.write_url()
    if is_tree_header(trace.header):  # a tree cycle has no per-position fields: engine/stats/trees.py reads it
        tree_stats_view.draw(trace)
        return
    keep_tab_widgets()
    h = trace.header
    st.caption(f"Target **{md(model_name(h, 'target'))}** · draft **{md(model_name(h, 'draft'))}** · K={trace.k} · "
               f"temperature {h['settings']['temperature']} · {len(trace.cycles)} cycles"
               + ("" if trace.complete else " · incomplete run (no summary)"))
    if not trace.cycles:
        st.warning("This trace has no cycles to analyse.")
        return
    shown, key, measured_now = with_calibration(trace, state.current_key())
    st_ = state.stats_of(key, shown)
    first_result().markdown(headline(trace, st_))
    # Only the open tab runs (on_change="rerun" and .open): a page load draws its 2 charts instead of
    # all 11, and loads no table code. Opening a tab costs one rerun.
    for name, tab in zip(TABS, st.tabs(TABS, key=TAB, on_change="rerun")):
        if tab.open:
            with tab:
                draw_tab(name, trace, st_, measured_now)


def draw_tab(name: str, trace: Trace, st_: TraceStats, measured_now: bool) -> None:
    if name == "Acceptance":
        acceptance_section(st_)
    elif name == "Cost and speed" and st_.speed is None:
        if st_.calibration_error:
            st.error(md(st_.calibration_error))
        calibrate_now(trace, state.current_key())
    elif name == "Cost and speed":
        cost_section(st_, measured_now)
        speed_section(st_)
        paths_section(trace.header)
    elif name == "K advisor" and st_.advice:
        advisor_section(st_)
    elif name == "K advisor":
        st.info("The K advisor needs step times: see **Cost and speed**.")
    elif name == "K sweep":
        sweep_section(trace, state.current_key())
    elif name == "Race and explorer":
        race_section(trace, st_)
        explorer_section(trace, st_)
    elif name == "Compare two traces":
        compare_section(trace, st_)
    elif name == "KV-cache layout":
        layout_section(layout_stats(trace), trace.drafter_kind)
    elif name == "Your server":
        from app.ui import server_view  # loaded only when the tab opens: it imports prometheus_client
        server_view.draw(st_)

main()
