"""The tree trace the teaching pages (walkthrough, interview) show a tree cycle from.

The open trace when it is a tree trace; else the bundled one, BUNDLED_TREE_TRACE in the bundled
traces folder (assets/traces/, state.traces_dir()); else nothing, with a note saying why. Until
that file is recorded the pages say there is no bundled tree trace yet.
"""
from dataclasses import dataclass

import streamlit as st

from app.figures.tree import root_text, tree_figure
from app.figures.tree_compaction import tree_compaction_figure
from app.figures.tree_mask import tree_mask_figure
from app.figures.tree_record import is_tree_header
from app.ui import state
from app.ui.pages import STEPPER
from app.ui.safe import md
from app.ui.widgets import chart, open_in_stepper, stepper_query
from engine.trace import Trace, TraceError
from engine.trace.layout_checks import layout_of

BUNDLED_TREE_TRACE = "chat-tree-dynamic-sampled.jsonl"  # the name the recording script gives it


@dataclass(frozen=True)
class TreeSource:
    trace: Trace | None
    note: str  # where the trace comes from, or why there is none (plain text: escape it)
    bundled: bool  # the bundled file rather than the open trace


def teaching_tree_trace() -> TreeSource:
    """The open trace if it is a tree trace with cycles, else the bundled tree trace, else a note."""
    open_trace = state.current_trace()
    if open_trace is not None and is_tree_header(open_trace.header) and open_trace.cycles:
        return TreeSource(open_trace, "the open trace", False)
    ref = state.TraceRef("bundled", BUNDLED_TREE_TRACE)
    if not ref.path.is_file():
        return TreeSource(None, f"No bundled tree trace yet: {BUNDLED_TREE_TRACE} is not among the bundled traces "
                                "(traces/). Open a tree trace (a run with --tree) to see one here.", False)
    try:
        trace, _ = state.load_ref(ref)
    except (TraceError, OSError) as err:
        return TreeSource(None, f"The bundled tree trace could not be read: {state.shown_paths(str(err))}", False)
    if not is_tree_header(trace.header) or not trace.cycles:
        return TreeSource(None, f"The bundled file {BUNDLED_TREE_TRACE} is not a tree trace with cycles.", False)
    return TreeSource(trace, f"the bundled tree trace {BUNDLED_TREE_TRACE}", True)


def show_tree_figures(source: TreeSource, c: dict, key: str, which: tuple[str, ...] = ("tree", "mask", "compaction")) -> None:
    """The chosen figures of one tree cycle of `source`, keyed `{key}_tree`, `{key}_mask`, `{key}_compaction`."""
    root = root_text(source.trace, c)
    layout = layout_of(source.trace.header)["name"]
    makers = {"tree": lambda: tree_figure(c, root, 5), "mask": lambda: tree_mask_figure(c, root),
              "compaction": lambda: tree_compaction_figure(c, root, layout)}
    for name in which:
        chart(makers[name](), key=f"{key}_{name}")


def open_in_stepper_button(source: TreeSource, cycle: int, key: str) -> None:
    """Into the stepper at this tree cycle's test stage: the open trace's own link, or a button that
    opens the bundled tree trace first."""
    if not source.bundled:
        open_in_stepper(cycle, 3, key=key)
        return
    if st.button(f"Open the bundled tree trace at cycle {cycle} in the stepper", key=key, icon=":material/play_circle:"):
        error = state.set_current(state.TraceRef("bundled", BUNDLED_TREE_TRACE), cycle, 3)
        if error:
            st.error(md(error), icon=":material/error:")
        else:
            st.switch_page(STEPPER, query_params=stepper_query(cycle, 3))
