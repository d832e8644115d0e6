"""bench/fast_step_times.py on a tiny pair, eager: every round reports every quantity the fast path's calibration
times, and the summary is those rounds' (timings themselves are not checked: tests do not time things)."""
import json

import pytest

from bench import fast_step_times
from tests.tiny import noisy_pair, save_tiny


def test_the_bench_reports_each_rounds_step_times_and_their_spread(tmp_path):
    target, draft = save_tiny(noisy_pair(0, noise=0.05), tmp_path)
    out = tmp_path / "out"
    assert fast_step_times.main(["--target", target, "--draft", draft, "--capture", "none", "--k", "3",
                                 "--rounds", "2", "--repeats", "2", "--out", str(out)]) == 0
    [path] = out.glob("fast-step-times-custom-float32-*.json")
    result = json.loads(path.read_text())
    quantities = ["target step", "draft step", *[f"forward of {w}" for w in range(1, 5)]]
    assert len(result["rounds"]) == 2 and all(list(r) == quantities for r in result["rounds"])
    for q in quantities:
        values = [r[q] for r in result["rounds"]]
        assert result["summary"][q] == {"median": pytest.approx(sum(values) / 2), "min": min(values),
                                        "max": max(values)} and min(values) > 0
    ratios = [q for q in quantities if q != "target step"]
    for way in ("paired", "separate"):  # what the advisor weighs, read both ways from the same timings
        assert [list(r) for r in result["steps"][way]] == [[f"{q} / step" for q in ratios]] * 2
    for r, steps in zip(result["rounds"], result["steps"]["separate"]):  # the calibration's own reading
        assert all(steps[f"{q} / step"] == pytest.approx(r[q] / r["target step"]) for q in ratios)
    text = path.with_suffix(".md").read_text()
    assert all(f"| {q} |" in text for q in quantities) and "Draft step over target step" in text
    assert "| draft step / step |" in text and "paired medians" in text


def test_the_paired_reading_keeps_each_rounds_ratio_where_a_slow_spell_moves_separate_medians():
    """A slow spell that straddles two rounds (the verify of one, the forward of the next) moves both separate
    medians; the typical round's ratio survives the paired reading."""
    from engine.stats.fast_calibrate import separate_medians
    rounds = [{1: 10.0, 4: 12.0, "step": 10.5}, {1: 12.0, 4: 30.0, "step": 12.6}, {1: 30.0, 4: 33.0, "step": 31.5}]
    paired, separate = fast_step_times.paired_medians(rounds), separate_medians(rounds)
    assert paired[1] == separate[1] == 12.0  # the reference keeps its own median
    assert paired[4] / paired[1] == pytest.approx(1.2) and separate[4] / separate[1] == pytest.approx(2.5)
    assert paired["step"] == pytest.approx(12.6)  # 1.05 of the forward in every round
