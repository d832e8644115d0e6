"""The app for suffix decoding: stage 1 of the stepper shows the match, both trees and the probabilities."""
import html
import re
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.figures import derive, explain
from app.views.sections import stepper_drafter
from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.drafters.suffix import SuffixDrafter
from engine.run import run_to_trace
from engine.trace import load_trace
from tests.tiny import tiny_pair

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")


@pytest.fixture(scope="module")
def suffix_trace(tmp_path_factory):
    """The second of two requests through one drafter: it has cycles from both trees."""
    folder = tmp_path_factory.mktemp("suffix-app")
    target = tiny_pair(0).target
    pair = Pair(target, None, set(), SuffixDrafter(target.full_vocab_size, depth=8, min_prob=0.0))
    s = SpecSettings(k=4, temperature=0.0, max_new_tokens=30)
    run_to_trace(pair, "the cat sat on a mat the cat sat", s, folder / "first.jsonl", chat_template=False)
    run_to_trace(pair, "the cat sat on a mat the cat sat", s, folder / "second.jsonl", chat_template=False)
    return folder / "second.jsonl", load_trace(folder / "second.jsonl")


def texts_before(trace, c) -> list[str]:
    return [t.text for t in derive.token_table(trace)[: c["committed_len_before"]]]


def test_the_view_marks_the_tail_and_for_the_request_tree_the_earlier_place(suffix_trace):
    _, trace = suffix_trace
    sources = set()
    for c in trace.cycles:
        state, texts = c["drafter_state"], texts_before(trace, c)
        view = derive.suffix_view(texts, c)
        sources.add(state["source"])
        if state["source"] is None:
            assert view is None
            continue
        roles = [r for _, r in view]
        m = state["match_len"]
        assert roles[-m:] == [derive.LOOKUP_TAIL] * m
        if state["source"] == "request":
            first = max(0, state["match_start"] - derive.LOOKUP_CONTEXT)
            followed = [i + first for i, r in enumerate(roles) if r == derive.SUFFIX_FOLLOWED]
            ids = list(trace.header["prompt_token_ids"]) + [t for x in trace.cycles[:c["cycle"]]
                                                             for t in x["committed_token_ids"]]
            assert [ids[p] for p in followed] == c["draft_token_ids"][:len(followed)] and followed
        else:
            assert derive.SUFFIX_MATCH not in roles  # the global tree's text is not in this trace
    assert {"request", "global"} <= sources


def test_the_panel_escapes_token_text_and_explains_both_trees(suffix_trace):
    _, trace = suffix_trace
    c = next(c for c in trace.cycles if c["drafter_state"]["source"] == "global")
    texts = ["<b>x</b>"] * c["committed_len_before"]
    page = stepper_drafter.lookup_html(derive.suffix_view(texts, c))
    assert "<b>" not in page and "&lt;b&gt;" in page
    caption = stepper_drafter.trees_caption(c["drafter_state"])
    assert "the global tree won" in caption and "all outputs (1 finished + this one)" in caption
    words = explain.stage_caption(c, derive.proposals(c), 1)
    assert "Suffix decoding matched" in words and "earlier request" in words


def plain(markdown: str) -> str:
    return html.unescape(re.sub(r"\\(.)", r"\1", markdown))


def test_stepper_stage_one_shows_the_trees_and_the_probabilities(suffix_trace, tmp_path, monkeypatch):
    path, trace = suffix_trace
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(path, folder / "default.jsonl")
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path / "uploads"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    cycle = next(i for i, c in enumerate(trace.cycles) if c["drafter_state"]["source"] == "request")
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.query_params.update({"trace": "bundled:default.jsonl", "cycle": str(cycle), "stage": "1"})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Suffix decoding matched" in plain(at.info[0].value)
    table = at.dataframe[0].value
    assert list(table["frequency probability"]) == [round(p, 4) for p in trace.cycles[cycle]["drafter_state"]["token_probs"]]
    assert any("this request's tree won" in plain(c.value) for c in at.caption)
    for stage in (2, 3, 4, 5):  # the later stages draw for this drafter as for prompt lookup
        later = AppTest.from_file(MAIN, default_timeout=60)
        later.query_params.update({"trace": "bundled:default.jsonl", "cycle": str(cycle), "stage": str(stage)})
        later.run()
        assert not later.exception, (stage, [e.value for e in later.exception])


def test_the_live_run_form_offers_suffix_decoding_with_its_depth(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.run()
    at.switch_page("views/trace_source.py").run()
    at.radio(key="live_drafter").set_value("suffix").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.number_input(key="live_suffix_depth").value == 24
    assert any("earlier live runs" in c.value for c in at.caption)


def test_the_statistics_page_splits_acceptance_by_tree(suffix_trace, tmp_path, monkeypatch):
    path, trace = suffix_trace
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(path, folder / "default.jsonl")
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.query_params.update({"trace": "bundled:default.jsonl"})
    at.run()
    at.switch_page("views/statistics.py").run()
    assert not at.exception, [e.value for e in at.exception]
    table = next(d.value for d in at.dataframe if "tree" in d.value.columns)
    assert set(table["tree"]) >= {"this request's text", "all outputs (global tree)"}
    assert table["cycles"].sum() == len(trace.cycles)
