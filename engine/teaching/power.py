"""How many samples the exactness lab needs to catch a broken acceptance rule.

The lab (engine/teaching/exactness.py) tests speculative samples against the target's
distribution p0 with Pearson's chi-square, pooling cells that expect fewer than
MIN_EXPECTED counts. A broken rule samples from another distribution p1, which
`predicted_first_token` works out from both models. The test's power is the chance
that n samples from p1 are rejected at the significance level.

Two ways to get it, which the tests check against each other:
- `approximate_power`: the large-sample law of the statistic under p1, a noncentral
  chi-square with the pooled cells' degrees of freedom and noncentrality
  n * sum((p1 - p0)^2 / p0) (Cochran 1952; Cohen 1988, ch. 7). Deterministic and cheap,
  so `samples_for_power` searches with it.
- `simulated_power`: many seeded runs of exactly the lab's test on multinomial draws
  from p1. Exact up to its sampling noise, so it checks the approximation.

The lab's verdict on one result is here too: how far the rule's distribution is from the
target's (`rule_distance`) and how often its test would catch it (`catch_chance`).

Imports torch and engine.teaching.exactness only.
"""
import math

import torch

from engine.teaching.exactness import MIN_EXPECTED, LabResult, chi2_survival


def pooled(probs: torch.Tensor, n: int) -> torch.Tensor:
    """(V,) bool: the cells the lab keeps apart at n samples (the rest pool into one)."""
    return probs.double() * n >= MIN_EXPECTED


def cells_of(p: torch.Tensor, keep: torch.Tensor, with_rest: bool) -> torch.Tensor:
    """(C,) the kept cells' probabilities, then (with_rest) the pooled rest."""
    p = p.double()
    return torch.cat([p[keep], p[~keep].sum(0, keepdim=True)]) if with_rest else p[keep]


def has_rest(p_null: torch.Tensor, keep: torch.Tensor) -> bool:
    """Whether the lab's test has a pooled cell: only when p0 gives the pooled cells some mass."""
    return float(p_null.double()[~keep].sum()) >= 1e-12


def critical_value(dof: int, alpha: float) -> float:
    """The statistic above which the lab rejects: chi2_survival(x, dof) = alpha, by bisection."""
    low, high = 0.0, float(dof) + 10.0
    while chi2_survival(high, dof) > alpha:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if chi2_survival(mid, dof) > alpha else (low, mid)
    return high


def noncentral_chi2_survival(x: float, dof: int, noncentrality: float) -> float:
    """P(X > x) for a noncentral chi-square: a Poisson(lambda/2) mixture of central ones."""
    half = noncentrality / 2
    centre = int(half)
    total = 0.0
    for j in range(max(0, centre - 60 - int(6 * math.sqrt(half))), centre + 60 + int(6 * math.sqrt(half))):
        weight = math.exp(-half + j * math.log(half) - math.lgamma(j + 1)) if half > 0 else float(j == 0)
        total += weight * chi2_survival(x, dof + 2 * j)
    return min(total, 1.0)


def approximate_power(p_true: torch.Tensor, p_null: torch.Tensor, n: int, alpha: float) -> float:
    """Chance that the lab's test rejects n samples drawn from p_true, large-sample law.

    Where p0 is zero but p_true is not, one such count rejects outright (the lab's statistic
    explodes): that happens with probability 1 - (1 - outside)^n, independently enough of the rest."""
    keep = pooled(p_null, n)
    rest = has_rest(p_null, keep)
    null, true = cells_of(p_null, keep, rest), cells_of(p_true, keep, rest)
    outside = 0.0 if rest else float(p_true.double()[~keep].sum())
    noncentrality = n * float(((true - null) ** 2 / null).sum())
    dof = max(len(null) - 1, 1)
    caught = noncentral_chi2_survival(critical_value(dof, alpha), dof, noncentrality)
    return 1 - (1 - outside) ** n * (1 - caught)


def simulated_power(p_true: torch.Tensor, p_null: torch.Tensor, n: int, alpha: float,
                    runs: int = 2000, seed: int = 0) -> float:
    """Share of `runs` seeded runs of the lab's test, on n draws from p_true, that reject."""
    gen = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(p_true.double().expand(runs, -1), n, replacement=True, generator=gen)  # (runs, n)
    counts = torch.zeros(runs, p_true.numel(), dtype=torch.float64).scatter_add_(
        1, draws, torch.ones_like(draws, dtype=torch.float64))  # (runs, V)
    keep = pooled(p_null, n)
    rest = has_rest(p_null, keep)
    expected = cells_of(p_null, keep, rest) * n  # (C,)
    outside = counts[:, ~keep].sum(1, keepdim=True)  # (runs, 1)
    observed = torch.cat([counts[:, keep], outside], 1) if rest else counts[:, keep]  # (runs, C)
    statistic = ((observed - expected) ** 2 / expected).sum(1)  # (runs,)
    dof = max(len(expected) - 1, 1)
    rejected = statistic > critical_value(dof, alpha)
    if not rest:  # a count where p0 is zero is impossible under the target: the lab rejects it
        rejected |= outside[:, 0] > 0
    return float(rejected.double().mean())


def samples_for_power(p_true: torch.Tensor, p_null: torch.Tensor, power: float = 0.99, alpha: float = 0.01,
                      smallest: int = 50, largest: int = 1_000_000) -> int | None:
    """The least n >= smallest (to 2%) at which the approximate power reaches `power`; None
    when even `largest` samples do not (a correct rule: then the power stays at alpha)."""
    if approximate_power(p_true, p_null, smallest, alpha) >= power:
        return smallest
    low, n = smallest, 2 * smallest
    while approximate_power(p_true, p_null, n, alpha) < power:
        if n >= largest:
            return None
        low, n = n, min(2 * n, largest)
    while n - low > max(1, n // 50):
        mid = (low + n) // 2
        low, n = (mid, n) if approximate_power(p_true, p_null, mid, alpha) < power else (low, mid)
    return n


# ---------------------------------------------------------------- the lab's settings

SIGNIFICANCE = 0.01  # the lab calls a histogram "not the target's" at p < 1%
LAB_POWER = 0.99  # each broken rule's default sample count catches it at least this often
SAMPLE_COUNTS = (100, 200, 400, 1000, 2000, 5000)  # the lab's choices
DEFAULT_SAMPLES = 200  # for the correct rule, which no sample count "catches"


def default_samples(p_rule: torch.Tensor, p_target: torch.Tensor) -> int:
    """The smallest of SAMPLE_COUNTS whose test catches a rule that samples p_rule with LAB_POWER
    (the largest if none does); DEFAULT_SAMPLES when p_rule is the target's distribution."""
    needed = samples_for_power(p_rule, p_target, LAB_POWER, SIGNIFICANCE, largest=SAMPLE_COUNTS[-1])
    if needed is None and approximate_power(p_rule, p_target, SAMPLE_COUNTS[-1], SIGNIFICANCE) <= 2 * SIGNIFICANCE:
        return DEFAULT_SAMPLES  # nothing to catch: the correct rule (or one indistinguishable from it)
    return next((n for n in SAMPLE_COUNTS if needed is not None and n >= needed), SAMPLE_COUNTS[-1])


# ---------------------------------------------------------------- the lab's verdict on one result

# Total variation from the target below which a rule counts as correct: the correct rule's
# worked-out distribution equals the target's up to float32 rounding (about 1e-7 per token,
# summed over the vocabulary), and a rule 1e-4 off would take some 10^8 samples to catch.
CORRECT_WITHIN_TV = 1e-4


def rule_distance(res: LabResult) -> float | None:
    """Total variation between the rule's worked-out distribution and the target's (next token only)."""
    if res.predicted is None:
        return None
    return 0.5 * sum(abs(a - b) for a, b in zip(res.predicted, res.exact))


def catch_chance(res: LabResult) -> float | None:
    """How often the test catches this broken rule at this sample count; None for a correct rule
    or for the token after next (whose rule distribution is not worked out)."""
    gap = rule_distance(res)
    if gap is None or gap <= CORRECT_WITHIN_TV:
        return None
    return approximate_power(torch.tensor(res.predicted), torch.tensor(res.exact), res.samples, SIGNIFICANCE)


def samples_for_result(found: LabResult | None) -> int:
    """The sample count for the rule a stored result sampled (default_samples on its worked-out
    distribution); DEFAULT_SAMPLES with no result, or one for the token after next."""
    if found is None or found.predicted is None:
        return DEFAULT_SAMPLES
    return default_samples(torch.tensor(found.predicted), torch.tensor(found.exact))
