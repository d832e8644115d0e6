"""Choose a trace: a bundled example, a live run, or an uploaded JSONL file."""
import streamlit as st

from app.figures.tree_record import is_tree_header, tree_words
from app.runs import live
from app.ui import state
from app.ui.names import TREE_SPEEDUP, example_label, model_label
from app.ui.pages import STEPPER, WORKLOAD
from app.ui.safe import markdown_table, md
from engine.stats.analysis import trace_stats
from engine.trace import TraceError


@st.cache_data(max_entries=4, ttl=state.CACHE_TTL_S, show_spinner=False)
def _describe(keys: tuple[str, ...], _refs: tuple) -> list[dict]:
    rows = []
    for ref in _refs:
        try:
            trace, _ = state.load_ref(ref)
        except (TraceError, OSError) as err:
            rows.append({"trace": ref.name, "model pair": f"unreadable: {state.shown_paths(str(err))}"})
            continue
        h = trace.header
        pair = f"{h['preset']} preset" if h.get("preset") else (
            f"target {model_label(h, 'target').label}, draft {model_label(h, 'draft').label}")
        if is_tree_header(h):  # engine/stats reads a chain's per-position fields
            rows.append({"trace": ref.name, "K": f"{tree_words(h['settings']['tree'])}",
                         "temperature": h["settings"]["temperature"], "alpha": "–",
                         # a tree run times its cycles (Statistics shows its tokens/s); what it lacks is plain
                         # decoding's time to compare with
                         "measured speedup": TREE_SPEEDUP, "model pair": pair})
            continue
        stats = trace_stats(trace)
        rows.append({"trace": ref.name, "K": trace.k, "temperature": h["settings"]["temperature"],
                     "alpha": f"{stats.alpha:.3f}",  # as Statistics prints it: round() showed 0.340 as 0.34
                     "measured speedup": f"{stats.speed.measured:.2f}×" if stats.speed else "no step times",
                     "model pair": pair})
    return rows


def describe_bundled(names: list[str]) -> list[dict]:
    """One row per bundled trace: pair, K, temperature, alpha and measured speedup (engine/stats/analysis.py)."""
    refs = tuple(state.TraceRef("bundled", n) for n in names)
    keys = tuple(state.content_key(r) for r in refs)
    return _describe(keys, refs)


def bundled() -> None:
    """The choice first, then the table that describes every trace: below an 18-row table, the button
    to open one was off the first screen."""
    names = state.bundled_traces()
    if not names:
        st.info(f"No bundled example traces yet: add `*.jsonl` files to {md(state.shown_paths(str(state.traces_dir())))}.")
        return
    rows = describe_bundled(names)
    ref = state.current_ref()
    index = names.index(ref.name) if ref and ref.kind == "bundled" and ref.name in names else 0
    described = {r["trace"]: r for r in rows}
    pick, go = st.columns([4, 1], vertical_alignment="bottom")
    name = pick.selectbox("Example trace (each is described in the table below)", names, index=index,
                          key="bundled_name", format_func=lambda n: example_label(n, described[n]))
    if go.button("Open example", key="open_bundled", type="primary", width="stretch"):
        error = state.set_current(state.TraceRef("bundled", name))
        if error:
            st.error(md(error), icon=":material/error:")
        else:
            st.switch_page(STEPPER)
    st.markdown(markdown_table(rows))  # plain Markdown: drawn with the page, no table script to load
    st.caption("Measured speedup: this run's tokens per second of decoding against plain target decoding on the "
               "same machine (its recorded step times); below 1× speculation was slower there.")


def upload() -> None:
    st.write("Upload a trace written elsewhere, e.g. on a GPU machine with the command line tool.")
    file = st.file_uploader("Trace file (.jsonl)", type=["jsonl", "json", "txt"], key="upload_file",
                            max_upload_size=state.MAX_UPLOAD_BYTES // 2**20)  # the browser refuses a larger one
    if file is None:
        return
    error = state.open_upload(file.name, file.getvalue())  # validates through engine.trace.format, stores, opens
    if error:
        st.error(f"Could not open this file as a trace: {md(error)}", icon=":material/error:")
    else:
        trace = state.current_trace()
        st.success(f"Opened {md(file.name)}: {len(trace.cycles)} cycles.")
        if not trace.complete:
            st.warning("This run did not finish (the file has no summary line): showing the cycles it has.")
        st.page_link(STEPPER, label="Step through it", icon=":material/play_circle:")


def main() -> None:
    st.title("Choose a trace")
    st.page_link(WORKLOAD, label="Many requests at once: the Workload page (each request opens in the stepper from there)",
                 icon=":material/stacked_bar_chart:")
    tab_bundled, tab_live, tab_upload = st.tabs(["Bundled examples", "Live run", "Upload"])
    with tab_bundled:
        bundled()
    with tab_live:
        live.run_form()
    with tab_upload:
        upload()


main()
