"""Warping and the residual: the same rules for draft and target."""
import torch

from engine.config import SpecSettings
from engine.models import sampling
from engine.models.sampling import draw, residual, sample, uniform, warp_probs

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def test_temperature_zero_is_one_hot_on_argmax():
    probs = warp_probs(LOGITS, SpecSettings(temperature=0))
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_temperature_scales_logits():
    probs = warp_probs(LOGITS, SpecSettings(temperature=2.0))
    torch.testing.assert_close(probs, torch.softmax(LOGITS / 2, -1))


def test_top_k_keeps_k_tokens_renormalised():
    probs = warp_probs(LOGITS, SpecSettings(top_k=2))
    expected = torch.softmax(torch.tensor([2.0, 1.0]), -1)
    torch.testing.assert_close(probs[:2], expected)
    assert probs[2:].sum() == 0


def test_top_p_keeps_smallest_prefix_reaching_p():
    full = torch.softmax(LOGITS, -1)  # 0.55, 0.20, 0.12, 0.07, 0.03
    probs = warp_probs(LOGITS, SpecSettings(top_p=0.7))
    kept = (probs > 0).tolist()
    assert kept == [True, True, False, False, False]
    torch.testing.assert_close(probs[:2], full[:2] / full[:2].sum())
    assert (warp_probs(LOGITS, SpecSettings(top_p=0.01)) > 0).sum() == 1  # the top token survives


def test_residual_is_normalised_positive_part():
    p_target = torch.tensor([0.5, 0.3, 0.2])
    p_draft = torch.tensor([0.2, 0.6, 0.2])
    torch.testing.assert_close(residual(p_target, p_draft), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(residual(p_target, p_target), p_target)  # nothing owed: fall back


def test_sample_follows_distribution_and_never_picks_zero_probability():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    for _ in range(20000):
        counts[sample(probs, gen)] += 1
    assert counts[[0, 2, 5]].sum() == 0
    # 20000 draws: the standard error of each frequency is below 0.004
    assert torch.allclose(counts / counts.sum(), probs, atol=0.015)


def test_sample_at_the_top_of_the_cdf_takes_the_last_possible_token(monkeypatch):
    # A draw that rounds up to the total mass must not land on the trailing zero-probability tokens.
    monkeypatch.setattr(sampling, "uniform", lambda generator: 1.0)
    probs = torch.tensor([0.25, 0.75, 0.0, 0.0])
    assert sample(probs, torch.Generator()) == 1


def test_greedy_draw_takes_argmax_without_spending_a_draw():
    probs = torch.tensor([0.1, 0.6, 0.3])
    gen = torch.Generator().manual_seed(0)
    assert draw(probs, SpecSettings(k=1, temperature=0.0), gen) == 1
    assert uniform(gen) == uniform(torch.Generator().manual_seed(0))


def nucleus_by_full_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The rule ranked over every token, as the definition reads."""
    ranked, order = torch.sort(probs, dim=-1, descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, torch.cumsum(ranked, -1) - ranked < top_p)
    return probs * keep / (probs * keep).sum(-1, keepdim=True)


def test_top_p_on_a_large_vocabulary_ranks_only_the_candidates_it_needs(monkeypatch):
    """Peaked rows (their nucleus inside the first candidates) and flat rows (it is not: every token is
    ranked) keep exactly the tokens the full ranking keeps; distinct random logits have no ties."""
    gen = torch.Generator().manual_seed(0)
    peaked = torch.randn(4, 5000, generator=gen) * 4
    flat = torch.randn(3, 5000, generator=gen) * 0.1
    fully_ranked = []
    monkeypatch.setattr(torch, "sort", lambda *a, **kw: fully_ranked.append(1) or torch.Tensor.sort(*a, **kw))
    for logits, sorts in ((peaked, 0), (flat, 1), (torch.cat([peaked, flat]), 1)):
        probs = torch.softmax(logits, -1)
        for top_p in (0.5, 0.9):
            fully_ranked.clear()
            got = sampling._nucleus(probs, top_p)
            assert len(fully_ranked) == sorts
            assert ((got > 0) == (nucleus_by_full_sort(probs, top_p) > 0)).all()
            torch.testing.assert_close(got, nucleus_by_full_sort(probs, top_p))
