"""bench/gpu.sh in its dry-run mode: every command a GPU session will run, on the CPU with tiny sizes,
so a typo or a broken import costs seconds here, not minutes of borrowed GPU time."""
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import fast_bench

ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str):
    return importlib.import_module(f"bench.{name}")


def test_gpu_sh_dry_run_runs_every_step_on_the_cpu(tmp_path):
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "tiny-shakespeare"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no CUDA device (cpu), so no CUDA graphs" in done.stdout
    checks = json.loads((tmp_path / "gpu-checks.json").read_text())
    assert checks["dry_run"] and checks["rows"] and checks["fast_path_rows"]
    assert all(r["method"] != "error" for r in checks["fast_path_rows"])
    # on the CPU in float32 the fast path is the reference path, token for token
    assert all(r["equal_to_cpu_reference"] for r in checks["fast_path_rows"])
    assert {r["temperature"] for r in checks["fast_path_rows"]} == {0.0, 1.0}
    assert all(r["cache_lengths_ok"] for r in checks["fast_path_rows"] if r["method"] == "speculative")
    bench = json.loads((tmp_path / "fast-tiny-shakespeare.json").read_text())
    # bfloat16 runs on a CPU only where it is in hardware (engine/models/device.py)
    cpu_dtypes = ["float32"] + (["bfloat16"] if fast_bench.runs_on_cpu("bfloat16") else [])
    assert bench["dry_run"] and [run["dtype"] for run in bench["runs"]] == cpu_dtypes
    settings = bench["runs"][0]["settings"]
    assert {st["temperature"] for st in settings} == {0.0, 1.0}
    for st in settings:
        assert set(st["tokens_per_s"]) == {"a", "b", "c", "d", "d'", "e"}
        assert st["limits"]["measured"]["plain_tokens_per_s"] > 0 and st["cycles"] > 0
    assert "DRY RUN" in (tmp_path / "fast-tiny-shakespeare.md").read_text()


def test_near_tie_report_and_tables_on_a_difference():
    from tests.tiny import tiny_pair
    gpu_checks = load_script("gpu_checks")
    pair = tiny_pair(0)
    report = gpu_checks.near_tie(pair, [1, 2], [{"u": [0.5], "accept_prob": [0.50001], "committed_token_ids": [3]}],
                                 [3, 4], 0)
    assert report["near_tie"] and report["min_u_minus_accept_prob"] == pytest.approx(1e-5, abs=1e-7)
    assert report["target_logit_gap"] >= 0
    table = gpu_checks.fast_table([
        {"preset": "p", "dtype": "float32", "capture": "graph", "temperature": 1.0, "method": "error", "error": "boom"},
        {"preset": "p", "dtype": "float32", "capture": "graph", "temperature": 0.0, "method": "speculative", "k": 4,
         "tokens": 8, "equal_to_cpu_reference": False, "first_difference": 5, **report, "cache_lengths_ok": True,
         "target_kv_gap": 0.0, "draft_kv_gap": 0.0}])
    assert "ERROR: boom" in table and "| False | 5 | True (" in table


def test_fast_bench_limits_and_goals():
    fast_bench = load_script("fast_bench")
    from tests.tiny import tiny_pair
    pair = tiny_pair(0)
    lim = fast_bench.limits(pair, 4, 3.0, 0.25, 1000.0)  # a full accept in a quarter of the cycles
    target_bytes = fast_bench.weight_bytes(pair.target.model)
    assert lim["plain_tokens_per_s"] == pytest.approx(1e12 / target_bytes)
    assert lim["speculative_tokens_per_s"] == pytest.approx(
        1e12 * 3.0 / (target_bytes + 4.25 * fast_bench.weight_bytes(pair.draft.model)))
    assert fast_bench.limits(pair, 4, 3.0, 0.25, None) is None
    result = {"dry_run": False, "machine": {"device": "cuda:0"}, "preset": "chat",
              "runs": [{"dtype": "float32", "settings": [{"k": 4, "temperature": 0.0,
                                                          "ratios": {"a/d": 12.0, "a/e": 1.1, "a/b": 0.97}}]}]}
    lines = "\n".join(fast_bench.goal_lines(result))
    assert "10x HF eager generate: K=4 12.00 met" in lines and "(a)/(e) at least 1.3: K=4 1.10 NOT met" in lines
    assert "tiny-shakespeare" not in lines
