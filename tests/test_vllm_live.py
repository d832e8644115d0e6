"""The live vLLM itself: it starts from its environment, answers with per-request speculative metrics,
reports its speculative configuration; and stop() ends a server's whole process group."""
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from engine.servers.launch import LiveServer

CHAT = {"model": "smollm2", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Count from one to ten in words, twice."}]}


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.loads(answer.read())


def test_an_answer_carries_its_speculative_steps(ngram_server):
    answer = post(f"{ngram_server.url}/v1/chat/completions", CHAT)
    spec = answer["metrics"]["speculative_decoding"]
    assert spec["num_spec_tokens"] == 3
    assert len(spec["per_step_accepted"]) == spec["num_spec_steps"] == sum(spec["acceptance_histogram"])
    assert sum(spec["per_step_accepted"]) == spec["num_accepted_draft_tokens"]
    assert 0 < answer["usage"]["completion_tokens"] <= CHAT["max_tokens"]


def test_the_server_reports_what_it_speculates_with(ngram_server):
    with urllib.request.urlopen(f"{ngram_server.url}/server_info", timeout=60) as answer:
        info = json.loads(answer.read())
    assert '"ngram"' in json.dumps(info) or "ngram" in json.dumps(info)


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie waiting for its parent (init, for an orphan) to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_stop_ends_the_servers_whole_process_group(tmp_path):
    """vLLM runs its engine in a child process; stop() must end both. A process that starts a child the same
    way stands in for it, so the session's shared server keeps serving the other tests."""
    child_pid = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              f"open({str(child_pid)!r} + '.tmp', 'w').write(str(c.pid)); "
              f"__import__('os').replace({str(child_pid)!r} + '.tmp', {str(child_pid)!r}); time.sleep(600)")
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    server = LiveServer("http://127.0.0.1:1", process, tmp_path / "log", "none", None)
    while not child_pid.exists():  # written in one step once the child is up
        assert process.poll() is None, "the stand-in exited early"
        time.sleep(0.05)
    child = int(child_pid.read_text())
    server.stop()
    assert process.poll() is not None
    guard = time.monotonic() + 120  # only against a hang: the child got its SIGTERM with the group already
    while not gone(child):
        assert time.monotonic() < guard, f"the engine's child {child} outlived stop()"
        time.sleep(0.05)
