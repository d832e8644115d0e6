"""The server's shared cache of stepper figures (app/ui/figure_cache.py, app/ui/widgets.py): bounded,
equal to freshly built figures, one entry for every session on the same step, never another trace's."""
import gc
import json
import shutil
import tracemalloc
from pathlib import Path

import plotly.io as pio
import pytest
from streamlit.testing.v1 import AppTest

from app.figures import acceptance, caches, derive, overview
from app.figures import cycle as figures
from app.ui import widgets
from app.ui.figure_cache import FIGURE_OVERHEAD_BYTES, FigureCache, PreparedFigure
from engine.stats.quiet import loud_cycles, median_cycle_s
from engine.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
MAIN = str(ROOT / "app" / "main.py")
BUNDLED = ROOT / "assets" / "traces"
OTHER = "shakespeare-greedy-k8.jsonl"  # K=8, greedy: unlike the default trace (K=4, sampled) in every figure


def stepper_figures(trace, cycle: int, stage: int) -> list:
    """The figures the stepper draws at a step, built fresh (as app/views/stepper.py calls them)."""
    c, tokens, ov = trace.cycles[cycle], derive.token_table(trace), derive.overview(trace)
    k, greedy, texts = derive.proposals(c), trace.header["settings"]["temperature"] == 0, derive.sequence_texts(trace, c)
    return [figures.cycle_figure(c, k, stage, greedy), acceptance.acceptance_figure(c, k, stage, greedy),
            acceptance.resample_figure(c, k), caches.cache_figure(c, stage, texts, trace.drafter_kind),
            overview.cycle_time_figure(c, median_cycle_s(trace), cycle in loud_cycles(trace)),
            figures.text_figure(tokens[:c["committed_len_before"]]),
            overview.overview_figure(ov, len(trace.cycles), cycle, loud_cycles(trace))]


def sent(fig) -> str:
    """What st.plotly_chart sends for a figure."""
    return pio.to_json(fig.to_dict(), validate=False)


@pytest.fixture(scope="module")
def default_trace():
    return load_trace(BUNDLED / "default.jsonl")


# ---------------------------------------------------------------- the cache alone

def one_figure(trace, i: int = 0):
    return [overview.cycle_time_figure(trace.cycles[i % len(trace.cycles)])]


def test_the_oldest_entries_go_first_beyond_the_entry_limit(default_trace):
    cache = FigureCache(max_entries=3, max_bytes=2**30, ttl_s=3600)
    for i in range(3):
        cache.get(("t", i), lambda i=i: one_figure(default_trace, i))
    cache.get(("t", 0), lambda: pytest.fail("a kept entry was built again"))  # 0 is now the most recently used
    cache.get(("t", 3), lambda: one_figure(default_trace, 3))
    assert cache.keys() == [("t", 2), ("t", 0), ("t", 3)]  # 1, the least recently used, went
    built = []
    cache.get(("t", 1), lambda: built.append(1) or one_figure(default_trace, 1))
    assert built == [1] and len(cache) == 3 and ("t", 2) not in cache


def test_the_cache_keeps_under_its_memory_limit(default_trace):
    probe = FigureCache(max_entries=100, max_bytes=2**30, ttl_s=3600)
    (fig,) = probe.get("probe", lambda: one_figure(default_trace))
    size = fig.json_bytes() + FIGURE_OVERHEAD_BYTES
    assert probe.bytes == size
    cache = FigureCache(max_entries=100, max_bytes=int(2.5 * size), ttl_s=3600)
    for i in range(6):
        cache.get(("t", i), lambda: one_figure(default_trace))  # the same figure: the same size each time
        assert cache.bytes <= cache.max_bytes
    assert cache.keys() == [("t", 4), ("t", 5)]
    huge = FigureCache(max_entries=100, max_bytes=size - 1, ttl_s=3600)
    (drawn,) = huge.get("big", lambda: one_figure(default_trace))
    assert sent(drawn) == sent(fig) and len(huge) == 0  # larger than the whole cache: drawn, not kept


def test_an_entry_older_than_its_time_to_live_is_built_again(default_trace):
    now = [0.0]
    cache = FigureCache(max_entries=10, max_bytes=2**30, ttl_s=60, clock=lambda: now[0])
    first = cache.get("a", lambda: one_figure(default_trace))
    now[0] = 59.0
    assert cache.get("a", lambda: pytest.fail("built before its time")) is first
    now[0] = 121.0
    assert cache.get("a", lambda: one_figure(default_trace)) is not first
    cache.get("b", lambda: one_figure(default_trace))
    now[0] = 200.0
    cache.get("c", lambda: one_figure(default_trace))  # each new entry sweeps out the expired ones
    assert cache.keys() == ["c"]


def test_a_prepared_figure_sends_what_the_figure_would(default_trace):
    for cycle in (0, 3, len(default_trace.cycles) - 1):
        for stage in range(1, 6):
            for fresh in stepper_figures(default_trace, cycle, stage):
                expected = sent(fresh)
                prepared = PreparedFigure(fresh)
                assert sent(prepared) == expected
                prepared.to_dict()["layout"]["title"]["text"] = "changed"  # a fresh dict each call
                fresh.update_layout(title_text="changed too")  # and a copy of the figure, not the figure
                assert sent(prepared) == expected


def test_the_memory_estimate_covers_what_a_cached_figure_holds():
    """tracemalloc over a cache filled with every stage's figures of bundled traces: the estimate the
    limit goes by (the JSON sent and FIGURE_OVERHEAD_BYTES a figure) must not be below what the entries hold."""
    traces = [load_trace(BUNDLED / name) for name in ("default.jsonl", "chat-eagle-sampled-k4.jsonl")]
    built = {(i, stage): stepper_figures(t, 1, stage) for i, t in enumerate(traces) for stage in range(1, 6)}
    PreparedFigure(built[0, 1][0])  # Plotly's lazily made validators are not the cache's
    cache = FigureCache(max_entries=10_000, max_bytes=2**40, ttl_s=3600)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for key, figs in built.items():
            cache.get(key, lambda figs=figs: figs)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(cache) == len(built)
    assert held <= cache.bytes, f"{held / 2**20:.1f} MiB held, {cache.bytes / 2**20:.1f} MiB estimated"


# ---------------------------------------------------------------- the stepper, through the cache

@pytest.fixture
def traces_dir(tmp_path, monkeypatch):
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(BUNDLED / "default.jsonl", folder / "default.jsonl")
    shutil.copy(BUNDLED / OTHER, folder / OTHER)
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path / "uploads"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    widgets.FIGURES.clear()
    yield folder
    widgets.FIGURES.clear()


def session(trace: str = "default.jsonl", cycle: int = 0, stage: int = 1) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.query_params.update({"trace": f"bundled:{trace}", "cycle": str(cycle), "stage": str(stage)})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def specs(at: AppTest) -> list[str]:
    """Every chart the page sent, as sent (the figure's JSON), in page order."""
    return [e.proto.spec for e in at.get("plotly_chart")]


def titles(at: AppTest) -> list[str]:
    return [json.loads(s)["layout"]["title"]["text"] for s in specs(at)]


def test_two_sessions_on_the_same_step_share_one_entry_per_figure(traces_dir):
    first = session(cycle=2, stage=3)
    kept, hits = widgets.FIGURES.keys(), widgets.FIGURES.hits
    assert len(kept) == len(specs(first)) >= 4  # one entry per chart of the step
    second = session(cycle=2, stage=3)
    assert widgets.FIGURES.keys() == kept  # nothing new: the second session drew the first's figures
    assert widgets.FIGURES.hits - hits == len(kept)
    assert specs(second) == specs(first)
    second.button(key="nav_next").click().run()
    assert len(widgets.FIGURES) == 2 * len(kept)  # the next cycle: figures of its own


def test_cached_charts_equal_charts_built_fresh(traces_dir, monkeypatch):
    """The same walk (forward, back, through stages: steps seen before come from the cache) with
    the cache and with a cache that keeps nothing; every chart sent must be the same."""
    def walk() -> list[list[str]]:
        at, seen = session(cycle=1, stage=1), []
        for widget, value in [("nav_next", None), ("nav_prev", None), ("stage_select", 4), ("nav_next", None),
                              ("nav_prev", None), ("stage_select", 2), ("stage_select", 5), ("stage_select", 4),
                              ("nav_next", None)]:
            seen.append(specs(at))
            if value is None:
                at.button(key=widget).click().run()
            else:
                at.segmented_control(key=widget).set_value(value).run()
            assert not at.exception
        return seen + [specs(at)]

    cached = walk()
    assert widgets.FIGURES.hits > 10  # the walk came back to steps it had drawn
    monkeypatch.setattr(widgets, "FIGURES", FigureCache(max_entries=0, max_bytes=0, ttl_s=0))
    fresh = walk()
    assert widgets.FIGURES.hits == 0 and len(widgets.FIGURES) == 0
    assert [len(s) for s in cached] == [len(s) for s in fresh]
    for step, (c, f) in enumerate(zip(cached, fresh)):
        assert c == f, f"step {step} of the walk drew other charts from the cache"


def test_a_different_trace_never_gets_another_traces_figures(traces_dir):
    sampled = session("default.jsonl", cycle=1, stage=2)
    greedy = session(OTHER, cycle=1, stage=2)  # the same step of another trace
    assert set(specs(greedy)).isdisjoint(specs(sampled))
    widgets.FIGURES.clear()
    assert specs(session(OTHER, cycle=1, stage=2)) == specs(greedy)  # what it draws with nothing cached
    # the same name with other content (a file replaced on the server): its own figures, not the old ones
    before = specs(session("default.jsonl", cycle=1, stage=2))
    shutil.copy(traces_dir / OTHER, traces_dir / "default.jsonl")
    assert specs(session("default.jsonl", cycle=1, stage=2)) == specs(greedy)
    assert set(before).isdisjoint(specs(greedy))
