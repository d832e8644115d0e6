"""The app's view of a draft model that read its own rendering of the prompt (draft_prompt "raw",
docs/drafters.md "A draft model mis-set on purpose"): its cache holds its own prompt, then every token
committed after the target's prompt, so every draft cache length is offset from the target's. The KV
strip must draw the draft's row at its own positions with its own tokens, and the captions must say what
that cache holds; an ordinary trace's figures and captions stay as they were."""
import base64
import html
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.figures import caches, derive, explain
from engine.config import SpecSettings
from engine.run import encode_prompt, run_to_trace
from engine.trace import Trace, load_trace
from tests.test_misset_draft import PROMPT, RAW, templated_pair

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
SETTINGS = SpecSettings(k=2, temperature=1.0, max_new_tokens=40, seed=5)  # rejections and full accepts (catch-up)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("offset")


@pytest.fixture(scope="module")
def offset(folder) -> Trace:
    """A sampled run whose draft read the prompt without the chat template (6 tokens; the target reads 19)."""
    run_to_trace(templated_pair(**RAW), PROMPT, SETTINGS, folder / "offset.jsonl")
    return load_trace(folder / "offset.jsonl")  # every check of the format, the draft's offsets included


@pytest.fixture(scope="module")
def ordinary(folder) -> Trace:
    """The same pair and prompt set right: the draft reads the target's templated prompt."""
    run_to_trace(templated_pair(), PROMPT, SETTINGS, folder / "ordinary.jsonl")
    return load_trace(folder / "ordinary.jsonl")


def rows(fig) -> dict[str, dict[int, str]]:
    """{row: {cache position: cell label}} read back from the figure's label traces."""
    out: dict[str, dict[int, str]] = {}
    for t in fig.data:
        if t.type == "scatter":
            for y, x, text in zip(t.y, t.x, t.text):
                out.setdefault(str(y), {})[int(x)] = html.unescape(str(text)).lstrip("✗")
    return out


def hovers(fig, row: str) -> dict[int, str]:
    return {round(b + 0.45): h for t in fig.data if t.type == "bar"
            for y, b, h in zip(t.y, t.base, t.hovertext) if y == row}


def label(text: str) -> str:
    """A cell's label as rows() reads it back."""
    return html.unescape(caches.shown(text, 6))


def draft_labels(trace: Trace, c: dict) -> list[str]:
    """What the draft's cache holds, position by position, straight from the header and the cycles: its own
    prompt's tokens (this tokenizer writes each word as itself), then the target's sequence after its prompt."""
    tok = templated_pair().target.tokenizer
    own = [tok.decode([t]) for t in trace.header["drafter"]["draft_prompt_token_ids"]]
    return own + derive.sequence_texts(trace, c)[len(trace.header["prompt_token_ids"]):]


# ---------------------------------------------------------------- what the trace gives the view

def test_the_own_prompt_is_read_from_the_header_with_texts_from_the_trace(offset):
    own = derive.own_prompt(offset)
    tok = templated_pair().target.tokenizer
    assert list(own.token_ids) == encode_prompt(tok, PROMPT, False) == offset.header["drafter"]["draft_prompt_token_ids"]
    assert own.target_len == len(offset.header["prompt_token_ids"]) == len(encode_prompt(tok, PROMPT, True))
    assert own.offset == len(own.token_ids) - own.target_len == 6 - 19  # "the dog slept on a log", then the template's
    assert [own.label(i) for i in range(len(own.token_ids))] == PROMPT.split()  # each word: the trace writes it out


def test_an_id_the_trace_never_writes_out_stays_an_id(offset):
    header = {**offset.header, "drafter": {**offset.header["drafter"], "draft_prompt_token_ids": [3, 0]}}
    own = derive.own_prompt(Trace(header, [], None))  # no cycles: <eos> (0) is nowhere in the trace
    assert own.texts == ("dog", None) and [own.label(0), own.label(1)] == ["dog", "#0"]
    c = offset.cycles[0]
    fig = caches.cache_figure(c, 1, derive.sequence_texts(offset, c), offset.drafter_kind, own)
    assert rows(fig)["draft"][1] == "#0"
    assert "id 0, which the trace writes no text for" in hovers(fig, "draft")[1]


def test_no_offset_without_a_raw_prompt_or_when_both_read_the_same(ordinary, tmp_path):
    assert derive.own_prompt(ordinary) is None
    trace = run_to_trace(templated_pair(**RAW), PROMPT, SpecSettings(k=2, temperature=0, max_new_tokens=6),
                         tmp_path / "t.jsonl", chat_template=False)  # no template: the raw prompt is the target's
    assert derive.own_prompt(load_trace(tmp_path / "t.jsonl")) is None
    assert trace.header["drafter"]["draft_prompt_token_ids"] == trace.header["prompt_token_ids"]


# ---------------------------------------------------------------- the KV strip

def test_the_offset_trace_has_the_cycles_the_checks_need(offset):
    assert any(c["draft_catch_up"] for c in offset.cycles)
    assert any(c["rejected_position"] is not None for c in offset.cycles)


@pytest.mark.parametrize("stage", [1, 2, 5])
def test_the_draft_row_has_its_real_length_and_its_own_tokens(offset, stage):
    own = derive.own_prompt(offset)
    chosen = {0, len(offset.cycles) - 1,
              next(c["cycle"] for c in offset.cycles if c["draft_catch_up"]),
              next(c["cycle"] for c in offset.cycles if c["rejected_position"] is not None)}
    for i in sorted(chosen):
        c = offset.cycles[i]
        t, d = c["target_cache_len"], c["draft_cache_len"]
        assert d["after_rollback"] == t["after_rollback"] + own.offset  # what the loader checked
        fig = caches.cache_figure(c, stage, derive.sequence_texts(offset, c), offset.drafter_kind, own)
        drawn = rows(fig)
        end = {"draft": max(d["after_append"], d["after_rollback"]) if stage == 5 else d["after_append"],
               "target": t["before"] if stage == 1 else max(t["after_append"], t["after_rollback"])}
        first = max(0, d["before"] - caches.CACHE_CONTEXT)  # the draft's row starts further left
        assert sorted(drawn["draft"]) == list(range(first, end["draft"])), (i, stage)
        assert sorted(drawn["target"]) == list(range(first, end["target"])), (i, stage)
        want = draft_labels(offset, c)
        assert all(drawn["draft"][p] == label(want[p]) for p in drawn["draft"]), (i, stage)
        seq = derive.sequence_texts(offset, c)
        assert all(drawn["target"][p] == label(seq[p]) for p in drawn["target"]), (i, stage)
        axis = fig.layout.xaxis.title.text
        assert f"its own {len(own.token_ids)}-token prompt (no chat template; the target's has {own.target_len})" in axis
        assert "its cells sit 13 positions behind the target's" in axis
        row_hovers = hovers(fig, "draft")
        for p in range(first, min(len(own.token_ids), end["draft"])):  # the own prompt's cells say so
            assert f"token {p + 1} of {len(own.token_ids)}" in row_hovers[p]


def test_the_first_cycle_feeds_the_draft_its_own_prompt_s_last_token(offset):
    own, c = derive.own_prompt(offset), offset.cycles[0]
    fig = caches.cache_figure(c, 1, derive.sequence_texts(offset, c), offset.drafter_kind, own)
    last = len(own.token_ids) - 1
    assert c["draft_cache_len"]["before"] == last
    assert rows(fig)["draft"][last] == PROMPT.split()[-1]  # 'log', not the template's last word
    assert offset.header["prompt_token_texts"][-1] != PROMPT.split()[-1]
    provisional = {round(b + 0.45) for t in fig.data if t.type == "bar" and "provisional" in t.name
                   for y, b in zip(t.y, t.base) if y == "draft"}
    assert min(provisional) == last


def test_the_catch_up_cell_is_the_committed_draft_in_the_draft_s_own_position(offset):
    own = derive.own_prompt(offset)
    c = next(c for c in offset.cycles if c["draft_catch_up"])
    fig = caches.cache_figure(c, 5, derive.sequence_texts(offset, c), offset.drafter_kind, own)
    d = c["draft_cache_len"]
    fed = {round(b + 0.45) for t in fig.data if t.type == "bar" and "catch-up" in t.name for y, b in zip(t.y, t.base)
           if y == "draft"}
    assert fed == set(range(d["after_append"], d["after_rollback"])) and fed
    assert all(rows(fig)["draft"][p] == label(c["draft_token_texts"][-1]) for p in fed)


# ---------------------------------------------------------------- the captions

def test_the_captions_state_the_offset(offset):
    own = derive.own_prompt(offset)
    for c in offset.cycles[:3] + [next(c for c in offset.cycles if c["draft_catch_up"])]:
        t, d = c["target_cache_len"], c["draft_cache_len"]
        words = explain.stage_caption(c, offset.k, 5, drafter=offset.drafter_kind, own=own)
        assert "both now hold" not in words
        assert f"target {t['after_append']} → {t['after_rollback']}, draft {d['after_append']} → {d['after_rollback']}" in words
        assert ("the draft holds its own prompt (6 tokens, without the chat template) and every committed token "
                "after the target's prompt but the last: 13 positions fewer than the target's") in words
        assert "its prompt, with the chat template, is 19 tokens" in words
        assert ("catch-up" in words) == c["draft_catch_up"]
        draft = explain.stage_caption(c, offset.k, 1, drafter=offset.drafter_kind, own=own)
        assert draft.startswith("The small draft model proposes K=2 tokens")
        assert "It read the prompt without the chat template (6 tokens of its own; the target read 19)" in draft
    for stage in (2, 3, 4):  # the other stages say nothing about the draft's cache
        c = offset.cycles[0]
        assert explain.stage_caption(c, offset.k, stage, own=own) == explain.stage_caption(c, offset.k, stage)


def test_an_ordinary_trace_s_figures_and_captions_are_unchanged(ordinary):
    assert derive.own_prompt(ordinary) is None
    for c in ordinary.cycles[:4]:
        texts = derive.sequence_texts(ordinary, c)
        for stage in (1, 2, 5):
            fig = caches.cache_figure(c, stage, texts, ordinary.drafter_kind, derive.own_prompt(ordinary))
            assert fig.to_json() == caches.cache_figure(c, stage, texts, ordinary.drafter_kind).to_json()
            assert fig.layout.xaxis.title.text.startswith("cache position") and "draft row" not in fig.layout.xaxis.title.text
            drawn = rows(fig)
            assert all(drawn["draft"][p] == label(texts[p]) for p in drawn["draft"])  # both rows: the same tokens
        words = explain.stage_caption(c, ordinary.k, 5, drafter=ordinary.drafter_kind, own=None)
        assert "both now hold every committed token but the last, which opens the next cycle." in words
        assert "own prompt" not in words
        assert "chat template" not in explain.stage_caption(c, ordinary.k, 1, drafter=ordinary.drafter_kind)


# ---------------------------------------------------------------- the pages

def plain(markdown: str) -> str:
    return html.unescape(re.sub(r"\\(.)", r"\1", markdown))


def charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def values(array) -> list:
    """A figure's array as the page's JSON spec writes it: a list, or Plotly's typed array (dtype, bdata)."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=np.dtype(array["dtype"])).tolist()
    return list(array)


def test_the_stepper_and_the_walkthrough_open_an_offset_trace(offset, folder, tmp_path, monkeypatch):
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(folder / "offset.jsonl", traces / "default.jsonl")
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(traces))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path / "uploads"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    own = derive.own_prompt(offset)
    c = next(c for c in offset.cycles if c["draft_catch_up"])
    for stage in (1, 5):
        at = AppTest.from_file(MAIN, default_timeout=60)
        at.query_params.update({"trace": "bundled:default.jsonl", "cycle": str(c["cycle"]), "stage": str(stage)})
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert plain(at.info[0].value) == explain.stage_caption(c, offset.k, stage, drafter=offset.drafter_kind, own=own)
        (strip,) = [f for f in charts(at) if f["layout"]["title"]["text"].startswith("KV caches")]
        draft_cells = {int(x): html.unescape(text).lstrip("✗") for t in strip["data"] if t["type"] == "scatter"
                       for y, x, text in zip(values(t["y"]), values(t["x"]), values(t["text"])) if y == "draft"}
        d = c["draft_cache_len"]
        assert max(draft_cells) + 1 == (d["after_append"] if stage == 1 else max(d["after_append"], d["after_rollback"]))
        want = draft_labels(offset, c)
        assert all(text == label(want[p]) for p, text in draft_cells.items())
    at.switch_page("views/walkthrough.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("its own prompt (6 tokens, without the chat template)" in plain(m.value) for m in at.markdown)
    assert any("without the chat template" in plain(i.value) for i in at.info)
    at.switch_page("views/interview.py").run()
    assert not at.exception, [e.value for e in at.exception]
