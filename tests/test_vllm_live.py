"""The live vLLM itself: it starts from its environment, answers with per-request speculative metrics,
reports its speculative configuration, and stops by its process id."""
import json
import os
import urllib.request

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


def test_it_stops_by_its_process_id(ngram_server):
    pid = ngram_server.pid
    ngram_server.stop()
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive
