"""A learned draft in a live vLLM and in the lab: the chat draft over the target's full vocabulary served as
vLLM's draft model, replayed by the lab on vLLM's prompt token ids (bench/vllm_draft_model.py says how the
steps line up); greedy, K=3, each request compared on its own."""
import pytest

from bench.vllm_draft_model import ask_vllm, first_difference, lab_side, vllm_side
from engine.models.presets import chat_draft_full_vocab_folder, smollm2_folder
from engine.run import load_pair
from engine.servers.launch import draft_model_config, start_vllm
from tests.live_vllm import require_vllm_env

K = 3
MAX_TOKENS = 16
PROMPTS = ["What is a good way to learn to cook?", "Write a haiku about autumn leaves.",
           "What is the capital of France, and why is it famous?"]


@pytest.fixture(scope="module")
def vllm_answers(tmp_path_factory) -> list[dict]:
    """vLLM's answers to PROMPTS; the server stops before the lab runs (two cores are not enough for both)."""
    require_vllm_env()
    server = start_vllm(smollm2_folder(), draft_model_config(chat_draft_full_vocab_folder(), K), model_name="smollm2",
                        log=tmp_path_factory.mktemp("vllm") / "server.log")
    try:
        return ask_vllm(server.url, PROMPTS, MAX_TOKENS)
    finally:
        server.stop()


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
