"""Workload: many requests read as a whole, by category, draft position, context length and request,
with a path from every number down to the cycles behind it (links into the stepper).

Sources: app/views/sections/workload_source.py; views: app/views/sections/workload_views.py and
workload_loss.py; a server's per-request metrics: app/views/sections/workload_server.py, in the
sources' tab; a replica's comparison with its server (`engine replica`): workload_replica.py, above
the tabs. Seven tabs, so that all of them fit at 1366x768; only the open tab runs. A server workload
(`engine client`'s folder under the live runs' folder's servers/) shows workload_server.py's views of it
in a tab of its own, beside the sources' tab.
"""
import streamlit as st

from app.ui import server_workloads, workloads
from app.ui.first_result import first_result
from app.ui.safe import md
from app.views.sections import workload_loss, workload_replica, workload_source, workload_views
from engine.trace import TraceError

TAB = "workload_tab"
SOURCES = "Upload or run live"
COMPARE = "Compare two workloads"
SERVER_TAB = "server_workload_tab"
SERVER_TABS = ["Your server's workload", SOURCES]
TABS = ["Categories", "Positions and context", "Where the loss is", "Requests", "Batch lanes", COMPARE, SOURCES]


def describe(choice: tuple[str, str], manifest: dict) -> str:
    pair, s = manifest["pair"], manifest["settings"]
    names = pair.get("preset") or pair["target"].get("name", "?")
    drafter = pair.get("drafter", {}).get("kind", "model")
    shape = f"tree {s['tree']}" if s.get("tree") else f"K={s['k']}"
    machine = manifest.get("machine", {})
    return (f"{md(workloads.words(choice))} · pair **{md(str(names))}** · drafter **{md(str(drafter))}** · {md(shape)}"
            f" · temperature {s['temperature']} · recorded on {md(str(machine.get('cpu', '?')))} "
            f"({md(str(machine.get('device', '?')))})")


def other_workload(choice: tuple[str, str]) -> tuple[tuple[str, str] | None, dict | None]:
    """The workload to compare with (another drafter, K, chain against tree, temperature): by default the
    first that decoded something else, so a batched twin of the same greedy run is not the first pair."""
    others = workloads.comparable(choice, [c for c in workloads.listed() if c != choice])
    if not others:
        st.info("Only one workload is here: upload or run another to compare.")
        return None, None
    current = st.session_state.get(workloads.OTHER)
    picked = st.selectbox("Compare with", others, index=others.index(current) if current in others else 0,
                          format_func=workloads.words, key="workload_other_pick")
    st.session_state[workloads.OTHER] = picked
    try:
        if workloads.same_outcome(choice, picked):
            st.info("These two decoded the same requests with the same acceptance (one ran them batched, or one "
                    "is a copy): every pair of bars matches. Pick another workload to see a difference.")
        return picked, workloads.stats_of(picked)
    except TraceError as err:
        st.error(f"Could not read {md(workloads.words(picked))}: {md(str(err))}", icon=":material/error:")
        return None, None


def draw_tab(name: str, choice: tuple[str, str], stats: dict) -> None:
    labels = (workloads.words(choice), "")
    if name == "Categories":
        workload_views.categories_tab(stats, None, labels)
    elif name == "Positions and context":
        workload_views.positions_tab(stats, None, labels)
        workload_views.context_tab(stats, None, labels)
    elif name == "Where the loss is":
        workload_loss.loss_tab(choice, stats)
    elif name == "Requests":
        workload_views.requests_tab(choice, stats)
    elif name == "Batch lanes":
        workload_views.batch_tab(choice)
    elif name == COMPARE:
        other, other_stats = other_workload(choice)
        if other_stats is not None:
            both = (workloads.words(choice), workloads.words(other))
            workload_views.categories_tab(stats, other_stats, both)
            workload_views.positions_tab(stats, other_stats, both)
            workload_views.context_tab(stats, other_stats, both)
    elif name == SOURCES:
        sources()


def sources() -> None:
    """An upload, the live form and a server's per-request metrics: in a tab of their own, so a page load
    draws none of them (their widgets' code would arrive before the first chart)."""
    workload_source.upload()
    workload_source.live_form()
    st.subheader("Your server's requests")
    from app.views.sections import workload_server  # loaded only when the tab opens
    workload_server.draw()


def main() -> None:
    st.title("Acceptance across a workload")
    slot = first_result()
    choice = workload_source.choose()
    if choice is None:
        sources()
    elif server_workloads.is_server(choice):
        show_server(slot, choice)
    else:
        show(slot, choice)


def show_server(slot, choice: tuple[str, str]) -> None:
    from app.views.sections import workload_server
    for name, tab in zip(SERVER_TABS, st.tabs(SERVER_TABS, key=SERVER_TAB, on_change="rerun")):
        if tab.open:
            with tab:
                if name == SOURCES:
                    sources()
                else:
                    workload_server.draw_folder(slot, choice)


def show(slot, choice: tuple[str, str]) -> None:
    try:
        workload = workloads.load(choice)
        stats = workloads.stats_of(choice)
    except TraceError as err:
        st.error(f"Could not read this workload: {md(str(err))}", icon=":material/error:")
        return
    if not stats["requests"]:
        st.warning("This workload has no finished request yet.")
        return
    workload_views.headline_row(slot, stats)
    st.caption(describe(choice, workload.manifest))
    skipped = [e for e in workload.entries if e.status == "skipped"]
    if skipped:
        st.caption(f"{len(skipped)} of {len(workload.entries)} requests were skipped: "
                   + md("; ".join(f"{e.id} ({e.reason})" for e in skipped)))
    workload_replica.draw(choice)
    for name, tab in zip(TABS, st.tabs(TABS, key=TAB, on_change="rerun")):
        if tab.open:
            with tab:
                draw_tab(name, choice, stats)


main()
