"""`engine client` against a real vLLM, and the folder it writes read back.

Every answer shaped like vLLM's comes from a real one: the module's n-gram vLLM (ngram_server, shared
by the test process) and, for an answer without per-request metrics, a second vLLM started without
speculation (plain_server, this module's only). The folder holds every request's answer with token ids
and per-request metrics; `engine stats --json` equals what the raw answers give; the /metrics
counters' difference equals the requests' sum; a run cut short, failed or killed continues with
--resume; a 4xx from the server (an unknown model) is one line, exit code 2, and sent once.
What a real vLLM never does comes from a peer written here, never a stand-in for vLLM: nothing
listening (a server down), a socket that accepts and never answers (a timeout), and a relay in front
of the real vLLM that passes its answers through but can count the requests, answer a 503 or
malformed JSON in their place, or hold a request unanswered. Each failure is one line naming the URL
and exit code 2, with the finished requests kept; a hostile folder is refused by `engine stats` in
one line naming the file.
"""
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import pytest

from engine.cli import main
from engine.models.presets import smollm2_folder
from engine.servers.launch import NGRAM_K3, free_port, start_vllm
from tests.live_vllm import require_vllm_env

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


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1]  # tqdm's bar (carriage returns) may come first; the error is the last line, and one line


# ---------------------------------------------------------------- peers that are not vLLM

FORWARD, HOLD = "forward", "hold"


class Relay:
    """`with Relay(upstream, act) as relay:` a peer on 127.0.0.1 between the client and a real vLLM.

    Every GET passes through to `upstream`, and so does each POST `act(n)` (n counts POSTs from 1)
    answers FORWARD for; for another POST it answers `act(n)`'s (status, body) itself, or with HOLD
    keeps it unanswered until the relay closes. relay.posts: POSTs received; relay.forwarded: passed on.
    """

    def __init__(self, upstream: str, act: Callable[[int], object] = lambda n: FORWARD):
        self.upstream, self.act = upstream, act
        self.posts = self.forwarded = 0
        self.lock, self.closing = threading.Lock(), threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def pass_on(self, path: str, body: bytes | None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.upstream + path, body, {"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=600) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as err:
            with err:
                return err.code, err.read()

    def handler(self):
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet: the test's output is the client's
                pass

            def reply(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self.reply(*relay.pass_on(self.path, None))

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                with relay.lock:
                    relay.posts += 1
                    what = relay.act(relay.posts)
                if what == HOLD:
                    relay.closing.wait()
                    return  # closed unanswered
                if what == FORWARD:
                    answer = relay.pass_on(self.path, body)
                    with relay.lock:
                        relay.forwarded += 1
                    return self.reply(*answer)
                self.reply(*what)

        return Handler

    def __enter__(self) -> "Relay":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def forward_first(n: int, then: object) -> Callable[[int], object]:
    return lambda i: FORWARD if i <= n else then


class Silent:
    """`with Silent() as url:` a socket on 127.0.0.1 that takes connections (the kernel's backlog) and never answers."""

    def __enter__(self) -> str:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        self.sock.close()


# ---------------------------------------------------------------- the n-gram vLLM


@pytest.fixture(scope="module")
def live_folder(ngram_server, tmp_path_factory) -> Path:
    """Every prompt, written once by the client against the n-gram vLLM; also the hostile-folder tests' good folder."""
    folder = tmp_path_factory.mktemp("client") / "run"
    prompts = write_prompts(folder.parent / "prompts.jsonl", PROMPTS)
    assert client(ngram_server.url, prompts, folder, "--speculative-config", json.dumps(NGRAM_K3)) == 0
    return folder


def test_the_folder_holds_every_answer_with_its_tokens_and_metrics(live_folder):
    m = manifest(live_folder)
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
    m = manifest(folder)
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


def test_a_failure_mid_run_keeps_the_finished_requests_and_resume_continues(ngram_server, tmp_path, capsys):
    """The relay passes the first two requests to the vLLM, then answers 503 (a proxy whose server went away):
    a 5xx is tried again, the two answers stay, and --resume through the relay, passing all, sends the other four."""
    prompts, out = write_prompts(tmp_path / "p.jsonl", PROMPTS), tmp_path / "out"
    command = ["client", "--prompts", str(prompts), "--out", str(out), "--max-tokens", str(MAX_TOKENS)]
    with Relay(ngram_server.url, forward_first(2, (503, b'{"error": "no server"}'))) as relay:
        assert main([*command, "--url", relay.url, "--retries", "1"]) == 2
        line = one_line_error(capsys)
        assert f"{relay.url}/v1/chat/completions: HTTP 503 after 2 tries" in line and "--resume" in line
        assert (relay.posts, relay.forwarded) == (4, 2)  # the third request tried twice
        assert [(e["id"], e["status"]) for e in manifest(out)["requests"]] == \
            [("count", "done"), ("days", "done"), ("repeat", "failed")]
        assert len(answers(out)) == 2
        relay.act = lambda n: FORWARD
        assert main([*command, "--url", relay.url, "--resume"]) == 0
        assert relay.forwarded == len(PROMPTS)
    # answers.jsonl is in finishing order (two requests run at once); each request is there exactly once.
    assert sorted(a["id"] for a in answers(out)) == sorted(p["id"] for p in PROMPTS)
    stats = stats_json(out, capsys)
    assert stats["requests"] == len(PROMPTS) and stats["totals"]["equal"] is True


def test_the_completions_endpoint_sends_prompts_and_refuses_conversations(ngram_server, tmp_path, capsys):
    out = tmp_path / "out"
    assert client(ngram_server.url, write_prompts(tmp_path / "p.jsonl", PROMPTS[:2]), out, "--endpoint", "completions") == 0
    got = sorted(answers(out), key=lambda a: a["id"])
    assert [a["request"]["prompt"] for a in got] == [p["prompt"] for p in sorted(PROMPTS[:2], key=lambda p: p["id"])]
    assert all(a["answer"]["object"] == "text_completion" for a in got)
    stats = stats_json(out, capsys)
    assert stats["endpoint"] == "completions" and stats["requests"] == 2 and stats["totals"]["equal"] is True
    assert client(ngram_server.url, write_prompts(tmp_path / "c.jsonl", PROMPTS[5:]), tmp_path / "other",
                  "--endpoint", "completions") == 2
    assert "c.jsonl line 1: a conversation (messages) needs --endpoint chat" in one_line_error(capsys)
    assert not (tmp_path / "other").exists()


def done_ids(folder: Path) -> list[str]:
    try:
        m = manifest(folder)
    except (OSError, ValueError):
        return []  # not written yet, or being replaced
    return [e["id"] for e in m["requests"] if e["status"] == "done"]


def test_a_killed_client_continues_with_resume(ngram_server, tmp_path, capsys):
    """A client process killed while two requests are held unanswered (the relay passed the first two to the
    vLLM): its two answers stay, and --resume sends the other four, each once."""
    prompts, out = write_prompts(tmp_path / "p.jsonl", PROMPTS), tmp_path / "out"
    command = [sys.executable, "-m", "engine", "client", "--prompts", str(prompts), "--out", str(out),
               "--max-tokens", str(MAX_TOKENS), "--concurrency", "2"]
    with Relay(ngram_server.url, forward_first(2, HOLD)) as relay:
        process = subprocess.Popen([*command, "--url", relay.url], cwd=ROOT, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            while relay.posts < 4 or len(done_ids(out)) < 2:  # both answers kept, both held requests sent
                assert process.poll() is None, "the client ended before it was killed"
                time.sleep(0.05)  # waiting on the state above, checked between short pauses
        finally:
            process.kill()
            process.wait()
    assert done_ids(out) == ["count", "days"] and relay.forwarded == 2
    with Relay(ngram_server.url) as relay:
        assert main([*command[3:], "--url", relay.url, "--resume"]) == 0
        assert relay.posts == relay.forwarded == len(PROMPTS) - 2
    # answers.jsonl is in finishing order (two requests run at once); each request is there exactly once.
    assert sorted(a["id"] for a in answers(out)) == sorted(p["id"] for p in PROMPTS)
    stats = stats_json(out, capsys)
    assert stats["requests"] == len(PROMPTS) and stats["totals"]["equal"] is True


def test_a_4xx_is_not_tried_again(ngram_server, tmp_path, capsys):
    """vLLM answers 404 for a model it does not serve; the relay counts what reached it."""
    with Relay(ngram_server.url) as relay:
        assert client(relay.url, write_prompts(tmp_path / "p.jsonl", PROMPTS[:1]), tmp_path / "out",
                      "--model", "no-such-model", "--retries", "3") == 2
        assert relay.posts == relay.forwarded == 1
    line = one_line_error(capsys)
    assert f"{relay.url}/v1/chat/completions: HTTP 404: " in line and "no-such-model" in line
    assert [e["status"] for e in manifest(tmp_path / "out")["requests"]] == ["failed"]


def test_malformed_json_is_one_line_naming_the_url(ngram_server, tmp_path, capsys):
    with Relay(ngram_server.url, lambda n: (200, b'{"choices": [')) as relay:
        code = client(relay.url, write_prompts(tmp_path / "p.jsonl", PROMPTS[:2]), tmp_path / "out", "--retries", "0")
    line = one_line_error(capsys)
    assert code == 2 and f"{relay.url}/v1/chat/completions: the answer is not JSON" in line
    assert {e["status"] for e in manifest(tmp_path / "out")["requests"]} == {"failed"}


def test_a_server_that_never_answers_is_one_line_naming_the_url(tmp_path, capsys):
    with Silent() as url:
        code = client(url, write_prompts(tmp_path / "p.jsonl", PROMPTS[:2]), tmp_path / "out", "--retries", "0",
                      "--timeout", "1")
        line = one_line_error(capsys)
    assert code == 2 and line.startswith(f"error: {url}/") and "no answer within 1 s (--timeout)" in line
    assert not (tmp_path / "out").exists()  # the folder starts only once the server has said what it is


def test_a_server_that_is_down_is_one_line_and_exit_2(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert client(url, write_prompts(tmp_path / "p.jsonl", PROMPTS), tmp_path / "out", "--retries", "0") == 2
    line = one_line_error(capsys)
    assert line.startswith("error: ") and url in line and "cannot connect" in line


def test_settings_are_refused_before_anything_is_sent(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    for extra, says in ((["--speculative-config", "{nope"], "--speculative-config: not JSON"),
                        (["--concurrency", "0"], "--concurrency 0"), (["--timeout", "0"], "--timeout 0")):
        assert client("http://127.0.0.1:9", prompts, tmp_path / "out", *extra) == 2
        assert says in one_line_error(capsys)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- hostile folders


def edit_manifest(change):
    def edit(folder: Path) -> None:
        m = manifest(folder)
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


def one_more_full_step(row: dict) -> None:
    spec(row)["acceptance_histogram"][-1] += 1  # a step the per-step lists do not hold


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
    "tokens against usage": (edit_answer(lambda r: r["answer"]["usage"].update(
        completion_tokens=r["answer"]["usage"]["completion_tokens"] - 1)), "answers.jsonl line 1", "usage.completion_tokens"),
    "two choices": (edit_answer(lambda r: r["answer"]["choices"].append(r["answer"]["choices"][0])),
                    "answers.jsonl line 1", "not one choice"),
    "another max_tokens": (edit_answer(lambda r: r["request"].update(max_tokens=5)), "answers.jsonl line 1", "max_tokens"),
    "a histogram off": (edit_answer(one_more_full_step), "answers.jsonl", "acceptance_histogram"),
    "more steps than tokens": (edit_answer(lambda r: spec(r).update(
        per_step_accepted=[3] * 10, per_step_drafted=[3] * 10, num_spec_steps=10, num_accepted_draft_tokens=30,
        num_draft_tokens=30, acceptance_histogram=[0, 0, 0, 10], mean_acceptance_length=4.0, draft_acceptance_rate=1.0)),
        "answers.jsonl", "commit 40 tokens"),  # more than MAX_TOKENS + K
    "no metrics": (edit_answer(lambda r: r["answer"].pop("metrics")), "answers.jsonl", "metrics.speculative_decoding"),
    "negative seconds": (edit_answer(lambda r: r.update(elapsed_s=-1)), "answers.jsonl line 1", "elapsed_s"),
    "a missing answer": (lambda f: (f / "answers.jsonl").write_text((f / "answers.jsonl").read_text().split("\n", 1)[1]),
                         "answers.jsonl", "no answer for request"),
    "an answer twice": (lambda f: (f / "answers.jsonl").write_text((f / "answers.jsonl").read_text() * 2),
                        f"answers.jsonl line {len(PROMPTS) + 1}", "answered twice"),
    "not JSON": (lambda f: (f / "answers.jsonl").write_text("{oops\n"), "answers.jsonl line 1", "malformed JSON"),
    "a scrape not Prometheus": (lambda f: (f / "metrics-after.prom").write_text("{not prometheus}\n"),
                                "metrics-after.prom", "not Prometheus text"),
    "a linked answers file": (lambda f: ((f / "answers.jsonl").unlink(), (f / "answers.jsonl").symlink_to("/etc/passwd")),
                              "answers.jsonl", "not a plain file"),
}


def test_the_good_folder_reads(live_folder, capsys):
    """The hostile tests' control: the client's folder, undamaged, reads."""
    stats = stats_json(live_folder, capsys)
    assert stats["requests"] == len(PROMPTS) and stats["totals"]["equal"] is True


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_folder_is_refused_in_one_line_naming_the_file(name, live_folder, tmp_path, capsys):
    folder = tmp_path / "copy"
    shutil.copytree(live_folder, folder)
    damage, file, says = HOSTILE[name]
    damage(folder)
    capsys.readouterr()
    assert main(["stats", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert f"{folder}/{file}" in err and says in err


# ---------------------------------------------------------------- a vLLM without speculation


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    """vLLM serving the same model without speculation: its answers carry no per-request speculative metrics.
    Its own start (about 45 s of CI's two cores), so only the one test below asks for it."""
    require_vllm_env()
    server = start_vllm(smollm2_folder(), None, model_name="smollm2", log=tmp_path_factory.mktemp("plain") / "server.log")
    yield server
    server.stop()


def test_an_answer_without_per_request_metrics_is_one_line_naming_the_url(plain_server, tmp_path, capsys):
    out = tmp_path / "out"
    code = client(plain_server.url, write_prompts(tmp_path / "p.jsonl", PROMPTS[:2]), out, "--retries", "0")
    line = one_line_error(capsys)
    assert code == 2 and f"{plain_server.url}/v1/chat/completions: the answer has no per-request speculative" in line
    m = manifest(out)
    assert m["speculative_config"] is None and {e["status"] for e in m["requests"]} == {"failed"}
    assert not (out / "answers.jsonl").exists()  # no answer kept
