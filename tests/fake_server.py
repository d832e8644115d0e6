"""A small OpenAI-compatible server for the client's tests that need no vLLM: it answers as vLLM 0.32.0 does
(token ids, metrics.speculative_decoding detailed, /metrics counters that count what it answered), and
a test tells it how to misbehave: fail from the Nth request (HTTP status), leave the metrics out,
answer malformed JSON, or never answer (hang until the test ends).

Runs on 127.0.0.1 and a free port in a thread of the test's process (the standard library's http.server).
"""
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

K = 3
PROMPT_IDS = [1, 9690, 198, 2683, 359]
# One answer's speculation: 4 steps accepting 2, 0, 3, 1 of 3 drafted tokens each, then the prefill's token
PER_STEP_ACCEPTED = [2, 0, 3, 1]


@dataclass
class Behaviour:
    fail_from: int | None = None  # the 1-based request from which every chat request fails
    status: int = 500
    no_metrics: bool = False
    malformed: bool = False
    hang: threading.Event | None = None  # given: from request hang_from on, wait on it, then answer nothing
    hang_from: int = 1
    served: int = 0  # chat requests answered with 200
    tried: int = 0  # chat requests received
    counters: dict = field(default_factory=lambda: {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * K})


def spec_block() -> dict:
    accepted = sum(PER_STEP_ACCEPTED)
    steps = len(PER_STEP_ACCEPTED)
    return {"mean_acceptance_length": 1 + accepted / steps, "draft_acceptance_rate": accepted / (K * steps),
            "acceptance_histogram": [PER_STEP_ACCEPTED.count(j) for j in range(K + 1)], "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted, "num_draft_tokens": K * steps, "num_spec_tokens": K,
            "per_step_accepted": list(PER_STEP_ACCEPTED), "per_step_drafted": [K] * steps}


def chat_answer(body: dict, no_metrics: bool) -> dict:
    """As vLLM answers /v1/chat/completions; /v1/completions ("prompt" in the body) keeps its prompt's
    token ids in the choice, and its text there, instead of a message."""
    tokens = min(body.get("max_tokens", 16), 1 + sum(a + 1 for a in PER_STEP_ACCEPTED))
    choice = {"index": 0, "finish_reason": "length", "token_ids": [100 + i for i in range(tokens)]}
    answer = {"id": "chatcmpl-fake", "object": "chat.completion", "model": body.get("model"), "choices": [choice],
              "usage": {"prompt_tokens": len(PROMPT_IDS), "completion_tokens": tokens,
                        "total_tokens": len(PROMPT_IDS) + tokens}}
    if "prompt" in body:
        choice |= {"text": "x" * tokens, "prompt_token_ids": list(PROMPT_IDS)}
    else:
        choice["message"] = {"role": "assistant", "content": "x" * tokens}
        answer["prompt_token_ids"] = list(PROMPT_IDS)
    if not no_metrics:
        answer["metrics"] = {"speculative_decoding": spec_block()}
    return answer


def metrics_text(c: dict) -> str:
    labels = 'engine="0",model_name="fake"'
    lines = [f"vllm:spec_decode_num_drafts_total{{{labels}}} {c['drafts']}.0",
             f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {c['draft_tokens']}.0",
             f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {c['accepted']}.0"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{p}"}} {n}.0'
              for p, n in enumerate(c["per_pos"])]
    return "\n".join(["# TYPE vllm:spec_decode_num_drafts counter", *lines[:1],
                      "# TYPE vllm:spec_decode_num_draft_tokens counter", lines[1],
                      "# TYPE vllm:spec_decode_num_accepted_tokens counter", lines[2],
                      "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter", *lines[3:]]) + "\n"


def count_answer(c: dict) -> None:
    c["drafts"] += len(PER_STEP_ACCEPTED)
    c["draft_tokens"] += K * len(PER_STEP_ACCEPTED)
    c["accepted"] += sum(PER_STEP_ACCEPTED)
    for p in range(K):
        c["per_pos"][p] += sum(a > p for a in PER_STEP_ACCEPTED)


def handler_for(b: Behaviour, lock: threading.Lock):
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
            if self.path == "/version":
                return self.reply(200, b'{"version": "0.32.0"}')
            if self.path == "/v1/models":
                return self.reply(200, json.dumps({"data": [{"id": "fake", "owned_by": "vllm", "root": "/models/fake",
                                                             "max_model_len": 1024}]}).encode())
            if self.path == "/metrics":
                with lock:
                    return self.reply(200, metrics_text(b.counters).encode())
            self.reply(404, b'{"detail": "Not Found"}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            with lock:
                b.tried += 1
                tried = b.tried
                failing = b.fail_from is not None and tried >= b.fail_from
            if b.hang is not None and tried >= b.hang_from:
                b.hang.wait()
                return
            if failing:
                return self.reply(b.status, b'{"error": {"message": "made to fail"}}')
            if b.malformed:
                return self.reply(200, b'{"choices": [')
            with lock:
                b.served += 1
                if not b.no_metrics:
                    count_answer(b.counters)
            self.reply(200, json.dumps(chat_answer(body, b.no_metrics)).encode())

    return Handler


class FakeServer:
    """`with FakeServer() as server:` server.url, server.behaviour."""

    def __init__(self, behaviour: Behaviour | None = None):
        self.behaviour = behaviour or Behaviour()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(self.behaviour, threading.Lock()))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.behaviour.hang is not None:
            self.behaviour.hang.set()
        self.httpd.shutdown()
        self.httpd.server_close()
