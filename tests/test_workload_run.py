"""Workload runs on tiny real models: one trace per request, the manifest, exactness, resume, refusals."""
import io
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from engine.cli import main
from engine.config import SpecSettings
from engine.cycle.plain import target_generate
from engine.run import encode_prompt
from engine.trace.format import load_trace
from engine.workload.folder import open_workload
from engine.workload.manifest import MANIFEST, WorkloadError
from engine.workload.prompts import PromptFileError, parse_prompts
from engine.workload.run import run_workload
from tests.tiny import save_tiny, tiny_pair

ROOT = Path(__file__).resolve().parents[1]
REQUESTS = [{"id": "r1", "category": "pets", "prompt": "the cat sat on a mat"},
            {"id": "r2", "category": "pets", "prompt": "a dog ran"},
            {"id": "r3", "category": "logs", "messages": [{"role": "user", "content": "the log and then"}]},
            {"id": "r4", "category": "logs", "prompt": "it slept far away"}]


def prompt_file(tmp_path, entries=REQUESTS, name="p.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(e) for e in entries) + "\n")
    return path


def requests_of(entries=REQUESTS):
    return parse_prompts("\n".join(json.dumps(e) for e in entries).encode(), "p.jsonl")


def without_times(path: Path) -> list[dict]:
    """A trace's records without what differs between two runs of the same request (clock readings)."""
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        out.append({k: v for k, v in rec.items() if not k.endswith(("_s", "_time_s")) and k not in
                    ("created", "draft_step_times_s", "tokens_per_s")})
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_request_is_an_ordinary_trace_and_greedy_equals_plain_decoding(tmp_path, temperature):
    pair = tiny_pair(3)
    s = SpecSettings(k=3, temperature=temperature, max_new_tokens=12, seed=5)
    workload = run_workload(pair, requests_of(), s, tmp_path / "w", prompts_name="p.jsonl")
    runs = workload.runs()
    assert [(r.id, r.category, r.file) for r in runs] == [
        ("r1", "pets", "request-0001.jsonl"), ("r2", "pets", "request-0002.jsonl"),
        ("r3", "logs", "request-0003.jsonl"), ("r4", "logs", "request-0004.jsonl")]
    for r, request in zip(runs, requests_of()):
        trace = load_trace(tmp_path / "w" / r.file)  # the stepper opens each as it is
        assert trace.header["request"] == {"id": request.id, "category": request.category}
        entry = workload.entry(r.id)
        assert entry.summary["num_generated"] == trace.summary["num_generated"]
        assert entry.summary["acceptance_rate"] == trace.summary["acceptance_rate"]
        ids = encode_prompt(pair.target.tokenizer, request.text, False)
        assert trace.header["prompt_token_ids"] == ids
        if temperature == 0:
            assert trace.summary["generated_token_ids"] == target_generate(pair.target, ids, s, pair.eos_ids)
    assert runs[2].trace.header["messages"] == [{"role": "user", "content": "the log and then"}]


def test_a_workload_request_equals_the_same_prompt_run_alone_with_its_own_seed(tmp_path):
    """Same settings, and request i's own seed (seed * SEED_STRIDE + i): its trace is the trace of a single
    run of its prompt with that seed."""
    from engine.run import run_to_trace
    from engine.workload.manifest import SEED_STRIDE
    pair = tiny_pair(4)
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=10, seed=9)
    run_workload(pair, requests_of(), s, tmp_path / "w")
    own = replace(s, seed=9 * SEED_STRIDE + 1)
    run_to_trace(pair, REQUESTS[1]["prompt"], own, tmp_path / "alone.jsonl", request={"id": "r2", "category": "pets"})
    assert without_times(tmp_path / "w" / "request-0002.jsonl") == without_times(tmp_path / "alone.jsonl")
    seeds = [load_trace(tmp_path / "w" / f"request-000{i}.jsonl").header["settings"]["seed"] for i in range(1, 5)]
    assert seeds == [9 * SEED_STRIDE + i for i in range(4)]  # each request its own random stream
    assert json.loads((tmp_path / "w" / MANIFEST).read_text())["settings"]["seed"] == 9


def test_a_manifest_from_before_per_request_seeds_still_opens(tmp_path):
    """Without "seed_stride", every request ran on the manifest's seed: such a folder (the bundled greedy
    workloads were recorded so) still opens, and a request whose seed is not the one its manifest implies is refused."""
    pair = tiny_pair(4)
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=6, seed=3)
    run_workload(pair, requests_of(), s, tmp_path / "w")
    path = tmp_path / "w" / MANIFEST
    manifest = json.loads(path.read_text())
    del manifest["seed_stride"]
    for entry in manifest["requests"]:  # as an old run wrote them: one seed for all
        trace_path = tmp_path / "w" / entry["file"]
        lines = [json.loads(x) for x in trace_path.read_text().splitlines()]
        lines[0]["settings"]["seed"] = 3
        trace_path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    path.write_text(json.dumps(manifest))
    assert len(open_workload(tmp_path / "w").runs()) == 4
    manifest["seed_stride"] = 100_000
    path.write_text(json.dumps(manifest))
    with pytest.raises(WorkloadError, match="request 0 runs with 300000"):
        open_workload(tmp_path / "w").runs()
    manifest["seed_stride"] = 7
    path.write_text(json.dumps(manifest))
    with pytest.raises(WorkloadError, match="seed_stride"):
        open_workload(tmp_path / "w").runs()


def test_an_interrupted_workload_keeps_its_requests_and_resume_finishes_it_identically(tmp_path):
    pair = tiny_pair(5)
    s = SpecSettings(k=3, temperature=1.0, max_new_tokens=12, seed=2)
    run_workload(pair, requests_of(), s, tmp_path / "whole")
    seen = []

    def stop_in_third(rec: dict) -> None:
        seen.append(rec["cycle"])
        if len(list((tmp_path / "cut").glob("request-*.jsonl"))) == 2 and rec["cycle"] == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_workload(pair, requests_of(), s, tmp_path / "cut", on_cycle=stop_in_third)
    manifest = json.loads((tmp_path / "cut" / MANIFEST).read_text())
    assert [r["status"] for r in manifest["requests"]] == ["done", "done", "pending", "pending"]
    assert (tmp_path / "cut" / "request-0003.jsonl.partial").is_file()
    with pytest.raises(WorkloadError, match="add --resume"):
        run_workload(pair, requests_of(), s, tmp_path / "cut")
    done = []
    run_workload(pair, requests_of(), s, tmp_path / "cut", resume=True, on_request=lambda e: done.append(e.id))
    assert done == ["r3", "r4"]  # the finished requests are not run again
    for i in range(1, 5):
        name = f"request-{i:04d}.jsonl"
        assert without_times(tmp_path / "cut" / name) == without_times(tmp_path / "whole" / name)


def test_resume_refuses_other_settings_or_another_prompt_file(tmp_path):
    pair = tiny_pair(6)
    s = SpecSettings(k=2, temperature=0.0, max_new_tokens=4)
    run_workload(pair, requests_of(), s, tmp_path / "w")
    with pytest.raises(WorkloadError, match="other settings"):
        run_workload(pair, requests_of(), SpecSettings(k=3, temperature=0.0, max_new_tokens=4), tmp_path / "w",
                     resume=True)
    changed = [dict(REQUESTS[0], prompt="the dog")] + REQUESTS[1:]
    with pytest.raises(WorkloadError, match="prompt file changed"):
        run_workload(pair, requests_of(changed), s, tmp_path / "w", resume=True)
    with pytest.raises(WorkloadError, match="holds no manifest.json"):
        run_workload(pair, requests_of(), s, tmp_path / "empty", resume=True)


def test_a_request_too_long_is_refused_by_line_unless_skipped(tmp_path):
    pair = tiny_pair(7)  # 512 positions
    long = {"id": "long", "category": "x", "prompt": " ".join(["the"] * 600)}
    entries = REQUESTS[:2] + [long]
    s = SpecSettings(k=2, temperature=0.0, max_new_tokens=4)
    with pytest.raises(PromptFileError, match="p.jsonl line 3: request 'long': the prompt is 600 tokens"):
        run_workload(pair, requests_of(entries), s, tmp_path / "w", prompts_name="p.jsonl")
    assert not (tmp_path / "w").exists()  # refused before anything was written
    workload = run_workload(pair, requests_of(entries), s, tmp_path / "w", skip_too_long=True)
    assert [e.status for e in workload.entries] == ["done", "done", "skipped"]
    assert "600 tokens" in workload.entries[2].reason
    assert [r.id for r in workload.runs()] == ["r1", "r2"]


def test_the_zip_of_a_workload_opens_as_the_folder_does(tmp_path):
    from engine.workload.folder import open_zip, zip_folder
    run_workload(tiny_pair(8), requests_of(), SpecSettings(k=2, temperature=0.0, max_new_tokens=6), tmp_path / "w")
    folder = open_workload(tmp_path / "w")
    zipped = open_zip(zip_folder(tmp_path / "w"), "w.zip")
    assert [(r.id, r.trace.summary) for r in zipped.runs()] == [(r.id, r.trace.summary) for r in folder.runs()]


def tamper(tmp_path, change) -> Path:
    folder = tmp_path / "w"
    if not folder.exists():
        run_workload(tiny_pair(9), requests_of(), SpecSettings(k=2, temperature=0.0, max_new_tokens=6), folder)
    copy = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
    copy.mkdir()
    for f in folder.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((copy / MANIFEST).read_text())
    change(manifest, copy)
    (copy / MANIFEST).write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize("change, message", [
    (lambda m, f: m["requests"][0].update(file="../../etc/passwd"), "requests[0].file' must be request-0001.jsonl"),
    (lambda m, f: m["requests"][1].update(id="r1"), "requests[].id' must be unique"),
    (lambda m, f: m["requests"][0]["summary"].update(mean_acceptance_length=9.0), "must be between 1 and K + 1"),
    (lambda m, f: m["requests"][0]["summary"].update(acceptance_rate=float("nan")), "not JSON"),
    (lambda m, f: m.update(version=7), "this engine reads version 1"),
    (lambda m, f: m["settings"].update(k=0), "settings.k"),
    (lambda m, f: m["requests"][0].update(status="finished"), "must be one of pending, done, skipped"),
])
def test_a_tampered_manifest_is_refused_naming_the_field(tmp_path, change, message):
    with pytest.raises(WorkloadError, match="manifest") as err:
        open_workload(tamper(tmp_path, change)).runs()
    assert message in str(err.value)


@pytest.mark.parametrize("change, message", [
    (lambda m, f: m["requests"][0]["summary"].update(num_generated=5), "differ from the manifest's summary"),
    (lambda m, f: (f / "request-0002.jsonl").unlink(), "request-0002.jsonl is missing"),
    (lambda m, f: (f / "request-0001.jsonl").write_bytes((f / "request-0002.jsonl").read_bytes()),
     "the trace is of request"),
    (lambda m, f: m["settings"].update(seed=1), "settings differ"),
])
def test_a_trace_that_does_not_belong_to_its_entry_is_refused(tmp_path, change, message):
    with pytest.raises(WorkloadError, match=message):
        open_workload(tamper(tmp_path, change)).runs()


def zipped(files: dict) -> bytes:
    """A zip holding these names and contents, as a stranger could make one."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_hostile_zips_are_refused(tmp_path):
    from engine.workload.folder import open_zip

    with pytest.raises(WorkloadError, match="not a zip"):
        open_zip(b"PK not really", "x.zip")
    with pytest.raises(WorkloadError, match="exactly one manifest.json"):
        open_zip(zipped({"a/manifest.json": "{}", "b/manifest.json": "{}"}), "x.zip")
    with pytest.raises(WorkloadError, match="exactly one manifest.json"):
        open_zip(zipped({"a/b/c/manifest.json": "{}"}), "x.zip")
    with pytest.raises(WorkloadError, match="not a workload manifest"):
        open_zip(zipped({"manifest.json": "[1]"}), "x.zip")
    with pytest.raises(WorkloadError, match="unpacks to more than"):
        open_zip(zipped({"manifest.json": "{}", "pad": b"\0" * (600 * 2**20)}), "x.zip")


# ---------------------------------------------------------------- the command line

@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_tiny(tiny_pair(11), tmp_path_factory.mktemp("models"))


def cli(folders, *args) -> list[str]:
    target, draft = folders
    return ["run", "--target", target, "--draft", draft, "--temperature", "0", "--max-new-tokens", "6", *args]


def test_cli_runs_a_workload_and_stats_reads_it(folders, tmp_path, capsys):
    out = tmp_path / "w"
    assert main(cli(folders, "--prompts", str(prompt_file(tmp_path)), "--out", str(out), "--k", "2")) == 0
    printed = capsys.readouterr().out
    assert f"workload written to {out}: 4 requests done, 0 skipped" in printed
    assert main(["stats", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["requests"] == 4 and set(stats["categories"]) == {"pets", "logs"}


@pytest.mark.parametrize("content, args, message", [
    ('{"prompt": "the cat"}\n{"prompt": ""}\n', [], "p.jsonl line 2: field 'prompt': the prompt is empty"),
    ('{"prompt": "the cat"}\n{"promt": "a"}\n', [], "p.jsonl line 2: unknown key 'promt'"),
    ('{"prompt": "the cat"}\n', ["--tree", "auto"], "--tree auto chooses per prompt"),
])
def test_cli_refuses_bad_input_in_one_line_and_writes_nothing(folders, tmp_path, capsys, content, args, message):
    (tmp_path / "p.jsonl").write_text(content)
    code = main(cli(folders, "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "w"), *args))
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "w").exists()


def test_cli_refuses_resume_without_prompts_and_a_file_as_the_folder(folders, tmp_path, capsys):
    assert main(cli(folders, "--prompt", "the cat", "--out", str(tmp_path / "t.jsonl"), "--resume")) == 2
    assert "--resume and --skip-too-long go with --prompts" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(cli(folders, "--prompts", str(prompt_file(tmp_path)), "--out", str(tmp_path / "file"))) == 2
    assert "--out names a folder" in capsys.readouterr().err


def test_a_killed_workload_resumes_from_its_finished_requests(folders, tmp_path):
    """SIGKILL mid-workload (no handler runs), then the same command with --resume."""
    entries = [{"id": f"q{i}", "prompt": "the cat sat on a mat " * (i + 1)} for i in range(5)]
    out = tmp_path / "w"
    command = [sys.executable, "-m", "engine", *cli(folders, "--prompts", str(prompt_file(tmp_path, entries)),
                                                     "--out", str(out), "--max-new-tokens", "80")]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None:  # waits on the manifest's state, not on a clock
            manifest = out / MANIFEST
            if manifest.is_file() and '"done"' in manifest.read_text():
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    statuses = [r["status"] for r in json.loads((out / MANIFEST).read_text())["requests"]]
    assert "done" in statuses
    result = subprocess.run(command + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert [e.status for e in open_workload(out).entries] == ["done"] * 5
    assert len(open_workload(out).runs()) == 5
