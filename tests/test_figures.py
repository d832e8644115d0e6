"""The app's figure functions against the numbers of real traces (tiny models, tests/tiny.py).

Every expectation is computed from the trace records directly, not through the
app's own derive helpers, so a figure that drifts from its trace fails here.
"""
import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest

from app.figures import acceptance, caches, derive, explain, overview, style
from app.figures import cycle as figures
from app.figures import stats as stats_figures
from app.ui.safe import md
from engine.stats.analysis import trace_stats
from engine.stats.quiet import loud_cycles, median_cycle_s
from engine.trace import Trace, load_trace

XSS = "<img src=x onerror=alert(1)>"
BUNDLED = Path(__file__).resolve().parent.parent / "assets" / "traces"


@pytest.fixture(scope="module")
def sampled(example_traces) -> Trace:
    return load_trace(example_traces["sampled"])


@pytest.fixture(scope="module")
def same_model(example_traces) -> Trace:
    return load_trace(example_traces["same-model"])


def first_cycle(trace: Trace, rejected: bool) -> dict:
    found = [c for c in trace.cycles if (c["rejected_position"] is not None) == rejected]
    assert found, f"the test trace has no cycle with rejected={rejected}"
    return found[0]


def partial_rejection(trace: Trace) -> dict:
    """A cycle that accepted some drafts and then rejected one (not at position 1 or K)."""
    for c in trace.cycles:
        if c["rejected_position"] is not None and 0 < c["num_accepted"]:
            return c
    return first_cycle(trace, rejected=True)


def by_name(fig, start: str) -> list:
    return [t for t in fig.data if t.name and t.name.endswith(start)]


def text_traces(fig) -> list:
    return [t for t in fig.data if t.type == "scatter" and t.mode == "text"]


def expected_origins(trace: Trace) -> list[str]:
    """Origin of every token, from the cycle records alone."""
    origins = ["prompt"] * len(trace.header["prompt_token_ids"])
    for c in trace.cycles:
        for i in range(len(c["committed_token_ids"])):
            if i < c["num_accepted"]:
                origins.append("accepted")
            else:
                origins.append("resampled" if c["rejected_position"] is not None else "bonus")
    return origins


def all_texts(trace: Trace) -> list[str]:
    return list(trace.header["prompt_token_texts"]) + [t for c in trace.cycles for t in c["committed_token_texts"]]


def strings_in(obj) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings_in(v)]
    if isinstance(obj, (list, tuple)) or hasattr(obj, "tolist"):
        return [s for v in (obj.tolist() if hasattr(obj, "tolist") else obj) for s in strings_in(v)]
    return []


# ---------------------------------------------------------------- the traces cover every case

def test_test_traces_cover_rejections_and_bonus(sampled, same_model):
    assert any(c["rejected_position"] for c in sampled.cycles)
    assert any(0 < c["num_accepted"] < sampled.k for c in sampled.cycles)
    assert all(c["bonus_token_id"] is not None for c in same_model.cycles)
    assert any(c["draft_catch_up"] for c in same_model.cycles)


# ---------------------------------------------------------------- text so far

@pytest.mark.parametrize("name", ["sampled", "same_model"])
def test_text_figure_tokens_in_order_coloured_by_origin(name, request):
    trace = request.getfixturevalue(name)
    cycle = len(trace.cycles) // 2
    tokens = derive.token_table(trace)
    fig = figures.text_figure(tokens, highlight_cycle=cycle)
    (labels,) = text_traces(fig)
    assert list(labels.text) == [style.esc(derive.visible_text(t)) for t in all_texts(trace)]
    where = {(float(x), int(y)): i for i, (x, y) in enumerate(zip(labels.x, labels.y))}
    seen = {}
    for bar in (t for t in fig.data if t.type == "bar"):
        for row, col, width, line in zip(bar.y, bar.base, bar.x, bar.marker.line.width):
            seen[where[(col + width / 2, int(row))]] = (bar.marker.color, line)
    origins = expected_origins(trace)
    assert len(seen) == len(origins)
    for i, origin in enumerate(origins):
        assert seen[i][0] == style.tint(style.STYLES[origin].colour), f"token {i} ({origin})"
    ends = derive.tokens_through(trace)
    this_cycle = range(ends[cycle - 1], ends[cycle])
    assert [i for i in seen if seen[i][1] == 2.5] == list(this_cycle)
    unmarked = figures.text_figure(tokens, highlight_cycle=None)  # stages 1-3: nothing of this cycle is final yet
    assert all(w == 0.5 for bar in unmarked.data if bar.type == "bar" for w in bar.marker.line.width)


def test_text_hover_shows_the_tokens_numbers(sampled):
    tokens = derive.token_table(sampled)
    fig = figures.text_figure(tokens)
    (accepted,) = by_name(fig, "accepted draft")
    hovers = list(accepted.hovertext)
    expected = [(c["p_target"][i], c["p_draft"][i], c["accept_prob"][i], c["u"][i])
                for c in sampled.cycles for i in range(min(c["num_accepted"], len(c["committed_token_ids"])))]
    assert len(hovers) == len(expected)
    for hover, (pt, pd, a, u) in zip(hovers, expected):
        assert f"p_target {style.fmt_p(pt)}" in hover and f"p_draft {style.fmt_p(pd)}" in hover
        assert f"p_draft) {style.fmt_p(a)}" in hover and f"u {style.fmt_p(u)}" in hover
        assert u < a  # an accepted token passed the test it shows
    (resampled,) = by_name(fig, "resampled")
    c = first_cycle(sampled, rejected=True)
    entry = next(e for e in c["residual_top"] if e["token_id"] == c["resampled_token_id"])
    assert f"drawn from the residual: {style.fmt_p(entry['residual'])}" in resampled.hovertext[0]


def test_origins_differ_by_more_than_colour():
    origins = [derive.PROMPT, derive.ACCEPTED, derive.RESAMPLED, derive.BONUS]
    outcomes = [derive.ACCEPTED, derive.REJECTED, derive.DISCARDED, derive.BONUS]
    for group in (origins, outcomes):
        styles = [style.STYLES[g] for g in group]
        assert len({s.mark for s in styles}) == len({s.label for s in styles}) == len(group)
        assert all(s.colour in style.OKABE_ITO.values() for s in styles)
    assert len({style.STYLES[o].colour for o in origins}) == 4  # and the colours differ too
    assert len({style.STYLES[o].symbol for o in outcomes}) == 4  # overview markers differ in shape
    assert style.tint("#0072B2", 0.6) == "#99C7E0"


def test_visible_whitespace():
    assert derive.visible_text(" a\n\tb\x00") == "·a↵→b\\x00"
    assert derive.visible_text("") == "∅"
    assert style.shown("abcdefghij", 6) == "abcde…" and style.shown(XSS, 6) == "&lt;img·…"
    placed = derive.place_tokens([derive.TokenInfo(t, derive.PROMPT, None) for t in ["ab", "c\n", "d"]], wrap=10)
    assert [(t.row, t.col) for t in placed] == [(0, 0), (0, 2), (1, 0)]


# ---------------------------------------------------------------- the test per position

def test_acceptance_figure_numbers(sampled):
    c, k = partial_rejection(sampled), sampled.k
    fig = acceptance.acceptance_figure(c, k, stage=3)
    (pt,) = by_name(fig, "(target model)")
    (pd,) = by_name(fig, "(draft model)")
    (acc,) = by_name(fig, "min(1, p_target/p_draft)")
    (u,) = by_name(fig, "u (uniform draw)")
    assert list(pt.y) == c["p_target"] and list(pd.y) == c["p_draft"]
    assert list(acc.y) == c["accept_prob"]
    assert c["accept_prob"] == pytest.approx([min(1.0, a / b) for a, b in zip(c["p_target"], c["p_draft"])], rel=1e-5)
    assert list(u.y) == c["u"] and list(u.x) == list(pt.x)[: len(c["u"])]
    j = c["rejected_position"]
    assert c["u"][j - 1] >= c["accept_prob"][j - 1]  # the figure marks the draw that failed
    ticks = list(pt.x)
    assert all("accepted" in t for t in ticks[: j - 1]) and "rejected" in ticks[j - 1]
    assert all("discarded" in t for t in ticks[j:])
    early = acceptance.acceptance_figure(c, k, stage=2)
    assert len(early.data) == 2 and not any("rejected" in t for t in early.data[0].x)


# ---------------------------------------------------------------- resample and bonus

def test_resample_figure_numbers(sampled):
    c = first_cycle(sampled, rejected=True)
    fig = acceptance.resample_figure(c, sampled.k)
    entries = {style.shown(e["text"]): e for e in c["residual_top"]}
    for e in c["residual_top"]:  # residual = normalised max(0, p_target - p_draft): proportional to the difference
        assert e["residual"] == pytest.approx(0.0, abs=1e-6) or e["p_target"] > e["p_draft"]
    for i in range(1, len(fig.data[0].x)):  # every bar after the rejected one is a residual entry, numbers as traced
        e = entries[fig.data[0].customdata[i]]
        assert [fig.data[f].y[i] for f in range(3)] == [e["p_target"], e["p_draft"], e["residual"]]
    chosen = list(fig.data[2].marker.line.width).index(3)
    assert style.esc(derive.visible_text(c["next_token_text"])) in fig.data[0].x[chosen]
    assert "resampled" in fig.data[0].x[chosen]


def test_bonus_figure_numbers(same_model):
    c, k = same_model.cycles[0], same_model.k
    fig = acceptance.resample_figure(c, k)
    entries = c["target_top"][k]
    assert list(fig.data[0].y) == [e["p"] for e in entries]
    ids = [e["token_id"] for e in entries]
    assert list(fig.data[0].marker.line.width) == [3 if i == c["bonus_token_id"] else 0 for i in ids]
    assert f"K+1={k + 1}" in fig.layout.title.text


# ---------------------------------------------------------------- KV caches

def cache_positions(fig) -> dict:
    """{(state label, model): [cache positions]} read back from the cells' bars."""
    out = {}
    for bar in (t for t in fig.data if t.type == "bar"):
        for model, base in zip(bar.y, bar.base):
            out.setdefault((bar.name.split(" ", 1)[1], model), []).append(round(base + 0.45))
    return out


def test_cache_figure_matches_recorded_lengths(sampled):
    c = partial_rejection(sampled)
    t, d = c["target_cache_len"], c["draft_cache_len"]
    texts = all_texts(sampled)[: c["committed_len_before"]] + c["draft_token_texts"]
    first = max(0, min(t["before"], d["before"]) - caches.CACHE_CONTEXT)
    draft_stage = cache_positions(caches.cache_figure(c, 1, texts))
    assert ("provisional", "target") not in draft_stage
    assert draft_stage[("provisional", "draft")] == list(range(d["before"], d["after_append"]))
    verify = cache_positions(caches.cache_figure(c, 2, texts))
    assert verify[("provisional", "target")] == list(range(t["before"], t["after_append"]))
    assert t["after_append"] - t["before"] == sampled.k + 1  # the target scored K+1 positions
    assert verify[("committed", "target")] == list(range(first, t["before"]))
    rollback_fig = caches.cache_figure(c, 5, texts)
    rollback = cache_positions(rollback_fig)
    assert rollback[("rolled back", "target")] == list(range(t["after_rollback"], t["after_append"]))
    assert rollback[("rolled back", "draft")] == list(range(d["after_rollback"], d["after_append"]))
    assert rollback[("committed", "target")] == list(range(first, t["after_rollback"]))
    assert f"target {t['after_append']} → {t['after_rollback']}" in rollback_fig.layout.title.text
    cells = {(float(x), y): s for tr in text_traces(rollback_fig) for x, y, s in zip(tr.x, tr.y, tr.text)}
    assert cells[(float(t["after_append"] - 1), "target")] == "✗" + style.shown(texts[t["after_append"] - 1], 6)


def test_cache_figure_shows_draft_catch_up(same_model):
    c = next(c for c in same_model.cycles if c["draft_catch_up"])
    d = c["draft_cache_len"]
    texts = all_texts(same_model)[: c["committed_len_before"]] + c["draft_token_texts"]
    rollback = cache_positions(caches.cache_figure(c, 5, texts))
    assert rollback[("draft catch-up (d_K fed)", "draft")] == list(range(d["after_append"], d["after_rollback"]))
    assert d["after_rollback"] - d["after_append"] == 1
    # All K accepted: the target keeps all K+1 entries (the bonus token has no K/V yet), nothing is rolled back.
    assert ("rolled back", "target") not in rollback
    assert rollback[("committed", "target")][-1] == c["target_cache_len"]["after_append"] - 1


# ---------------------------------------------------------------- one cycle at a glance

def test_cycle_figure_stages(sampled):
    c, k = partial_rejection(sampled), sampled.k
    stage1 = figures.cycle_figure(c, k, 1)
    assert [t.name for t in stage1.data if t.type == "bar"] == ["? provisional"]
    numbers = text_traces(stage1)[1]
    assert list(numbers.text) == [f"p_draft {derive.prob_text(p)}" for p in c["p_draft"]]
    stage3 = figures.cycle_figure(c, k, 3)
    bars = {t.name: len(t.x) for t in stage3.data if t.type == "bar"}
    assert bars["✓ accepted draft"] == c["num_accepted"] and bars["✗ rejected"] == 1
    assert bars.get("– discarded (never tested)", 0) == k - c["num_accepted"] - 1
    stage4 = figures.cycle_figure(c, k, 4)
    committed = [s for tr in text_traces(stage4) for y, s in zip(tr.y, tr.text) if y == figures.COMMITTED_ROW]
    shown = [style.shown(t, figures.cell_chars(k)) for t in c["committed_token_texts"]]
    assert [s.rsplit(" ", 1)[0] for s in committed] == shown
    assert committed[-1].endswith("↻")


def test_cycle_figure_prints_each_probability_as_the_strip_does():
    """The default trace's last cycle rejects a draft whose p_target is 1.5e-4: the strip above the chart
    printed it so, the chart under the token printed p_target 0.000; and a K=6 trace's p_draft 0.0051 read
    0.005 in the chart. The chart's numbers are derive.prob_text's now, at every K whose columns fit them."""
    trace = load_trace(Path(__file__).resolve().parent.parent / "assets" / "traces" / "default.jsonl")
    c = trace.cycles[-1]
    j = c["rejected_position"] - 1
    assert 0 < c["p_target"][j] < 0.001
    numbers = text_traces(figures.cycle_figure(c, trace.k, 3))[1]
    assert numbers.text[j] == f"p_draft {derive.prob_text(c['p_draft'][j])}<br>p_target {derive.prob_text(c['p_target'][j])}"
    assert "0.000" not in numbers.text[j]
    for k in range(1, 17):  # bare numbers past WIDE_K: still six characters where they fit
        shown = figures._numbers({"p_draft": [0.0051] * k, "p_target": [0.0004] * k}, k, 2)
        assert all(("0.0051" in t and "4.0e-4" in t) == figures.numbers_fit(k, "p_target " if k <= figures.WIDE_K else "")
                   for t in shown), (k, shown)


# ---------------------------------------------------------------- all cycles

def test_overview_points(sampled):
    ov = derive.overview(sampled)
    fig = overview.overview_figure(ov, len(sampled.cycles), current=3)
    points = {t.name.split(" ", 1)[1]: list(zip(t.x.tolist(), t.y.tolist())) for t in fig.data}
    k = sampled.k
    assert points["accepted draft"] == [(c["cycle"], i + 1) for c in sampled.cycles for i in range(c["num_accepted"])]
    assert points["rejected"] == [(c["cycle"], c["rejected_position"]) for c in sampled.cycles if c["rejected_position"]]
    assert len(points["discarded (never tested)"]) == sum(k - c["num_accepted"] - 1 for c in sampled.cycles
                                                          if c["rejected_position"])
    assert points["bonus"] == [(c["cycle"], k + 1) for c in sampled.cycles if c["bonus_token_id"] is not None]
    assert fig.layout.shapes[0].x0 == 2.5 and fig.layout.shapes[0].x1 == 3.5
    assert overview.SLOW_CYCLE not in [t.name for t in fig.data]  # no outlier named, none drawn


def test_a_stalled_cycle_is_marked_in_the_cycle_map_and_its_time_bar(sampled):
    trace = copy.deepcopy(sampled)
    for c in trace.cycles:  # even times, so that only the stall below can be an outlier on any machine
        c["cycle_time_s"], c["verify_time_s"] = 0.01, 0.004
    stalled = trace.cycles[2]
    stalled["cycle_time_s"] = 0.05  # 5x the median: another process took the core
    slow = loud_cycles(trace)
    assert slow == [stalled["cycle"]]
    fig = overview.overview_figure(derive.overview(trace), len(trace.cycles), 0, slow)
    marks = next(t for t in fig.data if t.name == overview.SLOW_CYCLE)
    assert marks.x.tolist() == [stalled["cycle"]] and marks.y.tolist() == [trace.k + 2]
    assert list(fig.layout.yaxis.ticktext)[-1] == "slow"
    bar = overview.cycle_time_figure(stalled, median_cycle_s(trace), True)
    assert "5.0x this trace's median 10.0 ms: an outlier" in bar.layout.title.text
    assert all(t.marker.line.width == 3 for t in bar.data)
    calm = overview.cycle_time_figure(trace.cycles[0], median_cycle_s(trace), False)
    assert "outlier" not in calm.layout.title.text and all(t.marker.line.width == 0 for t in calm.data)


# ---------------------------------------------------------------- every figure is valid Plotly and escapes text

def xss_trace(trace: Trace) -> Trace:
    """The trace with every token text replaced by an HTML payload."""
    header, cycles = copy.deepcopy(trace.header), copy.deepcopy(trace.cycles)
    header["prompt_token_texts"] = [XSS] * len(header["prompt_token_texts"])
    for c in cycles:
        c["draft_token_texts"] = [XSS] * len(c["draft_token_texts"])
        c["committed_token_texts"] = [XSS] * len(c["committed_token_texts"])
        c["next_token_text"] = XSS
        for entry in (c["residual_top"] or []) + [e for row in c["target_top"] for e in row]:
            entry["text"] = XSS
    return Trace(header, cycles, trace.summary)


def every_figure(trace: Trace):
    tokens = derive.token_table(trace)
    ov = derive.overview(trace)
    for c in trace.cycles[:3]:
        texts = [t.text for t in tokens[: c["committed_len_before"]]] + c["draft_token_texts"]
        for stage in range(1, 6):
            yield figures.cycle_figure(c, trace.k, stage)
            yield acceptance.acceptance_figure(c, trace.k, stage)
            yield caches.cache_figure(c, stage, texts)
        yield acceptance.resample_figure(c, trace.k)
    yield figures.text_figure(tokens, 1)
    yield overview.overview_figure(ov, len(trace.cycles), 1)


@pytest.mark.parametrize("name", ["sampled", "same_model"])
def test_figures_are_valid_plotly(name, request):
    for fig in every_figure(request.getfixturevalue(name)):
        style.validated(fig)  # raises on an invalid property


def test_token_text_is_escaped_everywhere(sampled, same_model):
    for trace in (xss_trace(sampled), xss_trace(same_model)):
        strings = [s for fig in every_figure(trace) for s in strings_in(fig.to_dict())]
        assert not [s for s in strings if "<img" in s]
        assert any("&lt;img·src=x·onerror=alert(1)&gt;" in s for s in strings)  # spaces made visible


def test_captions_and_markdown_escape(sampled):
    c = partial_rejection(sampled)
    j = c["rejected_position"]
    caption = explain.stage_caption(c, sampled.k, 3)
    i, text = j - 1, derive.prob_text
    assert (f"u = {text(c['u'][i])} ≥ min(1, {text(c['p_target'][i])} / {text(c['p_draft'][i])}) = "
            f"{text(c['accept_prob'][i])}") in caption and f"{c['num_accepted']} accepted" in caption
    t = c["target_cache_len"]
    assert f"target {t['after_append']} → {t['after_rollback']}" in explain.stage_caption(c, sampled.k, 5)
    faulty = explain.stage_caption(c, sampled.k, 5, {"keep_rejected_kv": True})
    assert "deliberate fault" in faulty and f"stays at {t['after_rollback']} entries" in faulty
    escaped = md(f"{XSS} **bold** $x$ :red[y] [a](javascript:alert(1))")
    assert "<img" not in escaped and "&lt;img" in escaped
    assert "\\*\\*bold\\*\\*" in escaped and "\\$x\\$" in escaped and "\\:red\\[y\\]" in escaped
    assert json.dumps(escaped)  # plain text, ready for st.markdown


# ---------------------------------------------------------------- statistics: reference lines near the bars

def test_reference_lines_of_bar_charts_are_named_in_the_legend_not_over_the_bars():
    """At 1366x768 the '1x = plain decoding' name landed on a '0.90x' bar value, and '1 step: what
    Leviathan's formula assumes' on bars 1-3: bars of these charts stand near 1 at any position,
    so their reference lines are named in the legend and no annotation is drawn in the plot."""
    st = trace_stats(load_trace(BUNDLED / "default.jsonl"))
    near_one = replace(st.speed, measured=0.9, leviathan=1.02, refined=0.97)
    for fig, name in ((stats_figures.speed_figure(near_one), "1x = plain decoding"),
                      (stats_figures.verify_steps_figure(st.calibration, st.advice),
                       "1 step: what Leviathan's formula assumes")):
        assert not fig.layout.annotations, [a.text for a in fig.layout.annotations]
        (line,) = [s for s in fig.layout.shapes if s.y0 == 1.0 == s.y1]
        assert line.showlegend and line.name == name
        style.validated(fig)


# ---------------------------------------------------------------- labels beside the data, never on it

def words_in_plot(fig) -> list[str]:
    """Every word a figure writes inside its plot area: annotations placed in data coordinates (or in
    the plot's own paper box) and text drawn at data points. Words in the legend or under an axis are
    outside it and are not listed."""
    words = []
    for a in fig.layout.annotations:
        in_paper = a.xref == "paper" and a.yref == "paper"
        outside = in_paper and (a.y is not None and (a.y > 1 or a.y < 0))
        if not outside:
            words.append(a.text)
    for t in fig.data:
        if "text" in (getattr(t, "mode", None) or "") and t.text is not None:
            words += list(t.text)
    return words


def test_statistics_figures_name_their_lines_in_the_legend_not_over_the_data():
    """The verify cost's one-step line sat on the verify curve, the advisor's 'best K' between its two
    curves, its 'this trace: K=4' on the Leviathan curve, the race's 'plain done' on both curves' ends:
    each name is now in the legend or under the axis, and the figures write nothing inside the plot."""
    trace = load_trace(BUNDLED / "default.jsonl")
    st = trace_stats(trace)
    verify = stats_figures.verify_cost_figure(st.calibration, st.k, st.times.verify_s)
    advisor = stats_figures.advisor_figure(st.advice, st.k)
    race = stats_figures.race_figure(trace.cycles, st.speed.target_step_s)
    explorer = stats_figures.explorer_figure(0.5, 0.1, 4, 16, (st.k, st.speed.measured), st.alpha, st.speed.c)
    for fig in (verify, advisor, race, explorer):
        assert words_in_plot(fig) == [], fig.layout.title.text
        style.validated(fig)
    (step,) = [s for s in verify.layout.shapes if s.y0 == s.y1 == st.calibration.target_step_s * 1000]
    assert step.showlegend and step.name.startswith("one target step")
    best = min(st.advice, key=lambda a: (-a.refined, a.k))
    assert [t.name for t in advisor.data if t.marker.symbol == "star"] == [f"best K = {best.k}"]
    ticks = dict(zip(advisor.layout.xaxis.tickvals, advisor.layout.xaxis.ticktext))
    assert ticks == {a.k: f"{a.k}<br>this trace" if a.k == st.k else f"{a.k}" for a in st.advice}
    plain_s = sum(len(c["committed_token_ids"]) for c in trace.cycles) * st.speed.target_step_s
    spec_s = sum(c["cycle_time_s"] for c in trace.cycles)
    names = [t.name for t in race.data]
    assert names[0].endswith(f"done at {plain_s:.2f} s") and names[1].endswith(f"done at {spec_s:.2f} s")
    assert sorted(s.x0 for s in race.layout.shapes) == pytest.approx(sorted([plain_s, spec_s]))


def test_the_static_cache_pointers_words_sit_outside_both_rows():
    """Written at a row's middle plus 22 px, 'write position 17: ...' covered the static cache's cells and
    'length 21: ...' the bug's: each now sits in the band beyond its own row, inside the axis range."""
    from app.figures import layouts
    fig = layouts.stale_comparison_figure(["in place"] * 15 + ["stale"] * 4, 0.49, 17, 4, 0.0, 2)
    rows = {layouts.BUG_ROW: 0, layouts.STATIC_ROW: 1}  # the category array's order, bottom to top
    ys = [rows[y] for t in fig.data if t.type == "bar" for y in t.y]
    low, high = min(ys) - fig.data[0].width / 2, max(ys) + fig.data[0].width / 2
    bottom, top = fig.layout.yaxis.range
    assert len(fig.layout.annotations) == 2
    for a in fig.layout.annotations:
        assert a.yref == "y" and bottom < a.y < top
        assert (a.yanchor == "bottom" and a.y > high) or (a.yanchor == "top" and a.y < low), (a.text, a.y)
    assert {a.text.split(":")[0] for a in fig.layout.annotations} == {"length 19", "write position 17"}
    style.validated(fig)


def test_a_dozen_category_lines_each_get_their_own_colour():
    from app.figures import workload
    rows = [{"position": 1, "rate": 0.5, "accepted": 1, "reached": 2}]
    group = {"conditional_acceptance": rows}
    stats = {"categories": {f"category {i:02d}": group for i in range(12)}, "overall": group}
    fig = workload.conditional_figure(stats)
    lines = [t for t in fig.data if t.name != workload.OVERALL]
    assert len(lines) == 12 and len({t.line.color for t in lines}) == 12
    assert len({(t.line.dash, t.marker.symbol) for t in lines}) > 1  # colour is not the only cue
    assert workload.OKABE_ITO["grey"] not in {t.line.color for t in lines}


@pytest.mark.parametrize("p,shown", [(0.6218869, "0.622"), (0.0011662, "0.0012"), (0.00014993, "1.5e-4"),
                                      (2.6771e-08, "2.7e-8"), (0.0, "0"), (1.0, "1.000"), (0.0099999, "0.0100")])
def test_probabilities_keep_their_leading_digits(p, shown):
    assert derive.prob_text(p) == shown and len(shown) <= 6


def test_a_token_with_quotes_is_quoted_once():
    assert derive.quoted("'s") == "“'s”" and derive.quoted(' "a') == '“·"a”'
    assert explain.quoted is derive.quoted
