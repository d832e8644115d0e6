"""The teacher-forced agreement probe (engine/diagnose/agreement.py) against real speculative runs."""
import copy

import pytest

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.cycle.plain import target_generate
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


def test_batched_agreements_equal_one_request_at_a_time(monkeypatch):
    """Ragged prompts and continuations, two rows per forward (so chunks and their sorting are used):
    each request's figures equal its own unbatched forward's."""
    import engine.diagnose.agreement as agreement_module
    monkeypatch.setattr(agreement_module, "ROWS_PER_FORWARD", 2)
    pair = noisy_pair(4, noise=0.1)
    s = SpecSettings(k=3, temperature=0.9, top_k=5, max_new_tokens=12)
    texts = ["a dog ran", "the cat sat on a mat and then it", "once", "we went to the sea and the sky was"]
    prompts = [encode_prompt(pair.target.tokenizer, t, False) for t in texts]
    continuations = [target_generate(pair.target, p, SpecSettings(k=3, temperature=0.0, max_new_tokens=n), set())
                     for p, n in zip(prompts, [12, 5, 9, 1])]
    assert agreement_module.can_batch(pair.target) and agreement_module.can_batch(pair.draft)
    batched = agreement_module.agreements(pair.target, pair.draft, prompts, continuations, s)
    for p, c, got in zip(prompts, continuations, batched):
        alone = agreement(pair.target, pair.draft, p, c, s)
        assert got.continuation == c and len(got.top1) == len(c)
        # batched kernels round float32 differently from a single row's: 1e-5 on probabilities in [0, 1]
        assert got.overlap == pytest.approx(alone.overlap, abs=1e-5)
        assert got.target_margin == pytest.approx(alone.target_margin, abs=1e-5)
        assert [a == b or m < NEAR_TIE for a, b, m in zip(got.top1, alone.top1, alone.target_margin)] == [True] * len(c)


def test_chunks_group_similar_lengths_and_bound_the_padding():
    from engine.diagnose.agreement import chunks
    lengths = [100, 10, 12, 11, 400, 95, 13]
    assert chunks(lengths, rows=3) == [[1, 3, 2], [6], [5, 0], [4]]
    for group in chunks(lengths, rows=16):
        assert max(lengths[i] for i in group) * len(group) <= 1.25 * sum(lengths[i] for i in group)
    assert sorted(i for g in chunks(lengths) for i in g) == list(range(len(lengths)))
