"""The Workload page's "Your server's requests" section (in its sources' tab): vLLM's per-request spec-decode metrics (summary
or detailed) or SGLang's per-request counts and histogram, in the same views as a workload.

Every number comes from engine/servers/ (the same as `python -m engine metrics FILE`). Servers
report counts only: the tab shows what the file carries (per request, per step, per position
where there, per category when the file names one) and says what a trace would add. The input
is untrusted: size-checked before it is decoded, one line per refusal, every text through md().
"""
import streamlit as st

from app.figures import workload as figs
from app.figures.workload import fmt
from app.ui.safe import markdown_table, md
from app.ui.widgets import chart
from engine.servers.read import decode, read_requests_text
from engine.servers.request_stats import requests_stats
from engine.servers.server_metrics import MAX_INPUT_BYTES, ServerMetricsError

SHOWN_REQUESTS = 200  # rows of the per-request table; the statistics count every request


def read_input() -> dict | None:
    file = st.file_uploader("Per-request metrics: vLLM responses with metrics.speculative_decoding "
                            "(--per-request-spec-decode-metrics summary or detailed), or SGLang responses with "
                            "meta_info (JSON or JSON Lines; an optional \"category\" per request is kept)",
                            key="wl_server_file", max_upload_size=max(1, MAX_INPUT_BYTES // 2**20))
    pasted = st.text_area("…or paste it here", key="wl_server_paste", height=120)
    if file is None and not pasted.strip():
        st.info("Upload or paste a server's per-request output to read it here.")
        return None
    try:
        requests = read_requests_text(decode(file.getvalue(), file.name) if file is not None else pasted)
    except ServerMetricsError as err:
        st.error(md(str(err)), icon=":material/error:")
        return None
    if requests is None:
        st.error("This file holds no per-request speculative-decoding metrics (server-wide counters are read on "
                 "the statistics page's **Your server** tab).", icon=":material/error:")
        return None
    return requests_stats(requests)


def draw() -> None:
    stats = read_input()
    if stats is None:
        return
    o = stats["overall"]
    st.markdown(f"**{stats['requests']}** requests from {md(str(stats['source']))} · draft acceptance rate "
                f"**{fmt(o['acceptance_rate'])}** · mean acceptance length **{fmt(o['mean_acceptance_length'], 2)}**"
                f" · K {stats['k'] if stats['k'] is not None else 'not given'}")
    for note in stats["notes"]:
        st.caption(md(note))
    chart(figs.category_figure(stats), key="wl_server_categories")
    if o["conditional_acceptance"] is not None:
        chart(figs.conditional_figure(stats), key="wl_server_conditional")
    if o["accepted_histogram"] is not None:
        chart(figs.histogram_figure(stats, labels=(stats["source"], "")), key="wl_server_histogram")
    rows = stats["per_request"]
    st.markdown(markdown_table([
        {"request": r["id"], "category": r["category"], "steps": r["cycles"], "acceptance rate": fmt(r["acceptance_rate"]),
         "mean acceptance length": fmt(r["mean_acceptance_length"], 2),
         "accepted per step": "–" if r["accepted_per_cycle"] is None else " ".join(map(str, r["accepted_per_cycle"]))}
        for r in rows[:SHOWN_REQUESTS]]))
    if len(rows) > SHOWN_REQUESTS:
        st.caption(f"The first {SHOWN_REQUESTS} of {len(rows)} requests; the charts count them all.")
    st.markdown("**What a trace of these requests would add:**\n" +
                "\n".join(f"- {md(line)}" for line in stats["what_a_trace_adds"]))
