"""Speculative sampling must reproduce the target's distribution exactly (chi-square)."""
import copy

import pytest
import torch
from scipy.stats import chi2

from engine.config import SpecSettings
from engine.cycle.pair import TokenTexts
from engine.cycle.reference import run_cycle, start_run
from engine.models.sampling import warp_probs
from engine.teaching.faults import Faults
from tests.tiny import tiny_pair

PROMPT = [1, 2, 4]
SAMPLES = 2000
# A broken rule's p stayed below 1e-10 at 600 samples over three seeds (far past the 1e-4 the controls ask), so the
# controls draw fewer than the test of the correct rule, whose p must stay high where it is right.
CONTROL_SAMPLES = 800


def exact_two_token_distribution(pair, s: SpecSettings, prompt: list[int] = PROMPT) -> torch.Tensor:
    """P(x1, x2) = p_target(x1 | prompt) * p_target(x2 | prompt, x1): (V, V)."""
    v = pair.target.full_vocab_size
    first = warp_probs(pair.target.model(torch.tensor([prompt])).logits[0, -1], s)  # (V,)
    seqs = torch.tensor([prompt + [x] for x in range(v)])  # (V, T+1)
    second = warp_probs(pair.target.model(seqs).logits[:, -1], s)  # (V, V)
    return first[:, None] * second


def sample_two_tokens(pair, s: SpecSettings, faults: Faults, n: int, prompt: list[int] = PROMPT,
                      tally: dict | None = None) -> torch.Tensor:
    """Counts (V, V) of the first two emitted tokens over n independent runs; `tally`, if
    given, sums the draft tokens proposed ("drafted") and accepted ("accepted")."""
    v = pair.target.full_vocab_size
    counts = torch.zeros(v, v)
    base = start_run(pair, prompt)  # prefill once; every run starts from a copy
    gen = torch.Generator().manual_seed(s.seed)
    texts = TokenTexts(pair.target.tokenizer)
    for _ in range(n):
        state = copy.deepcopy(base)
        while not state.finished:
            rec = run_cycle(pair, state, s, gen, 0, texts, faults, record=False)
            if tally is not None:
                tally["drafted"] = tally.get("drafted", 0) + len(rec["draft_token_ids"])
                tally["accepted"] = tally.get("accepted", 0) + rec["num_accepted"]
        counts[state.generated[0], state.generated[1]] += 1
    return counts


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square, cells with expected count < 5 pooled into one."""
    n = counts.sum()
    expected = (probs * n).flatten()
    observed = counts.flatten()
    big = expected >= 5
    exp_cells = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    obs_cells = torch.cat([observed[big], observed[~big].sum(0, keepdim=True)])
    stat = float(((obs_cells - exp_cells) ** 2 / exp_cells.clamp(min=1e-9)).sum())
    return float(chi2.sf(stat, len(exp_cells) - 1))


@pytest.fixture(scope="module")
def setup():
    pair = tiny_pair(0, draft_seed=5)
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=2, seed=1234)
    with torch.inference_mode():
        return pair, s, exact_two_token_distribution(pair, s)


def test_speculative_sampling_matches_target_distribution(setup):
    pair, s, exact = setup
    counts = sample_two_tokens(pair, s, Faults(), SAMPLES)
    p = chi_square_p_value(counts, exact)
    assert p > 0.01, f"correct rule rejected by chi-square, p={p:.2g}"


@pytest.mark.parametrize("rule", ["p_target_only", "no_residual"])
def test_chi_square_catches_broken_acceptance(setup, rule):
    pair, s, exact = setup
    counts = sample_two_tokens(pair, s, Faults(acceptance_rule=rule), CONTROL_SAMPLES)
    p = chi_square_p_value(counts, exact)
    assert p < 1e-4, f"broken rule {rule} not caught, p={p:.2g}"
