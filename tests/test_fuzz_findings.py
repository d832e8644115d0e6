"""Defects the fuzz harness (bench/fuzz/) found that no one had listed, each pinned by the smallest input
that showed it: an integer too large for a float, a diagnosis whose rates mean nothing, and a workload
upload kept without reading its batch trace.
"""
import io
import json
import re
import zipfile
from pathlib import Path

import pytest

from app.ui import diagnoses
from engine.trace import TraceError, loads_trace
from engine.trace.batch_reader import loads_batch_trace
from engine.workload.manifest import loads_manifest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN_WORKLOAD = ROOT / "tests" / "golden" / "batched_workload"
HUGE = 10**400  # an integer JSON may hold and no float can


def with_huge(line: str, field: str) -> str:
    record = json.loads(line)
    record[field] = HUGE
    return json.dumps(record)


@pytest.mark.parametrize("field", ["verify_time_s", "u"])
def test_a_trace_with_an_integer_beyond_any_float_is_refused(field):
    lines = (ROOT / "assets" / "traces" / "chat-greedy-k4.jsonl").read_text().split("\n")
    record = json.loads(lines[1])
    record[field] = [HUGE] if isinstance(record[field], list) else HUGE
    with pytest.raises(TraceError, match="line 2: the number 1000.* is too large to be a finite number"):
        loads_trace("\n".join([lines[0], json.dumps(record), *lines[2:]]), "t.jsonl")


def test_a_batch_trace_and_a_manifest_with_an_integer_beyond_any_float_are_refused():
    lines = (GOLDEN_WORKLOAD / "batch.jsonl").read_text().split("\n")
    with pytest.raises(TraceError, match="cycle 0: the time split must be finite"):
        loads_batch_trace("\n".join([lines[0], with_huge(lines[1], "draft_time_s"), *lines[2:]]))
    manifest = json.loads((GOLDEN_WORKLOAD / "manifest.json").read_text())
    manifest["requests"][0]["summary"]["wall_time_s"] = HUGE
    with pytest.raises(TraceError, match=r"requests\[0\].summary.wall_time_s"):
        loads_manifest(json.dumps(manifest).encode(), "m")


def bundled_diagnosis() -> dict:
    return json.loads((ROOT / "assets" / "diagnoses" / "chat-set-correctly.json").read_text())


@pytest.mark.parametrize("edit, where", [
    (lambda d: d["baseline"].update(acceptance_rate=1.5), "baseline.acceptance_rate"),
    (lambda d: d["baseline"].update(tokens_per_s=-8.0), "baseline.tokens_per_s"),
    (lambda d: d["baseline"].update(tokens_per_s=HUGE), "baseline.tokens_per_s"),
    (lambda d: d["probe"]["overall"].update(top1_agreement=1.7), "probe.overall.top1_agreement"),
    (lambda d: d["findings"][0]["acceptance_rate"].update(variant=-0.1), "findings[0].acceptance_rate.variant"),
])
def test_a_diagnosis_whose_rates_or_speeds_mean_nothing_is_refused(edit, where):
    d = bundled_diagnosis()
    edit(d)
    with pytest.raises(diagnoses.DiagnosisError, match=f"^case: {re.escape(where)}: "):
        diagnoses.check(d, "case")


def test_a_bundled_diagnosis_still_passes():
    assert diagnoses.check(bundled_diagnosis(), "case")["baseline"]["requests"] == 30


def test_an_uploaded_workload_with_a_broken_batch_trace_is_refused(monkeypatch, tmp_path):
    from app.ui import workloads
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path / "uploads"))
    files = {p.name: p.read_bytes() for p in GOLDEN_WORKLOAD.iterdir()}
    for name in files:  # the golden traces keep no clock readings: give each cycle a time again
        if name.startswith("request-"):
            records = [json.loads(x) for x in files[name].split(b"\n") if x.strip()]
            for r in records:
                r.update({k: 0.002 for k in ("verify_time_s", "cycle_time_s") if r.get(k) == 0})
            files[name] = "".join(json.dumps(r) + "\n" for r in records).encode()
    batch = files["batch.jsonl"].split(b"\n")
    cycle = json.loads(batch[1])
    cycle["idle_rows"] += 1
    files["batch.jsonl"] = b"\n".join([batch[0], json.dumps(cycle).encode(), *batch[2:]])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    with monkeypatch.context():
        import streamlit as st
        monkeypatch.setattr(st, "session_state", {})
        choice, error = workloads.open_upload("batched.zip", buffer.getvalue())
    assert choice is None and "batched.zip/batch.jsonl cycle 0: idle_rows must count the idle rows" in error
    assert not (tmp_path / "uploads" / "workloads").exists() or not any((tmp_path / "uploads" / "workloads").iterdir())


def test_a_negative_counter_of_one_engine_is_refused_though_the_sum_is_not_negative():
    from engine.servers.read import read_text
    from engine.servers.server_metrics import ServerMetricsError
    text = (ROOT / "tests" / "server_samples" / "vllm_scrape_1.prom").read_text()
    engine0 = 'vllm:spec_decode_num_drafts_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 60.0'
    assert engine0 in text
    with pytest.raises(ServerMetricsError, match="drafts_total .*engine.* is -5: a counter cannot be negative"):
        read_text(text.replace(engine0, engine0.replace(" 60.0", " -5.0")))
    assert read_text(text).drafts == 100
