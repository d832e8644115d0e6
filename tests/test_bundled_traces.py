"""The example traces shipped in assets/ are complete, valid and self-consistent."""
from pathlib import Path

import pytest

from engine.stats.quiet import MAX_VERIFY_OVER_MEDIAN, quiet_words, verify_seconds_per_position
from engine.trace import load_trace, model_name
from tests.checks import assert_self_consistent

TRACES = sorted((Path(__file__).resolve().parent.parent / "assets" / "traces").glob("*.jsonl"))


def test_default_trace_is_shipped():
    assert any(p.name == "default.jsonl" for p in TRACES)


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_bundled_trace_is_valid(path):
    trace = load_trace(path)
    assert_self_consistent(trace)
    assert trace.header["preset"] in ("chat", "tiny-shakespeare")


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_bundled_trace_names_no_machine_path(path):
    """Shipped traces name models portably (assets/... or a preset's label), never by a build machine's folder."""
    header = load_trace(path).header
    for role in ("target", "draft"):
        name = (header.get(role) or {}).get("name", "")
        assert not name.startswith(("/", "~")) and ":\\" not in name, f"{role} named by a machine path: {name}"


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_bundled_trace_was_recorded_quietly(path):
    """No verify pass over 3x the trace's median (engine/stats/quiet.py): a busy recording
    machine would teach a wrong speed."""
    assert quiet_words(load_trace(path)) is None


def test_traces_of_one_target_agree_on_verify_time_per_position():
    """Recorded on one machine, one target costs about the same per scored position whatever the
    K, drafter or cache layout: within MAX_VERIFY_OVER_MEDIAN of each other."""
    per_target: dict[str, dict[str, float]] = {}
    for path in TRACES:
        trace = load_trace(path)
        if trace.is_tree:  # a tree verifies 13-25 positions at once: on a CPU each costs less than a chain's
            continue
        per_target.setdefault(model_name(trace.header, "target"), {})[path.name] = verify_seconds_per_position(trace)
    for target, seconds in per_target.items():
        assert max(seconds.values()) <= MAX_VERIFY_OVER_MEDIAN * min(seconds.values()), (target, seconds)
