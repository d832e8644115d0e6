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
    text = path.with_suffix(".md").read_text()
    assert all(f"| {q} |" in text for q in quantities) and "Draft step over target step" in text
