"""The app on EAGLE-head traces: the head's cache is its own row, named so, and stage 1 says which
feature each draft step read. Checked against the engine's own run (tests/eagle_tiny.py's head)."""
import copy
import html
import re
import shutil
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from app.figures import acceptance, caches, derive, explain
from app.views.sections import stepper_drafter
from engine.cycle.pair import TokenTexts
from engine.cycle.reference import run_cycle, start_run
from engine.trace import load_trace
from tests.eagle_tiny import EAGLE_SETTINGS, eagle_trace, random_eagle_pair
from tests.test_figures import cache_positions

ROOT = Path(__file__).resolve().parent.parent
MAIN = str(ROOT / "app" / "main.py")


@pytest.fixture(scope="module")
def engine_run() -> tuple[list[dict], list[list[int]], list[str], list[int]]:
    """Every cycle record of an engine run, the positions the head was fed again after each
    (EagleState.last_fed), and the prompt's token texts and ids."""
    pair = random_eagle_pair()
    prompt = pair.target.tokenizer("the cat sat on a mat", add_special_tokens=False)["input_ids"]
    state = start_run(pair, prompt, EAGLE_SETTINGS)
    gen = torch.Generator().manual_seed(EAGLE_SETTINGS.seed)
    texts = TokenTexts(pair.target.tokenizer)
    cycles, refed = [], []
    while not state.finished:
        cycles.append(run_cycle(pair, state, EAGLE_SETTINGS, gen, len(cycles), texts))
        refed.append(list(state.draft_state.last_fed))
    return cycles, refed, texts.many(prompt), prompt


def texts_before(prompt_texts: list[str], cycles: list[dict], i: int) -> list[str]:
    return prompt_texts + [t for c in cycles[:i] for t in c["committed_token_texts"]]


def test_the_run_has_rejections_partial_and_full_accepts(engine_run):
    cycles, refed, _, _ = engine_run
    accepted = [c["num_accepted"] for c in cycles]
    assert 0 in accepted and EAGLE_SETTINGS.k in accepted and any(0 < n < EAGLE_SETTINGS.k for n in accepted)
    assert all(bool(r) == c["draft_catch_up"] for c, r in zip(cycles, refed))


def test_the_head_is_its_own_row_and_its_rollback_draws_what_the_engine_did(engine_run):
    cycles, refed, prompt_texts, _ = engine_run
    for i, (c, fed) in enumerate(zip(cycles, refed)):
        seq = texts_before(prompt_texts, cycles, i) + c["draft_token_texts"]
        d = c["draft_cache_len"]
        for stage in range(1, 6):
            fig = caches.cache_figure(c, stage, seq, "eagle")
            rows = {y for bar in fig.data if bar.type == "bar" for y in bar.y}
            assert rows == {"EAGLE head", "target"}  # never "draft"
            assert list(fig.layout.yaxis.categoryarray) == ["EAGLE head", "target"]
            assert "EAGLE head" in fig.layout.title.text and "draft" not in fig.layout.title.text
        cells = cache_positions(caches.cache_figure(c, 5, seq, "eagle"))
        catch_up = cells.get((caches.HEAD_CATCH_UP, "EAGLE head"), [])
        assert catch_up == fed  # exactly the positions the engine fed again with the target's features
        assert cells.get(("rolled back", "EAGLE head"), []) == list(range(d["after_rollback"], d["after_append"]))
        kept = cells[("committed", "EAGLE head")]
        assert kept[-1] == d["before"]  # the first draft step's entry (built on a true feature) stays
        assert cells.get(("rolled back", "target"), []) == list(range(c["target_cache_len"]["after_rollback"],
                                                                       c["target_cache_len"]["after_append"]))


def test_stage_one_hover_says_which_feature_built_each_head_entry(engine_run):
    cycles, _, prompt_texts, _ = engine_run
    c = cycles[1]
    seq = texts_before(prompt_texts, cycles, 1) + c["draft_token_texts"]
    hovers = {}
    for bar in caches.cache_figure(c, 1, seq, "eagle").data:
        if bar.type == "bar":
            for y, base, h in zip(bar.y, bar.base, bar.hovertext):
                hovers[(y, round(base + 0.45))] = h
    before = c["draft_cache_len"]["before"]
    assert "target's true feature" in hovers[("EAGLE head", before)]
    for p in range(before + 1, before + EAGLE_SETTINGS.k):
        assert "head's predicted feature" in hovers[("EAGLE head", p)]


def test_a_model_trace_keeps_its_draft_row(engine_run):
    cycles, _, prompt_texts, _ = engine_run
    c = copy.deepcopy(cycles[1])
    c.pop("drafter_state")  # as a draft model's cycle records it
    fig = caches.cache_figure(c, 5, texts_before(prompt_texts, cycles, 1) + c["draft_token_texts"])
    assert {y for bar in fig.data if bar.type == "bar" for y in bar.y} == {"draft", "target"}


def test_head_steps_say_what_each_step_read(engine_run):
    cycles, _, prompt_texts, _ = engine_run
    k = EAGLE_SETTINGS.k
    for i, c in enumerate(cycles):
        texts = texts_before(prompt_texts, cycles, i)
        steps = derive.head_steps(texts, c)
        assert [s.feature for s in steps] == c["drafter_state"]["feature_sources"] == ["target"] + ["head"] * (k - 1)
        assert [s.token_text for s in steps] == [texts[-1]] + c["draft_token_texts"][:-1]
        assert [s.position for s in steps] == list(range(c["committed_len_before"] - 1, c["committed_len_before"] - 1 + k))
        assert [s.feature_position for s in steps] == [s.position - 1 for s in steps]
        assert [s.proposed_text for s in steps] == c["draft_token_texts"]
        assert [s.outcome for s in steps].count(derive.ACCEPTED) == c["num_accepted"]
        page = stepper_drafter.head_steps_html(steps)
        assert page.count("the target's true feature") == 1 and page.count("the head's own predicted feature") == k - 1
    older = copy.deepcopy(cycles[0])
    older.pop("drafter_state")  # an eagle trace without the feature record: said, not guessed
    assert {s.feature for s in derive.head_steps(prompt_texts, older)} == {None}


def test_head_steps_escape_token_text(engine_run):
    cycles, _, prompt_texts, _ = engine_run
    c = copy.deepcopy(cycles[0])
    c["draft_token_texts"] = ["<b>bold</b>", "<script>x</script>", "&amp;"][: len(c["draft_token_texts"])]
    page = stepper_drafter.head_steps_html(derive.head_steps(prompt_texts[:-1] + ["<img src=x>"], c))
    assert "<b>" not in page and "<script>" not in page and "<img" not in page
    assert "&lt;script&gt;" in page and "&amp;amp;" in page


def test_stage_captions_describe_the_head(engine_run):
    cycles, refed, _, _ = engine_run
    for c, fed in zip(cycles, refed):
        k = len(c["draft_token_ids"])
        draft = explain.stage_caption(c, k, 1, drafter="eagle")
        assert draft.startswith("The EAGLE head proposes") and "target's true feature" in draft
        assert "draft model" not in draft
        rollback = explain.stage_caption(c, k, 5, drafter="eagle")
        d = c["draft_cache_len"]
        assert f"EAGLE head cache {d['after_append']} → {d['after_rollback']}" in rollback
        assert (f"the {len(fed)} accepted token(s) are fed to it again" in rollback) == bool(fed)
        assert "draft model" not in rollback
    # the cycle's own drafter_state names the head when the caller does not
    assert explain.stage_caption(cycles[0], k, 1).startswith("The EAGLE head proposes")


def test_acceptance_bars_name_the_head(engine_run):
    c = engine_run[0][0]
    names = [t.name for t in acceptance.acceptance_figure(c, len(c["draft_token_ids"]), 3).data]
    assert "p_draft (EAGLE head)" in names


# ---------------------------------------------------------------- the pages

@pytest.fixture(scope="module")
def eagle_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("eagle-app")
    (folder / "traces").mkdir()
    eagle_trace(folder / "traces" / "eagle.jsonl")
    shutil.copy(folder / "traces" / "eagle.jsonl", folder / "traces" / "default.jsonl")
    return folder


def plain(markdown: str) -> str:
    return html.unescape(re.sub(r"\\(.)", r"\1", markdown))


def page(folder: Path, monkeypatch, cycle: int, stage: int, view: str = "views/stepper.py") -> AppTest:
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder / "traces"))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(folder / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.query_params.update({"trace": "bundled:eagle.jsonl", "cycle": str(cycle), "stage": str(stage)})
    at.run()
    if view != "views/stepper.py":
        at.switch_page(view).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_stepper_stage_one_shows_the_feature_each_step_read(eagle_folder, monkeypatch):
    trace = load_trace(eagle_folder / "traces" / "eagle.jsonl")
    cycle = next(i for i, c in enumerate(trace.cycles) if 0 < c["num_accepted"] < trace.k)
    c = trace.cycles[cycle]
    at = page(eagle_folder, monkeypatch, cycle, 1)
    assert plain(at.info[0].value) == explain.stage_caption(c, trace.k, 1, drafter="eagle")
    tables = [h.proto.body for h in at.get("html") if "with the feature" in h.proto.body]
    assert len(tables) == 1
    assert tables[0].count("the target's true feature") == 1
    assert tables[0].count("the head's own predicted feature") == trace.k - 1
    at5 = page(eagle_folder, monkeypatch, cycle, 5)
    assert plain(at5.info[0].value) == explain.stage_caption(c, trace.k, 5, drafter="eagle")


@pytest.mark.parametrize("view", ["views/walkthrough.py", "views/interview.py", "views/statistics.py"])
def test_the_other_trace_pages_draw_an_eagle_trace(eagle_folder, monkeypatch, view):
    at = page(eagle_folder, monkeypatch, 1, 5, view)
    assert not at.error, [e.value for e in at.error]
    if view == "views/statistics.py":  # only the open tab runs: open the layout tab, as a click would
        at.session_state["stats_tab"] = "KV-cache layout"
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        rows = [list(d.value["model"]) for d in at.dataframe if "model" in d.value.columns]
        assert ["target", "EAGLE head"] in rows
