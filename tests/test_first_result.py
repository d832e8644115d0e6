"""Each chart page's first result (app/ui/first_result.py): plain Markdown at the top, before any chart,
with the numbers of the open trace or stored result (AppTest; every number recomputed here from the
trace or the engine's result, never read back from the page)."""
import html
import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.figures.derive import prob_text, visible_text, whitespace_legend
from app.runs import precomputed, teaching_pair
from app.ui.safe import md
from engine.config import SpecSettings
from engine.stats.analysis import trace_stats
from engine.teaching.runs import CORRECT, MODE_LABELS, first_divergence
from engine.trace import load_trace
from engine.trace.metrics import decoding_tokens_per_s
from tests.hostile import set_text_everywhere

ROOT = Path(__file__).resolve().parent.parent
MAIN = str(ROOT / "app" / "main.py")
BUNDLED = ROOT / "assets" / "traces"
STEPPER, WALKTHROUGH, STATISTICS = "views/stepper.py", "views/walkthrough.py", "views/statistics.py"
ROLLBACK, EXACTNESS = "views/rollback_demo.py", "views/exactness_lab.py"
CHART_TYPES = {"plotly_chart", "arrow_data_frame", "table"}  # what needs Plotly or the grid's script
TEXT_TYPES = {"markdown", "caption"}  # drawn with the page's own script


def open_page(page: str, query: dict | None = None) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    for name, value in (query or {}).items():
        at.query_params[name] = value
    at.run()
    if page != STEPPER:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def in_order(node, inside: bool = False):
    """(element, inside the first-result container) for every element of the page, top to bottom."""
    for child in getattr(node, "children", {}).values():
        box = getattr(child, "proto", None) is not None and getattr(child.proto, "id", "").endswith("-first_result")
        if hasattr(child, "children") and child.type not in CHART_TYPES | TEXT_TYPES:
            yield from in_order(child, inside or box)
        else:
            yield child, inside


def first_result(at: AppTest) -> str:
    """The first result's Markdown; asserts it is the only one and comes before every chart and table."""
    elements = list(in_order(at.main))
    found = [i for i, (e, inside) in enumerate(elements) if inside]
    assert len(found) == 1 and elements[found[0]][0].type in TEXT_TYPES, [e.type for e, _ in elements]
    charts = [i for i, (e, _) in enumerate(elements) if e.type in CHART_TYPES]
    assert charts, "the page draws charts: the first result must come before them"
    assert found[0] < charts[0]
    return elements[found[0]][0].value


@pytest.fixture
def bundled(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(BUNDLED))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)


def token(text: str) -> str:
    return md(visible_text(text))


# ---------------------------------------------------------------- stepper: the cycle's tokens

@pytest.mark.parametrize("trace_name,all_accepted", [("default.jsonl", False), ("shakespeare-greedy-k8.jsonl", True),
                                                     ("chat-sampled-k2.jsonl", False)])
@pytest.mark.parametrize("stage", [1, 2, 3, 4, 5])
def test_stepper_token_strip_shows_the_cycles_tokens_and_numbers(bundled, trace_name, all_accepted, stage):
    trace = load_trace(BUNDLED / trace_name)
    c = next(c for c in trace.cycles if (c["rejected_position"] is None) == all_accepted and len(c["p_draft"]) > 1)
    at = open_page(STEPPER, {"trace": f"bundled:{trace_name}", "cycle": str(c["cycle"]), "stage": str(stage)})
    strip = first_result(at)
    prefix = f"**Drafted** ({whitespace_legend()}): "  # what · and ↵ in the tokens stand for
    assert strip.startswith(prefix)
    drafted, _, committed = strip.removeprefix(prefix).partition(" → ")
    cells = drafted.split(" · ")
    assert len(cells) == len(c["draft_token_texts"])
    for i, cell in enumerate(cells):
        assert cell.startswith(f"{i + 1} **{token(c['draft_token_texts'][i])}**")
        assert f"p_draft {prob_text(c['p_draft'][i])}" in cell
        assert (f"p_target {prob_text(c['p_target'][i])}" in cell) == (stage >= 2)
        mark = "✓" if i < c["num_accepted"] else "✗" if i == c["num_accepted"] else "–"
        assert (f"** {mark} (" in cell) == (stage >= 3)
    if stage < 4:
        assert not committed
        return
    n = len(c["committed_token_ids"])
    assert committed.startswith(f"**committed ({n}):** ")
    shown = [token(t) for t in c["draft_token_texts"][:c["num_accepted"]]] + [token(c["next_token_text"])]
    assert shown == [token(t) for t in c["committed_token_texts"]] and len(shown) == n
    for text in shown:
        assert f"**{text}**" in committed
    end = "(bonus)" if all_accepted else f"(at position {c['rejected_position']})"
    assert committed.endswith(f"{'★' if all_accepted else '↻'} **{shown[-1]}** {end}")


def shown_text(markdown: str) -> str:
    """Markdown from app.ui.safe.md back to the text a reader sees."""
    return html.unescape(re.sub(r"\\(.)", r"\1", markdown))


def test_the_test_note_states_the_numbers_the_table_and_the_strip_show(bundled):
    """The last cycle of the default trace rejects a draft whose p_target is 1.5e-4: its note said
    "u=0.622 >= 0.001" while the strip showed p_target 0.000. The note now spells out the comparison
    with the numbers as the strip and the test table print them, and the comparison holds as printed."""
    trace = load_trace(BUNDLED / "default.jsonl")
    c = trace.cycles[-1]
    j = c["rejected_position"]
    assert j is not None and 0 < c["p_target"][j - 1] < 0.001  # the case that printed as 0.000
    at = open_page(STEPPER, {"trace": "bundled:default.jsonl", "cycle": str(c["cycle"]), "stage": "3"})
    note = shown_text(at.info[0].value)
    found = re.search(r"rejected because u = (\S+) ≥ min\(1, (\S+) / (\S+)\) = ([^;.]+(?:\.\d+)?(?:e-\d+)?)", note)
    assert found, note
    u, p_target, p_draft, ratio = found.groups()
    row = at.dataframe[0].value.iloc[j - 1]
    assert (row["u"], row["p_target"], row["p_draft"], row["min(1, ratio)"]) == (u, p_target, p_draft, ratio)
    assert float(u) >= float(ratio) and float(p_target) > 0  # what the note states is visible in its numbers
    assert float(p_target) == pytest.approx(c["p_target"][j - 1], rel=0.05)
    assert f"p_target {p_target})" in first_result(at).split(" · ")[j - 1]


def test_a_token_with_a_quote_shows_as_its_text(bundled):
    """Cycle 0 of the default trace resamples the token 's: the caption quoted it as ''s'."""
    trace = load_trace(BUNDLED / "default.jsonl")
    c = trace.cycles[0]
    assert c["next_token_text"] == "'s" and c["rejected_position"] is not None
    at = open_page(STEPPER, {"trace": "bundled:default.jsonl", "cycle": "0", "stage": "4"})
    caption = shown_text(at.info[0].value)
    assert "the token “'s” is drawn" in caption and "''s'" not in caption


def hostile_trace(tmp_path: Path) -> tuple[Path, str]:
    """The default trace with every draft token of cycle 0 written as Markdown and HTML (consistently
    everywhere those ids appear, so the trace stays valid)."""
    evil = "<img src=x onerror=alert(1)>**b** [l](http://e) $x$ :red[y]"
    records = [json.loads(line) for line in (BUNDLED / "default.jsonl").read_text().splitlines()]
    cycle0 = next(r for r in records if r.get("type") == "cycle" and r["cycle"] == 0)
    for i, token_id in enumerate(dict.fromkeys(cycle0["draft_token_ids"] + cycle0["committed_token_ids"])):
        set_text_everywhere(records, token_id, f"{evil}{i}")
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path, evil


@pytest.mark.parametrize("page", [STEPPER, WALKTHROUGH])
def test_token_texts_in_first_results_are_escaped(bundled, monkeypatch, tmp_path, page):
    path, evil = hostile_trace(tmp_path)
    monkeypatch.setenv("SPECLAB_TRACE", str(path))
    query = {"trace": "env", "cycle": "0", "stage": "4"}
    at = open_page(page, query)
    if page == WALKTHROUGH:
        at.selectbox(key="wt_cycle").set_value(0).run()
    text = first_result(at)
    assert md(visible_text(evil + "0")) in text
    assert "<img" not in text and "**b**" not in text and "[l](" not in text and ":red[" not in text


# ---------------------------------------------------------------- walkthrough: the cycle in brief

@pytest.mark.parametrize("trace_name", ["default.jsonl", "shakespeare-greedy-k8.jsonl",
                                        "chat-prompt-lookup-greedy-k4.jsonl"])
def test_walkthrough_cycle_in_brief(bundled, trace_name):
    trace = load_trace(BUNDLED / trace_name)
    at = open_page(WALKTHROUGH, {"trace": f"bundled:{trace_name}"})
    for cycle in {at.selectbox(key="wt_cycle").value, *(c["cycle"] for c in trace.cycles if not c["draft_token_texts"]),
                  *(c["cycle"] for c in trace.cycles if c["rejected_position"] is None)}:
        if at.selectbox(key="wt_cycle").value != cycle:
            at.selectbox(key="wt_cycle").set_value(cycle).run()
        c = trace.cycles[cycle]
        text = first_result(at)
        assert text.startswith(f"**Cycle {cycle} in brief:** ")
        for t in c["draft_token_texts"]:
            assert f"“{token(t)}”" in text
        q_next = f"“{token(c['next_token_text'])}”"
        if not c["draft_token_texts"]:
            assert f"nothing was proposed, so the target's own token {q_next} was taken" in text
        elif c["rejected_position"] is None:
            assert f"all {len(c['draft_token_texts'])} accepted, then the bonus token {q_next}" in text
        else:
            j = c["rejected_position"]
            assert (f"{c['num_accepted']} accepted, position {j} (“{token(c['draft_token_texts'][j - 1])}”) "
                    f"rejected and {q_next}") in text
        assert f": {len(c['committed_token_ids'])} token(s) committed" in text
        t = c["target_cache_len"]
        assert text.endswith(f"went from {t['after_append']} entries (after the verify pass) to {t['after_rollback']}.")


# ---------------------------------------------------------------- statistics: the headline

@pytest.mark.parametrize("trace_name", ["default.jsonl", "shakespeare-sampled-k4-high-acceptance.jsonl"])
def test_statistics_headline_numbers(bundled, trace_name):
    trace = load_trace(BUNDLED / trace_name)
    stats = trace_stats(trace)
    at = open_page(STATISTICS, {"trace": f"bundled:{trace_name}"})
    text = first_result(at)
    a, r = stats.acceptance, stats.speed
    assert f"α = **{stats.alpha:.3f}**" in text
    assert f"draft acceptance rate **{a['acceptance_rate']:.3f}**" in text
    assert f"mean acceptance length **{a['mean_acceptance_length']:.3f}**" in text
    spread = r.measured_spread
    # both measured speedups, each said to be what it is: the median cycle's and the whole run's (the race's
    # ratio, worked out here from the records: every token over every cycle's time)
    whole = r.target_step_s * sum(len(c["committed_token_ids"]) for c in trace.cycles) / sum(
        c["cycle_time_s"] for c in trace.cycles)
    assert (f"measured speedup **{r.measured:.2f}×** at the median cycle (middle half of cycles "
            f"{spread.low:.2f}–{spread.high:.2f}×; {whole:.2f}× over the whole run, slow cycles included, as the "
            f"race draws it; Leviathan predicts {r.leviathan:.2f}×, refined {r.refined:.2f}×)") in text
    assert f"**{decoding_tokens_per_s(trace.cycles):.1f}** tokens/s decoding" in text
    # the same numbers the metrics below show
    assert f"{a['acceptance_rate']:.3f}" in [m.value for m in at.metric]


# ---------------------------------------------------------------- rollback and exactness: the stored result

def default_choice() -> teaching_pair.PairChoice:
    return teaching_pair.choices()[0]


def test_rollback_result_in_words(bundled, monkeypatch):
    monkeypatch.delenv("SPECLAB_TEACHING_PAIR", raising=False)
    choice = default_choice()
    key = precomputed.rollback_key(choice.key, choice.prompt,
                                   SpecSettings(k=4, temperature=0.0, seed=0, max_new_tokens=40).to_dict())
    stored = precomputed.find(key)
    assert stored is not None, "the default settings have a stored result"
    cmp = precomputed.comparison_from_dict(stored["result"])
    at = open_page(ROLLBACK)
    text = first_result(at)
    correct = cmp.runs[CORRECT]
    assert text.startswith(f"**Result for the settings below:** the correct engine accepted "
                           f"**{correct.acceptance_rate:.2f}** of the draft tokens; ")
    for mode, run in cmp.runs.items():
        if mode == CORRECT:
            continue
        first = first_divergence(run.generated, correct.generated)
        output = "the same output" if first is None else f"output that differs from token **{first}** on"
        assert (f"*{md(MODE_LABELS[mode])}* gives {output}, acceptance **{run.acceptance_rate:.2f}**, target drift "
                f"up to {max(c.target_tv for c in run.cycles):.2g}") in text
    assert above_the_settings(at)


def test_exactness_verdict_in_words(bundled, monkeypatch):
    monkeypatch.delenv("SPECLAB_TEACHING_PAIR", raising=False)
    choice = default_choice()
    s = SpecSettings(k=1, temperature=1.0, top_k=0, seed=0)
    key = precomputed.exactness_key(choice.key, choice.prompt, s.to_dict(), "ratio", False, 200, 1)
    stored = precomputed.find(key)
    assert stored is not None, "the default settings have a stored result"
    res, _ = precomputed.lab_from_dict(stored["result"])
    at = open_page(EXACTNESS)
    text = first_result(at)
    spec, plain_p = res.speculative_test.p_value, res.plain_test.p_value
    assert text.startswith(f"**Result for the settings below (ratio rule, {res.samples} samples):** ")
    word = "consistent with the target" if spec >= 0.01 else "**not** the target's distribution"
    assert f"speculative sampling: {word}" in text and (f"p = {spec:.3g}" in text or f"p = {spec:.2g}" in text)
    assert "plain target sampling: " in text and (f"p = {plain_p:.3g}" in text or f"p = {plain_p:.2g}" in text)
    assert text.endswith(f"first draft token accepted {res.acceptance_rate:.0%}.")
    assert above_the_settings(at)


def above_the_settings(at: AppTest) -> bool:
    """Only the title and the page's introduction come before the first result: no widget, no form."""
    elements = list(in_order(at.main))
    index = next(i for i, (_, inside) in enumerate(elements) if inside)
    return {e.type for e, _ in elements[:index]} <= {"title", "markdown"}
