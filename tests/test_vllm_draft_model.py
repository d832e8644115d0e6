"""A learned draft in a live vLLM and in the lab: the chat draft over the target's full vocabulary served as
vLLM's draft model, replayed by the lab on vLLM's prompt token ids (bench/vllm_draft_model.py says how the
steps line up); greedy, K=3, each request compared on its own.

The server runs with the capture plugin on and draws its drafts from the draft's distribution
(draft_sample_method "probabilistic"; greedy requests still draft the argmax): every captured trace loads, the
greedy ones step as vLLM reports, and the sampled ones replay their accepts from their own u, p and q."""
import json
from pathlib import Path

import pytest

from bench.vllm_draft_model import MODEL_NAME, ask_vllm, first_difference, lab_side, post, vllm_side
from engine.models.presets import chat_draft_full_vocab_folder, smollm2_folder
from engine.run import load_pair
from engine.servers.launch import draft_model_config, start_vllm
from engine.trace import load_trace
from tests.live_vllm import require_vllm_env
from vllm_capture.speclab_vllm_capture import recorder as rec

K = 3
MAX_TOKENS = 16
PROMPTS = ["What is a good way to learn to cook?", "Write a haiku about autumn leaves.",
           "What is the capital of France, and why is it famous?"]
SAMPLED = ["Repeat this sentence twice: The quick brown fox jumps over the lazy dog.",
           "Name four colours of the rainbow."]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[list[dict], Path]:
    """vLLM's greedy answers to PROMPTS (then SAMPLED at temperature 0.8, top-p 0.95) and its capture folder;
    the server stops before the lab runs (two cores are not enough for both)."""
    require_vllm_env()
    folder = tmp_path_factory.mktemp("vllm")
    config = draft_model_config(chat_draft_full_vocab_folder(), K, draft_sampling="probabilistic")
    server = start_vllm(smollm2_folder(), config, model_name=MODEL_NAME, log=folder / "server.log",
                        env={"SPECLAB_CAPTURE_DIR": str(folder / "traces")})
    try:
        answers = ask_vllm(server.url, PROMPTS, MAX_TOKENS)
        for i, prompt in enumerate(SAMPLED):
            post(f"{server.url}/v1/chat/completions", {
                "model": MODEL_NAME, "max_tokens": 24, "temperature": 0.8, "top_p": 0.95, "seed": 11 + i,
                "messages": [{"role": "user", "content": prompt}]})
        return answers, folder / "traces"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def vllm_answers(served) -> list[dict]:
    return served[0]


@pytest.fixture(scope="module")
def captured(served) -> list[tuple[dict, object]]:
    """Each manifest entry with its trace, loaded (so checked: the ratio test replayed from u, p and q)."""
    folder = served[1]
    entries = json.loads((folder / rec.MANIFEST).read_text())["traces"]
    return [(e, load_trace(folder / e["file"], allow_incomplete=not e["complete"])) for e in entries]


@pytest.fixture(scope="module")
def lab_pair():
    return load_pair(str(smollm2_folder()), str(chat_draft_full_vocab_folder()), device="cpu")


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_each_request_matches_the_lab_token_for_token_and_step_for_step(vllm_answers, lab_pair, index):
    answer = vllm_answers[index]
    vllm = vllm_side(answer)
    lab = lab_side(lab_pair, answer["prompt_token_ids"], K, MAX_TOKENS)
    assert vllm["token_ids"] == lab["token_ids"]
    assert vllm["per_step_drafted"] == lab["per_step_drafted"]
    assert vllm["per_step_accepted"] == lab["per_step_accepted"]
    assert (vllm["num_draft_tokens"], vllm["num_accepted_draft_tokens"]) == (
        lab["num_draft_tokens"], lab["num_accepted_draft_tokens"])


def test_the_draft_model_really_drafts(vllm_answers):
    """Every step drafts K tokens, and some are accepted: the server speculated with the draft, not without it."""
    steps = [vllm_side(a) for a in vllm_answers]
    assert all(n == K for s in steps for n in s["per_step_drafted"])
    assert sum(s["num_accepted_draft_tokens"] for s in steps) > 0


def test_where_two_runs_part():
    """What the report names when vLLM and the lab part: the first differing position, a prefix's end, or none."""
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_each_greedy_capture_steps_as_vllm_reports(vllm_answers, captured):
    by_prompt = {tuple(t.header["prompt_token_ids"]): t for e, t in captured if e["temperature"] == 0}
    for answer in vllm_answers:
        trace = by_prompt[tuple(answer["prompt_token_ids"])]
        vllm = vllm_side(answer)
        assert trace.summary["generated_token_ids"] == vllm["token_ids"]
        steps = [c for c in trace.cycles if c["draft_token_ids"]]
        assert [len(c["draft_token_ids"]) for c in steps] == vllm["per_step_drafted"]
        assert [c["num_accepted"] for c in steps] == vllm["per_step_accepted"]
        assert trace.header["drafter"] == {"kind": "model", "vllm_draft_sample_method": "probabilistic",
                                           "p_draft": trace.header["drafter"]["p_draft"]}
        assert all(p == 1.0 for c in steps for p in c["p_draft"])  # a greedy request drafts the argmax


def test_sampled_captures_load_or_say_where_vllm_tested_against_nan(captured):
    """vLLM sampled these drafts from the draft's distribution and handed it to its rejection sampler. Every
    captured step has been replayed by load_trace from u < min(1, p_target / q). vLLM 0.32's CPU build tests
    sampled drafts against rows built from uninitialised temperatures (docs/servers.md, "Capturing vLLM's
    cycles"), so a trace may end early; its manifest entry then says so."""
    sampled = [(e, t) for e, t in captured if e["temperature"] > 0]
    assert len(sampled) == len(SAMPLED)
    for e, t in sampled:
        assert t.header["drafter"]["vllm_draft_sample_method"] == "probabilistic"
        # vLLM's sampling draft warps by temperature alone, so with top-p the lab calls it "temperature only"
        assert t.header["drafter"]["draft_filters"] == "temperature only"
        assert t.complete == e["complete"] and (e["complete"] or "not finite" in e["ended"]), e
        steps = [c for c in t.cycles if c["draft_token_ids"]]
        assert all(len(c["u"]) == min(c["num_accepted"] + 1, len(c["draft_token_ids"])) for c in steps)
