"""The app for prompt lookup and the other-tokenizer draft: stage 1 provenance, figures, stats."""
import html
import re
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.figures import acceptance, caches, derive, explain, overview
from app.figures import cycle as figures
from app.views.sections import stepper_drafter
from engine.config import SpecSettings
from engine.run import run_to_trace
from engine.stats.analysis import trace_stats
from engine.stats.report import format_stats
from engine.trace import load_trace
from tests.test_other_tokenizer import PROMPT_TEXT, other_tokenizer_pair
from tests.test_prompt_lookup import lookup_pair

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
BUNDLED = Path(__file__).resolve().parent.parent / "assets" / "traces"


@pytest.fixture(scope="module")
def drafter_traces(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("drafter-traces")
    paths = {"lookup": folder / "lookup.jsonl", "other": folder / "other.jsonl"}
    run_to_trace(lookup_pair(0), "the cat sat on a mat the cat sat on a <b>log</b> the cat",
                 SpecSettings(k=4, temperature=0, max_new_tokens=24), paths["lookup"], chat_template=False)
    run_to_trace(other_tokenizer_pair(0), PROMPT_TEXT, SpecSettings(k=4, temperature=0, max_new_tokens=16), paths["other"])
    return {name: load_trace(p) for name, p in paths.items()} | {"paths": paths}


def committed_texts(trace, c) -> list[str]:
    return [t.text for t in derive.token_table(trace)[: c["committed_len_before"]]]


def test_lookup_view_marks_the_matched_ngram_and_the_copied_tokens(drafter_traces):
    trace = drafter_traces["lookup"]
    matched = [c for c in trace.cycles if c["drafter_state"]["matched"]]
    assert matched
    committed = list(trace.header["prompt_token_ids"])
    for c in trace.cycles:
        texts = committed_texts(trace, c)
        view = derive.lookup_view(texts, c)
        st = c["drafter_state"]
        if not st["matched"]:
            assert view is None
        else:
            first = max(0, st["match_start"] - derive.LOOKUP_CONTEXT)
            roles = [r for _, r in view]
            ngram = [i + first for i, r in enumerate(roles) if r == derive.LOOKUP_NGRAM]
            assert ngram == list(range(st["match_start"], st["match_start"] + st["ngram_size"]))
            copied = [i + first for i, r in enumerate(roles) if r == derive.LOOKUP_COPIED]
            # the copied tokens are the proposal (those of them that are not also the looked-up tail)
            assert [committed[p] for p in copied] == c["draft_token_ids"][:len(copied)]
            page = stepper_drafter.lookup_html(view)
            assert "<b>" not in page  # token texts are escaped
        committed += c["committed_token_ids"]


def test_alignment_rows_split_the_re_encoding_by_draft_token(drafter_traces):
    for c in drafter_traces["other"].cycles:
        rows = derive.alignment_rows(c)
        st = c["drafter_state"]
        assert [r.draft_token_id for r in rows] == st["draft_token_ids"]
        joined = [t for r in rows for t in r.target_texts]
        assert joined == st["target_token_texts"][:len(joined)]
        assert all(r.aligned is not None for r in rows)
    assert derive.alignment_rows(drafter_traces["lookup"].cycles[0]) is None


def test_every_stage_figure_and_caption_draws_for_both_drafters(drafter_traces):
    for name in ("lookup", "other"):
        trace = drafter_traces[name]
        ov = derive.overview(trace)
        overview.overview_figure(ov, len(trace.cycles), 0)
        for c in trace.cycles:
            k = derive.proposals(c)
            for stage in range(1, 6):
                caption = explain.stage_caption(c, k, stage)
                assert "draft model proposes" not in caption or name == "other"
                figures.cycle_figure(c, k, stage)
                caches.cache_figure(c, stage, committed_texts(trace, c) + list(c["draft_token_texts"]))
                assert derive.sequence_texts(trace, c) == committed_texts(trace, c) + list(c["draft_token_texts"])
                if stage >= 2:
                    acceptance.acceptance_figure(c, k, stage)
                if stage >= 4:
                    acceptance.resample_figure(c, k)
                # both traces are greedy: the pages draw the greedy explanation and argmax marks
                greedy_caption = explain.stage_caption(c, k, stage, greedy=True)
                if stage == 3:
                    assert greedy_caption.startswith("Temperature 0")
                    if c["rejected_position"] is not None:
                        assert explain.quoted(c["next_token_text"]) in greedy_caption
                figures.cycle_figure(c, k, stage, greedy=True)
                if stage >= 2:
                    acceptance.acceptance_figure(c, k, stage, greedy=True)
        # bonus markers sit right after each cycle's own proposals
        bonus_cycles, bonus_positions = ov.points[derive.BONUS]
        for cyc, pos in zip(bonus_cycles, bonus_positions):
            assert pos == derive.proposals(trace.cycles[cyc]) + 1


def test_no_match_caption_says_plain_target_step(drafter_traces):
    trace = drafter_traces["lookup"]
    c = next(c for c in trace.cycles if not c["drafter_state"]["matched"]) if any(
        not c["drafter_state"]["matched"] for c in trace.cycles) else None
    if c is None:
        pytest.skip("every cycle matched")
    assert "plain target step" in explain.stage_caption(c, 0, 1)
    assert "ordinary decoding step" in explain.stage_caption(c, 0, 2)


def test_stats_for_prompt_lookup(drafter_traces):
    trace = drafter_traces["lookup"]
    st = trace_stats(trace)
    drafted = sum(len(c["draft_token_ids"]) for c in trace.cycles)
    accepted = sum(c["num_accepted"] for c in trace.cycles)
    assert st.acceptance["acceptance_rate"] == pytest.approx(accepted / drafted)
    assert sum(r.cycles for r in st.by_ngram) == len(trace.cycles)
    assert sum(r.accepted for r in st.by_ngram) == accepted
    out = format_stats(trace)
    assert "DRAFTER: prompt-lookup" in out and "acceptance by matched n-gram size" in out
    assert trace_stats(drafter_traces["other"]).by_ngram is None
    assert "DRAFTER: other-tokenizer" in format_stats(drafter_traces["other"])


def plain(markdown: str) -> str:
    return html.unescape(re.sub(r"\\(.)", r"\1", markdown))


@pytest.mark.parametrize("name, marker", [("lookup", "Prompt lookup"), ("other", "its own tokenizer")])
def test_stepper_stage_one_shows_the_proposal_origin(drafter_traces, tmp_path, monkeypatch, name, marker):
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(drafter_traces["paths"][name], folder / "default.jsonl")
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path / "uploads"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    trace = drafter_traces[name]
    cycle = next((i for i, c in enumerate(trace.cycles) if c["draft_token_ids"]), 0)
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.query_params.update({"trace": "bundled:default.jsonl", "cycle": str(cycle), "stage": "1"})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert marker in plain(at.info[0].value)
    for stage in (3, 4):  # the greedy explanation, argmax table and residual chart draw for this drafter too
        at2 = AppTest.from_file(MAIN, default_timeout=60)
        at2.query_params.update({"trace": "bundled:default.jsonl", "cycle": str(cycle), "stage": str(stage)})
        at2.run()
        assert not at2.exception, [e.value for e in at2.exception]
        assert plain(at2.info[0].value) == explain.stage_caption(trace.cycles[cycle], derive.proposals(trace.cycles[cycle]),
                                                                stage, greedy=True)
        if stage == 3:
            assert "target's argmax" in list(at2.dataframe[-1].value.columns)
    if name == "other":
        table = at.dataframe[0].value
        assert list(table["draft token id"]) == trace.cycles[cycle]["drafter_state"]["draft_token_ids"]


@pytest.mark.parametrize("name", ["chat-prompt-lookup-greedy-k4.jsonl", "shakespeare-other-tokenizer-greedy-k6.jsonl"])
def test_a_bundled_trace_per_new_drafter(name):
    trace = load_trace(BUNDLED / name)
    assert trace.drafter_kind == name.split("-")[1] + "-" + name.split("-")[2]
    assert trace.header["calibration"]["draft_step_s"] < trace.header["calibration"]["target_step_s"]
    assert any(c["num_accepted"] > 0 for c in trace.cycles)


def test_stats_page_on_the_bundled_prompt_lookup_trace(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(BUNDLED))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    name = "chat-prompt-lookup-greedy-k4.jsonl"
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.query_params["trace"] = f"bundled:{name}"
    at.run()
    at.switch_page("views/statistics.py").run()
    assert not at.exception, [e.value for e in at.exception]
    st = trace_stats(load_trace(BUNDLED / name))
    table = next(d.value for d in at.dataframe if "n-gram size" in d.value.columns)
    assert list(table["accepted"]) == [r.accepted for r in st.by_ngram]
    assert st.speed.c < 0.05  # no model runs: c close to 0
    at.session_state["stats_tab"] = "Cost and speed"  # only the open tab runs
    at.run()
    shown_c = [m.value for m in at.metric if m.label == "c = t_draft / t_step"]
    assert shown_c == [f"{st.speed.c:.3f}"]


def test_interview_tokenizer_question_opens_the_bundled_other_tokenizer_trace(monkeypatch, tmp_path):
    from tests.test_teaching_pages import make_teaching_folder
    root = make_teaching_folder(tmp_path / "teaching")
    monkeypatch.setenv("SPECLAB_TEACHING_PAIR", str(root / "pair"))
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(BUNDLED))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(MAIN, default_timeout=180)
    at.run()
    at.switch_page("views/interview.py").run()
    assert not at.exception, [e.value for e in at.exception]
    at.button(key="iv_tokenizer_trace").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["trace_ref"].token == "bundled:shakespeare-other-tokenizer-greedy-k6.jsonl"
    assert at.subheader[0].value == "Cycle 0 · stage 1 Draft"
    assert "its own tokenizer" in plain(at.info[0].value)


PAGES = ["views/stepper.py", "views/walkthrough.py", "views/rollback_demo.py", "views/exactness_lab.py",
         "views/interview.py", "views/statistics.py", "views/trace_source.py"]


@pytest.mark.parametrize("name", ["chat-prompt-lookup-greedy-k4.jsonl", "shakespeare-other-tokenizer-greedy-k6.jsonl"])
def test_every_page_and_walkthrough_cycle_renders_a_bundled_drafter_trace(tmp_path, monkeypatch, name):
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(BUNDLED / name, folder / "default.jsonl")
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path / "uploads"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    trace = load_trace(folder / "default.jsonl")
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.query_params.update({"trace": "bundled:default.jsonl", "cycle": "0", "stage": "3"})
    at.run()
    for page in PAGES:
        at.switch_page(page).run()
        assert not at.exception, (page, [e.value for e in at.exception])
    at.switch_page("views/walkthrough.py").run()
    no_proposal = [c["cycle"] for c in trace.cycles if not c["draft_token_ids"]]
    for cycle in sorted({0, len(trace.cycles) - 1, *no_proposal[:1]}):  # a cycle that proposed nothing too
        at.selectbox(key="wt_cycle").set_value(cycle).run()
        assert not at.exception, (cycle, [e.value for e in at.exception])
        if trace.cycles[cycle]["draft_cache_len"] is None:  # the rollback is told without a draft cache
            assert any("Target cache entries past the committed prefix" in m.value for m in at.markdown)
