"""Texts the pages build from a cycle's numbers say what the numbers say."""
from pathlib import Path

import pytest

from app.figures.explain import discarded_untested


@pytest.mark.parametrize("rejected, k, words", [
    (4, 4, ""),  # the last position was the rejected one: nothing after it
    (3, 4, "; position 4 is discarded untested"),  # one position, not "positions 4–4"
    (1, 4, "; positions 2–4 are discarded untested"),
])
def test_the_positions_after_a_rejection_are_counted_right(rejected, k, words):
    assert discarded_untested(rejected, k) == words


def test_the_probability_chart_is_titled_by_what_its_stage_shows():
    """Stage 2 (Verify) shows both models' probabilities; the test and its rule appear at stage 3."""
    from app.figures.acceptance import acceptance_figure
    from engine.trace import load_trace

    c = load_trace(Path(__file__).resolve().parent.parent / "assets" / "traces" / "default.jsonl").cycles[0]
    k = len(c["draft_token_ids"])
    assert acceptance_figure(c, k, 2).layout.title.text.startswith("Verify")
    assert acceptance_figure(c, k, 3).layout.title.text.startswith("Test: keep while u <")


def test_a_live_run_is_said_to_be_saved_where_it_is(monkeypatch, tmp_path):
    from app.ui import state

    monkeypatch.delenv("SPECLAB_RUNS_DIR", raising=False)  # the default: runs/live/ in the project
    assert state.shown_paths(str(state.runs_dir() / "live-1.jsonl")) == "runs/live/live-1.jsonl"
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "elsewhere"))  # outside it: named, never shown whole
    assert state.shown_paths(str(state.runs_dir() / "live-1.jsonl")) == "runs/live-1.jsonl"
