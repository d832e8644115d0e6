"""`engine client` against a live vLLM and against a small fake server, and the folder it writes read back.

Live (the module's vLLM, ngram_server): the folder holds every request's answer with token ids and
per-request metrics; `engine stats --json` equals what the raw answers give; the /metrics counters'
difference equals the requests' sum; a run cut short continues with --resume.
No vLLM needed (tests/fake_server.py, or nothing listening): a server that is down, fails, hangs,
answers without metrics or with malformed JSON is one line naming the URL and exit code 2, with the
finished requests kept; a hostile folder is refused by `engine stats` in one line naming the file.
"""
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.cli import main
from engine.servers.launch import NGRAM_K3, free_port
from tests.fake_server import Behaviour, FakeServer

PROMPTS = [
    {"id": "count", "category": "lists", "prompt": "Count from one to ten in words, twice."},
    {"id": "days", "category": "lists", "prompt": "List the days of the week, then list them again."},
    {"id": "repeat", "category": "copy", "prompt": "Repeat exactly: the cat sat on the mat, the cat sat on the mat."},
    {"id": "abc", "category": "copy", "prompt": "Write the letters a to j separated by commas, twice."},
    {"id": "capital", "category": "facts", "prompt": "What is the capital of France?"},
    {"id": "colours", "category": "facts", "messages": [{"role": "user", "content": "Name three colours."}]},
]
MAX_TOKENS = 24
ROOT = Path(__file__).resolve().parents[1]


def write_prompts(path: Path, prompts: list[dict]) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return path


def client(url: str, prompts: Path, out: Path, *extra: str) -> int:
    return main(["client", "--url", url, "--prompts", str(prompts), "--out", str(out), "--max-tokens", str(MAX_TOKENS),
                 "--concurrency", "2", *extra])


def stats_json(folder: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["stats", str(folder), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def answers(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "answers.jsonl").read_text().splitlines()]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1]  # tqdm's bar (carriage returns) may come first; the error is the last line, and one line


# ---------------------------------------------------------------- live vLLM


@pytest.fixture(scope="module")
def live_folder(ngram_server, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("client") / "run"
    prompts = write_prompts(folder.parent / "prompts.jsonl", PROMPTS)
    assert client(ngram_server.url, prompts, folder, "--speculative-config", json.dumps(NGRAM_K3)) == 0
    return folder


def test_the_folder_holds_every_answer_with_its_tokens_and_metrics(live_folder):
    m = json.loads((live_folder / "manifest.json").read_text())
    assert (m["format"], m["version"], m["endpoint"]) == ("speclab-server-workload", 1, "chat")
    assert m["server"]["kind"] == "vLLM" and m["server"]["model"] == "smollm2"
    assert m["speculative_config"] == NGRAM_K3 and m["speculative_config_source"] == "server_info+user"
    assert [e["id"] for e in m["requests"]] == [p["id"] for p in PROMPTS]
    assert {e["status"] for e in m["requests"]} == {"done"}
    assert m["scrapes"] == {"before": "metrics-before.prom", "after": "metrics-after.prom"}
    got = answers(live_folder)
    assert sorted(a["id"] for a in got) == sorted(p["id"] for p in PROMPTS)
    for a in got:
        assert a["request"]["return_token_ids"] is True
        choice = a["answer"]["choices"][0]
        assert len(choice["token_ids"]) == a["answer"]["usage"]["completion_tokens"] <= MAX_TOKENS
        assert a["answer"]["metrics"]["speculative_decoding"]["num_spec_tokens"] == 3


def test_stats_equal_a_recomputation_from_the_raw_answers(live_folder, capsys):
    stats = stats_json(live_folder, capsys)
    raw = {a["id"]: a["answer"]["metrics"]["speculative_decoding"] for a in answers(live_folder)}
    for row in stats["per_request"]:
        spec = raw[row["id"]]
        assert row["cycles"] == len(spec["per_step_accepted"])
        assert row["accepted_tokens"] == sum(spec["per_step_accepted"])
        assert row["draft_tokens"] == sum(spec["per_step_drafted"])
        assert row["accepted_histogram"] == [spec["per_step_accepted"].count(j) for j in range(4)]
    steps = [(d, a) for s in raw.values() for d, a in zip(s["per_step_drafted"], s["per_step_accepted"])]
    overall = stats["overall"]
    assert overall["cycles"] == len(steps)
    assert overall["accepted_tokens"] == sum(a for _, a in steps)
    assert overall["accepted_histogram"] == [sum(a == j for _, a in steps) for j in range(4)]
    for row in overall["conditional_acceptance"]:
        i = row["position"]
        assert row["reached"] == sum(d >= i and a >= i - 1 for d, a in steps)
        assert row["accepted"] == sum(d >= i and a >= i for d, a in steps)
    assert set(stats["categories"]) == {"lists", "copy", "facts"}


def prometheus_total(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_the_counters_difference_equals_the_requests_sum(live_folder, capsys):
    totals = stats_json(live_folder, capsys)["totals"]
    assert totals["equal"] is True and totals["counters"] == totals["requests"]
    before, after = ((live_folder / n).read_text() for n in ("metrics-before.prom", "metrics-after.prom"))
    raw = [a["answer"]["metrics"]["speculative_decoding"] for a in answers(live_folder)]
    drafted = prometheus_total(after, "vllm:spec_decode_num_draft_tokens_total") \
        - prometheus_total(before, "vllm:spec_decode_num_draft_tokens_total")
    assert drafted == sum(s["num_draft_tokens"] for s in raw) == totals["requests"]["draft_tokens"]
    assert capsys.readouterr().out == "" and main(["stats", str(live_folder)]) == 0
    assert "equal: every drafted and accepted token" in capsys.readouterr().out


def test_a_run_cut_short_continues_with_resume(ngram_server, tmp_path, capsys):
    """A first run of half the requests, then what a kill leaves (an answer line its manifest never called
    done, a line cut off), then --resume with the whole file: each request answered once, counters equal."""
    folder = tmp_path / "run"
    assert client(ngram_server.url, write_prompts(tmp_path / "half.jsonl", PROMPTS[:3]), folder) == 0
    first = answers(folder)
    m = json.loads((folder / "manifest.json").read_text())
    m["scrapes"]["after"] = None  # killed before the last scrape
    (folder / "manifest.json").write_text(json.dumps(m))
    (folder / "metrics-after.prom").unlink()
    orphan = first[0] | {"id": PROMPTS[3]["id"], "category": PROMPTS[3]["category"]}
    with open(folder / "answers.jsonl", "a") as f:
        f.write(json.dumps(orphan) + "\n" + json.dumps(first[1])[:50])
    assert main(["stats", str(folder)]) == 2
    assert "cut off" in one_line_error(capsys)
    assert client(ngram_server.url, write_prompts(tmp_path / "all.jsonl", PROMPTS), folder, "--resume") == 0
    got = answers(folder)
    assert sorted(a["id"] for a in got) == sorted(p["id"] for p in PROMPTS)
    assert [a for a in got if a["id"] in {p["id"] for p in PROMPTS[:3]}] == first  # kept as they were
    assert next(a for a in got if a["id"] == orphan["id"])["answer"]["id"] != orphan["answer"]["id"]  # sent again
    totals = stats_json(folder, capsys)["totals"]
    assert totals["equal"] is True


# ---------------------------------------------------------------- no vLLM: a server down, failing or lying


def test_a_server_that_is_down_is_one_line_and_exit_2(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert client(url, write_prompts(tmp_path / "p.jsonl", PROMPTS), tmp_path / "out", "--retries", "0") == 2
    line = one_line_error(capsys)
    assert line.startswith("error: ") and url in line and "cannot connect" in line


def test_a_failure_mid_run_keeps_the_finished_requests_and_resume_continues(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    with FakeServer(Behaviour(fail_from=3, status=503)) as server:
        assert main(["client", "--url", server.url, "--prompts", str(prompts), "--out", str(tmp_path / "out"),
                     "--retries", "1"]) == 2
        line = one_line_error(capsys)
        assert f"{server.url}/v1/chat/completions: HTTP 503 after 2 tries" in line and "--resume" in line
        assert server.behaviour.tried == 4  # a 5xx is tried again
        m = json.loads((tmp_path / "out" / "manifest.json").read_text())
        assert [(e["id"], e["status"]) for e in m["requests"]] == [("count", "done"), ("days", "done"), ("repeat", "failed")]
        assert len(answers(tmp_path / "out")) == 2
        server.behaviour.fail_from = None
        capsys.readouterr()
        assert main(["client", "--url", server.url, "--prompts", str(prompts), "--out", str(tmp_path / "out"),
                     "--resume"]) == 0
        assert server.behaviour.served == len(PROMPTS)
    assert [a["id"] for a in answers(tmp_path / "out")] == [p["id"] for p in PROMPTS]
    stats = stats_json(tmp_path / "out", capsys)
    assert stats["totals"]["equal"] is True and stats["overall"]["cycles"] == 4 * len(PROMPTS)


def test_the_completions_endpoint_sends_prompts_and_refuses_conversations(tmp_path, capsys):
    with FakeServer() as server:
        out = tmp_path / "out"
        assert main(["client", "--url", server.url, "--prompts", str(write_prompts(tmp_path / "p.jsonl", PROMPTS[:2])),
                     "--out", str(out), "--endpoint", "completions"]) == 0
        assert [a["request"]["prompt"] for a in answers(out)] == [p["prompt"] for p in PROMPTS[:2]]
        assert stats_json(out, capsys)["endpoint"] == "completions"
        assert main(["client", "--url", server.url, "--prompts", str(write_prompts(tmp_path / "c.jsonl", PROMPTS[5:])),
                     "--out", str(tmp_path / "other"), "--endpoint", "completions"]) == 2
    assert "c.jsonl line 1: a conversation (messages) needs --endpoint chat" in one_line_error(capsys)


def done_ids(folder: Path) -> list[str]:
    try:
        m = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return []  # not written yet
    return [e["id"] for e in m["requests"] if e["status"] == "done"]


def test_a_killed_client_continues_with_resume(tmp_path, capsys):
    """A client process killed while two requests hang on the server: its two answers stay, --resume sends the rest."""
    prompts, out = write_prompts(tmp_path / "p.jsonl", PROMPTS), tmp_path / "out"
    command = [sys.executable, "-m", "engine", "client", "--prompts", str(prompts), "--out", str(out), "--concurrency", "2"]
    with FakeServer(Behaviour(hang=threading.Event(), hang_from=3)) as server:
        process = subprocess.Popen([*command, "--url", server.url], cwd=ROOT, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            while server.behaviour.tried < 4 or len(done_ids(out)) < 2:  # both answers kept, both hung requests sent
                assert process.poll() is None, "the client ended before it was killed"
                time.sleep(0.05)  # waiting on the state above, checked between short pauses
        finally:
            process.kill()
            process.wait()
    assert done_ids(out) == ["count", "days"]
    with FakeServer() as server:
        assert main(["client", "--url", server.url, "--prompts", str(prompts), "--out", str(out), "--resume"]) == 0
        assert server.behaviour.served == len(PROMPTS) - 2
    assert [a["id"] for a in answers(out)] == [p["id"] for p in PROMPTS]
    assert stats_json(out, capsys)["requests"] == len(PROMPTS)


def test_a_4xx_is_not_tried_again(tmp_path, capsys):
    with FakeServer(Behaviour(fail_from=1, status=400)) as server:
        assert main(["client", "--url", server.url, "--prompts", str(write_prompts(tmp_path / "p.jsonl", PROMPTS[:1])),
                     "--out", str(tmp_path / "out"), "--retries", "3"]) == 2
        assert server.behaviour.tried == 1
    assert "HTTP 400: " in one_line_error(capsys)


@pytest.mark.parametrize("behaviour, says", [
    (lambda: Behaviour(no_metrics=True), "no per-request speculative-decoding metrics"),
    (lambda: Behaviour(malformed=True), "the answer is not JSON"),
    (lambda: Behaviour(hang=threading.Event()), "no answer within 1 s"),
])
def test_a_bad_answer_is_one_line_naming_the_url(behaviour, says, tmp_path, capsys):
    with FakeServer(behaviour()) as server:
        code = main(["client", "--url", server.url, "--prompts", str(write_prompts(tmp_path / "p.jsonl", PROMPTS[:2])),
                     "--out", str(tmp_path / "out"), "--retries", "0", "--timeout", "1"])
        line = one_line_error(capsys)
    assert code == 2 and f"{server.url}/v1/chat/completions" in line and says in line
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_settings_are_refused_before_anything_is_sent(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    for extra, says in ((["--speculative-config", "{nope"], "--speculative-config: not JSON"),
                        (["--concurrency", "0"], "--concurrency 0"), (["--timeout", "0"], "--timeout 0")):
        assert client("http://127.0.0.1:9", prompts, tmp_path / "out", *extra) == 2
        assert says in one_line_error(capsys)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- hostile folders


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory) -> Path:
    """A folder the client wrote against the fake server (no vLLM needed)."""
    folder = tmp_path_factory.mktemp("good") / "run"
    prompts = write_prompts(folder.parent / "p.jsonl", PROMPTS[:3])
    with FakeServer() as server:
        assert main(["client", "--url", server.url, "--prompts", str(prompts), "--out", str(folder)]) == 0
    return folder


def edit_manifest(change):
    def edit(folder: Path) -> None:
        m = json.loads((folder / "manifest.json").read_text())
        change(m)
        (folder / "manifest.json").write_text(json.dumps(m))
    return edit


def edit_answer(change, line: int = 0):
    def edit(folder: Path) -> None:
        rows = answers(folder)
        change(rows[line])
        (folder / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return edit


def spec(row: dict) -> dict:
    return row["answer"]["metrics"]["speculative_decoding"]


HOSTILE = {
    "another version": (edit_manifest(lambda m: m.update(version=2)), "manifest.json", "version 2"),
    "a duplicate id": (edit_manifest(lambda m: m["requests"].append(dict(m["requests"][0]))), "manifest.json", "listed twice"),
    "a scrape outside": (edit_manifest(lambda m: m["scrapes"].update(after="../../etc/passwd")), "manifest.json",
                         "scrapes.after"),
    "a path as prompts": (edit_manifest(lambda m: m.update(prompts="/etc/passwd")), "manifest.json", "a file name"),
    "a planned count as text": (edit_manifest(lambda m: m.update(planned_requests="many")), "manifest.json",
                                "planned_requests"),
    "an index as text": (edit_manifest(lambda m: m["requests"][0].update(index="0")), "manifest.json", "'index'"),
    "an unknown kind": (edit_manifest(lambda m: m["server"].update(kind="evil")), "manifest.json", "server.kind"),
    "a NaN setting": (edit_manifest(lambda m: m["settings"].update(temperature=float("nan"))), "manifest.json", "malformed JSON"),
    "an unlisted id": (edit_answer(lambda r: r.update(id="stranger")), "answers.jsonl line 1", "not a done request"),
    "another category": (edit_answer(lambda r: r.update(category="other")), "answers.jsonl line 1", "category"),
    "a negative token": (edit_answer(lambda r: r["answer"]["choices"][0]["token_ids"].__setitem__(0, -1)),
                         "answers.jsonl line 1", "token_ids[0]"),
    "a float token": (edit_answer(lambda r: r["answer"]["prompt_token_ids"].__setitem__(1, 2.5)),
                      "answers.jsonl line 1", "prompt_token_ids[1]"),
    "tokens against usage": (edit_answer(lambda r: r["answer"]["usage"].update(completion_tokens=3)),
                             "answers.jsonl line 1", "usage.completion_tokens"),
    "two choices": (edit_answer(lambda r: r["answer"]["choices"].append(r["answer"]["choices"][0])),
                    "answers.jsonl line 1", "not one choice"),
    "another max_tokens": (edit_answer(lambda r: r["request"].update(max_tokens=5)), "answers.jsonl line 1", "max_tokens"),
    "a histogram off": (edit_answer(lambda r: spec(r).update(acceptance_histogram=[0, 0, 0, 4])),
                        "answers.jsonl", "acceptance_histogram"),
    "more steps than tokens": (edit_answer(lambda r: spec(r).update(
        per_step_accepted=[3] * 10, per_step_drafted=[3] * 10, num_spec_steps=10, num_accepted_draft_tokens=30,
        num_draft_tokens=30, acceptance_histogram=[0, 0, 0, 10], mean_acceptance_length=4.0, draft_acceptance_rate=1.0)),
        "answers.jsonl", "commit 40 tokens"),
    "no metrics": (edit_answer(lambda r: r["answer"].pop("metrics")), "answers.jsonl", "metrics.speculative_decoding"),
    "negative seconds": (edit_answer(lambda r: r.update(elapsed_s=-1)), "answers.jsonl line 1", "elapsed_s"),
    "a missing answer": (lambda f: (f / "answers.jsonl").write_text((f / "answers.jsonl").read_text().split("\n", 1)[1]),
                         "answers.jsonl", "no answer for request"),
    "an answer twice": (lambda f: (f / "answers.jsonl").write_text((f / "answers.jsonl").read_text() * 2),
                        "answers.jsonl line 4", "answered twice"),
    "not JSON": (lambda f: (f / "answers.jsonl").write_text("{oops\n"), "answers.jsonl line 1", "malformed JSON"),
    "a scrape not Prometheus": (lambda f: (f / "metrics-after.prom").write_text("{not prometheus}\n"),
                                "metrics-after.prom", "not Prometheus text"),
    "a linked answers file": (lambda f: ((f / "answers.jsonl").unlink(), (f / "answers.jsonl").symlink_to("/etc/passwd")),
                              "answers.jsonl", "not a plain file"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_folder_is_refused_in_one_line_naming_the_file(name, good_folder, tmp_path, capsys):
    folder = tmp_path / "copy"
    shutil.copytree(good_folder, folder)
    damage, file, says = HOSTILE[name]
    damage(folder)
    capsys.readouterr()
    assert main(["stats", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert f"{folder}/{file}" in err and says in err


def test_the_good_folder_reads(good_folder, capsys):
    stats = stats_json(good_folder, capsys)
    assert stats["requests"] == 3 and stats["totals"]["equal"] is True
