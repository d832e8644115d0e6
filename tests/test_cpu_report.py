"""bench/cpu_report.py's reading of its own figures (no timing here: the figures are hand-built).

The report judges a CPU against the small-batch goals: a step within 2x its memory limit, a verify of 2-5
positions within 1.2 steps, speculation at the advisor's choice never below plain decoding. These check
that the verdicts follow the numbers, and that bfloat16 is timed only where the CPU computes in it; and that
the llama.cpp anchor its int4 part runs (bench/speed.py) stops the report clearly when llama.cpp crashes.
"""
import pytest

from bench import cpu_report


def timing(ms: float) -> dict:
    return {"median_s": ms / 1000, "low_s": ms / 1000, "high_s": ms / 1000}


def forwards(rows_ms: dict[int, float], loaded_ms: dict[int, float]) -> dict:
    """A float32 forwards part with two paths, the faster chosen per width, as cpu_report.forwards builds it."""
    by_width = {w: {"as_loaded": timing(loaded_ms[w]), "rows": timing(rows_ms[w])} for w in cpu_report.WIDTHS}
    chosen = {w: min(p, key=lambda name: p[name]["median_s"]) for w, p in by_width.items()}
    step = by_width[1][chosen[1]]["median_s"]
    return {"kind": "float32", "decoder": "hf", "weight_bytes": 538e6, "bandwidth_gbs": 32.0,
            "memory_limit_s": 538e6 / 32e9, "by_width": by_width, "chosen": chosen,
            "verify_steps": {w: by_width[w][chosen[w]]["median_s"] / step for w in cpu_report.WIDTHS}}


def test_the_verdicts_follow_the_chosen_path_per_width():
    loaded = {1: 30.0, 2: 33.0, 3: 36.0, 4: 50.0, 5: 54.0, 6: 60.0}
    rows = {1: 32.0, 2: 34.0, 3: 35.0, 4: 35.5, 5: 35.9, 6: 37.0}
    text = "\n".join(cpu_report.forwards_markdown(forwards(rows, loaded)))
    assert "| 1 | 30.0 (30.0-30.0) | 32.0 (32.0-32.0) | as_loaded | 1.78 | 1.00 |" in text
    assert "| 5 | 54.0 (54.0-54.0) | 35.9 (35.9-35.9) | rows | 2.14 | 1.20 |" in text
    assert "Step: 1.78x its memory limit (goal 2x: met)" in text
    assert "at most 1.20 steps (goal 1.2: met)" in text
    rows[3] = 37.0  # width 3 now costs 36/30 = 1.2 steps on the library's path, still met; width 4 over
    rows[4] = 40.0
    text = "\n".join(cpu_report.forwards_markdown(forwards(rows, loaded)))
    assert "at most 1.33 steps (goal 1.2: not met)" in text


def test_plain_decoding_advised_counts_as_plain_speed():
    s = {"file": "speed-chat-amd-epyc-avx2-int4.md", "k": 2, "advised_k": 0, "alpha": 0.36,
         "tokens_per_s": {"a": 20.0, "e": 25.0}, "a_over_e": 0.8, "a_over_e_at_advised": 1.0, "e_over_f": None, "anchor": None,
         "anchor_skipped": "no --llama-python"}
    text = "\n".join(cpu_report.speed_markdown("chat", s))
    assert "the advisor's pick: plain decoding, K=0" in text and "a/e 0.80 at K=2, 1.00 at the advisor's choice" in text
    assert "llama.cpp did not run: no --llama-python" in text


@pytest.mark.parametrize("features, rows, kinds", [
    (["avx2", "fma"], False, ["float32", "int4", "int4-a8"]),
    (["avx2", "fma"], True, ["float32", "bfloat16", "int4", "int4-a8"]),
    (["avx512f", "avx512_bf16"], False, ["float32", "bfloat16", "int4", "int4-a8"]),
    (["avx512f", "amx_tile"], False, ["float32", "bfloat16", "int4", "int4-a8"])])
def test_bfloat16_is_timed_where_the_cpu_computes_in_it_or_the_rows_kernel_reads_it(monkeypatch, features, rows, kinds):
    monkeypatch.setattr(cpu_report, "cpu_features", lambda: features)
    monkeypatch.setattr(cpu_report.f32_rows_kernel, "unavailable", lambda: None if rows else "no C compiler")
    assert cpu_report.kinds_here() == kinds


def test_unknown_parts_are_refused():
    with pytest.raises(SystemExit):
        cpu_report.parse_args(["--parts", "forwards,gpu"])


def test_an_anchor_that_dies_mid_request_is_a_clear_error(tmp_path):
    """llama.cpp's own crash (a native build on an AMX Xeon segfaulted in its first decode) must stop the
    benchmark with the exit code, not a JSON error on an empty line. The stand-in here is a real process
    that answers ready and then kills itself with the same signal."""
    from bench.speed import LlamaAnchor
    from engine.config import SpecSettings

    python = tmp_path / "dying-python"
    python.write_text("#!/bin/sh\necho '{\"ready\": true}'\nread line\necho 'crashed here' >&2\nkill -SEGV $$\n")
    python.chmod(0o755)
    anchor = LlamaAnchor(str(python), tmp_path / "model.gguf", threads=1)
    with pytest.raises(RuntimeError, match=r"exited with code -11 during a request.*crashed here"):
        anchor.run([1, 2, 3], SpecSettings(k=1, temperature=0.0, max_new_tokens=4, seed=0))
