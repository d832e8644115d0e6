"""The Workload page's sources: a bundled workload, a live workload run, an uploaded zip, or a server workload
(`python -m engine client --out` put under the live runs' folder's servers/, app/ui/server_workloads.py).

A live run takes a few requests per category of the bundled prompt set through a shipped pair
on app/ui/jobs.py's queue (like every live run: alone, since its traces record times) and
writes an ordinary workload folder under the live runs' folder.
"""
import time
import uuid
from pathlib import Path

import streamlit as st

from app.ui import jobs, server_workloads, state, workloads
from app.ui.safe import md
from app.ui.widgets import remembered_pick
from engine.config import SettingsError, SpecSettings
from engine.models.presets import PRESETS
from engine.workload.prompts import BUNDLED_PROMPT_SET, read_prompts

PROMPT_SET = BUNDLED_PROMPT_SET
LIVE_JOB = "workload-run"
MAX_LIVE_PER_CATEGORY = 3  # a live workload is a demonstration: up to 30 short requests
MAX_LIVE_TOKENS = 32


def choose() -> tuple[str, str] | None:
    """The workload the page shows: picked from the list (the engine's workloads, then the server workloads under
    the live runs' folder's servers/), opened from an upload, or a finished live run."""
    ref = state.current_ref()
    came_from = state.parse_request_name(ref.name)[:2] if ref is not None and ref.kind == "workload" else None
    found = workloads.listed() + server_workloads.listed()
    return remembered_pick("Workload", found, remember=workloads.OPEN, key="workload_pick",
                           words=workloads.words, came_from=came_from,
                           empty="No workload here yet: upload one, or run a small one live, below.")


def upload() -> None:
    file = st.file_uploader("Upload a workload: a zip of the folder `python -m engine run --prompts` wrote",
                            type=["zip"], key="workload_upload",
                            max_upload_size=state.MAX_UPLOAD_BYTES // 2**20)
    if file is None:
        return
    choice, error = workloads.open_upload(file.name, file.getvalue())
    if error:
        st.error(f"Could not open this file as a workload: {md(error)}", icon=":material/error:")
        return
    if st.session_state.get("workload_uploaded") != choice:
        st.session_state["workload_uploaded"] = choice
        st.session_state[workloads.OPEN] = choice
        st.session_state.pop("workload_pick", None)  # the list shows the upload next
        st.rerun()


def live_form() -> None:
    """A small live workload on a shipped pair."""
    categories = sorted({r.category for r in read_prompts(PROMPT_SET)})
    with st.form("workload_live"):
        cols = st.columns(4)
        preset = cols[0].selectbox("Pair", sorted(PRESETS), key="wl_preset")
        per = cols[1].number_input("Requests per category", 1, MAX_LIVE_PER_CATEGORY, 1, key="wl_per")
        k = cols[2].number_input("K", 1, 8, 4, key="wl_k")
        tokens = cols[3].number_input("New tokens each", 4, MAX_LIVE_TOKENS, 16, key="wl_tokens")
        chosen = st.multiselect("Categories", categories, default=categories[:3], key="wl_categories")
        go = st.form_submit_button("Run this workload live", type="primary")
    if go:
        start_live(preset, int(per), int(k), int(tokens), chosen)
    job = jobs.show(LIVE_JOB)
    if job is not None and job.running:
        st.caption("Each finished request is kept; the page shows the workload when the run ends.")


def start_live(preset: str, per: int, k: int, tokens: int, categories: list[str]) -> None:
    if not categories:
        st.error("Pick at least one category.")
        return
    requests = [r for r in read_prompts(PROMPT_SET) if r.category in categories]
    requests = [r for c in categories for r in [q for q in requests if q.category == c][:per]]
    try:
        settings = SpecSettings(k=k, temperature=0.0, max_new_tokens=tokens, trace_top_k=3)
    except SettingsError as err:
        st.error(md(str(err)))
        return
    from app.runs.live import cached_preset  # loads torch: only when a live run starts
    pair = cached_preset(preset)
    name = f"live-{preset}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    folder = state.workloads_dir("run") / name

    def work(report):
        from engine.workload.run import run_workload
        done = []

        def on_request(entry) -> None:
            done.append(entry.id)
            report(len(done) / len(requests), f"{len(done)} of {len(requests)} requests ({entry.id} done)")

        run_workload(pair, requests, settings, folder, preset=preset, prompts_name=Path(PROMPT_SET).name,
                     on_request=on_request)
        return ("run", name)

    def on_done(choice) -> None:
        st.session_state[workloads.OPEN] = choice
        st.session_state.pop("workload_pick", None)

    jobs.start(LIVE_JOB, f"Live workload on {preset} ({len(requests)} requests)", work, on_done, alone=True)
