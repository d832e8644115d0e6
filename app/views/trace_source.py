"""Choose a trace: a bundled example, a live run, or an uploaded JSONL file."""
import streamlit as st

from app import live, state
from app.safe import md

STEPPER = "views/stepper.py"


def bundled() -> None:
    names = state.bundled_traces()
    if not names:
        st.info(f"No bundled example traces yet: add `*.jsonl` files to {md(state.shown_paths(str(state.traces_dir())))}.")
        return
    ref = state.current_ref()
    index = names.index(ref.name) if ref and ref.kind == "bundled" and ref.name in names else 0
    name = st.selectbox("Example trace", names, index=index, key="bundled_name")
    if st.button("Open example", key="open_bundled", type="primary"):
        error = state.set_current(state.TraceRef("bundled", name))
        if error:
            st.error(md(error), icon=":material/error:")
        else:
            st.switch_page(STEPPER)


def upload() -> None:
    st.write("Upload a trace written elsewhere, e.g. on a GPU machine with the command line tool.")
    file = st.file_uploader("Trace file (.jsonl)", type=["jsonl", "json", "txt"], key="upload_file")
    if file is None:
        return
    error = state.open_upload(file.name, file.getvalue())  # validates through engine.trace, stores, opens
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
    tab_bundled, tab_live, tab_upload = st.tabs(["Bundled examples", "Live run", "Upload"])
    with tab_bundled:
        bundled()
    with tab_live:
        live.run_form()
    with tab_upload:
        upload()


main()
