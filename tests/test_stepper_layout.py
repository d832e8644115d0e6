"""The stepper on a projector (1366x768): labels fit for every K from 1 to 8, hovers carry the
whole token, the residual chart shows what it is about, greedy cycles show no u.

Geometry is checked from the figures themselves: each label's drawn width (monospace,
style.text_px) against the room its column or bar has at the projector's plot width.
"""
import copy
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.figures import acceptance, derive, explain, overview, style
from app.figures import cycle as figures
from engine.config import SpecSettings
from engine.run import run_to_trace
from engine.trace import Trace, load_trace
from tests.tiny import tiny_pair

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
KS = list(range(1, 9))
LONG = " substitution"  # a long token, as a real tokenizer makes


@pytest.fixture(scope="module")
def layout_folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("layout")


@pytest.fixture(scope="module")
def traces_by_k(layout_folder) -> dict[int, Trace]:
    """A real sampled trace at each K (tiny models), and a greedy one at K=4 (key 0)."""
    folder = layout_folder
    pair = tiny_pair()
    out = {}
    for k in KS + [0]:
        s = SpecSettings(k=k or 4, temperature=0.0 if k == 0 else 1.0, max_new_tokens=16, seed=k)
        run_to_trace(pair, "the cat sat", s, folder / f"k{k}.jsonl")
        out[k] = load_trace(folder / f"k{k}.jsonl")
    return out


def long_tokens(c: dict) -> dict:
    c = copy.deepcopy(c)
    c["draft_token_texts"] = [LONG] * len(c["draft_token_texts"])
    return c


def text_rows(fig) -> list:
    return [t for t in fig.data if t.type == "scatter" and t.mode == "text"]


def assert_row_fits(xs, texts, size: int, px_per_unit: float) -> None:
    """Neighbouring labels on one row never overlap."""
    placed = sorted(zip(xs, texts))
    for (x1, t1), (x2, t2) in zip(placed, placed[1:]):
        room = (x2 - x1) * px_per_unit
        need = (style.text_px(t1, size) + style.text_px(t2, size)) / 2
        assert need <= room, f"labels {t1!r} and {t2!r} overlap: need {need:.0f} px, have {room:.0f}"


@pytest.mark.parametrize("k", KS)
def test_cycle_figure_labels_fit_at_every_k(traces_by_k, k):
    trace = traces_by_k[k]
    for c in (trace.cycles[0], long_tokens(trace.cycles[0])):
        for stage in range(1, 6):
            fig = figures.cycle_figure(c, k, stage)
            lo, hi = fig.layout.xaxis.range
            px_per_unit = style.PROJECTOR_WIDTH_PX / (hi - lo)
            for row in text_rows(fig):
                for y in set(row.y):
                    on_row = [(x, t) for x, yy, t in zip(row.x, row.y, row.text) if yy == y]
                    assert_row_fits([x for x, _ in on_row], [t for _, t in on_row], row.textfont.size, px_per_unit)
            # the whole token is in the hover of every draft cell, however short its label
            hovers = [h for t in fig.data if t.type == "bar" for h in t.hovertext if h.startswith("position")]
            if c["draft_token_texts"][0] == LONG:
                assert len(hovers) == k and all(style.shown(LONG) in h for h in hovers)


@pytest.mark.parametrize("k", KS)
def test_acceptance_figure_labels_fit_at_every_k(traces_by_k, k):
    c = traces_by_k[k].cycles[0]
    fig = acceptance.acceptance_figure(long_tokens(c), k, 3)
    slot_px = style.HALF_WIDTH_PX / k
    bars = [t for t in fig.data if t.type == "bar"]
    for bar in bars:
        # no values on the bars: neighbours' values ran together ("1.0001.000"); the hover has them
        assert bar.text is None and "%{y:.4f}" in bar.hovertemplate
        assert list(bar.customdata) == [style.shown(LONG)] * k  # full token in the hover
    for tick in bars[0].x:
        assert style.text_px(tick, 12) <= slot_px, f"tick {tick!r} wider than its slot at K={k}"
    assert style.text_px(fig.layout.title.text, 14) <= style.HALF_WIDTH_PX  # the title is not cut off
    (u,) = [t for t in fig.data if t.name == "u (uniform draw)"]
    assert u.text is None and u.mode == "markers"  # u values go in the hover and table, not on the bars


def test_residual_chart_shows_the_rejected_and_the_sampled_token(traces_by_k):
    seen = 0
    for trace in traces_by_k.values():
        for c in trace.cycles:
            j = c["rejected_position"]
            if j is None:
                continue
            seen += 1
            fig = acceptance.resample_figure(c, trace.k)
            pt, pd, res = fig.data
            labels = list(pt.x)
            assert len(labels) <= acceptance.RESIDUAL_BARS
            # first bar: the rejected draft token, with its own numbers from the trace
            assert "rejected" in labels[0] and style.shown(c["draft_token_texts"][j - 1], 8) in labels[0]
            slot_px = style.HALF_WIDTH_PX / len(labels)
            assert all(style.text_px(t, 12) <= slot_px for t in labels), labels  # tick labels fit their slots
            assert pt.y[0] == pytest.approx(c["p_target"][j - 1]) and pd.y[0] == pytest.approx(c["p_draft"][j - 1])
            # the resampled token: labelled, outlined, with the trace's residual value
            chosen = [i for i, w in enumerate(res.marker.line.width) if w == 3]
            assert len(chosen) == 1 and "resampled" in labels[chosen[0]]
            entry = next(e for e in c["residual_top"] if e["token_id"] == c["resampled_token_id"])
            assert res.y[chosen[0]] == pytest.approx(entry["residual"]) and res.y[chosen[0]] > 0
            # no empty bars: every other token has something to draw
            for i in range(len(labels)):
                if i not in (0, chosen[0]):
                    assert max(pt.y[i], pd.y[i], res.y[i]) >= 0.005
    assert seen >= 5


def test_greedy_cycles_explain_the_argmax_check(traces_by_k):
    trace = traces_by_k[0]
    assert trace.header["settings"]["temperature"] == 0
    c = next(c for c in trace.cycles if c["rejected_position"] is not None)
    fig = acceptance.acceptance_figure(c, trace.k, 3, greedy=True)
    names = [t.name for t in fig.data]
    assert "u (uniform draw)" not in names and "target's most likely token (argmax)" in names
    assert "argmax" in fig.layout.title.text
    caption = explain.stage_caption(c, trace.k, 3, greedy=True)
    assert "argmax" in caption and "u = " not in caption
    hover = [h for t in figures.cycle_figure(c, trace.k, 3, greedy=True).data if t.type == "bar"
             for h in t.hovertext if h.startswith("position")]
    assert all(" u " not in h for h in hover) and any("target's argmax" in h for h in hover)
    assert "argmax" in explain.stage_caption(c, trace.k, 4, greedy=True)


def open_stepper(monkeypatch, trace_file, cycle: int, stage: int) -> AppTest:
    monkeypatch.setenv("SPECLAB_TRACE", str(trace_file))
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.query_params.update({"trace": "env", "cycle": str(cycle), "stage": str(stage)})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_stepper_table_says_not_drawn_and_shows_argmax_when_greedy(traces_by_k, layout_folder, monkeypatch):
    sampled = traces_by_k[4]
    c = next(c for c in sampled.cycles if c["rejected_position"] is not None and c["rejected_position"] < 4)
    at = open_stepper(monkeypatch, layout_folder / "k4.jsonl", c["cycle"], 3)
    assert at.subheader[0].value.startswith(f"Cycle {c['cycle']} · stage 3")
    (frame,) = at.dataframe
    table = frame.value
    assert list(table["u"]) == [derive.prob_text(u) for u in c["u"]] + ["not drawn"] * (4 - len(c["u"]))
    assert list(table["min(1, ratio)"]) == [derive.prob_text(a) for a in c["accept_prob"]]
    greedy = traces_by_k[0]
    g = next(c for c in greedy.cycles if c["rejected_position"] is not None)
    at = open_stepper(monkeypatch, layout_folder / "k0.jsonl", g["cycle"], 3)
    (frame,) = at.dataframe
    table = frame.value
    assert "u" not in table.columns and "min(1, ratio)" not in table.columns
    j = g["rejected_position"]
    argmax = list(table["target's argmax"])
    assert argmax[j - 1] == derive.visible_text(g["target_top"][j - 1][0]["text"])
    assert argmax[j:] == ["not drawn"] * (greedy.k - j)
    assert "argmax" in at.info[0].value and "u = " not in at.info[0].value


def test_cycle_time_bar_adds_up_to_the_recorded_cycle_time(traces_by_k):
    for c in traces_by_k[4].cycles[:5]:
        fig = overview.cycle_time_figure(c)
        ms = {t.name: t.x[0] for t in fig.data}
        assert ms["draft: K steps"] == pytest.approx(c["draft_time_s"] * 1000)
        assert ms["verify: one target pass"] == pytest.approx(c["verify_time_s"] * 1000)
        assert ms["draft catch-up"] == pytest.approx(c["catch_up_time_s"] * 1000)
        assert sum(ms.values()) == pytest.approx(c["cycle_time_s"] * 1000)
        style.validated(fig)


def test_walkthrough_on_a_greedy_trace_explains_the_argmax_check(traces_by_k, layout_folder, monkeypatch):
    monkeypatch.setenv("SPECLAB_TRACE", str(layout_folder / "k0.jsonl"))
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.run()
    at.switch_page("views/walkthrough.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("argmax check" in i.value for i in at.info)
    accept = [json.loads(c.proto.spec) for c in at.get("plotly_chart") if c.proto.id.endswith("-wt_accept")]
    assert len(accept) == 1 and "argmax" in accept[0]["layout"]["title"]["text"]
    assert not any(t.get("name") == "u (uniform draw)" for t in accept[0]["data"])
