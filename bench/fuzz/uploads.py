"""Uploads through the app: a trace (app/ui/state.py `open_upload`) and a workload zip (app/ui/workloads.py
`open_upload`), called for real in Streamlit's bare mode (no server: st.session_state is the bare
mode's own, fresh in every forked child), with the upload folder inside the case's working folder.

The bytes are the traces' and the workloads' cases; the upload's name is chosen here, often hostile
(a path into the canary, a '../' climb, markup). The app may write only in its upload folder.
"""
import os
import random
from pathlib import Path

from app.ui import state, workloads
from bench.fuzz import traces
from bench.fuzz.cases import Case, Refused
from bench.fuzz.sandbox import Places
from bench.fuzz.workloads import workload_change

KIND = "uploads"
UPLOADS = "uploads"  # inside the working folder: the only place the app may write


def upload_name(rng: random.Random, places: Places, suffix: str) -> str:
    return rng.choice([f"run{suffix}", f"my run (2){suffix}", f"{places.canary}/planted{suffix}",
                       f"../canary/planted{suffix}", f"..\\canary\\planted{suffix}", f"C:/canary/planted{suffix}",
                       f"<img src=x onerror=alert(1)>{suffix}", f"\u202eevil{suffix}", f"/etc/passwd{suffix}"])


def shown_as(name: str) -> tuple[str, ...]:
    """The forms a refusal may name the upload by: as sent, its last part, or as the app shows a name
    (unprintable characters, a bidi override among them, as "?")."""
    return (name, Path(name).name, state.upload_name(name), state.upload_name(Path(name).name))


def make(rng: random.Random, index: int, places: Places) -> Case:
    if rng.random() < 0.5:
        change = traces.trace_change(rng)
        while change.max_bytes is not None:  # the app's size limit is its own: no smaller one can be handed in
            change = traces.trace_change(rng)
        name = upload_name(rng, places, ".jsonl")
        return Case(KIND, index, f"trace upload {name!r}: {change.words}", change.expect_incomplete, name, "trace",
                    data=change.data, mentions=shown_as(name), options={"allowed": UPLOADS})
    change = workload_change(rng, places, zipped_only=True)
    name = upload_name(rng, places, ".zip")
    return Case(KIND, index, f"workload upload {name!r}: {change.words}", change.expect, name, "workload",
                data=change.zip, tag=change.tag, mentions=shown_as(name), options={"allowed": UPLOADS})


def attempt(case: Case, work: Path) -> str:
    os.environ["SPECLAB_UPLOADS_DIR"] = str(work / UPLOADS)
    if case.call == "trace":
        error = state.open_upload(case.source, case.data)
        if error is not None:
            raise Refused(error)
        return f"opened, {len(state.current_trace().cycles)} cycles"
    choice, error = workloads.open_upload(case.source, case.data)
    if error is not None:
        raise Refused(error)
    return f"kept as {choice}"
