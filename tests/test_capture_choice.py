"""--fast --capture auto on the CPU (engine/cycle/capture_choice.py): one cycle's forwards timed
eager and compiled on this machine, the faster kept on disk and reused, recorded in the header,
and the header's record checked when a trace is loaded."""
import json
from dataclasses import asdict

import pytest

from engine.cli import main
from engine.cycle import capture_choice as cc
from engine.run import load_pair
from engine.trace import load_trace
from engine.trace.format import TraceError, loads_trace
from tests.tiny import noisy_pair, save_tiny

K = 3


@pytest.fixture(autouse=True)
def own_cache_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CAPTURE_CHOICE", str(tmp_path / "capture-choice.json"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_tiny(noisy_pair(0, noise=0.3), tmp_path_factory.mktemp("pair"))


def times(none_s: float, compile_s: float, spread: float = 0.01) -> cc.CaptureTimes:
    return cc.CaptureTimes({"cpu": "x"}, "a/b", K, {"none": none_s, "compile": compile_s}, 20.0, "now", spread)


def test_compiled_is_chosen_only_when_clearly_faster():
    assert times(0.030, 0.020).chosen() == "compile"
    assert times(0.030, 0.029).chosen() == "none"  # within TIE_MARGIN: not worth a compile
    assert times(0.020, 0.030).chosen() == "none"


def test_a_measurement_is_kept_and_reused_and_a_damaged_one_is_measured_over(folders, monkeypatch):
    pair = load_pair(*folders, device="cpu")
    key = cc.pair_key(pair.target, pair.draft, K)
    kept = times(0.030, 0.020)
    cc.CACHE.write({key: asdict(kept)})

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured although this machine's choice was on disk")
    monkeypatch.setattr(cc, "measure", no_measuring)
    assert cc.capture_times(pair.target, pair.draft, K) == kept
    with pytest.raises(AssertionError, match="measured although"):
        cc.capture_times(pair.target, pair.draft, K + 1)  # another K is another entry
    for damaged in ({**asdict(kept), "cycle_s": {"none": -1, "compile": 0.02}}, {**asdict(kept), "spread": 0.9},
                    {"cycle_s": "fast"}, None):
        cc.CACHE.write({key: damaged})
        with pytest.raises(AssertionError, match="measured although"):
            cc.capture_times(pair.target, pair.draft, K)
    cc.CACHE.path().write_text("{not json")
    assert cc.CACHE.read() == {}


def test_measuring_times_both_modes_on_real_forwards(folders):
    pair = load_pair(*folders, device="cpu")
    measured = cc.measure(pair.target, pair.draft, K, repeats=3)
    assert set(measured.cycle_s) == {"none", "compile"} and all(s > 0 for s in measured.cycle_s.values())
    assert measured.compile_s > 0 and measured.chosen() in cc.CAPTURES


def test_cli_auto_records_the_measurement_and_runs_what_it_chose(folders, tmp_path, capsys):
    out = tmp_path / "auto.jsonl"
    assert main(["run", "--prompt", "the cat sat", "--target", folders[0], "--draft", folders[1], "--k", str(K),
                 "--max-new-tokens", "12", "--seed", "2", "--device", "cpu", "--fast", "--capture", "auto",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "eager" in err and "compiled" in err
    header = load_trace(out).header
    measured = header["fast_path"]["measured"]
    chosen = cc.times_from_dict({**measured, "machine": {}, "models": "", "k": K, "measured": ""})
    assert header["fast_path"]["capture"] == chosen.chosen()
    assert main(["stats", str(out)]) == 0
    stats = capsys.readouterr().out
    assert "FORWARDS: the fast path, its fixed-shape forwards" in stats
    assert f"{measured['cycle_s']['none'] * 1000:.1f} ms eager, {measured['cycle_s']['compile'] * 1000:.1f} ms compiled" in stats



@pytest.mark.parametrize("fast_path", [
    "compiled",
    {"capture": "fused"},
    {"capture": "none", "extra": 1},
    {"capture": "none", "measured": {"cycle_s": {"none": 0.02}, "compile_s": 1.0, "kept": True}},
    {"capture": "none", "measured": {"cycle_s": {"none": 0.02, "compile": -1}, "compile_s": 1.0, "kept": True}},
    {"capture": "compile", "measured": {"cycle_s": {"none": 0.02, "compile": 0.01}, "compile_s": "long", "kept": True}},
    {"capture": "graph", "measured": {"cycle_s": {"none": 0.02, "compile": 0.01}, "compile_s": 1.0, "kept": True}},
])
def test_a_header_with_a_malformed_fast_path_is_refused(folders, tmp_path, fast_path):
    out = tmp_path / "fast.jsonl"
    assert main(["run", "--prompt", "the cat", "--target", folders[0], "--draft", folders[1], "--k", str(K),
                 "--max-new-tokens", "6", "--device", "cpu", "--fast", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    header = json.loads(lines[0])
    loads_trace("\n".join(lines))  # as written: valid
    header["fast_path"] = fast_path
    with pytest.raises(TraceError, match="fast_path"):
        loads_trace("\n".join([json.dumps(header), *lines[1:]]))
