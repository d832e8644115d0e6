"""Goodput against batch size on the statistics page: the figures on hand-built sweeps, the Batch size
tab reading benchmark files (checked, escaped, spoilt ones left out and named), and a sweep measured now."""
import json

import pytest

from app.figures.batch_goodput import acceptance_speedup_figure, advisor_rows, goodput_figure
from app.figures.style import validated
from app.runs import batch_bench
from engine.stats.batch_results import PLAIN_K, BatchSize, BatchSweep, batch_sweep_json
from tests.app_jobs import finish_job
from tests.test_stats_page import figure, folder, open_page, open_tab  # noqa: F401 (folder: the module's traces)


def hand_built(preset: str = "chat") -> BatchSweep:
    """Pays at B = 1 and 2 (best K 3, then 1), not at B = 4; the advisor right at 1 and 4, wrong at 2."""
    return BatchSweep(preset, 16, 32, 0.62, [
        BatchSize(1, 20.0, {1: 22.0, 3: 26.0}, {1: 0.6, 3: 0.5}, 3, hf_generate=21.0),
        BatchSize(2, 36.0, {1: 40.0, 3: 38.0}, {1: 0.6, 3: 0.5}, PLAIN_K, hf_generate=35.0),
        BatchSize(4, 70.0, {1: 60.0, 3: 50.0}, {1: 0.6, 3: 0.5}, PLAIN_K, hf_generate=71.0)])


def by_name(fig, name: str) -> dict:
    (found,) = [t for t in fig.to_dict()["data"] if t.get("name") == name]
    return found


def test_the_goodput_figure_draws_what_was_measured_and_marks_the_crossover():
    sweep = hand_built()
    fig = validated(goodput_figure(sweep))
    assert list(by_name(fig, "plain batched decoding (engine)")["y"]) == [20.0, 36.0, 70.0]
    assert list(by_name(fig, "Hugging Face generate (plain)")["y"]) == [21.0, 35.0, 71.0]
    best = by_name(fig, "speculating at the best K")
    assert list(best["y"]) == [26.0, 40.0, 60.0] and "text" not in best  # no words on the points
    stars = by_name(fig, "the advisor's choice")
    assert list(stars["y"]) == [26.0, 36.0, 70.0]  # K=3, then plain decoding twice
    assert stars["text"][1] == "plain, 0.90 of the best"  # 36 against K=1's 40 (in the hover)
    # the best K per B under the axis, the crossover named in the legend: nothing written inside the plot
    assert list(fig.layout.xaxis.tickvals) == [1, 2, 4]
    assert list(fig.layout.xaxis.ticktext) == ["1<br>best K=3", "2<br>best K=1", "4<br>best K=1"]
    crossover = by_name(fig, "no K pays from B = 4")
    assert list(crossover["x"]) == [4, 4] and crossover["y"][0] == 0 and crossover["y"][1] == 71.0  # to the top
    assert not fig.layout.annotations and not fig.layout.shapes
    assert all("text" not in t or t.get("mode") == "markers" for t in fig.to_dict()["data"])


def test_acceptance_is_drawn_flat_beside_the_falling_speedup():
    sweep = hand_built()
    fig = validated(acceptance_speedup_figure(sweep))
    assert list(by_name(fig, "acceptance rate at K=3")["y"]) == [0.5, 0.5, 0.5]
    speedup = by_name(fig, "best K over plain batched decoding")
    assert list(speedup["y"]) == pytest.approx([26 / 20, 40 / 36, 60 / 70])
    assert speedup["xaxis"] == "x2" and fig.layout.shapes[0].y0 == 1


def test_the_advisor_table_says_what_it_chose_against_the_best_measured():
    rows = advisor_rows(hand_built())
    assert [r["advisor"] for r in rows] == ["K=3", "plain", "plain"]
    assert [r["advised / best"] for r in rows] == [1.0, 0.9, 1.0]
    assert [r["gain"] for r in rows] == ["1.30×", "1.11×", "0.86×"]
    assert [r["predicted"] for r in rows] == ["–"] * 3  # no prediction kept in this sweep
    assert "idle rows" not in rows[0]  # none measured
    idle = BatchSweep("p", 4, 8, 0.6, [BatchSize(2, 10.0, {2: 14.0}, {2: 0.6}, idle_share={2: 0.125})])
    assert advisor_rows(idle)[0]["idle rows"] == "12%"
    predicted = BatchSweep("p", 4, 8, 0.6, [BatchSize(1, 10.0, {2: 14.0}, {2: 0.6}, PLAIN_K, {"plain": 9.5, "2": 15.25})])
    assert advisor_rows(predicted)[0]["predicted"] == 9.5


def test_no_crossover_draws_no_line():
    sweep = BatchSweep("p", 4, 8, 0.9, [BatchSize(1, 10.0, {2: 15.0}, {2: 0.9})])
    fig = validated(goodput_figure(sweep))
    assert not fig.layout.shapes and not fig.layout.annotations
    assert not any(t.name.startswith("no K pays") for t in fig.data)
    assert "the advisor's choice" not in [t.name for t in fig.data]  # none asked


def write_bench(into, name: str, presets: list[dict], cpu: str = "Test CPU") -> None:
    (into / name).write_text(json.dumps({"machine": {"cpu": cpu}, "presets": presets}))


def test_the_tab_reads_the_benchmark_files_and_names_the_ones_it_left_out(folder, monkeypatch, tmp_path):  # noqa: F811
    good = batch_sweep_json(hand_built("<b>chat</b>"))
    spoilt = json.loads(json.dumps(good)) | {"alpha": 3.0}
    write_bench(tmp_path, "batch-good.json", [good], cpu="Xeon <i>x</i>")
    write_bench(tmp_path, "batch-spoilt.json", [spoilt])
    (tmp_path / "batch-garbage.json").write_text("{not json")
    monkeypatch.setattr(batch_bench, "BENCH_RESULTS", tmp_path)
    at = open_tab(open_page(folder, monkeypatch), "Batch size")
    assert not at.error, [e.value for e in at.error]
    fig = figure(at, "fig_batch_goodput")
    plain = [t for t in fig["data"] if t.get("name") == "plain batched decoding (engine)"]
    assert plain[0]["y"] == [20.0, 36.0, 70.0]
    assert "&lt;b&gt;chat&lt;/b&gt;" in fig["layout"]["title"]["text"]  # a file's text never reaches Plotly as HTML
    said = " ".join(m.value for m in at.markdown).replace("\\", "")
    assert "speculation stops paying at B = 4" in said and "<i>" not in said
    left_out = [c.value.replace("\\", "") for c in at.caption if c.value.startswith("Left out")]
    assert any("batch-spoilt.json" in c and "alpha must be at most 1" in c for c in left_out)
    assert any("batch-garbage.json" in c and "not a batch benchmark" in c for c in left_out)
    assert at.selectbox(key="batch_choice").options == [batch_bench.read_bench_file(tmp_path / "batch-good.json")[0][0].label]


def test_a_sweep_measured_now_runs_on_the_servers_pair_and_is_drawn(folder, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setattr(batch_bench, "BENCH_RESULTS", tmp_path)  # nothing shipped
    monkeypatch.setenv("SPECLAB_MEASURE_PAIR", str(folder / "models"))  # the operator's pair: this trace has no preset
    at = open_tab(open_page(folder, monkeypatch), "Batch size")
    assert any("No batch benchmark is shipped" in i.value for i in at.info)
    at.multiselect(key="batch_sizes").set_value([1, 2])
    at.multiselect(key="batch_ks").set_value([2])
    at.number_input(key="batch_requests").set_value(3)
    at.number_input(key="batch_max_new").set_value(4)
    at.button(key="batch_run").click().run()
    finish_job(at)
    at.run()  # the stored sweep opens first
    assert not at.exception and not at.error, [e.value for e in at.error]
    ((machine, sweep),) = at.session_state["batch_sweeps"].values()
    assert [s.batch for s in sweep.sizes] == [1, 2] and sweep.requests == 3 and sweep.max_new_tokens == 4
    assert at.selectbox(key="batch_choice").value.endswith("measured now on this server")
    fig = figure(at, "fig_batch_goodput")
    plain = [t for t in fig["data"] if t.get("name") == "plain batched decoding (engine)"]
    assert plain[0]["y"] == [s.plain for s in sweep.sizes]
