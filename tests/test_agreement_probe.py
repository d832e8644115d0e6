"""The teacher-forced agreement probe (engine/diagnose/agreement.py) against real speculative runs."""
import copy

import pytest

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.diagnose.agreement import agreement, greedy_agreement, simulate_greedy_cycles
from engine.models.loading import wrap_model
from engine.run import encode_prompt, run_to_trace
from tests.tiny import noisy_pair

NEAR_TIE = 1e-4  # a full forward and a cached one round float32 differently; below this an argmax may flip


@pytest.mark.parametrize("seed, noise, k", [(0, 0.05, 4), (1, 0.1, 3), (2, 0.2, 5)])
def test_the_probe_gives_every_greedy_cycles_accepted_count(tmp_path, seed, noise, k):
    pair = noisy_pair(seed, noise=noise)
    s = SpecSettings(k=k, temperature=0.0, max_new_tokens=40)
    ids = encode_prompt(pair.target.tokenizer, "the cat sat on a mat and then", False)
    probe = greedy_agreement(pair.target, pair.draft, ids, s, pair.eos_ids)
    assert min(probe.target_margin) > NEAR_TIE  # the premise: no near-tie on this path
    trace = run_to_trace(pair, "the cat sat on a mat and then", s, tmp_path / "t.jsonl", chat_template=False)
    assert probe.continuation[:40] == trace.summary["generated_token_ids"]
    assert simulate_greedy_cycles(probe.top1, k, 40) == [c["num_accepted"] for c in trace.cycles]


def test_a_draft_that_is_the_target_agrees_everywhere():
    pair = noisy_pair(3, noise=0.0)
    same = Pair(pair.target, wrap_model("same", copy.deepcopy(pair.target.model), pair.target.tokenizer), set())
    s = SpecSettings(k=4, temperature=0.8, top_p=0.9, max_new_tokens=20)
    ids = encode_prompt(pair.target.tokenizer, "a dog ran", False)
    probe = agreement(same.target, same.draft, ids, [3, 4, 5, 6, 7], s)
    assert all(probe.top1) and probe.overlap == pytest.approx([1.0] * 5, abs=1e-5)  # float32 softmax rounding


def test_simulated_cycles_on_hand_built_agreements():
    t, f = True, False
    assert simulate_greedy_cycles([t, t, f, t, t, t, t, t, f], 3, 9) == [2, 3, 1]
    assert simulate_greedy_cycles([f, f, f], 2, 3) == [0, 0, 0]
    assert simulate_greedy_cycles([t] * 10, 4, 10) == [4, 4]  # each commits 4 and a bonus: the budget is spent
