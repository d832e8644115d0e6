"""The Workload page's replica section: for a workload `python -m engine replica` wrote, greedy, each
request against its server, equal or the first drafting step where they part, linked into the stepper
there; sampled, conditional acceptance per draft position on both sides with intervals, the overall
figures, and each request's counts."""
import streamlit as st

from app.ui import replicas
from app.ui.safe import markdown_table, md
from engine.replica.report import sampled_summary_line, summary_line
from engine.replica.sampled import SampledComparison
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
    if isinstance(comparisons, SampledComparison):
        draw_sampled(choice, comparisons)
        return
    st.caption(md(summary_line(comparisons)) + ". A server counts only the steps that drafted; the replica's "
               "cycles that drafted nothing are skipped before the two are laid side by side.")
    st.markdown(markdown_table(replicas.replica_rows(choice, comparisons), raw=("request",)))


def draw_sampled(choice: tuple[str, str], c: SampledComparison) -> None:
    st.caption(md(sampled_summary_line(c)) + ". Sampled, the server and the replica draw from different random "
               "generators, so their texts part at once and only their pooled rates compare. Per position: of the "
               "drafting steps that drafted position i and accepted every position before it, the share that "
               "accepted i, with a 95% Wilson interval and a two-proportion test. Both take every step as an "
               "independent trial, which the steps of one request are not: read them as approximate. The overall "
               "figures' intervals resample whole requests.")
    st.markdown(markdown_table(replicas.position_rows(c)))
    st.markdown(markdown_table(replicas.overall_rows(c)))
    st.markdown(markdown_table(replicas.sampled_request_rows(choice, c), raw=("request",)))
