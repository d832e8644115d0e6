"""Statistics: acceptance, cost and measured speed of the open trace, and why speculation pays off or not.

Every number comes from engine/stats/analysis.py (the same code as `python -m engine stats`);
this page lays them out in tabs, one section module each (app/views/sections/statistics_*.py; the
Batch size tab reads the batch benchmarks and batch sweeps, not the trace's cycles),
and draws them with app/figures/stats.py. A tree trace gets its own statistics and a comparison
with a chain of the same pair (app/views/sections/statistics_tree.py).
"""
import streamlit as st

from app.figures.tree_record import is_tree_header
from app.ui import state
from app.ui.first_result import first_result
from app.ui.names import model_label, models_help
from app.ui.safe import md
from app.views.sections import statistics_batch, statistics_tree
from app.views.sections.statistics_acceptance import acceptance_section
from app.views.sections.statistics_compare import compare_section, layout_section
from app.views.sections.statistics_speed import (
    advisor_section,
    calibrate_now,
    cost_section,
    paths_section,
    speed_section,
    with_calibration,
)
from app.views.sections.statistics_sweep import explorer_section, race_section, sweep_section
from app.views.sections.statistics_widgets import keep_tab_widgets
from engine.stats.analysis import TraceStats, whole_run_speedup
from engine.stats.layouts import layout_stats
from engine.trace import Trace
from engine.trace.metrics import decoding_tokens_per_s

TAB = "stats_tab"  # session_state: the open tab's label
TABS = ["Acceptance", "Cost and speed", "K advisor", "K sweep", "Batch size", "Race and explorer",
        "Compare two traces", "KV-cache layout", "Your server"]
TAB_WIDGETS = ("sweep_ks", "sweep_max_new", "ex_alpha", "ex_c", "ex_k", "compare_with",
               *statistics_batch.WIDGETS)  # widgets inside tabs


def headline(trace: Trace, st_: TraceStats) -> str:
    """The page's point in one line of Markdown, above the tabs (app/ui/first_result.py): no chart needed."""
    a, r = st_.acceptance, st_.speed
    parts = [f"α = **{st_.alpha:.3f}**", f"draft acceptance rate **{a['acceptance_rate']:.3f}**",
             f"mean acceptance length **{a['mean_acceptance_length']:.3f}**"]
    if r is not None:
        # two measured speedups, each said to be what it is: the median cycle's, and the whole run's (the race)
        parts.append(f"measured speedup **{r.measured:.2f}×** at the median cycle (middle half of cycles "
                     f"{r.measured_spread.low:.2f}–{r.measured_spread.high:.2f}×; "
                     f"{whole_run_speedup(trace.cycles, r.target_step_s):.2f}× over the whole run, slow cycles "
                     f"included, as the race draws it; Leviathan predicts {r.leviathan:.2f}×, refined {r.refined:.2f}×)")
    else:
        parts.append("no step times, so no speedup (see **Cost and speed**)")
    rate = decoding_tokens_per_s(trace.cycles)
    if rate > 0:  # 0: the cycles carry no times
        parts.append(f"**{rate:.1f}** tokens/s decoding")
    return "This run: " + " · ".join(parts)


def main() -> None:
    st.title("Why speculation pays off, or doesn't")
    trace = state.current_trace()
    if trace is None:
        st.warning("No trace is open. Open **Choose a trace** first.", icon=":material/folder_open:")
        return
    state.write_url()
    if is_tree_header(trace.header):  # a tree cycle has no per-position fields: engine/stats/trees.py reads it
        statistics_tree.draw(trace)
        return
    keep_tab_widgets(TAB_WIDGETS)
    h = trace.header
    st.caption(f"Target **{md(model_label(h, 'target').label)}** · draft **{md(model_label(h, 'draft').label)}** · "
               f"K={trace.k} · temperature {h['settings']['temperature']} · {len(trace.cycles)} cycles"
               + ("" if trace.complete else " · incomplete run (no summary)"), help=md(models_help(h)))
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
        speed_section(st_, trace.cycles)
        paths_section(trace.header)
    elif name == "K advisor" and st_.advice:
        advisor_section(st_)
    elif name == "K advisor":
        st.info("The K advisor needs step times: see **Cost and speed**.")
    elif name == "K sweep":
        sweep_section(trace, state.current_key())
    elif name == "Batch size":
        statistics_batch.draw(trace, state.current_key())
    elif name == "Race and explorer":
        race_section(trace, st_)
        explorer_section(trace, st_)
    elif name == "Compare two traces":
        compare_section(trace, st_)
    elif name == "KV-cache layout":
        layout_section(layout_stats(trace), trace.drafter_kind)
    elif name == "Your server":
        from app.views.sections import statistics_server  # loaded only when the tab opens: it imports prometheus_client
        statistics_server.draw(st_)

main()
