"""The layouts in the app: stage 2/5 figures, the rollback page's stale-slot comparison, stats, the live run."""
import json
import shutil

import pytest

from app.figures import layouts as fl
from app.figures.style import validated
from engine.config import SpecSettings
from engine.run import run_to_trace
from engine.stats.layouts import layout_stats
from engine.teaching.runs import KEEP_REJECTED, traced_run
from engine.teaching.stale_slots import static_run
from engine.trace import load_trace
from tests.app_jobs import finish_job
from tests.test_app import plain, start
from tests.tiny import noisy_pair, tiny_pair

PROMPT_IDS = [1, 2, 4, 6, 7]


@pytest.fixture(scope="module")
def layout_traces(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("layout-traces")
    pair = noisy_pair(1, noise=0.08)
    paths = {}
    for layout in ("dynamic", "static", "paged"):
        paths[layout] = folder / f"{layout}.jsonl"
        run_to_trace(pair, "the cat sat on a mat and then", SpecSettings(
            k=4, temperature=1.0, max_new_tokens=40, seed=2, cache_layout=layout, block_size=4), paths[layout])
    return {name: load_trace(path) for name, path in paths.items()} | {"paths": paths}


def xs_of(fig, name_start: str, row: str | None = None) -> list[int]:
    """Cell positions of the bar trace whose legend name starts with `name_start`."""
    out = []
    for t in fig.data:
        if t.type == "bar" and t.name.split(" ", 1)[1].startswith(name_start):
            out += [round(float(b) + 0.45) for b, y in zip(t.base, t.y) if row is None or y == row]
    return sorted(out)


def test_static_figures_show_the_write_pointer_and_the_stale_cells(layout_traces):
    trace = layout_traces["static"]
    capacity = trace.header["cache_layout"]["capacity"]
    checked = 0
    for c in trace.cycles:
        states = c["target_cache_layout_state"]
        for stage in (2, 5):
            [fig] = fl.layout_figures(trace.header, c, stage)
            validated(fig)
            s = states["after_rollback" if stage == 5 else "after_append"]
            pointer = fig.layout.shapes[0]
            assert pointer.x0 == s["write_position"] - 0.5 and "write position" in fig.layout.annotations[0].text
            stale = list(range(s["write_position"], s["write_position"] + s["stale_slots"]))
            assert xs_of(fig, "stale") == stale
            assert f"{capacity} slots preallocated" in fig.layout.title.text or stage == 5
            if stage == 5:
                assert f"{s['stale_slots']} stale slot" in fig.layout.title.text
                assert max(xs_of(fig, "committed")) == s["write_position"] - 1
            else:
                assert xs_of(fig, "provisional") == list(range(c["target_cache_len"]["before"], s["write_position"]))
            checked += bool(stale)
    assert checked > 3


def test_paged_figures_show_block_table_and_blocks_going_back(layout_traces):
    trace = layout_traces["paged"]
    saw_free = saw_whole = False
    for c in trace.cycles:
        states = c["target_cache_layout_state"]
        for stage in (2, 5):
            table_fig, pool_fig = fl.layout_figures(trace.header, c, stage)
            validated(table_fig), validated(pool_fig)
            s = states["after_rollback" if stage == 5 else "after_append"]
            heads = [a.text for a in table_fig.layout.annotations]
            shown_blocks = [int(h.split("<b>block ")[1].split("<")[0]) for h in heads]
            table = states["after_append"]["block_table"]
            assert shown_blocks == table[len(table) - len(shown_blocks):]
            held = set(s["block_table"])
            assert set(xs_of(pool_fig, "block in the table")) | set(xs_of(pool_fig, "allocated this cycle")) == held
            if stage == 5:
                assert xs_of(pool_fig, "returned to the free list") == sorted(states["blocks_freed"])
                freed_heads = [h for h in heads if "freed" in h]
                assert len(freed_heads) == len(states["blocks_freed"])
                saw_free |= bool(states["blocks_freed"])
                partial = s["num_tokens"] % trace.header["cache_layout"]["block_size"] != 0
                assert ("partial one too" in table_fig.layout.title.text) == partial  # only when it is partial
                saw_whole |= not partial
            else:
                assert xs_of(pool_fig, "allocated this cycle") == sorted(set(states["blocks_allocated"]) & held)
            pool_blocks = trace.header["cache_layout"]["pool_blocks"]
            assert f"{s['blocks_used']} of {pool_blocks} blocks used" in pool_fig.layout.title.text
    assert saw_free and saw_whole


def test_dynamic_figure_cuts_the_strip(layout_traces):
    trace = layout_traces["dynamic"]
    for c in trace.cycles:
        lens = c["target_cache_len"]
        [fig] = fl.layout_figures(trace.header, c, 5)
        assert xs_of(fig, "rolled back") == list(range(lens["after_rollback"], lens["after_append"]))
        assert fig.layout.shapes[0].x0 == lens["after_rollback"] - 0.5
    old = {k: v for k, v in trace.header.items() if k != "cache_layout"}  # a trace from before layouts
    assert len(fl.layout_figures(old, trace.cycles[0], 2)) == 1


def test_memory_figure_and_stats_per_layout(layout_traces):
    for layout in ("dynamic", "static", "paged"):
        trace = layout_traces[layout]
        ls = layout_stats(trace)
        fig = fl.memory_figure(ls)
        validated(fig)
        held = list(fig.data[0].y)
        assert held == ls.target.per_cycle_held and len(held) == len(trace.cycles)
        if layout == "paged":
            unused = [len(c["target_cache_layout_state"]["after_rollback"]["block_table"]) * 4
                      - c["target_cache_len"]["after_rollback"] for c in trace.cycles]
            assert list(fig.data[1].y) == unused and "fragmentation" in fig.data[1].name
        if layout == "static":
            assert set(held) == {trace.header["cache_layout"]["capacity"]}


def test_static_stale_slots_get_zero_attention_while_the_bug_reads_them():
    pair = noisy_pair(1, noise=0.08)
    s = SpecSettings(k=4, temperature=0.0, max_new_tokens=30)
    static = static_run(pair, PROMPT_IDS, s)
    correct = traced_run(pair, PROMPT_IDS, s, "correct")
    bug = traced_run(pair, PROMPT_IDS, s, KEEP_REJECTED)
    assert static.generated == correct.generated
    assert sum(c.stale_slots >= 2 for c in static.cycles) >= 3  # stale slots the next query could have read
    assert all(c.attention_on_stale == 0.0 for c in static.cycles)
    assert all(c.attention_on_attended > 0.05 for c in static.cycles)
    assert max(c.stale_attention for c in bug.cycles) > 0.01


def test_stale_comparison_figure_places_both_pointers():
    fig = fl.stale_comparison_figure(["in place"] * 5 + ["stale", "stale", "in place"], 0.2, 6, 3, 0.0, 1)
    validated(fig)
    assert xs_of(fig, "rejected K/V inside", fl.BUG_ROW) == [5, 6]
    assert xs_of(fig, "stale: rejected", fl.STATIC_ROW) == [6, 7, 8]
    assert [s.x0 for s in fig.layout.shapes] == [7.5, 5.5]
    assert "20.0% of its attention" in fig.layout.title.text and "get 0.0%" in fig.layout.title.text


# ---------------------------------------------------------------- the app, headless

@pytest.fixture
def layout_dir(tmp_path, layout_traces, monkeypatch):
    folder = tmp_path / "traces"
    folder.mkdir()
    for name in ("static", "paged", "dynamic"):
        shutil.copy(layout_traces["paths"][name], folder / f"{name}.jsonl")
    shutil.copy(layout_traces["paths"]["paged"], folder / "default.jsonl")
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path / "uploads"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    monkeypatch.setenv("SPECLAB_CUSTOM_MODELS", "1")  # the live-run test names model folders
    return folder


def charts(at) -> dict[str, dict]:
    return {e.proto.id.rsplit("-", 1)[-1]: json.loads(e.proto.spec) for e in at.get("plotly_chart")}


@pytest.mark.parametrize("name, stage, title", [
    ("paged", 2, "Paged cache (target): block table"), ("paged", 5, "Paged cache (target): rollback"),
    ("static", 5, "Static cache (target): rollback moves the write position"),
    ("dynamic", 5, "Dynamic cache (target): crop"), ("static", 3, None)])
def test_stepper_draws_the_layout_at_stages_2_and_5(layout_dir, name, stage, title):
    at = start({"trace": f"bundled:{name}.jsonl", "cycle": "1", "stage": str(stage)})
    shown = charts(at)
    if title is None:
        assert "layout_0" not in shown
    else:
        assert shown["layout_0"]["layout"]["title"]["text"].startswith(title)
        assert ("layout_1" in shown) == (name == "paged")


def test_stats_page_shows_the_layout_figures(layout_dir):
    at = start({"trace": "bundled:paged.jsonl"})
    at.switch_page("views/statistics.py").run()
    at.session_state["stats_tab"] = "KV-cache layout"  # only the open tab runs
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[-1].value
    ls = layout_stats(load_trace(layout_dir / "paged.jsonl"))
    assert list(table["blocks freed"]) == [ls.target.blocks_freed, ls.draft.blocks_freed]
    assert list(table["peak K/V slots held"]) == [ls.target.peak_slots_held, ls.draft.peak_slots_held]
    assert "layout_memory" in charts(at)


def test_live_run_in_the_paged_layout(layout_dir, tmp_path):
    from tests.tiny import save_tiny
    target, draft = save_tiny(tiny_pair(0), tmp_path / "models")
    at = start()
    at.switch_page("views/trace_source.py").run()
    at.selectbox(key="live_preset").set_value("custom").run()
    at.text_input(key="live_target").set_value(target)
    at.text_input(key="live_draft").set_value(draft)
    at.text_area(key="live_prompt").set_value("the cat sat")
    at.number_input(key="live_max_new").set_value(10)
    at.selectbox(key="live_cache_layout").set_value("paged").run()
    at.number_input(key="live_block_size").set_value(4)
    at.checkbox(key="live_insist_k").check()  # the K as set, not the advisor's machine-dependent choice
    at.button(key="live_run").click().run(timeout=120)
    finish_job(at)
    assert not at.exception and not at.error, [e.value for e in at.error]
    trace = load_trace(at.session_state["trace_ref"].path)
    assert trace.header["cache_layout"] == {**trace.header["cache_layout"], "name": "paged", "block_size": 4}
    assert all(c["target_cache_layout_state"]["after_rollback"]["block_table"] for c in trace.cycles)


@pytest.fixture(scope="module")
def teaching_folder(tmp_path_factory):
    from tests.test_teaching_pages import make_teaching_folder
    return make_teaching_folder(tmp_path_factory.mktemp("teaching"))


def test_rollback_page_sets_the_bug_beside_the_static_cache(teaching_folder, monkeypatch, tmp_path):
    from tests.test_teaching_pages import click_run_live, figure, open_page
    monkeypatch.setenv("SPECLAB_TEACHING_PAIR", str(teaching_folder / "pair"))
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(teaching_folder / "traces"))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = click_run_live(open_page("rollback"))  # the injected pair has no stored result
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Static cache: attention on stale slots"] == "0.0%"
    assert metrics["Static cache output equals the correct run"] == "yes"
    assert float(metrics["Bug: attention on rejected K/V"].rstrip("%")) > 0
    fig = figure(at, "rb_stale")
    names = {t["name"] for t in fig["data"] if t.get("name")}
    assert any("inside the attended range" in n for n in names) and any("stale: rejected K/V, masked" in n for n in names)
    assert "Stale K/V that corrupts, and stale K/V that does not" in [s.value for s in at.subheader]


@pytest.mark.parametrize("name, title", [("static", "Static cache (target): rollback"),
                                         ("paged", "Paged cache (target): rollback")])
def test_walkthrough_rollback_stage_draws_the_layout(layout_dir, name, title):
    at = start({"trace": f"bundled:{name}.jsonl"})
    at.switch_page("views/walkthrough.py").run()
    assert not at.exception, [e.value for e in at.exception]
    shown = charts(at)
    assert shown["wt_layout_0"]["layout"]["title"]["text"].startswith(title)
    assert any(fl.LAYOUT_WORDS[name] in plain(m.value) for m in at.markdown)
