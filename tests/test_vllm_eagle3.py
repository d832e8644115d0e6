"""An EAGLE-3 head in the speculators format, served by a live vLLM and run by the lab: the same folder, the same
greedy tokens, the same drafted and accepted counts step by step (bench/vllm_eagle3.py says how they line up).

One server for the module: a tiny random 6-layer target saved to disk with a head fitted to it in a few seconds
(so drafts are often accepted), K=3, four requests of 16 tokens past EOS; it stops before the lab runs."""
from pathlib import Path

import pytest

from bench.vllm_draft_model import compare, lab_side, vllm_side
from bench.vllm_eagle3 import ask_vllm, completion_request, lab_pair, tiny_folders, tiny_prompts
from tests.live_vllm import require_vllm_env

K = 3
MAX_TOKENS = 16
REQUESTS = 4


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[list[dict], Path, Path]:
    require_vllm_env()
    work = tmp_path_factory.mktemp("vllm-eagle3")
    target, head = tiny_folders(work)
    answers = ask_vllm(target, head, K, [completion_request(p, MAX_TOKENS) for p in tiny_prompts(REQUESTS, seed=99)],
                       work / "server.log")
    return answers, target, head


@pytest.fixture(scope="module")
def lab(served):
    _, target, head = served
    return lab_pair(target, head, ignore_eos=True)


@pytest.mark.parametrize("index", range(REQUESTS))
def test_each_request_matches_the_lab_token_for_token_and_step_for_step(served, lab, index):
    answer = served[0][index]
    ids, vllm = answer["prompt_token_ids"], vllm_side(answer)
    mine = lab_side(lab, ids, K, MAX_TOKENS)
    agree = compare(lab, ids, vllm, mine)
    assert vllm["token_ids"] == mine["token_ids"], agree
    assert vllm["per_step_drafted"] == mine["per_step_drafted"]
    assert vllm["per_step_accepted"] == mine["per_step_accepted"], agree


def test_the_head_really_drafts_and_is_accepted_at_times(served):
    """Every step drafts K, and the fitted head's drafts are accepted in some steps but not all: the comparison
    above covers full, partial and no accepts."""
    steps = [a for answer in served[0] for a in vllm_side(answer)["per_step_accepted"]]
    drafted = {d for answer in served[0] for d in vllm_side(answer)["per_step_drafted"]}
    assert drafted == {K}
    assert sum(steps) > 0 and 0 in steps
