"""Which trace is open, shared by every page.

A trace is named by a `TraceRef` (bundled file, live run, upload, or the path in the
SPECLAB_TRACE environment variable). Its short token (e.g. "bundled:default.jsonl")
goes into the URL, so a link reopens the same trace; tokens only ever name files
inside the app's own folders, never an arbitrary path.

Pages call `current_trace()`; the step (cycle, stage) lives in st.session_state too.
"""
import atexit
import hashlib
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from engine.stats.analysis import TraceStats, trace_stats
from engine.trace import Trace, TraceError, load_trace, loads_trace
from engine.workload.folder import Workload, open_workload
from engine.workload.manifest import REQUEST_FILE

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("bundled", "run", "upload", "env", "workload")  # workload: one request's trace inside a workload
# Where a workload is kept: assets, this server's uploads, live runs, and the arms of the bundled
# diagnoses (assets/diagnoses/<case>--<arm>.zip: app/ui/diagnoses.py; not on the Workload page's list).
WORKLOAD_KINDS = ("bundled", "upload", "run", "diagnosis")
WORKLOAD_SEP = "~"  # a request's name: KIND~WORKLOAD~request-NNNN.jsonl
MAX_UPLOAD_BYTES = 64 * 2**20  # a long chat run with K=8 and top-10 lists is a few MB
MAX_UPLOADS = 64  # kept per server; the oldest go first
MAX_UPLOAD_NAME_CHARS = 100  # of an upload's file name, in messages
# What the server keeps for every visitor at once (Streamlit's caches): at most so many entries
# per cached function, none older than CACHE_TTL_S (an evicted entry is computed again when asked).
TRACES_KEPT = 32  # parsed traces, one object shared by every session that opens the same file: every
# bundled trace (22 today) stays parsed once, with room for uploads and live runs
DERIVED_KEPT = 32  # each kind of data derived from a trace (its statistics, the stepper's token table)
CACHE_TTL_S = 3600.0

# session_state keys (other pages read these through the helpers below)
REF, TRACE, TRACE_KEY, ERROR, CYCLE, STAGE = "trace_ref", "trace", "trace_key", "trace_error", "cycle", "stage"
REFUSED_UPLOAD = "upload_refused"  # (hash of the bytes, why they are not a trace): not parsed again on a rerun


def traces_dir() -> Path:
    return Path(os.environ.get("SPECLAB_TRACES_DIR", ROOT / "assets" / "traces"))


def runs_dir() -> Path:
    return Path(os.environ.get("SPECLAB_RUNS_DIR", ROOT / "runs" / "live"))


_UPLOADS: list[Path] = []  # this server's private upload folder, made on first use
_UPLOADS_LOCK = threading.Lock()


def uploads_dir() -> Path:
    """SPECLAB_UPLOADS_DIR if the server sets it, else a private folder of this server process.

    The private folder is made by mkdtemp (mode 0700, a fresh name no other user can have
    planted) and removed when the process exits.
    """
    if os.environ.get("SPECLAB_UPLOADS_DIR"):
        return Path(os.environ["SPECLAB_UPLOADS_DIR"])
    with _UPLOADS_LOCK:
        if not _UPLOADS:
            folder = Path(tempfile.mkdtemp(prefix="speclab-uploads-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            _UPLOADS.append(folder)
        return _UPLOADS[0]


def shown_paths(text: str) -> str:
    """A message with the server's absolute folders replaced by names relative to the app."""
    runs = runs_dir()  # under the project (runs/live/ by default) it is shown as it is named there
    runs_name = runs.resolve().relative_to(ROOT.resolve()).as_posix() if runs.resolve().is_relative_to(ROOT.resolve()) else "runs"
    folders = [(uploads_dir(), "uploads"), (runs, runs_name), (traces_dir(), "traces"), (ROOT, ""),
               (Path(tempfile.gettempdir()), "tmp"), (Path.home(), "~")]
    for folder, name in sorted(folders, key=lambda f: -len(str(f[0]))):
        text = text.replace(str(folder) + os.sep, f"{name}/" if name else "").replace(str(folder), name or ".")
    return text


@dataclass(frozen=True)
class TraceRef:
    kind: str  # one of KINDS
    name: str = ""  # a file name inside that kind's folder ("" for env)

    @property
    def token(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind

    @property
    def path(self) -> Path:
        """The file, or for a workload's request the workload (its zip or folder)."""
        if self.kind == "env":
            return Path(os.environ.get("SPECLAB_TRACE", ""))
        if self.kind == "workload":
            kind, workload, _ = self.name.split(WORKLOAD_SEP)
            return workload_path(kind, workload)
        folder = {"bundled": traces_dir(), "run": runs_dir(), "upload": uploads_dir()}[self.kind]
        return folder / self.name

    @property
    def label(self) -> str:
        if self.kind == "workload":
            return request_label(*self.name.split(WORKLOAD_SEP))
        what = {"bundled": "example", "run": "live run", "upload": "upload", "env": "SPECLAB_TRACE"}[self.kind]
        return f"{what}: {self.name or self.path.name}"


def parse_token(token: str | None) -> TraceRef | None:
    """A ref from a URL token, or None if it names nothing the app may open."""
    if not token:
        return None
    kind, _, name = token.partition(":")
    if kind not in KINDS or (kind == "env") != (name == "") or (kind == "env" and not os.environ.get("SPECLAB_TRACE")):
        return None
    if name and (Path(name).name != name or name.startswith(".")):
        return None  # a bare file name only: no folders, no '..'
    if kind == "workload" and parse_request_name(name) is None:
        return None
    return TraceRef(kind, name)


def is_bare(name: str) -> bool:
    return bool(name) and Path(name).name == name and not name.startswith(".") and WORKLOAD_SEP not in name


def parse_request_name(name: str) -> tuple[str, str, str] | None:
    """(where the workload is kept, its bare name, the request's file) from KIND~WORKLOAD~FILE, or None."""
    parts = name.split(WORKLOAD_SEP)
    if len(parts) != 3 or parts[0] not in WORKLOAD_KINDS or not is_bare(parts[1]):
        return None
    return (parts[0], parts[1], parts[2]) if REQUEST_FILE.fullmatch(parts[2]) else None


def request_label(kind: str, workload: str, file: str) -> str:
    """A workload's request named by its id and category, as its manifest lists them; by its file
    only where the workload cannot be read (the file name says nothing about the request)."""
    try:
        entry = next((e for e in load_workload(kind, workload).entries if e.file == file), None)
    except (TraceError, OSError):
        entry = None
    shown = workload.removesuffix(".zip")
    return f"workload {shown}: {file}" if entry is None else f"{entry.id} ({entry.category}) of workload {shown}"


def request_ref(kind: str, workload: str, file: str) -> TraceRef:
    return TraceRef("workload", WORKLOAD_SEP.join((kind, workload, file)))


def diagnoses_dir() -> Path:
    """The bundled diagnoses: <case>.json beside one workload zip per arm, <case>--<arm>.zip."""
    return Path(os.environ.get("SPECLAB_DIAGNOSES_DIR", ROOT / "assets" / "diagnoses"))


def workloads_dir(kind: str) -> Path:
    """Bundled workloads are zips in assets/workloads/; uploads are zips named by their hash; live
    runs are folders under the live runs' folder; a bundled diagnosis's arms are zips beside it."""
    if kind == "bundled":
        return Path(os.environ.get("SPECLAB_WORKLOADS_DIR", ROOT / "assets" / "workloads"))
    if kind == "diagnosis":
        return diagnoses_dir()
    return (uploads_dir() if kind == "upload" else runs_dir()) / "workloads"


def workload_path(kind: str, name: str) -> Path:
    if kind not in WORKLOAD_KINDS or not is_bare(name) or (kind == "diagnosis" and not name.endswith(".zip")):
        raise TraceError(f"no such workload: {name!r}")
    return workloads_dir(kind) / name


@st.cache_resource(max_entries=8, ttl=CACHE_TTL_S, show_spinner="Reading workload…")
def _open_workload(path: str, mtime_ns: int, source: str) -> Workload:
    """Keyed by path and modification time (a live run's folder changes as its requests finish).
    One object per workload for every session: its traces are parsed once, as they are asked for."""
    workload = open_workload(path)
    workload.source = source  # messages name the workload, never the server's folders
    return workload


def load_workload(kind: str, name: str) -> Workload:
    path = workload_path(kind, name)
    if not path.exists():
        raise TraceError(f"workload not found: {name}")
    mtime = (path / "manifest.json").stat().st_mtime_ns if path.is_dir() else path.stat().st_mtime_ns
    return _open_workload(str(path), mtime, name)


def bundled_traces() -> list[str]:
    folder = traces_dir()
    return sorted(p.name for p in folder.glob("*.jsonl")) if folder.is_dir() else []


def saved_refs() -> list[TraceRef]:
    """The traces this server keeps, to compare the open one with: the bundled examples, then the live runs."""
    refs = [TraceRef("bundled", n) for n in bundled_traces()]
    runs = runs_dir()
    if runs.is_dir():
        refs += [TraceRef("run", p.name) for p in sorted(runs.glob("*.jsonl"))]
    return refs


def default_ref() -> TraceRef | None:
    """SPECLAB_TRACE if set, else assets/traces/default.jsonl, else the first bundled trace by name."""
    if os.environ.get("SPECLAB_TRACE"):
        return TraceRef("env")
    names = bundled_traces()
    if not names:
        return None
    return TraceRef("bundled", "default.jsonl" if "default.jsonl" in names else names[0])


# ---------------------------------------------------------------- loading (cached)

@st.cache_resource(max_entries=TRACES_KEPT, ttl=CACHE_TTL_S, show_spinner="Reading trace…")
def _load_path(path: str, mtime_ns: int, source: str) -> Trace:
    """Keyed by path and modification time, so a rewritten file is read again.

    A resource cache, not st.cache_data: every session that opens the same file holds the one
    parsed object instead of a copy of its own (a bundled trace parses to 0.4-1.6 MiB; a class
    of 30 on one trace would hold 30 copies). So no page may change a trace it is given; pages
    that need another one build a new Trace (app/views/sections/statistics_speed.py with_calibration does)."""
    return load_trace(path, allow_incomplete=True, source=source)


def load_ref(ref: TraceRef) -> tuple[Trace, str]:
    """The trace a ref names and a key that changes whenever its content can have changed."""
    if ref.kind == "workload":
        kind, name, file = parse_request_name(ref.name)
        workload = load_workload(kind, name)
        entry = next((e for e in workload.entries if e.file == file), None)
        if entry is None:
            raise TraceError(f"{name} has no {file}")
        return workload.trace(entry), content_key(ref)
    path = ref.path
    if not path.is_file():
        raise TraceError(f"trace file not found: {ref.label}")
    return _load_path(str(path), path.stat().st_mtime_ns, ref.label), content_key(ref)


def content_key(ref: TraceRef) -> str:
    """A key that changes whenever the file a ref names can have changed.

    The path is part of it: SPECLAB_TRACE (or the traces folder) can put different files under one token,
    and a fresh checkout gives many files the same modification time."""
    stat = ref.path.stat()
    return f"{ref.token}|{ref.path.resolve()}@{stat.st_mtime_ns}:{stat.st_size}"


# ---------------------------------------------------------------- the current trace

def set_current(ref: TraceRef, cycle: int = 0, stage: int = 1) -> str | None:
    """Open a trace; returns an error message (and keeps the previous trace) if it cannot be read."""
    try:
        trace, key = load_ref(ref)
    except (TraceError, OSError) as err:
        return shown_paths(str(err))
    st.session_state.update({REF: ref, TRACE: trace, TRACE_KEY: key})
    set_step(cycle, stage)
    return None


def current_ref() -> TraceRef | None:
    return st.session_state.get(REF)


def current_trace() -> Trace | None:
    """The open trace, or None when nothing could be opened."""
    return st.session_state.get(TRACE)


def current_key() -> str:
    """A string naming the open trace's content, for st.cache_data keys of derived data."""
    return st.session_state.get(TRACE_KEY, "")


@st.cache_data(max_entries=DERIVED_KEPT, ttl=CACHE_TTL_S, show_spinner=False)
def stats_of(key: str, _trace: Trace) -> TraceStats:
    """Every number the pages show about a trace (engine/stats/analysis.py), computed once per trace."""
    return trace_stats(_trace)


def current_stats() -> TraceStats | None:
    trace = current_trace()
    return stats_of(current_key(), trace) if trace is not None else None


def link_error() -> str | None:
    """Why the trace a link named could not be opened (shown in the sidebar), or None."""
    return st.session_state.get(ERROR)


def open_upload(name: str, data: bytes) -> str | None:
    """Validate uploaded bytes through the engine's loader, keep them, and open them.

    Returns an error message for the user, or None on success. The bytes are saved
    under their hash so the page URL can name the upload. Each rerun with the file still in
    the uploader comes here again: the bytes are parsed once, not on every rerun, and no parsed
    copy is cached beside the one the opened file gives (a 64 MiB upload parses to far more).
    """
    if len(data) > MAX_UPLOAD_BYTES:
        return f"{len(data) / 2**20:.1f} MiB is larger than the {MAX_UPLOAD_BYTES // 2**20} MiB an upload may have"
    digest = hashlib.sha256(data).hexdigest()[:16]
    ref = TraceRef("upload", f"{digest}.jsonl")
    if current_ref() == ref:
        return None  # a rerun with the same file still in the uploader: keep the step
    refused = st.session_state.get(REFUSED_UPLOAD)
    if refused is not None and refused[0] == digest:
        return refused[1]
    try:
        loads_trace(data, upload_name(name), allow_incomplete=True)
    except Exception as err:  # noqa: BLE001 - an upload is refused in one line, never with a traceback
        st.session_state[REFUSED_UPLOAD] = (digest, upload_refusal(name, err))
        return st.session_state[REFUSED_UPLOAD][1]
    try:
        store_upload(ref.path, data)
    except OSError as err:
        return f"could not keep the upload on the server: {shown_paths(str(err))}"
    return set_current(ref)


def upload_name(name: str) -> str:
    """An upload's file name as messages show it: the browser sends any text, so it is cut short and its
    unprintable characters (a newline would break the one line) are shown as "?"."""
    return "".join(ch if ch.isprintable() else "?" for ch in name[:MAX_UPLOAD_NAME_CHARS]) or "upload"


def upload_refusal(name: str, err: Exception) -> str:
    """The one line a visitor reads about a refused upload. A reader's refusal (TraceError, WorkloadError among
    them) says where and what; anything else a hostile file provokes in a reader is named by its type only."""
    if isinstance(err, TraceError):
        return shown_paths(" ".join(str(err).split()))
    return f"{upload_name(name)}: cannot be read ({type(err).__name__})"


def store_upload(path: Path, data: bytes) -> None:
    """Write a new upload without following links (O_NOFOLLOW) or replacing a file (O_EXCL).

    A file of that name already holds the same bytes (its name is their hash) unless
    someone else wrote it: then it is refused, never trusted or overwritten.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # raises on a planted link
        with os.fdopen(fd, "rb") as f:
            if f.read(MAX_UPLOAD_BYTES + 1) != data:
                raise OSError(f"{path.name} exists with other content") from None
        return
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    prune_uploads(path.parent)


def prune_uploads(folder: Path, keep: int = MAX_UPLOADS) -> None:
    """Delete the oldest uploads beyond `keep` (links and folders are left alone): traces, and
    workload zips in their own folder."""
    files = [p for p in folder.glob("*.jsonl" if folder.name != "workloads" else "*.zip")
             if p.is_file() and not p.is_symlink()]
    for old in sorted(files, key=lambda p: p.stat().st_mtime_ns)[:-keep]:
        old.unlink(missing_ok=True)


# ---------------------------------------------------------------- the step

def set_step(cycle: int, stage: int) -> None:
    """Move to a cycle and stage, clamped to the open trace."""
    trace = current_trace()
    last = max(0, len(trace.cycles) - 1) if trace else 0
    st.session_state[CYCLE] = min(max(0, cycle), last)
    st.session_state[STAGE] = min(max(1, stage), 5)


def step() -> tuple[int, int]:
    return st.session_state.get(CYCLE, 0), st.session_state.get(STAGE, 1)


def _int_param(name: str, default: int) -> int:
    try:
        return int(st.query_params.get(name, default))
    except ValueError:
        return default


def open_from_url_or_default() -> None:
    """Once per session: open the trace, cycle and stage the URL names, else the default trace."""
    if st.session_state.get("_opened"):
        return
    st.session_state["_opened"] = True
    token = st.query_params.get("trace")
    ref, problem = parse_token(token), None
    if token and ref is None:
        problem = f"the link names a trace this app cannot open ({token!r}); showing the default"
    ref = ref or default_ref()
    if ref is not None:
        problem = set_current(ref, _int_param("cycle", 0), _int_param("stage", 1)) or problem
        if problem and ref != default_ref() and default_ref() is not None:
            set_current(default_ref())
    st.session_state[ERROR] = problem


def write_url() -> None:
    """Put the open trace and step into the URL, so copying it shares this exact view."""
    ref = current_ref()
    if ref is None:
        return
    cycle, stage = step()
    wanted = {"trace": ref.token, "cycle": str(cycle), "stage": str(stage)}
    if {k: st.query_params.get(k) for k in wanted} != wanted:
        st.query_params.update(wanted)
