"""The Workload page's replica section: for a workload `python -m engine replica` wrote, each request
against its server, equal or the first drafting step where they part, linked into the stepper there."""
import streamlit as st

from app.ui import replicas
from app.ui.safe import markdown_table, md
from engine.replica.report import summary_line
from engine.trace import TraceError


def draw(choice: tuple[str, str]) -> None:
    try:
        comparisons = replicas.comparison_of(choice)
    except TraceError as err:
        st.error(f"Could not read this replica's comparison: {md(str(err))}", icon=":material/error:")
        return
    if comparisons is None:
        return
    st.subheader("Against its server")
    st.caption(md(summary_line(comparisons)) + ". A server counts only the steps that drafted; the replica's "
               "cycles that drafted nothing are skipped before the two are laid side by side.")
    st.markdown(markdown_table(replicas.replica_rows(choice, comparisons), raw=("request",)))
