"""Warping and the residual: the same rules for draft and target."""
import torch

from engine.config import SpecSettings
from engine.sampling import residual, warp_probs

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
