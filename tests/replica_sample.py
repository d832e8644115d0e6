"""What the replica's tests and the Workload page's tests share, built without vLLM: a hand-made one-answer
server-workload folder, a live workload folder with a hand-made replica.json beside it (the bundled
prompt-lookup workload unzipped), the Workload page opened on a root of such folders, and the links
into the stepper that page shows."""
import json
import re
import zipfile
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from streamlit.testing.v1 import AppTest

from engine.replica.comparison import REPLICA_FILE
from engine.workload.folder import open_folder

ROOT = Path(__file__).resolve().parent.parent
MAIN = ROOT / "app" / "main.py"
LOOKUP_ZIP = ROOT / "assets" / "workloads" / "chat-prompt-lookup-greedy-k4.zip"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def server_folder(tmp: Path, config: dict | None = NGRAM, answer_line: str | None = None) -> Path:
    """A one-answer server workload, hand-built (no server needed to refuse it)."""
    tmp.mkdir(parents=True, exist_ok=True)
    manifest = {"format": "speclab-server-workload", "version": 1, "url": "http://127.0.0.1:1", "endpoint": "chat",
                "server": {"kind": "vLLM", "version": None, "model": "smollm2", "model_root": "x"},
                "speculative_config": config, "speculative_config_source": None if config is None else "user",
                "settings": {"max_tokens": 8, "temperature": 0, "top_p": 1.0, "seed": 0, "concurrency": 1,
                             "timeout_s": 10, "retries": 0}, "prompts": "t", "created": "now",
                "requests": [{"id": "a", "category": "c", "status": "done", "error": None}],
                "scrapes": {"before": None, "after": None}}
    answer = {"prompt_token_ids": [1, 2, 3], "choices": [{"token_ids": [4, 5, 2]}],
              "metrics": {"speculative_decoding": {"num_spec_tokens": 3, "num_spec_steps": 1, "num_draft_tokens": 3,
                                                   "num_accepted_draft_tokens": 1, "acceptance_histogram": [0, 1, 0, 0],
                                                   "per_step_accepted": [1], "per_step_drafted": [3]}}}
    line = {"id": "a", "category": "c", "request": {"model": "smollm2", "max_tokens": 8, "temperature": 0, "top_p": 1.0,
                                                    "messages": [{"role": "user", "content": "hi"}]},
            "answer": answer, "elapsed_s": 0.1}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    (tmp / "answers.jsonl").write_text((answer_line if answer_line is not None else json.dumps(line)) + "\n")
    return tmp


PARTED = "request-0002.jsonl"  # the hand-made comparison's request that parts from its server


def build_replica_runs(tmp_path: Path, sampled_trace: Path) -> tuple[Path, int]:
    """Under tmp_path: runs/workloads/replica-of-vllm, a live workload folder (the bundled prompt-lookup
    workload, unzipped) with a replica.json beside its manifest: its first request equal, its second parting
    at its second drafting cycle; and traces/default.jsonl, a copy of `sampled_trace` (conftest's
    example_traces). Returns (tmp_path, that cycle)."""
    runs = tmp_path / "runs"
    folder = runs / "workloads" / "replica-of-vllm"
    with zipfile.ZipFile(LOOKUP_ZIP) as z:
        z.extractall(folder)
    workload = open_folder(folder)
    first, second = workload.entries[:2]
    drafting = [c["cycle"] for c in workload.trace(second).cycles if c["draft_token_ids"]]
    parted_at = drafting[1]
    cyc = next(c for c in workload.trace(second).cycles if c["cycle"] == parted_at)
    k = workload.manifest["settings"]["k"]
    body = {"format": "speclab-replica", "version": 1, "server_workload": "s", "server": {}, "speculative_config": NGRAM,
            "requests": [{"id": first.id, "equal": True, "server_steps": 1, "replica_drafting_cycles": 1,
                          "tokens_equal": True, "first_difference": None},
                         {"id": second.id, "equal": False, "server_steps": len(drafting),
                          "replica_drafting_cycles": len(drafting), "tokens_equal": True,
                          "first_difference": {"step": 1, "server_drafted": k, "server_accepted": 0,
                                               "replica_drafted": len(cyc["draft_token_ids"]),
                                               "replica_accepted": cyc["num_accepted"], "replica_cycle": parted_at}}]}
    (folder / REPLICA_FILE).write_text(json.dumps(body))
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "default.jsonl").write_bytes(sampled_trace.read_bytes())
    return tmp_path, parted_at


def open_workload_page(root: Path, monkeypatch) -> AppTest:
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(root / "traces"))
    monkeypatch.setenv("SPECLAB_WORKLOADS_DIR", str(root / "no-bundled"))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(root / "runs"))
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(root / "uploads"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(str(MAIN), default_timeout=120)
    at.run()
    at.switch_page("views/workload.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def stepper_links(at: AppTest) -> list[tuple[str, dict]]:
    text = "\n".join(m.value for m in at.markdown)
    found = re.findall(r"\[([^\]]*)\]\((\./\?[^)]*)\)", text)
    return [(t.replace("\\", ""), {k: v[0] for k, v in parse_qs(urlparse(u).query).items()}) for t, u in found]
