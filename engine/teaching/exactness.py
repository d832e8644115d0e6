"""Is speculative sampling really distributed like the target? Count and test.

For a fixed prefix we draw the next token (or the token after it) many times in two
ways, and compare both histograms with the exact target distribution:

- speculative: every sample is a complete engine cycle (the driver's `run_cycles` over a `ChainCycle`: the draft
  proposes, the target verifies, the acceptance rule decides), started from the same
  prefilled caches, which are rolled back to the prefix after each sample;
- plain: the target's own warped distribution at that position, drawn with the same
  `sample` function plain decoding uses.

A chi-square goodness-of-fit test says how surprising each histogram would be if it
really came from the target's distribution.
"""
from dataclasses import dataclass
from typing import Callable

import torch

from engine.config import SpecSettings
from engine.cycle.driver import run_cycles
from engine.cycle.pair import Pair
from engine.cycle.reference import ChainCycle, RunState, start_run
from engine.kv.ops import crop
from engine.models.sampling import residual, sample, warp_probs
from engine.teaching.faults import Faults

MIN_EXPECTED = 5.0  # the chi-square approximation needs about five expected counts per cell
MAX_VOCAB_FOR_SECOND_TOKEN = 4096  # the exact second-token law needs one pass per first token
Progress = Callable[[float], None]  # called with the share of the work done, 0..1


@dataclass
class ChiSquare:
    statistic: float
    dof: int
    p_value: float
    cells: int  # cells after pooling the rare ones


@dataclass
class LabResult:
    """Counts and distributions over the full vocabulary, as plain lists."""

    position: int  # 1 = the next token, 2 = the one after it
    samples: int
    exact: list[float]  # the target's distribution at that position
    predicted: list[float] | None  # what the chosen rule samples in theory (position 1 only)
    speculative_counts: list[int]
    plain_counts: list[int]
    speculative_test: ChiSquare
    plain_test: ChiSquare
    acceptance_rate: float  # of the first draft token, over the speculative samples


# ---------------------------------------------------------------- exact distributions

@torch.inference_mode()
def next_token_probs(pair: Pair, prompt_ids: list[int], s: SpecSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """Warped (V,) distributions of target and draft right after the prefix."""
    p_target = warp_probs(pair.target.forward(prompt_ids, pair.target.new_cache())[-1], s).cpu()
    p_draft = warp_probs(pair.draft.forward(prompt_ids, pair.draft.new_cache())[-1], s).cpu()
    return p_target, p_draft


@torch.inference_mode()
def second_token_probs(pair: Pair, prompt_ids: list[int], s: SpecSettings, first: torch.Tensor,
                       batch: int = 256) -> torch.Tensor:
    """P(x2) = sum over x1 of p_target(x1) p_target(x2 | x1): one target pass per possible x1."""
    ids = torch.nonzero(first > 0).flatten().tolist()
    if len(ids) > MAX_VOCAB_FOR_SECOND_TOKEN:
        raise ValueError(f"the second-token check needs one pass per possible first token; "
                         f"{len(ids)} is too many (limit {MAX_VOCAB_FOR_SECOND_TOKEN}): use top-k or top-p")
    out = torch.zeros_like(first)
    model = pair.target
    for start in range(0, len(ids), batch):
        chunk = ids[start:start + batch]
        seqs = torch.tensor([prompt_ids + [x] for x in chunk], device=model.device)  # (B, T+1)
        if model.full_to_row is not None:
            seqs = model.full_to_row[seqs]
        logits = model.model(input_ids=seqs).logits[:, -1, : model.full_vocab_size].float()  # (B, V)
        out += (first[chunk, None] * warp_probs(logits, s).cpu()).sum(0)
    return out


def predicted_first_token(p_target: torch.Tensor, p_draft: torch.Tensor, rule: str,
                          greedy_draft: bool) -> torch.Tensor:
    """What one cycle emits first under a given acceptance rule, worked out on paper.

    The draft proposes d ~ q (or its argmax when greedy); d is kept with probability
    a(d); otherwise the fallback distribution r is drawn. So P(x) = q(x) a(x) + (1 - sum q a) r(x).
    """
    q = torch.zeros_like(p_draft)
    if greedy_draft:
        q[int(p_draft.argmax())] = 1.0
    else:
        q = p_draft
    ratio = torch.where(p_draft > 0, p_target / p_draft.clamp(min=1e-30), torch.zeros_like(p_target))
    keep = {"ratio": ratio.clamp(max=1.0), "no_residual": ratio.clamp(max=1.0),
            "p_target_only": p_target, "token_match": p_target}[rule]
    # The engine's residual uses the draft's sampling distribution, even for a greedy draft.
    fallback = p_target if rule == "no_residual" else residual(p_target, p_draft)
    kept = q * keep
    return kept + (1 - kept.sum()) * fallback


# ---------------------------------------------------------------- sampling

def _reset(pair: Pair, state: RunState, prompt_ids: list[int]) -> None:
    """Back to the prefilled prefix: both caches hold all prompt tokens but the last."""
    crop(state.target_cache, len(prompt_ids) - 1)
    pair.drafter.roll_back(state.draft_state, list(prompt_ids))
    state.committed, state.generated, state.finished = list(prompt_ids), [], False


def speculative_samples(pair: Pair, prompt_ids: list[int], s: SpecSettings, faults: Faults,
                        n: int, position: int = 1, on_progress: Progress | None = None) -> tuple[torch.Tensor, float]:
    """Counts (V,) of the token at `position` over n independent speculative runs, and
    the share of runs whose first draft token was accepted."""
    run = SpecSettings(**{**s.to_dict(), "max_new_tokens": position})
    gen = torch.Generator().manual_seed(s.seed)
    kind = ChainCycle(pair, run, faults)
    state = start_run(pair, prompt_ids)  # prefilled once; every sample starts from it
    counts = torch.zeros(pair.target.full_vocab_size, dtype=torch.long)
    first_accepted = 0
    every = max(1, n // 50)  # about 50 progress reports per run
    for i in range(n):
        if on_progress and i % every == 0:
            on_progress(i / n)
        _reset(pair, state, prompt_ids)
        for rec in run_cycles(kind, state, record=False, gen=gen):  # one generator over all samples
            first_accepted += rec["cycle"] == 0 and rec["num_accepted"] > 0
        counts[state.generated[position - 1]] += 1
    return counts, first_accepted / max(n, 1)


def plain_samples(probs: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Counts (V,) of n draws from the target's own distribution, as plain decoding draws."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(probs.shape[-1], dtype=torch.long)
    for _ in range(n):
        counts[sample(probs, gen)] += 1
    return counts


# ---------------------------------------------------------------- the test

def chi2_survival(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof): the regularised upper incomplete gamma
    Q(dof/2, statistic/2). torch has it, so the app needs no scipy."""
    if statistic <= 0:
        return 1.0
    q = torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                torch.tensor(statistic / 2, dtype=torch.float64))
    return float(q)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> ChiSquare:
    """Pearson chi-square of counts against probs; cells expecting fewer than 5 are pooled.

    A count in a cell the target gives probability zero is impossible under the target:
    it pools into the rare cell, whose tiny expectation makes the statistic explode, as it should.
    """
    n = float(counts.sum())
    expected = probs.double() * n
    observed = counts.double()
    big = expected >= MIN_EXPECTED
    exp_cells = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    obs_cells = torch.cat([observed[big], observed[~big].sum(0, keepdim=True)])
    if float(exp_cells[-1]) < 1e-12 and float(obs_cells[-1]) == 0:
        exp_cells, obs_cells = exp_cells[:-1], obs_cells[:-1]  # no rare cell at all
    stat = float(((obs_cells - exp_cells) ** 2 / exp_cells.clamp(min=1e-12)).sum())
    dof = max(len(exp_cells) - 1, 1)
    return ChiSquare(stat, dof, chi2_survival(stat, dof), len(exp_cells))


def run_lab(pair: Pair, prompt_ids: list[int], s: SpecSettings, faults: Faults, n: int,
            position: int = 1, on_progress: Progress | None = None) -> LabResult:
    """Everything the exactness lab shows for one prefix, rule and sample count.

    `on_progress` hears the share done of the speculative sampling, which is nearly all the time."""
    p_target, p_draft = next_token_probs(pair, prompt_ids, s)
    exact = p_target if position == 1 else second_token_probs(pair, prompt_ids, s, p_target)
    predicted = predicted_first_token(p_target, p_draft, faults.acceptance_rule, faults.greedy_draft) \
        if position == 1 else None
    spec_counts, accepted = speculative_samples(pair, prompt_ids, s, faults, n, position, on_progress)
    if position == 1:
        plain_counts = plain_samples(exact, n, s.seed + 1)
    else:  # two plain draws in a row: the first token, then the next given it
        plain_counts = plain_second_token_samples(pair, prompt_ids, s, p_target, n)
    return LabResult(position, n, exact.tolist(), None if predicted is None else predicted.tolist(),
                     spec_counts.tolist(), plain_counts.tolist(), chi_square(spec_counts, exact),
                     chi_square(plain_counts, exact), accepted)


@torch.inference_mode()
def plain_second_token_samples(pair: Pair, prompt_ids: list[int], s: SpecSettings,
                               first: torch.Tensor, n: int) -> torch.Tensor:
    """Plain decoding twice: x1 from the target, then x2 from the target given x1."""
    gen = torch.Generator().manual_seed(s.seed + 1)
    counts = torch.zeros_like(first, dtype=torch.long)
    second: dict[int, torch.Tensor] = {}  # one target pass per distinct first token
    for _ in range(n):
        x1 = sample(first, gen)
        if x1 not in second:
            logits = pair.target.forward(prompt_ids + [x1], pair.target.new_cache())[-1]
            second[x1] = warp_probs(logits, s).cpu()
        counts[sample(second[x1], gen)] += 1
    return counts
