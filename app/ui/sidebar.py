"""The sidebar every page shares: what trace is open, and why a link's trace could not be opened."""
import streamlit as st

from app.ui import jobs, operator, state
from app.ui.names import model_label, models_help, shape_words
from app.ui.pages import DIAGNOSE, WORKLOAD
from app.ui.safe import md


def render(slot=None) -> None:
    """Into `slot` (an st.sidebar.empty() placeholder, so a second call replaces the first), else the sidebar."""
    with (slot.container() if slot is not None else st.sidebar):
        ref, trace = state.current_ref(), state.current_trace()
        if trace is None:
            st.caption("No trace open.")
        else:
            h = trace.header  # the models in words, their folders in the tooltip (app/ui/names.py)
            st.caption(f"Open trace: **{md(ref.label)}**  \n"
                       f"Target **{md(model_label(h, 'target').label)}**, draft **{md(model_label(h, 'draft').label)}**"
                       f"  \n{md(shape_words(h))}, {len(trace.cycles)} cycles", help=md(models_help(h)))
            request = trace.header.get("request")
            if request and ref.kind == "workload":  # a workload's request: say which, and the way back
                if state.parse_request_name(ref.name)[0] == "diagnosis":  # an arm of a bundled diagnosis
                    st.caption(f"Request **{md(request['id'])}** ({md(request['category'])}) of this diagnosis arm")
                    st.page_link(DIAGNOSE, label="Back to the diagnosis", icon=":material/troubleshoot:")
                else:
                    st.caption(f"Its trace: {md(state.parse_request_name(ref.name)[2])} in this workload")
                    st.page_link(WORKLOAD, label="Back to the workload", icon=":material/stacked_bar_chart:")
        if state.link_error():
            st.error(md(state.link_error()), icon=":material/error:")
        job = jobs.current()
        if job is not None and job.running:  # so a user who left its page knows where it went
            what = "Waiting in the server's queue" if job.waiting else "Still running in this session"
            st.caption(f"{what}: **{md(job.label)}** (its page shows the progress).")
        if operator.read_only():
            st.caption("Read-only class server: bundled and uploaded traces, nothing live.")
