"""The acceptance test on hand-built distributions (as vLLM's rejection-sampler tests do).

No model runs here: p_draft and p_target are written out by hand, so every expected
outcome can be worked out on paper.
"""
import pytest
import torch

from engine.cycle.driver import commit_tokens
from engine.cycle.ratio_test import Decision, accept_reject
from engine.models.sampling import residual

V = 5


def dist(*probs: float) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float32)


def one_hot(i: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(i), V).float()


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_perfect_match_accepts_everything_and_draws_a_bonus():
    p = dist(0.1, 0.2, 0.3, 0.4, 0.0)
    p_draft = torch.stack([p, p, p])  # (3, V) the draft is the target
    p_target = torch.stack([p, p, p, one_hot(4)])  # (4, V): position 4 is certain of token 4
    for seed in range(20):
        d = accept_reject([3, 1, 0], p_draft, p_target, gen(seed))
        assert d.num_accepted == 3 and d.rejected_position is None
        assert d.accept_prob == [1.0, 1.0, 1.0] and len(d.u) == 3
        assert d.next_token_id == 4 and d.residual_probs is None  # the bonus, from p_target at K+1


def test_early_mismatch_rejects_at_the_first_position_and_samples_the_residual():
    p_draft = torch.stack([one_hot(2), one_hot(3)])
    p_target = torch.stack([dist(0.5, 0.5, 0, 0, 0), dist(0, 0, 0, 1, 0), one_hot(0)])
    d = accept_reject([2, 3], p_draft, p_target, gen())
    # p_target(2) = 0 at position 1: never accepted, whatever u is; position 2 is never tested.
    assert d.num_accepted == 0 and d.rejected_position == 1 and len(d.u) == 1
    assert d.accept_prob == [0.0, 1.0]
    assert d.next_token_id in (0, 1)
    torch.testing.assert_close(d.residual_probs, dist(0.5, 0.5, 0, 0, 0))


def test_residual_removes_the_draft_mass_and_renormalises():
    p_target, p_draft = dist(0.4, 0.3, 0.2, 0.1, 0.0), dist(0.1, 0.5, 0.2, 0.0, 0.2)
    # max(0, p_t - p_d) = (0.3, 0, 0, 0.1, 0): normalised (0.75, 0, 0, 0.25, 0)
    torch.testing.assert_close(residual(p_target, p_draft), dist(0.75, 0, 0, 0.25, 0))
    # A deterministic proposal: the residual is p_target with the token zeroed, renormalised.
    torch.testing.assert_close(residual(p_target, one_hot(0)), dist(0, 0.5, 1 / 3, 1 / 6, 0))


def test_mismatch_in_the_middle_keeps_the_accepted_prefix():
    p_draft = torch.stack([one_hot(1), one_hot(2), one_hot(3)])
    p_target = torch.stack([one_hot(1), one_hot(4), one_hot(3), one_hot(0)])
    d = accept_reject([1, 2, 3], p_draft, p_target, gen())
    assert d.num_accepted == 1 and d.rejected_position == 2 and d.next_token_id == 4
    assert len(d.u) == 2  # positions 1 and 2 tested, position 3 discarded


def test_acceptance_probability_is_the_ratio_capped_at_one():
    p_draft = torch.stack([dist(0.5, 0.5, 0, 0, 0), dist(0.2, 0.8, 0, 0, 0)])
    p_target = torch.stack([dist(0.25, 0.75, 0, 0, 0), dist(0.4, 0.6, 0, 0, 0), one_hot(0)])
    d = accept_reject([0, 0], p_draft, p_target, gen())
    assert d.accept_prob == pytest.approx([0.5, 1.0])


def test_acceptance_frequency_follows_the_ratio():
    p_draft, p_target = torch.stack([dist(0.8, 0.2, 0, 0, 0)]), torch.stack([dist(0.2, 0.8, 0, 0, 0), one_hot(0)])
    g = gen(7)
    accepted = sum(accept_reject([0], p_draft, p_target, g).num_accepted for _ in range(4000))
    assert accepted / 4000 == pytest.approx(0.25, abs=0.03)  # p_target(0) / p_draft(0)


def test_no_proposals_is_a_plain_target_step():
    d = accept_reject([], torch.zeros(0, V), torch.stack([one_hot(3)]), gen())
    assert d == Decision(0, [], [], None, 3, None)


def decision(num_accepted: int, next_token: int, k: int) -> Decision:
    return Decision(num_accepted, [1.0] * k, [0.0] * min(num_accepted + 1, k),
                    None if num_accepted == k else num_accepted + 1, next_token, None)


def test_commit_cuts_at_the_first_eos():
    tokens, finished = commit_tokens([5, 0, 6], decision(3, 7, 3), budget=10, eos_ids={0})
    assert tokens == [5, 0] and finished  # nothing after EOS, not even the accepted 6 or the bonus
    tokens, finished = commit_tokens([5, 6], decision(1, 0, 2), budget=10, eos_ids={0})
    assert tokens == [5, 0] and finished  # the resampled token is EOS


def test_commit_cuts_at_the_token_budget():
    tokens, finished = commit_tokens([5, 6, 7], decision(3, 8, 3), budget=2, eos_ids=set())
    assert tokens == [5, 6] and finished
    tokens, finished = commit_tokens([5, 6, 7], decision(3, 8, 3), budget=10, eos_ids=set())
    assert tokens == [5, 6, 7, 8] and not finished  # all accepted plus the bonus


def test_the_engine_core_holds_only_the_correct_rule():
    import engine.cycle.reference as core
    import engine.teaching.runs as teaching
    assert not hasattr(core, "Faults") and not hasattr(core, "ACCEPTANCE_RULES")
    assert teaching.Faults().acceptance_rule == "ratio"  # the teaching code owns the broken ones
