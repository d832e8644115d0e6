"""Workloads the app can show: the bundled zips, this server's live workload runs, and uploads.

A workload is named by (kind, bare name) as app/ui/state.py's workload refs are; a request's
trace opens in the stepper as TraceRef("workload", KIND~NAME~request-NNNN.jsonl). An uploaded
zip is checked whole (every entry, its manifest, every trace and a batch's batch.jsonl,
engine/workload/folder.py) before it is kept, under the hash of its bytes; a refusal is one
line (state.upload_refusal). Statistics are computed once per workload content.
"""
import hashlib
from urllib.parse import urlencode

import streamlit as st

from app.ui import state
from app.ui.safe import md
from engine.trace import TraceError
from engine.workload.folder import Workload, open_zip
from engine.workload.stats import workload_stats

OPEN = "workload_open"  # session_state: the (kind, name) the Workload page shows
OTHER = "workload_other"  # session_state: the (kind, name) it compares with
REFUSED = "workload_refused"  # session_state: (hash of refused bytes, why), not parsed again on a rerun
KIND_WORDS = {"bundled": "example", "run": "live run", "upload": "upload", "diagnosis": "arm of a bundled diagnosis",
              "server": "server workload"}  # the last: app/ui/server_workloads.py, listed by the page beside these
LISTED_KINDS = ("bundled", "upload", "run")  # the bundled diagnoses' arms open from the Diagnose page only


def listed() -> list[tuple[str, str]]:
    """The bundled workloads, then the uploads, then this server's live workload runs, by name (a live
    diagnosis's arms are live workload runs too; a bundled diagnosis's arms are not listed)."""
    found = []
    for kind in LISTED_KINDS:
        folder = state.workloads_dir(kind)
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            usable = path.suffix == ".zip" and path.is_file() if kind != "run" else (path / "manifest.json").is_file()
            if usable and state.is_bare(path.name) and not path.is_symlink():
                found.append((kind, path.name))
    return found


def words(choice: tuple[str, str]) -> str:
    kind, name = choice
    return f"{name.removesuffix('.zip')} ({KIND_WORDS[kind]})"


def content_key(choice: tuple[str, str]) -> str:
    path = state.workload_path(*choice)
    stamp = (path / "manifest.json").stat() if path.is_dir() else path.stat()
    return f"{choice[0]}~{choice[1]}@{stamp.st_mtime_ns}:{stamp.st_size}"


def load(choice: tuple[str, str]) -> Workload:
    return state.load_workload(*choice)


@st.cache_resource(max_entries=8, ttl=state.CACHE_TTL_S, show_spinner="Computing the workload's statistics…")
def _stats(key: str, _workload: Workload) -> dict:
    """A resource, not st.cache_data: every session reads the one dict (no page may change it) instead
    of unpickling its own copy on every rerun (a 100-request workload's loss points and per-request rows)."""
    return workload_stats(_workload.runs())


def stats_of(choice: tuple[str, str]) -> dict:
    """engine/workload/stats.py's statistics of a workload, computed once per content."""
    return _stats(content_key(choice), load(choice))


def open_upload(name: str, data: bytes) -> tuple[tuple[str, str] | None, str | None]:
    """Check an uploaded zip whole, keep it under its hash, and return its (kind, name), or the reason it was refused."""
    if len(data) > state.MAX_UPLOAD_BYTES:
        return None, f"{len(data) / 2**20:.1f} MiB is larger than the {state.MAX_UPLOAD_BYTES // 2**20} MiB an upload may have"
    digest = hashlib.sha256(data).hexdigest()[:16]
    refused = st.session_state.get(REFUSED)
    if refused is not None and refused[0] == digest:
        return None, refused[1]
    choice = ("upload", f"{digest}.zip")
    if state.workload_path(*choice).is_file():
        return choice, None
    try:
        workload = open_zip(data, state.upload_name(name))  # the zip checked whole: every entry's name, type and bytes
        workload.runs()  # every trace, checked against its entry
        workload.batch_trace()  # a batched workload's batch.jsonl, checked against the manifest and the traces
    except Exception as err:  # noqa: BLE001 - an upload is refused in one line, never with a traceback
        st.session_state[REFUSED] = (digest, state.upload_refusal(name, err))
        return None, st.session_state[REFUSED][1]
    try:
        state.store_upload(state.workload_path(*choice), data)
    except OSError as err:
        return None, f"could not keep the upload on the server: {state.shown_paths(str(err))}"
    return choice, None


def request_query(choice: tuple[str, str], file: str, cycle: int = 0, stage: int = 1) -> dict[str, str]:
    """The stepper's URL parameters for one request of a workload, at a cycle and stage."""
    return {"trace": state.request_ref(choice[0], choice[1], file).token, "cycle": str(cycle), "stage": str(stage)}


def link(text: str, choice: tuple[str, str], file: str, cycle: int = 0, stage: int = 1) -> str:
    """A Markdown link into the stepper (a new session reads its parameters); the text escaped,
    the parameters built from checked names."""
    return f"[{md(text)}](./?{urlencode(request_query(choice, file, cycle, stage))})"


def open_request(choice: tuple[str, str], file: str, cycle: int, stage: int) -> str | None:
    """Open a request's trace at a cycle in this session (the stepper then shows it); an error, or None."""
    return state.set_current(state.request_ref(choice[0], choice[1], file), cycle, stage)


def same_outcome(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Whether two workloads decoded the same (engine/workload/folder.py Workload.outcome): a comparison
    of them draws every bar twice. Compared by content, so a copy under another name counts too."""
    return load(a).outcome() == load(b).outcome()


def comparable(choice: tuple[str, str], others: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`others` with those that decoded differently from `choice` first, in list order (a comparison
    opens on the first); one that cannot be read counts as different (picking it says why)."""
    def same(other: tuple[str, str]) -> bool:
        try:
            return same_outcome(choice, other)
        except TraceError:
            return False
    return sorted(others, key=same)  # stable: False (different) first
