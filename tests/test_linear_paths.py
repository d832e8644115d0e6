"""The per-machine linear paths: each width runs on the path measured faster here, the measurement is
kept on disk per machine and model, and a calibrated trace records it (and is checked on reading)."""
import json

import pytest
import torch

from engine.config import SpecSettings
from engine.mode import RunMode
from engine.models import linear_paths
from engine.models.linear_paths import PathCurve, cache_file, settle
from engine.run import run_to_trace
from engine.stats.paths import noisy_words
from engine.stats.report import format_stats
from engine.trace import TraceError, load_trace
from engine.trace.schema import AS_LOADED, PACKED
from tests.tiny import tiny_pair

# Rows of a matrix product never mix, and both paths multiply the same float32 operands; only the
# order of the additions inside a dot product differs (MKL's and oneDNN's blockings), which moves a
# logit of these 32-wide models by a few float32 ulps of values near 1: 1e-5 is over 10x that.
ACROSS_PATHS = 1e-5


def curve(packed: list[float], loaded: list[float]) -> PathCurve:
    return PathCurve({"cpu": "test cpu", "torch": torch.__version__}, "m", list(range(1, len(packed) + 1)),
                     {PACKED: packed, AS_LOADED: loaded}, "2026-12-01T00:00:00Z")


def test_each_width_runs_on_its_faster_path_and_a_tie_stays_as_loaded():
    c = curve([1.0, 2.0, 3.0], [2.0, 1.0, 3.0])
    assert c.chosen() == {1: PACKED, 2: AS_LOADED, 3: AS_LOADED}


REAL_TIME_ROWS_VARIANTS = linear_paths.time_rows_variants


@pytest.fixture(autouse=True)
def steady_variants(monkeypatch):
    """The rows kernel's variants timed without noise, the first (the default) fastest everywhere: the tests
    that fake the paths' timings to know whether a curve is kept must not hang on real timings of a tiny
    model's products, tens of microseconds that a busy machine spreads past QUIET_SPREAD."""
    from engine.models import f32_rows_kernel

    def fake(loaded, widths, repeats):
        variants = f32_rows_kernel.candidate_variants(loaded.dtype)
        return {v: [[0.001 if i == 0 else 0.002] * repeats for _ in widths] for i, v in enumerate(variants)}
    monkeypatch.setattr(linear_paths, "time_rows_variants", fake)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_LINEAR_PATHS", str(tmp_path / "linear-paths.json"))
    return tmp_path


def steady(packed_first: bool):
    """time_paths' timings for a machine where one path wins at every width, with no noise."""
    winner = PACKED if packed_first else AS_LOADED
    return winning(winner)


def winning(winner: str):
    """time_paths' timings where `winner` is fastest at every width, every other path slower, no noise."""
    def fake(loaded, widths, repeats, paths):
        return {p: [[0.001 if p == winner else 0.002] * repeats for _ in widths] for p in paths}
    return fake


class _threads:
    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> None:
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self.before)


def test_a_real_measurement_times_both_paths_at_every_width(cache_dir):
    c = linear_paths.measure(tiny_pair().target, repeats=3)
    assert c.widths == list(range(1, linear_paths.WIDTHS + 1)) and c.spread >= 0
    assert all(len(v) == len(c.widths) and min(v) > 0 for v in c.seconds.values())


def test_settle_measures_once_per_machine_and_model_and_forwards_follow_it(cache_dir, monkeypatch):
    monkeypatch.setattr(linear_paths, "time_paths", steady(packed_first=False))
    pair = tiny_pair()
    record = settle(pair.target)
    chosen = {int(w): p for w, p in record["chosen"].items()}
    assert chosen == {w: AS_LOADED for w in range(1, linear_paths.WIDTHS + 1)} == pair.target.linear_paths
    assert record["kept"] and json.loads(cache_file().read_text())["format"] == "speclab-linear-paths"
    for width in chosen:
        assert pair.target.runner_for(width) is pair.target.model
    pair.target.linear_paths = {2: PACKED}
    assert pair.target.runner_for(2) is pair.target.runner is not pair.target.model
    # the next run on this machine reads the stored curve: measuring again would fail this test
    monkeypatch.setattr(linear_paths, "time_paths", lambda *a: pytest.fail("measured again"))
    again = tiny_pair()
    assert settle(again.target)["seconds"] == record["seconds"] and again.target.linear_paths == chosen
    # another model (the draft's shapes) or another thread count is measured anew
    monkeypatch.setattr(linear_paths, "time_paths", steady(packed_first=True))
    assert set(settle(pair.draft)["chosen"].values()) == {PACKED}
    with _threads(1 if torch.get_num_threads() != 1 else 2):  # a thread count other than the suite's own
        settle(again.target)
    assert len(json.loads(cache_file().read_text())["entries"]) == 3


def test_a_noisy_measurement_chooses_this_run_s_paths_but_is_not_kept(cache_dir, monkeypatch):
    def noisy(loaded, widths, repeats, paths):
        wild = [0.001, 0.001, 0.004, 0.004, 0.001]  # middle half 3x the median: another process on the core
        return {p: [wild if p == PACKED else [0.002] * 5 for _ in widths] for p in paths}
    monkeypatch.setattr(linear_paths, "time_paths", noisy)
    pair = tiny_pair()
    record = settle(pair.target)
    assert not record["kept"] and record["spread"] > linear_paths.QUIET_SPREAD
    assert set(pair.target.linear_paths.values()) == {PACKED}  # the medians still choose this run's paths
    assert not cache_file().exists()  # nothing kept: the next run measures again
    assert "measured on a busy machine" in noisy_words({"linear_paths": {"target": record}})


def test_a_damaged_cache_file_is_measured_over(cache_dir, monkeypatch):
    monkeypatch.setattr(linear_paths, "time_paths", steady(packed_first=True))  # quiet: kept
    cache_file().write_text('{"format": "speclab-linear-paths", "version": 1, "entries": {"x": ')
    pair = tiny_pair()
    assert settle(pair.target) is not None
    assert len(json.loads(cache_file().read_text())["entries"]) == 1
    key = next(iter(json.loads(cache_file().read_text())["entries"]))
    broken = {"format": "speclab-linear-paths", "version": 1, "entries": {key: {"widths": [1], "seconds": "fast"}}}
    cache_file().write_text(json.dumps(broken))
    assert settle(tiny_pair().target)["widths"] == list(range(1, linear_paths.WIDTHS + 1))


def test_both_paths_give_the_same_logits_at_every_width(cache_dir):
    pair = tiny_pair()
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    out = {}
    for path in (AS_LOADED, PACKED):
        pair.target.linear_paths = {w: path for w in range(1, 10)}
        cache = pair.target.new_cache()
        pair.target.fill(ids[:2], cache)
        out[path] = pair.target.forward(ids[2:], cache)  # width 9
    assert torch.allclose(out[AS_LOADED], out[PACKED], atol=ACROSS_PATHS, rtol=0)


def test_a_calibrated_trace_records_the_paths_and_a_wrong_choice_is_refused(cache_dir, tmp_path):
    pair = tiny_pair()
    path = tmp_path / "t.jsonl"
    run_to_trace(pair, "the cat sat", SpecSettings(k=3, max_new_tokens=8, seed=1), path, RunMode(calibrate=True))
    header = load_trace(path).header
    assert set(header["linear_paths"]) == {"target", "draft"}
    assert {int(w): p for w, p in header["linear_paths"]["target"]["chosen"].items()} == pair.target.linear_paths
    printed = format_stats(load_trace(path))  # python -m engine stats
    assert "LINEAR PATH PER WIDTH" in printed
    [row] = [line for line in printed.splitlines() if line.split()[:2] == ["target", "2"]]
    assert row.split()[-1] == pair.target.linear_paths[2]
    variants = header["linear_paths"]["target"].get("rows_variants")
    if variants:  # the rows path was timed here (a C compiler): the row names its kernel's variant at width 2
        assert row.split()[-2] == variants["2"]
    lines = path.read_text().splitlines()
    bad = json.loads(lines[0])
    cur = bad["linear_paths"]["target"]
    slower = PACKED if cur["chosen"]["2"] == AS_LOADED else AS_LOADED
    cur["chosen"]["2"] = slower  # claims the slower path ran width 2
    path.write_text("\n".join([json.dumps(bad), *lines[1:]]) + "\n")
    with pytest.raises(TraceError, match=r"linear_paths\.target\.chosen\.2.*faster path"):
        load_trace(path)


def test_a_compiled_fast_run_settles_the_paths_it_was_not_given_and_an_eager_one_keeps_the_reference_paths(
        cache_dir, monkeypatch, tmp_path):
    """Uncalibrated, the compiled fast path still compiles each width on this machine's choice (else inductor
    gets the module as loaded at every width), and its header says which; the eager fast path keeps the
    reference path's products, so the two stay equal record for record."""
    from engine.cycle.fast import new_fast_cache
    from engine.cycle.fast_forward import FixedForward
    from engine.trace.schema import ROWS
    monkeypatch.setattr(linear_paths, "time_paths", winning(ROWS))
    pair = tiny_pair()
    cache = new_fast_cache(pair.target, 16)
    FixedForward(pair.target, cache, 3, "none")
    assert pair.target.linear_paths is None
    FixedForward(pair.target, cache, 3, "compile")  # torch.compile compiles at the first call, not here
    assert pair.target.linear_paths == {w: ROWS for w in range(1, linear_paths.WIDTHS + 1)}
    assert pair.target.compiled_module_for(3) is pair.target.rows_runner
    fresh = tiny_pair()
    s = SpecSettings(k=2, max_new_tokens=2, cache_layout="static")
    header = run_to_trace(fresh, "ab", s, tmp_path / "f.jsonl", RunMode(fast="compile")).header
    assert header["linear_paths"]["target"]["chosen"]["3"] == ROWS
    assert "linear_paths" not in run_to_trace(tiny_pair(), "ab", s, tmp_path / "e.jsonl", RunMode(fast="none")).header


def test_the_rows_kernel_s_variants_are_timed_on_the_model_and_each_width_runs_its_fastest(cache_dir, monkeypatch):
    """The variant timings are faked (which variant wins depends on the CPU); the rest is real: the choice per
    width, the twin's plan, the kernel calls of a forward, the stored curve and the header's check."""
    from engine.models import f32_rows_kernel as rows_kernel
    from engine.trace.check_basics import BrokenInvariant as CheckError
    from engine.trace.header_checks import check_linear_path_curve
    from engine.trace.schema import ROWS

    monkeypatch.delenv(rows_kernel.ISA_ENV, raising=False)
    variants = rows_kernel.candidate_variants()
    if len(variants) < 2:
        pytest.skip("this machine runs one variant of the rows kernel: nothing to choose")
    default, other = variants[0], variants[-1]

    def fake_variants(loaded, widths, repeats):  # `other` wins from 3 rows up, the default below
        return {v: [[0.001 if (v == other) == (w >= 3) else 0.002] * repeats for w in widths] for v in variants}
    monkeypatch.setattr(linear_paths, "time_rows_variants", fake_variants)
    monkeypatch.setattr(linear_paths, "time_paths", winning(ROWS))
    pair = tiny_pair()
    record = settle(pair.target)
    expected = {w: other if w >= 3 else default for w in range(1, linear_paths.WIDTHS + 1)}
    assert {int(w): v for w, v in record["rows_variants"].items()} == expected
    assert pair.target.rows_variants == {w: rows_kernel.VARIANTS[v] for w, v in expected.items()}
    plan = pair.target.rows_runner.rows_plan
    assert plan.variant(2) == rows_kernel.VARIANTS[default] and plan.variant(3) == rows_kernel.VARIANTS[other]
    calls = []
    kernel = rows_kernel.linear
    monkeypatch.setattr(rows_kernel, "linear",
                        lambda x, w, b=None, isa=None: calls.append((x.shape[0], isa)) or kernel(x, w, b, isa))
    cache = pair.target.new_cache()
    pair.target.fill([1, 2, 3], cache)
    pair.target.forward([4, 5, 6], cache)  # width 3: on the rows path
    # a product of 3 rows runs `other`; one of fewer (the prefill's output layer reads its last row only) the default
    assert {(3, rows_kernel.VARIANTS[other])} <= set(calls)
    assert all(isa == rows_kernel.VARIANTS[other if rows >= 3 else default] for rows, isa in calls)
    check_linear_path_curve(record, "header", "linear_paths.target")  # what the trace header holds passes
    wrong = {**record, "rows_variants": {**record["rows_variants"], "3": default}}  # the slower one at 3
    with pytest.raises(CheckError, match=r"rows_variants\.3.*fastest variant"):
        check_linear_path_curve(wrong, "header", "linear_paths.target")
    unknown = {**record, "rows_seconds": {"neon": record["rows_seconds"][default]}}
    with pytest.raises(CheckError, match="rows_seconds"):
        check_linear_path_curve(unknown, "header", "linear_paths.target")
    # kept on disk; forcing one variant (SPECLAB_F32_ROWS_ISA) makes the stored curve another machine's choice
    monkeypatch.setattr(linear_paths, "time_rows_variants", lambda *a: pytest.fail("measured again"))
    assert settle(tiny_pair().target)["rows_variants"] == record["rows_variants"]
    monkeypatch.setenv(rows_kernel.ISA_ENV, default)
    monkeypatch.setattr(linear_paths, "time_rows_variants",
                        lambda loaded, widths, repeats: {default: [[0.001] * repeats for _ in widths]})
    forced = settle(tiny_pair().target)
    assert set(forced["rows_variants"].values()) == {default} and list(forced["rows_seconds"]) == [default]


def test_a_real_measurement_times_every_variant_of_the_rows_kernel_here(cache_dir, monkeypatch):
    from engine.models import f32_rows_kernel as rows_kernel
    from engine.trace.schema import ROWS

    monkeypatch.delenv(rows_kernel.ISA_ENV, raising=False)
    monkeypatch.setattr(linear_paths, "time_rows_variants", REAL_TIME_ROWS_VARIANTS)
    pair = tiny_pair()
    if ROWS not in linear_paths.paths_for(pair.target)[0]:
        pytest.skip("no C compiler: the rows path is absent here")
    c = linear_paths.measure(pair.target, repeats=2)
    assert list(c.rows_seconds) == rows_kernel.candidate_variants()
    assert all(len(t) == len(c.widths) and min(t) > 0 for t in c.rows_seconds.values())
    assert pair.target.rows_variants == {w: rows_kernel.VARIANTS[v] for w, v in c.rows_variants().items()}
