"""The lab's definitions pinned to answers of a real vLLM (tests/server_samples/vllm_live_answers.jsonl,
recorded with scripts/record_vllm_answers.py): its reader gives the server's own figures, and its engine,
run on the same prompt tokens with the same lookup, gives the same tokens, text and mean acceptance length.
One live test checks that the server still answers what was recorded."""
import json
import urllib.request
from pathlib import Path

import pytest
import torch

from engine.config import SpecSettings
from engine.cycle.reference import speculative_generate
from engine.drafters.registry import DrafterOptions
from engine.models.presets import smollm2_folder
from engine.run import answer_text, load_with_drafter
from engine.servers.launch import NGRAM_K3
from engine.servers.per_request import read_requests
from engine.servers.request_stats import requests_stats
from engine.trace.metrics import trace_acceptance
from engine.trace.schema import NGRAM_EARLIEST, NGRAM_LATEST, PROMPT_LOOKUP

SAMPLES = Path(__file__).parent / "server_samples" / "vllm_live_answers.jsonl"
RECORDED = [json.loads(line) for line in SAMPLES.read_text().splitlines()]
ANSWERS = [r["answer"] for r in RECORDED]
K = NGRAM_K3["num_speculative_tokens"]
REPEATED = 3  # "Repeat after me: ...": its last n-gram occurs twice in the prompt


def spec(answer: dict) -> dict:
    return answer["metrics"]["speculative_decoding"]


# ---------------------------------------------------------------- the reader

def test_the_reader_gives_the_servers_own_figures():
    rows = requests_stats(read_requests(ANSWERS))["per_request"]
    assert [row["id"] for row in rows] == [a["id"] for a in ANSWERS]
    for row, answer in zip(rows, ANSWERS):
        s = spec(answer)
        assert row["accepted_histogram"] == s["acceptance_histogram"]
        assert row["accepted_per_cycle"] == s["per_step_accepted"]
        if s["num_spec_steps"]:
            assert row["mean_acceptance_length"] == pytest.approx(s["mean_acceptance_length"], rel=1e-12)
            assert row["acceptance_rate"] == pytest.approx(s["draft_acceptance_rate"], rel=1e-12)
        else:  # vLLM writes 1.0 and 0.0 for a request that never drafted; the lab says nothing was drafted
            assert (s["mean_acceptance_length"], s["draft_acceptance_rate"]) == (1.0, 0.0)
            assert row["mean_acceptance_length"] is None and row["acceptance_rate"] is None


# ---------------------------------------------------------------- the engine on the same prompts

def ngram_lookup(match: str):
    options = DrafterOptions(kind=PROMPT_LOOKUP, max_ngram=NGRAM_K3["prompt_lookup_max"],
                             min_ngram=NGRAM_K3["prompt_lookup_min"], ngram_match=match)
    return load_with_drafter(str(smollm2_folder()), options)


@pytest.fixture(scope="module")
def chat_lookup():
    """The lab's default lookup: after the n-gram's most recent occurrence."""
    torch.set_num_threads(1)
    return ngram_lookup(NGRAM_LATEST)


@pytest.fixture(scope="module")
def vllm_lookup():
    """vLLM V1's order (vllm/v1/spec_decode/ngram_proposer.py): after the n-gram's earliest occurrence."""
    torch.set_num_threads(1)
    return ngram_lookup(NGRAM_EARLIEST)


def lab_run(pair, recorded: dict) -> list[dict]:
    s = SpecSettings(k=K, temperature=0, max_new_tokens=recorded["request"]["max_tokens"])
    return list(speculative_generate(pair, recorded["answer"]["prompt_token_ids"], s))


def drafting(cycles: list[dict]) -> list[int]:
    return [c["num_accepted"] for c in cycles if c["draft_token_ids"]]


def assert_same_answer(pair, cycles: list[dict], answer: dict) -> None:
    tokens = [t for c in cycles for t in c["committed_token_ids"]]
    assert tokens == answer["choices"][0]["token_ids"]
    assert answer_text(pair.target.tokenizer, tokens) == answer["choices"][0]["message"]["content"]


def test_the_engine_with_vllms_lookup_gives_the_servers_answers(vllm_lookup):
    runs = [lab_run(vllm_lookup, r) for r in RECORDED]
    assert all(any(not c["draft_token_ids"] for c in cycles) for cycles in runs)  # every run has plain steps
    for cycles, answer in zip(runs, ANSWERS):
        s = spec(answer)
        assert_same_answer(vllm_lookup, cycles, answer)
        assert drafting(cycles) == (s["per_step_accepted"] or [])  # vLLM counts no step that drafted nothing
        m = trace_acceptance(cycles, K)
        if s["num_spec_steps"]:
            assert m["mean_acceptance_length"] == pytest.approx(s["mean_acceptance_length"], rel=1e-12)
            assert m["acceptance_rate"] == pytest.approx(s["draft_acceptance_rate"], rel=1e-12)
        else:
            assert m["mean_acceptance_length"] == 0.0  # nothing drafted


def test_the_labs_own_lookup_differs_only_where_an_ngram_repeats(chat_lookup):
    for n, (recorded, answer) in enumerate(zip(RECORDED, ANSWERS)):
        cycles = lab_run(chat_lookup, recorded)
        assert_same_answer(chat_lookup, cycles, answer)  # greedy: the text never depends on the drafter
        if n != REPEATED:
            assert drafting(cycles) == (spec(answer)["per_step_accepted"] or [])
    # "mat." occurs twice: vLLM copies what followed the first (" The cat sat", all rejected), the lab
    # what followed the most recent (the end of turn and a newline, both accepted).
    assert spec(ANSWERS[REPEATED])["per_step_accepted"] == [3, 0]
    assert drafting(lab_run(chat_lookup, RECORDED[REPEATED])) == [3, 2]


# ---------------------------------------------------------------- the recording is still what the server says

def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.loads(answer.read())


def test_the_live_server_still_answers_as_recorded(ngram_server):
    for recorded in RECORDED:
        answer = post(f"{ngram_server.url}/v1/chat/completions", recorded["request"])
        assert answer["prompt_token_ids"] == recorded["answer"]["prompt_token_ids"]
        assert answer["choices"][0]["token_ids"] == recorded["answer"]["choices"][0]["token_ids"]
        assert answer["choices"][0]["message"]["content"] == recorded["answer"]["choices"][0]["message"]["content"]
        assert spec(answer) == spec(recorded["answer"])
