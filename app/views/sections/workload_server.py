"""The Workload page's views of a server's requests: the "Your server's requests" section (in its sources' tab:
vLLM's per-request spec-decode metrics, summary or detailed, or SGLang's per-request counts and histogram,
pasted or uploaded) and a server-workload folder (`python -m engine client --out`, under the live runs'
folder's servers/, app/ui/server_workloads.py), both drawn by draw_stats in the same views as a workload.
A folder adds what only it holds: prompt lengths, the per-step strip, and both totals (the requests' sum
against the server's /metrics counters) with whether they agree and why they may not.

Every number comes from engine/servers/ (the same as `python -m engine metrics FILE`). Servers
report counts only: the tab shows what the file carries (per request, per step, per position
where there, per category when the file names one) and says what a trace would add. The input
is untrusted: size-checked before it is decoded, one line per refusal, every text through md().
"""
import json

import streamlit as st

from app.figures import server_workload as server_figs
from app.figures import workload as figs
from app.figures.workload import fmt
from app.ui import server_workloads
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
    if stats is not None:
        draw_stats(stats, "wl_server")


def draw_stats(stats: dict, key: str) -> None:
    """What any server's per-request statistics show (requests_stats' dict, or server_workload_stats' which holds it)."""
    o = stats["overall"]
    st.markdown(f"**{stats['requests']}** requests from {md(str(stats['source']))} · draft acceptance rate "
                f"**{fmt(o['acceptance_rate'])}** · mean acceptance length **{fmt(o['mean_acceptance_length'], 2)}**"
                f" · K {stats['k'] if stats['k'] is not None else 'not given'}")
    for note in stats["notes"]:
        st.caption(md(note))
    chart(figs.category_figure(stats), key=f"{key}_categories")
    if o["conditional_acceptance"] is not None:
        chart(figs.conditional_figure(stats), key=f"{key}_conditional")
    if o["accepted_histogram"] is not None:
        chart(figs.histogram_figure(stats, labels=(stats["source"], "")), key=f"{key}_histogram")
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


# ---------------------------------------------------------------- a server-workload folder

def describe(stats: dict) -> str:
    server, s = stats["server"], stats["settings"]
    config = stats["speculative_config"]
    said = "not told" if config is None else f"{json.dumps(config)} (from {stats['speculative_config_source']})"
    return (f"{md(server['kind'])} {md(str(server['version'] or ''))} at {md(stats['url'])} ({md(stats['endpoint'])}) · "
            f"model {md(str(server['model']))} · speculative config {md(said)} · max_tokens {s['max_tokens']} · "
            f"temperature {s['temperature']:g} · {stats['requests']} requests done of "
            f"{stats['planned_requests'] if stats['planned_requests'] is not None else '?'} planned, "
            f"{len(stats['failed'])} failed")


def totals(stats: dict) -> None:
    """Both totals side by side, then equal / differ / not compared and why."""
    word, why = server_workloads.verdict(stats)
    st.markdown(f"**Both totals: {word}**")
    st.markdown(markdown_table(server_workloads.totals_rows(stats)))
    st.caption(f"{md(word.capitalize())}: {md(why)}.")


def draw_folder(slot, choice: tuple[str, str]) -> None:
    """A server-workload folder: the same views as pasted requests, plus prompt lengths, the strip and both totals."""
    try:
        stats = server_workloads.stats_of(choice)
    except ServerMetricsError as err:  # ServerWorkloadError among them: one escaped line
        st.error(f"Could not read this server workload: {md(str(err))}", icon=":material/error:")
        return
    o = stats["overall"]
    slot.markdown(f"Across **{stats['requests']}** requests the server accepted **{fmt(o['acceptance_rate'])}** of "
                  f"its draft tokens; **{fmt(o['mean_acceptance_length'], 2)}** tokens per step (mean acceptance length)")
    st.caption(describe(stats))
    for f in stats["failed"]:
        st.caption(f"failed {md(f['id'])}: {md(f['error'])}")
    totals(stats)
    draw_stats(stats, "wl_folder")
    if stats["context_length"]:
        chart(server_figs.prompt_length_figure(stats), key="wl_folder_prompt_length")
    strips = server_figs.strip_rows(stats)
    if strips:
        chart(server_figs.accepted_strip_figure(stats), key="wl_folder_strip")
        with_steps = sum(r["accepted_per_cycle"] is not None for r in stats["per_request"])
        if with_steps > len(strips):
            st.caption(f"The first {len(strips)} of {with_steps} requests with per-step counts are drawn as strips.")
    else:
        st.caption("No request carries per-step counts (vLLM's summary metrics give totals only), so there is no strip.")
