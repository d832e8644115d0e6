"""The Workload page on the bundled chat workloads (AppTest), every number against the engine's
(engine/workload/stats.py on the same zips, read apart from the app):

- a comparison opens on a workload that decoded something else (not the batched twin, whose every
  bar is the same) and shows both workloads in every chart and table;
- at temperature 0 "Where the loss is" pairs each rejected token with the target's choice instead of
  one-hot p-values, with spaces and line breaks visible, and "rate − median" has the sign its words say;
- every speedup below 1 has a "Why?" with the stepper's explanation (app/figures/slower.py);
- the charts' rate axes fit their data, every rate has its counts beside it, and no two category lines
  of the positions chart share a colour.
"""
import html
import json
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.figures import workload as figs
from app.figures.derive import visible_text
from app.figures.slower import SlowerRun, why_slower
from app.ui.safe import md
from engine.workload.folder import open_workload
from engine.workload.stats import workload_stats
from tests.test_workload_page import MAIN, PAGE, _values, category_row, figure, open_tab, texts

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "assets" / "workloads"
DRAFT = "chat-draft-model-greedy-k4.zip"  # the page's default: first in the list
TWIN = "chat-draft-model-k4-batch-4-greedy.zip"  # the same greedy requests, run four at a time
LOOKUP = "chat-prompt-lookup-greedy-k4.zip"  # the same requests, drafted by prompt lookup


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    folder = tmp_path_factory.mktemp("truth") / "workloads"
    folder.mkdir()
    for name in (DRAFT, TWIN, LOOKUP):
        shutil.copy(SHIPPED / name, folder / name)
    return folder, {name: workload_stats(open_workload(folder / name).runs()) for name in (DRAFT, LOOKUP)}


def open_page(folder: Path, monkeypatch, tmp_path: Path) -> AppTest:
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(ROOT / "assets" / "traces"))
    monkeypatch.setenv("SPECLAB_WORKLOADS_DIR", str(folder))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path / "uploads"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(str(MAIN), default_timeout=180)
    at.run()
    at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def table_rows(at: AppTest, first_header: str) -> list[list[str]]:
    """The rows of the Markdown table whose first column is `first_header` (md()'s escapes taken out)."""
    found = [m.value.replace("\\", "") for m in at.markdown if m.value.startswith(f"| {first_header} |")]
    assert len(found) == 1, f"{len(found)} tables headed {first_header!r}"
    header, _, *rows = found[0].split("\n")
    return [[html.unescape(cell) for cell in line.strip("| ").split(" | ")] for line in [header, *rows]]


def popovers(at: AppTest) -> dict[str, str]:
    return {p.proto.popover.label: "\n".join(m.value for m in p.markdown) for p in at.get("popover")}


def colours(fig: dict) -> list[str]:
    return [line["line"]["color"] for line in fig["data"]]


def test_a_comparison_opens_on_another_outcome_and_shows_both_everywhere(shipped, monkeypatch, tmp_path):
    folder, want = shipped
    at = open_tab(open_page(folder, monkeypatch, tmp_path), "Compare two workloads")
    assert at.selectbox(key="workload_other_pick").value == ("bundled", LOOKUP)  # not the twin listed before it
    a, b = want[DRAFT], want[LOOKUP]
    bars = figure(at, "wl_categories_chart")["data"]
    assert [[round(v, 9) for v in _values(t["y"])] for t in bars] == \
        [[round(g["acceptance_rate"], 9) for g in figs.groups(s).values()] for s in (a, b)]
    shown = texts(at)
    for s in (a, b):  # both categories tables, every cell
        for name, g in figs.groups(s).items():
            assert category_row(name, g) in shown
    lines = figure(at, "wl_conditional_chart")["data"]
    assert [[round(v, 9) for v in _values(t["y"])] for t in lines] == \
        [[round(r["rate"], 9) for r in s["overall"]["conditional_acceptance"]] for s in (a, b)]
    rows = table_rows(at, "group")[1:]
    assert [r[1:] for r in rows] == [[f"{p['rate']:.3f} ({p['accepted']}/{p['reached']})"
                                      for p in s["overall"]["conditional_acceptance"]] for s in (a, b)]
    histogram = figure(at, "wl_histogram_chart")["data"]
    assert [list(t["text"]) for t in histogram] == [[str(c) for c in s["overall"]["accepted_histogram"]] for s in (a, b)]
    context = figure(at, "wl_context_chart")["data"]
    assert [list(t["text"]) for t in context] == [[f"{c['requests']} req<br>{c['cycles']} cyc" for c in s["context_length"]]
                                                  for s in (a, b)]
    for s in (a, b):  # both context tables
        for c in s["context_length"]:
            assert (f"| {figs.bin_name(c)} | {c['requests']} | {c['cycles']} | {c['accepted_tokens']}/"
                    f"{c['draft_tokens']} | {c['acceptance_rate']:.3f} |") in shown
    at.selectbox(key="workload_other_pick").set_value(("bundled", TWIN)).run()
    assert any("every pair of bars matches" in i.value for i in at.info)


def test_at_temperature_0_the_loss_tab_pairs_each_rejected_token_with_the_targets(shipped, monkeypatch, tmp_path):
    folder, want = shipped
    loss = want[DRAFT]["loss"]
    assert loss["rejected_tokens"]["greedy"]
    at = open_tab(open_page(folder, monkeypatch, tmp_path), "Where the loss is")
    header, *rows = table_rows(at, "cycle")
    assert header == ["cycle", "lost / drafted", "rejected draft token", "the target's token", "context"]
    assert [r[2:4] for r in rows] == [[visible_text(c["text"]), visible_text(c["target_text"])]
                                      for c in loss["worst_cycles"]]
    assert not [e for e in at.get("plotly_chart") if e.proto.id.endswith("-wl_rejection_chart")]  # one dot at T=0
    header, *rows = table_rows(at, "rejected draft token")
    pairs = loss["rejected_tokens"]["top_pairs"]
    assert [r[:3] for r in rows] == [[visible_text(p["text"]), visible_text(p["target_text"]), str(p["count"])]
                                     for p in pairs]
    # whitespace tokens are rejected here: shown as the stepper shows them, never as a blank cell
    assert any(p["text"].strip() == "" for p in pairs) and all(r[0].strip() and r[1].strip() for r in rows)
    assert any("↵" in r[0] for r in rows)
    header, *rows = table_rows(at, "request")
    assert header[3] == "rate − median"
    worst = loss["worst_requests"]
    assert [float(r[3]) for r in rows] == [round(-w["below_median"], 3) for w in worst]
    assert all(w["below_median"] > 0 for w in worst) and all(r[3].startswith("-") for r in rows)
    assert f"median request's acceptance rate is {want[DRAFT]['median_acceptance_rate']:.3f}" in \
        " ".join(c.value for c in at.caption).replace("\\", "")


@pytest.mark.parametrize("name", [DRAFT, LOOKUP])
def test_every_speedup_below_1_has_the_steppers_why(shipped, monkeypatch, tmp_path, name):
    folder, want = shipped
    at = open_page(folder, monkeypatch, tmp_path)
    at.selectbox(key="workload_pick").set_value(("bundled", name)).run()
    stats = want[name]
    o = stats["overall"]
    assert o["speedup"]["measured"] < 1  # 0.72x and 0.98x as recorded
    why = popovers(at)
    assert why["Why?"] == why_slower(SlowerRun.of_speedup(o["speedup"], o["mean_acceptance_length"]))
    assert f"predicts {o['speedup']['leviathan']:.2f}×" in why["Why?"]  # 1.94x for prompt lookup: said why
    slow = {n: g for n, g in figs.groups(stats).items() if g["speedup"]["measured"] < 1}
    (label,) = [label for label in why if label.startswith("Why? (")]
    assert label == f"Why? ({len(slow)} of the speedups in this table are below 1×)"
    for n, g in slow.items():
        reason = why_slower(SlowerRun.of_speedup(g["speedup"], g["mean_acceptance_length"]))
        assert f"**{md(n)}** ({g['speedup']['measured']:.2f}×): {reason}" in why[label]
    faster = [n for n, g in figs.groups(stats).items() if g["speedup"]["measured"] >= 1]
    assert all(f"**{md(n)}**" not in why[label] for n in faster)


def test_the_explanation_adds_up_to_the_measured_speedup(shipped):
    """Its cycle cost, split into drafting, verifying and the rest, gives back the speedup it explains."""
    for stats in shipped[1].values():
        o = stats["overall"]
        run = SlowerRun.of_speedup(o["speedup"], o["mean_acceptance_length"])
        said = why_slower(run)
        steps = o["mean_acceptance_length"] / o["speedup"]["measured"]
        rest = steps - run.k * run.c - run.verify_steps
        assert run.verify_steps == o["speedup"]["verify_measured"]  # the group's own passes, as c is its own
        assert f"about {steps:.2f} target steps" in said and f"committed {o['mean_acceptance_length']:.2f} tokens" in said
        assert f"positions took {run.verify_steps:.2f}" in said and f"took {run.k * run.c:.2f}" in said
        assert f"the other {rest:.2f}" in said if rest >= 0.005 else "the other" not in said
    over = SlowerRun(k=6, c=0.078, verify_in_steps=1.58, leviathan=1.03, measured=0.81, tokens_per_cycle=1.41)
    assert "together 2.05, a little more than the median cycle" in why_slower(over)  # parts never said to fit inside


def test_the_charts_fit_their_data_and_count_every_rate(shipped):
    stats = shipped[1][DRAFT]
    named = figs.groups(stats)
    fig = json.loads(figs.category_figure(stats).to_json())
    highs = [g["intervals"]["acceptance_rate"][1] for g in named.values()]
    top = fig["layout"]["yaxis"]["range"][1]
    assert max(highs) <= top <= 1.5 * max(highs) < 0.5  # rates of 0.05-0.14 fill the chart
    assert fig["layout"]["xaxis"]["ticktext"] == [f"{n}<br>{g['requests']} req" for n, g in named.items()]
    context = json.loads(figs.context_figure(stats).to_json())
    bins = stats["context_length"]
    assert any(b["requests"] == 1 for b in bins)  # a bin of one request: its count must show
    assert context["data"][0]["text"] == [f"{b['requests']} req<br>{b['cycles']} cyc" for b in bins]
    assert max(b["acceptance_rate"] for b in bins) <= context["layout"]["yaxis"]["range"][1] < 0.5
    positions = json.loads(figs.conditional_figure(stats).to_json())
    assert len(stats["categories"]) == 11 and len(positions["data"]) <= len(figs.LINES) + 1
    assert len(set(colours(positions))) == len(positions["data"])  # no colour drawn twice
    every = json.loads(figs.conditional_figure(stats, sorted(stats["categories"])).to_json())
    drawn = min(len(stats["categories"]), len(figs.LINES)) + 1  # a line per category it has colours for, and all requests
    assert len(every["data"]) == drawn and len(set(colours(every))) == len(every["data"])
    rates = [r["rate"] for g in named.values() for r in g["conditional_acceptance"] if r["rate"] is not None]
    assert max(rates) <= positions["layout"]["yaxis"]["range"][1] <= 1.12


def test_the_default_lines_are_every_category_or_the_lowest_and_highest(shipped):
    stats = shipped[1][DRAFT]
    assert len(stats["categories"]) <= len(figs.LINES)  # the bundled workload: a colour for each
    assert figs.default_lines(stats) == sorted(stats["categories"])
    rates = {f"c{i:02d}": 0.05 * i for i in range(len(figs.LINES) + 7)} | {"unmeasured": None}
    many = {"categories": {name: {"acceptance_rate": rate} for name, rate in rates.items()}}
    half = len(figs.LINES) // 2
    measured = sorted((n for n, r in rates.items() if r is not None), key=rates.get)
    assert figs.default_lines(many) == sorted(measured[:half] + measured[-half:])
    assert "unmeasured" not in figs.default_lines(many)


def test_a_batched_twin_decodes_what_its_one_at_a_time_run_did():
    """What the comparison skips by default: the same requests with the same acceptance, in another file."""
    draft, twin, lookup = (open_workload(SHIPPED / name).outcome() for name in (DRAFT, TWIN, LOOKUP))
    assert draft == twin != lookup
