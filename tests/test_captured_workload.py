"""A vLLM capture folder (vllm_capture/'s recorder, fed made-up steps) read as a workload: `engine stats`, the
Workload page and the stepper's request links open it; requests with other settings or that did not finish are
listed as skipped with why; a hostile capture manifest is refused in one line."""
import json
from pathlib import Path

import pytest

from engine.cli import main
from engine.trace import TraceError, load_trace
from engine.workload.folder import open_folder, open_zip, zip_folder
from engine.workload.manifest import DONE, SKIPPED, WorkloadError
from engine.workload.stats import workload_stats
from tests.test_vllm_capture import record, recorder
from vllm_capture.speclab_vllm_capture import recorder as rec

ROOT = Path(__file__).resolve().parent.parent


def mixed_capture(folder: Path) -> Path:
    """Three greedy requests (two seeded differently), a sampled one, and a greedy one aborted mid-way."""
    r = recorder(folder)
    record(r, "cmpl-a", 0.0, seed=None)
    record(r, "cmpl-b", 0.0, seed=7)
    record(r, "cmpl-s", 0.8, seed=3)
    record(r, "cmpl-x", 0.0, finish=False)
    record(r, "cmpl-c", 0.0, seed=9)
    return folder


def test_a_capture_folder_reads_as_a_workload_of_its_most_common_settings(tmp_path):
    workload = open_folder(mixed_capture(tmp_path))
    rows = [(e.id, e.status, e.file) for e in workload.entries]
    assert rows == [("cmpl-a", DONE, "request-0001.jsonl"), ("cmpl-b", DONE, "request-0002.jsonl"),
                    ("cmpl-s", SKIPPED, "request-0003.jsonl"), ("cmpl-x.jsonl.incomplete", SKIPPED, "request-0004.jsonl"),
                    ("cmpl-c", DONE, "request-0005.jsonl")]
    reasons = {e.id: e.reason for e in workload.entries if e.status == SKIPPED}
    assert reasons["cmpl-s"].startswith("ran with temperature 0.8") and reasons["cmpl-x.jsonl.incomplete"] == \
        "did not finish: aborted"
    assert workload.manifest["settings"]["temperature"] == 0 and workload.manifest["settings"]["seed"] is None
    for e in workload.done:  # each request's file is the captured trace behind it, its seed its own
        captured = load_trace(tmp_path / f"{e.id}.jsonl")
        trace = workload.trace(e)
        assert trace.cycles == captured.cycles and trace.header == captured.header
    assert [workload.trace(e).header["settings"]["seed"] for e in workload.done] == [0, 7, 9]


def test_engine_stats_on_a_capture_folder_counts_its_finished_requests(tmp_path, capsys):
    folder = mixed_capture(tmp_path)
    stats = workload_stats(open_folder(folder).runs())
    assert stats["requests"] == 3
    drafting = [c for n in ("a", "b", "c") for c in load_trace(folder / f"cmpl-{n}.jsonl").cycles if c["draft_token_ids"]]
    assert stats["overall"]["draft_tokens"] == sum(len(c["draft_token_ids"]) for c in drafting) == 9
    assert stats["overall"]["accepted_tokens"] == sum(c["num_accepted"] for c in drafting) == 6
    assert main(["stats", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "WORKLOAD: 3 requests, K=3" in out and "vllm" in out


def test_a_zip_of_a_capture_folder_opens_too(tmp_path):
    folder = mixed_capture(tmp_path / "cap")
    zipped = open_zip(zip_folder(folder), "cap.zip")  # zip_folder writes the workload manifest it stands for
    assert [e.id for e in zipped.done] == ["cmpl-a", "cmpl-b", "cmpl-c"]


def capture_manifest(folder: Path) -> dict:
    return json.loads((folder / rec.MANIFEST).read_text())


@pytest.mark.parametrize("change,words", [
    (lambda m: m["traces"][0].update(file="../cmpl-a.jsonl"), "traces[0].file' must be a bare file name"),
    (lambda m: m["traces"][0].update(file="/etc/passwd.jsonl"), "traces[0].file' must be a bare file name"),
    (lambda m: m["traces"][0].update(complete=False), "traces[0].complete' must be true for a .jsonl"),
    (lambda m: m["traces"].append(dict(m["traces"][0])), "traces[].file' must be unique"),
    (lambda m: m.update(version=2), "this engine reads capture version 1"),
    (lambda m: m.update(traces=[]), "must list 1 to"),
    (lambda m: m.update(traces=[m["traces"][3]]), "no captured request finished"),
])
def test_a_hostile_capture_manifest_is_one_line(tmp_path, change, words):
    folder = mixed_capture(tmp_path)
    m = capture_manifest(folder)
    change(m)
    (folder / rec.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(WorkloadError) as err:
        open_folder(folder)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_captured_trace_that_breaks_a_rule_is_refused_naming_its_file(tmp_path):
    folder = mixed_capture(tmp_path)
    lines = (folder / "cmpl-b.jsonl").read_text().splitlines()
    cycle = json.loads(lines[2])
    cycle["num_accepted"] = 3  # the third draft was rejected: its p_target is 0
    lines[2] = json.dumps(cycle)
    (folder / "cmpl-b.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as err:
        open_folder(folder)
    assert "cmpl-b.jsonl" in str(err.value)


def test_the_workload_page_and_the_stepper_open_a_captured_request(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest
    runs = tmp_path / "runs"
    mixed_capture(runs / "workloads" / "captured-vllm")
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(runs))
    monkeypatch.setenv("SPECLAB_WORKLOADS_DIR", str(tmp_path / "none"))
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60)
    at.switch_page("views/workload.py").run()
    assert not at.exception, [e.value for e in at.exception]
    said = " ".join(c.value for c in at.caption).replace("\\", "")  # Markdown's escapes aside
    assert "captured-vllm (live run)" in said and "drafter **prompt-lookup**" in said, said
    assert "2 of 5 requests were skipped: cmpl-s (ran with temperature 0.8" in said, said
    assert "cmpl-x.jsonl.incomplete (did not finish: aborted)" in said, said
    shown = " ".join(m.value for m in at.markdown)
    assert "This workload: **3** requests, **9** cycles" in shown  # the finished greedy requests, prefill included
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60)
    at.query_params.update({"trace": "workload:run~captured-vllm~request-0005.jsonl", "cycle": "1", "stage": "3"})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.subheader[0].value.startswith("Cycle 1 · stage 3")
