"""The statistics page for a tree trace: its tree statistics, and a chain trace of
the same pair beside it (the chain page's Compare tab shows the same comparison from the chain's side).

Numbers: engine/stats/trees.py (the same code as `python -m engine stats`), computed once per
trace (st.cache_data, keyed by the traces' content keys); figures: app/figures/tree_stats.py.
The chain to compare with is one of the bundled traces or live runs, or a file uploaded here;
only a chain trace of the same target, draft and prompt is offered, and the page says why the
others are not. Every text from a trace or an upload reaches the page through md().
"""
import hashlib

import streamlit as st

from app.figures import tree_stats as figs
from app.figures.tree_record import tree_words
from app.ui import state
from app.ui.first_result import first_result
from app.ui.names import model_label, models_help
from app.ui.safe import md
from app.ui.widgets import chart
from app.views.sections.statistics_widgets import chart_pair, keep_tab_widgets, metric_row, numbered_line
from engine.stats.trees import (
    TREE_DEFINITIONS,
    ChainTreeComparison,
    TreeStats,
    compare_chain_tree,
    is_tree_trace,
    pair_differences,
    tree_stats,
)
from engine.trace import Trace, TraceError, loads_trace
from engine.trace.metrics import TOKENS_PER_S

TAB = "stats_tree_tab"  # session_state: the open tab's label
TABS = ["Tree acceptance", "Cost", "Compare with a chain"]
COMPARE_WITH = "tree_compare_with"  # session_state: the chosen chain trace (a state.TraceRef)
UPLOADER = "tree_compare_uploader"  # the file uploader's key
UPLOADED = "tree_compare_uploaded"  # session_state: (digest of the bytes, TraceRef or None, why refused or None)
PICK = "tree_compare_pick"  # session_state: a just-uploaded chain to select on the next run


# ---------------------------------------------------------------- data (cached per trace)

@st.cache_data(max_entries=state.DERIVED_KEPT, ttl=state.CACHE_TTL_S, show_spinner=False)
def tree_stats_of(key: str, _trace: Trace) -> TreeStats:
    return tree_stats(_trace)


@st.cache_data(max_entries=state.DERIVED_KEPT, ttl=state.CACHE_TTL_S, show_spinner=False)
def comparison_of(chain_key: str, tree_key: str, _chain: Trace, _tree: Trace) -> ChainTreeComparison:
    return compare_chain_tree(_chain, _tree)


def chain_refs() -> list[state.TraceRef]:
    """Where a chain trace to compare with may come from: bundled traces, live runs, this session's upload."""
    refs = state.saved_refs()
    uploaded = st.session_state.get(UPLOADED)
    if uploaded and uploaded[1] is not None:
        refs.append(uploaded[1])
    return [r for r in refs if r != state.current_ref()]


def sort_candidates(tree: Trace, refs: list[state.TraceRef]) -> tuple[list[state.TraceRef], list[tuple[str, str]]]:
    """(chain traces of the tree's pair and prompt, [(label, why not)] for the rest)."""
    matches, others = [], []
    for ref in refs:
        try:
            trace, _ = state.load_ref(ref)
        except (TraceError, OSError) as err:
            others.append((ref.label, f"could not be read: {state.shown_paths(str(err))[:160]}"))
            continue
        if is_tree_trace(trace):
            others.append((ref.label, "a tree trace, not a chain"))
            continue
        why = pair_differences(trace.header, tree.header)
        if why or not trace.cycles:
            others.append((ref.label, "; ".join(why) or "no cycles"))
        else:
            matches.append(ref)
    return matches, others


# ---------------------------------------------------------------- sections

def acceptance_section(ts: TreeStats) -> None:
    metric_row([("Tokens per cycle", f"{ts.tokens_per_cycle:.3f}", TREE_DEFINITIONS["tokens_per_cycle"]),
                ("Accepted / drafted nodes", f"{ts.acceptance_rate:.3f}", TREE_DEFINITIONS["acceptance_rate"]),
                ("Cycles saved by a later sibling", f"{ts.saved_cycles} of {ts.num_cycles}",
                 TREE_DEFINITIONS["saved_cycles"]),
                ("Next token a bonus", f"{ts.bonus_cycles} of {ts.num_cycles}", TREE_DEFINITIONS["next_token"])])
    numbered_line("Acceptance by depth", ts.acceptance_by_depth)
    st.caption(TREE_DEFINITIONS["acceptance_by_depth"])
    chart_pair((figs.acceptance_depth_figure(ts), "tree_fig_depth"), (figs.tokens_distribution_figure(ts), "tree_fig_tokens"))
    chart(figs.sibling_rank_figure(ts), key="tree_fig_ranks")
    st.caption(TREE_DEFINITIONS["sibling_rank"])


def cost_section(ts: TreeStats) -> None:
    metric_row([("Draft forwards per cycle", f"{ts.draft_forwards:.2f}",
                 TREE_DEFINITIONS["draft_forwards"] + f" Catch-up in {ts.catch_up_share:.0%} of cycles."),
                ("Verify pass (median)", f"{ts.verify_s.median * 1000:.2f} ms",
                 f"Nodes per cycle: mean {ts.nodes_mean:.1f}, min {ts.nodes_min}, max {ts.nodes_max}; "
                 "the pass covers them and the root."),
                ("Cycle (median)", f"{ts.cycle_s.median * 1000:.2f} ms",
                 f"middle half {ts.cycle_s.low * 1000:.2f}–{ts.cycle_s.high * 1000:.2f} ms"),
                ("Tokens/s (decoding)", f"{ts.tokens_per_s:.1f}", TOKENS_PER_S[0].upper() + TOKENS_PER_S[1:] + ".")])
    chart(figs.verify_width_figure(ts), key="tree_fig_verify")
    st.dataframe([{"verify width (positions)": w.width, "cycles": w.cycles,
                   "median ms": round(w.verify_s.median * 1000, 3), "25% ms": round(w.verify_s.low * 1000, 3),
                   "75% ms": round(w.verify_s.high * 1000, 3)} for w in ts.verify_by_width],
                 hide_index=True, key="tree_verify_table")
    st.info("Tree runs record no step-time calibration yet, so this page gives no speedup over plain decoding. "
            "**Compare with a chain** measures the tree against a chain run of the same pair.",
            icon=":material/timer_off:")


def comparison_rows(cmp: ChainTreeComparison) -> list[dict]:
    c, t = cmp.chain, cmp.tree

    def ratio(a: float, b: float) -> str:
        return f"{b / a:.2f}×" if a > 0 else "–"

    rows = [("tokens per cycle", c.tokens_per_cycle, t.tokens_per_cycle, ".3f"),
            ("draft forwards per cycle", c.draft_forwards, t.draft_forwards, ".2f"),
            ("verify width (positions)", c.verify_width, t.verify_width, ".1f"),
            ("verify ms (median)", c.verify_s.median * 1000, t.verify_s.median * 1000, ".2f"),
            ("cycle ms (median)", c.cycle_s.median * 1000, t.cycle_s.median * 1000, ".2f"),
            ("tokens/s (decoding)", c.tokens_per_s, t.tokens_per_s, ".1f"),
            ("cycles", c.cycles, t.cycles, "d")]
    return [{"": name, c.label: f"{a:{fmt}}", t.label: f"{b:{fmt}}", "tree / chain": ratio(a, b)}
            for name, a, b, fmt in rows]


def comparison_section(cmp: ChainTreeComparison, ts: TreeStats, chain_label: str) -> None:
    metric_row([("Measured speedup of the tree over the chain", "–" if cmp.speedup is None else f"{cmp.speedup:.2f}×",
                 "The tree's tokens/s over the chain's, both decoding only: " + TOKENS_PER_S + "."),
                ("Tokens per cycle, tree / chain", f"{cmp.tokens_ratio:.2f}×",
                 "What the tree's extra branches bought per cycle; the speedup is what is left after the "
                 "wider verify pass paid for them.")])
    (st.success if cmp.fair else st.warning)(md(cmp.fairness), icon=":material/balance:")
    for note in cmp.notes:
        st.warning(md(note), icon=":material/tune:")
    st.dataframe(comparison_rows(cmp), hide_index=True, height="content", key="tree_compare_table")
    st.caption(f"Chain: {md(chain_label)}. Target **{md(cmp.target)}**, draft **{md(cmp.draft)}**, the same prompt.")
    chart_pair((figs.acceptance_depth_figure(ts, cmp), "tree_fig_compare_depth"),
               (figs.tokens_distribution_figure(ts, cmp), "tree_fig_compare_tokens"))
    chart(figs.verify_width_figure(ts, cmp), key="tree_fig_compare_verify")


def upload_chain(tree: Trace) -> None:
    """A chain trace uploaded for the comparison: checked by the loader and against the tree's pair,
    kept in the server's upload folder under its hash, remembered for this session (not opened)."""
    file = st.file_uploader("…or upload a chain trace of this pair (.jsonl)", type=["jsonl", "json", "txt"],
                            key=UPLOADER, max_upload_size=state.MAX_UPLOAD_BYTES // 2**20)
    if file is None:
        return
    data = file.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:16]
    kept = st.session_state.get(UPLOADED)
    if kept is None or kept[0] != digest:  # parsed once per file, not on every rerun
        st.session_state[UPLOADED] = (digest, *check_upload(tree, file.name, data, digest))
        ref = st.session_state[UPLOADED][1]
        if ref is not None:  # the selector, drawn above, cannot change in this run: select it in the next
            st.session_state[PICK] = ref
            st.rerun()
    refused = st.session_state[UPLOADED][2]
    if refused:
        st.error(f"Not compared: {md(refused)}", icon=":material/error:")


def check_upload(tree: Trace, name: str, data: bytes, digest: str) -> tuple[state.TraceRef | None, str | None]:
    if len(data) > state.MAX_UPLOAD_BYTES:
        return None, f"{len(data) / 2**20:.1f} MiB is larger than the {state.MAX_UPLOAD_BYTES // 2**20} MiB an upload may have"
    try:
        chain = loads_trace(data, name, allow_incomplete=True)
    except TraceError as err:
        return None, state.shown_paths(str(err))
    if is_tree_trace(chain):
        return None, f"{name} is a tree trace: upload a chain run of the same pair"
    why = pair_differences(chain.header, tree.header)
    if why:
        return None, "; ".join(why)
    ref = state.TraceRef("upload", f"{digest}.jsonl")
    try:
        state.store_upload(ref.path, data)
    except OSError as err:
        return None, f"could not keep the upload on the server: {state.shown_paths(str(err))}"
    return ref, None


def compare_tab(tree: Trace, ts: TreeStats) -> None:
    st.write("A chain run of the same target, draft and prompt, beside this tree: what the extra branches buy "
             "per cycle, and what they cost in the verify pass.")
    matches, others = sort_candidates(tree, chain_refs())
    if PICK in st.session_state:
        st.session_state[COMPARE_WITH] = st.session_state.pop(PICK)
    if matches:
        if st.session_state.get(COMPARE_WITH) not in matches:
            st.session_state[COMPARE_WITH] = matches[0]
        ref = st.selectbox("Chain trace", matches, format_func=lambda r: r.label, key=COMPARE_WITH)
    else:
        ref = None
        st.info(f"None of the {len(others)} other traces here is a chain run of this pair and prompt "
                f"(target {md(model_label(tree.header, 'target').label)}, draft {md(model_label(tree.header, 'draft').label)}). "
                "Record one with `python -m engine run` and the same prompt without `--tree`, or upload one below.",
                icon=":material/search_off:")
    if others:
        with st.expander(f"Traces not offered ({len(others)})"):
            st.markdown("\n".join(f"- {md(label)}: {md(why)}" for label, why in others))
    upload_chain(tree)
    if ref is None:
        return
    try:
        chain, chain_key = state.load_ref(ref)
        cmp = comparison_of(chain_key, state.current_key(), chain, tree)
    except (TraceError, OSError, ValueError) as err:
        st.error(f"Could not compare with {md(ref.label)}: {md(state.shown_paths(str(err)))}")
        return
    comparison_section(cmp, ts, ref.label)


# ---------------------------------------------------------------- the page's tree part

def headline(ts: TreeStats) -> str:
    depth1 = ts.acceptance_by_depth[0] if ts.acceptance_by_depth else 0.0
    # three decimals, as the metric under it and a chain's headline print it (1.81 above 1.815 read as two values)
    parts = [f"**{ts.tokens_per_cycle:.3f}** tokens per cycle", f"depth 1 reached in **{depth1:.0%}** of cycles",
             f"a later sibling saved **{ts.saved_cycles}** of {ts.num_cycles} cycles"]
    if ts.tokens_per_s > 0:  # 0: the cycles carry no times
        parts.append(f"**{ts.tokens_per_s:.1f}** tokens/s decoding")
    return "This tree run: " + " · ".join(parts)


def draw(trace: Trace) -> None:
    """The statistics page for the open tree trace."""
    keep_tab_widgets((COMPARE_WITH,))  # the comparison's choice, kept while another tab is open
    h = trace.header
    st.caption(f"Target **{md(model_label(h, 'target').label)}** · draft **{md(model_label(h, 'draft').label)}** · "
               f"{md(tree_words(h['settings']['tree']))} · temperature "
               f"{h['settings']['temperature']} · {len(trace.cycles)} cycles"
               + ("" if trace.complete else " · incomplete run (no summary)"), help=md(models_help(h)))
    if not trace.cycles:
        st.warning("This trace has no cycles to analyse.")
        return
    ts = tree_stats_of(state.current_key(), trace)
    first_result().markdown(headline(ts))
    for name, tab in zip(TABS, st.tabs(TABS, key=TAB, on_change="rerun")):
        if tab.open:
            with tab:
                if name == "Tree acceptance":
                    acceptance_section(ts)
                elif name == "Cost":
                    cost_section(ts)
                else:
                    compare_tab(trace, ts)
