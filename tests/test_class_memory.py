"""A class on one server: what 100 visitors opening traces cost in memory (app/ui/state.py).

The bound, and why: a trace file parses to at most PARSED_PER_BYTE bytes of Python objects per
byte of JSON (measured 4.4x on default.jsonl, 5.6x on chat-greedy-k4.jsonl). Every session that
opens the same file holds the one parsed object (st.cache_resource), so visitors on the bundled
traces cost those traces once, however many visitors there are; the cache keeps at most
TRACES_KEPT of them. A visitor on a trace of their own (an upload, a live run) holds that
trace, and only while their session lasts. So with every visitor on the 14 bundled traces
(2.3 MB of JSON), 100 visitors stay under 8 x 2.3 MB + 2 MiB, about 20 MiB, where a copy per
visitor would be about 90 MiB.

Measured with tracemalloc over the app's own loaders (not AppTest: 100 page runs would take
minutes); bench/class_load.py measures a real server's resident memory with real sessions.
"""
import gc
import shutil
import tracemalloc
from pathlib import Path

import pytest

from app.ui import state
from app.views.sections.statistics_tree import tree_stats_of

PARSED_PER_BYTE = 8  # Python objects per byte of trace JSON, with headroom over the 4.4-5.6x measured
SMALL_STATE = 2 * 2**20  # the statistics cached per trace (2 KB each) and the visitors' own few entries
VISITORS = 100
BUNDLED = Path(__file__).resolve().parent.parent / "assets" / "traces"


@pytest.fixture
def traced(monkeypatch):
    """tracemalloc on, the app's caches empty and the bundled traces as the examples."""
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(BUNDLED))
    state._load_path.clear()
    state.stats_of.clear()
    tree_stats_of.clear()
    gc.collect()
    tracemalloc.start()
    yield
    tracemalloc.stop()
    state._load_path.clear()
    state.stats_of.clear()


def held_bytes() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def open_as_visitor(ref: state.TraceRef) -> dict:
    """What a session keeps once it has opened a trace (state.set_current, the statistics)."""
    trace, key = state.load_ref(ref)
    stats = tree_stats_of(key, trace) if trace.is_tree else state.stats_of(key, trace)  # as the statistics page
    return {state.REF: ref, state.TRACE: trace, state.TRACE_KEY: key, "stats": stats,
            state.CYCLE: 0, state.STAGE: 1}


def test_a_hundred_visitors_on_the_bundled_traces_cost_those_traces_once(traced):
    names = state.bundled_traces()
    json_bytes = sum((BUNDLED / n).stat().st_size for n in names)
    before = held_bytes()
    sessions = [open_as_visitor(state.TraceRef("bundled", names[i % len(names)])) for i in range(VISITORS)]
    grown = held_bytes() - before
    assert grown <= PARSED_PER_BYTE * json_bytes + SMALL_STATE, f"{grown / 2**20:.1f} MiB for {VISITORS} visitors"
    same_file = [s for s in sessions if s[state.REF].name == names[0]]
    assert len(same_file) > 1 and all(s[state.TRACE] is same_file[0][state.TRACE] for s in same_file)


def test_visitors_on_traces_of_their_own_hold_them_only_while_their_session_lasts(traced, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path))
    source = BUNDLED / "chat-prompt-lookup-greedy-k4.jsonl"  # the smallest bundled trace: fast to parse
    own = state.TRACES_KEPT + 8  # more distinct uploads than the cache keeps
    for i in range(own):
        shutil.copyfile(source, tmp_path / f"visitor{i:03d}.jsonl")
    per_trace = PARSED_PER_BYTE * source.stat().st_size
    before = held_bytes()
    sessions = [open_as_visitor(state.TraceRef("upload", f"visitor{i:03d}.jsonl")) for i in range(own)]
    assert len({id(s[state.TRACE]) for s in sessions}) == own  # distinct files: one object each
    while_there = held_bytes() - before
    assert while_there <= own * per_trace + SMALL_STATE, f"{while_there / 2**20:.1f} MiB"
    sessions.clear()  # the visitors leave; the cache keeps its newest TRACES_KEPT
    after = held_bytes() - before
    assert after <= state.TRACES_KEPT * per_trace + SMALL_STATE, f"{after / 2**20:.1f} MiB"
    assert after < while_there
