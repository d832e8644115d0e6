"""The example traces shipped in assets/ are complete, valid and self-consistent."""
from pathlib import Path

import pytest

from engine.trace import load_trace
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
