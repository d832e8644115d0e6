"""Server workloads the Workload page can show: folders `python -m engine client --out` wrote, put under the
live runs' folder's servers/ (runs/live/servers/NAME by default, $SPECLAB_RUNS_DIR/servers/NAME where the
server sets it). Named ("server", NAME) beside the engine workloads' (kind, name) in the page's chooser.

A folder is read whole through engine/servers/server_workload.py (every file checked; the manifest may
name only the folder's fixed file names, so nothing in it points elsewhere) and its statistics come from
engine/workload/server_stats.py, the same numbers `python -m engine stats FOLDER` prints; computed once
per content. A refusal is one line with the server's folders shown by their app-relative names.
Rows here are plain data, so tests read them without drawing the page.
"""
from pathlib import Path

import streamlit as st

from app.ui import state
from engine.servers import server_workload as files
from engine.servers.server_workload import ServerWorkloadError, is_server_workload, open_server_workload
from engine.workload.server_report import COUNT_NAMES, count_text, totals_verdict
from engine.workload.server_stats import server_workload_stats

KIND = "server"  # app/ui/workloads.py KIND_WORDS says it in words


def folder() -> Path:
    return state.runs_dir() / "servers"


def listed() -> list[tuple[str, str]]:
    """The server-workload folders under servers/, by name (links and hidden names are left out)."""
    root = folder()
    if not root.is_dir():
        return []
    return [(KIND, p.name) for p in sorted(root.iterdir())
            if state.is_bare(p.name) and not p.is_symlink() and p.is_dir() and is_server_workload(p)]


def is_server(choice: tuple[str, str] | None) -> bool:
    return choice is not None and choice[0] == KIND


def path_of(choice: tuple[str, str]) -> Path:
    if not is_server(choice) or not state.is_bare(choice[1]):
        raise ServerWorkloadError(f"no such server workload: {choice[1]!r}")
    return folder() / choice[1]


def stamp(path: Path) -> tuple:
    """Each file's modification time and size: a client still running (or resumed) changes them."""
    found = []
    for name in (files.MANIFEST, files.ANSWERS, files.BEFORE, files.AFTER):
        try:
            s = (path / name).stat()
            found.append((name, s.st_mtime_ns, s.st_size))
        except OSError:
            found.append((name, None, None))
    return tuple(found)


@st.cache_resource(max_entries=8, ttl=state.CACHE_TTL_S, show_spinner="Reading the server workload…")
def _stats(path: str, _stamp: tuple) -> dict:
    """One dict for every session (no page may change it), keyed by the folder and its files' stamps."""
    return server_workload_stats(open_server_workload(path))


def stats_of(choice: tuple[str, str]) -> dict:
    """engine/workload/server_stats.py's statistics of the folder; ServerWorkloadError in one line where it is refused."""
    path = path_of(choice)
    try:
        return _stats(str(path), stamp(path))
    except ServerWorkloadError as err:
        raise ServerWorkloadError(state.shown_paths(" ".join(str(err).split()))) from None


def totals_rows(stats: dict) -> list[dict]:
    """Both totals side by side: the sum over the requests' answers, and vLLM's counters after - before."""
    t = stats["totals"]
    counters = t["counters"] or {}
    return [{"count": COUNT_NAMES[key], "sum of the requests": count_text(t["requests"][key]),
             "the server's counters (after - before)": count_text(counters.get(key))} for key in COUNT_NAMES]


def verdict(stats: dict) -> tuple[str, str]:
    """("equal" | "differ" | "not compared", why), in the words `engine stats FOLDER` prints."""
    return totals_verdict(stats["totals"])
