"""The K advisor per batch size: which K to speculate with at batch B on this machine, or none.

At batch B a cycle costs K batched draft steps, the d_K forward (the batched cycle feeds it every
time), and one verify of B x (K+1) positions; it commits E[tokens per cycle] tokens in every row.
Plain batched decoding commits one token per row per batched step. So, per second over all rows:

    speculating:  B x E[tokens | alpha, K] / ((K + 1) t_draft(B) + t_verify(B, K+1) + t_other(B))
    plain:        B / t_step(B)

with E[tokens | alpha, K] = (1 - alpha^(K+1)) / (1 - alpha) (Leviathan et al. 2023). At B = 1 a
verify of K+1 positions costs about one step (the weights are read once either way), so speculation
pays. As B grows the verify's B x (K+1) rows make it compute-bound, while the plain step's B rows
still ride on one read of the weights: t_verify(B, K+1) grows towards (K+1) t_step(B) and the gain
goes (vLLM #26504: acceptance flat from batch 1 to 32, speculation +23% at 1 and -16% at 32).
Every time here is measured on this machine (`measure_batch_costs`), per batch size and width.

That formula holds while every row is busy (continuous batching refills a finished row at once). A
static batch of requests with N new tokens each runs until its slowest row is done, and rows accept
different numbers of tokens, so it needs E[max over its B rows of the cycles a row needs for N tokens]
cycles, more than N / E[tokens] and more as B grows: another reason the gain shrinks with the batch.
`BatchLoad` estimates that expectation by drawing rows' cycles (each row with the acceptance measured
for one request, each draft passing with probability alpha until the first rejection). Measured on
tiny-shakespeare at B = 8, K = 4 (32 tokens a request): 13 cycles a batch, where N / E[tokens] is 9.
Rows that stop early at an EOS are not modelled.
"""
import functools
import random
import time
from dataclasses import dataclass
from statistics import fmean, median

import torch

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.kv.rows import forward_rows, new_rows_cache, prefill_rows
from engine.models.sampling import draw, warp_probs
from engine.stats.batch_results import PLAIN_K
from engine.trace.metrics import expected_tokens_per_cycle


@dataclass(frozen=True)
class BatchLoad:
    """What the batch decodes: each request's acceptance alpha (a pilot's, one per request), and the new
    tokens per request when the batch is static (None: continuous batching, no row waits for another)."""

    alphas: tuple[float, ...]
    tokens: int | None = None
    trials: int = 300  # batches drawn per estimate: the estimate's spread is about 1% of its mean at B = 8

    def batch_cycles(self, k: int, batch: int) -> float:
        """E[cycles of a static batch of B rows]: its slowest row's, rows drawn from the measured requests."""
        return static_batch_cycles(self.alphas, self.tokens, self.trials, k, batch)


def row_cycles(alpha: float, k: int, tokens: int, rng: random.Random) -> int:
    """Cycles one row needs for `tokens` tokens: each commits its accepted drafts and one more."""
    committed = cycles = 0
    while committed < tokens:
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        committed, cycles = committed + accepted + 1, cycles + 1
    return cycles


@functools.lru_cache(maxsize=256)  # the advice and the predictions ask for the same (K, B): draw once
def static_batch_cycles(alphas: tuple[float, ...], tokens: int, trials: int, k: int, batch: int) -> float:
    """`BatchLoad.batch_cycles`, seeded, so the same numbers give the same advice every time."""
    rng = random.Random(0)
    return fmean(max(row_cycles(rng.choice(alphas), k, tokens, rng) for _ in range(batch)) for _ in range(trials))


@dataclass(frozen=True)
class BatchCosts:
    """One batch size's forwards on this machine (medians of repeated timings, seconds)."""

    batch: int
    target_step_s: float  # a plain batched step: B rows of one position
    draft_step_s: float  # one batched draft step: B rows of one position
    verify_s: dict[int, float]  # width -> a target forward of B rows x width positions
    other_s: float = 0.0  # per cycle beyond the forwards (ratio tests, commits, rollbacks), measured by a run

    def plain_goodput(self) -> float:
        return self.batch / self.target_step_s

    def cycle_s(self, k: int) -> float:
        return (k + 1) * self.draft_step_s + self.verify_s[k + 1] + self.other_s

    def goodput(self, load: BatchLoad, k: int) -> float:
        """Committed tokens per second over all rows, speculating with K on `load`."""
        if load.tokens is None:  # every row busy: each commits E[tokens | its alpha, K] a cycle
            return self.batch * fmean(expected_tokens_per_cycle(a, k) for a in load.alphas) / self.cycle_s(k)
        return self.batch * load.tokens / (load.batch_cycles(k, self.batch) * self.cycle_s(k))


def advise_batch_k(load: BatchLoad, costs: BatchCosts) -> int:
    """The K (1.. the widest width measured - 1) with the highest predicted goodput; PLAIN_K when plain
    batched decoding is predicted faster than every K (ties: the smaller K, then plain)."""
    ks = sorted(w - 1 for w in costs.verify_s if w >= 2)
    predicted = {k: costs.goodput(load, k) for k in ks}
    best = max(ks, key=lambda k: (predicted[k], -k))
    return best if predicted[best] > costs.plain_goodput() else PLAIN_K


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median(times)


@torch.inference_mode()
def time_rows(model, prompts_ids: list[list[int]], width: int, repeats: int, s: SpecSettings,
              draws: bool = False) -> float:
    """One forward of every row's `width` next positions after its prompt, rolled back after each timing,
    with what the cycle does to its logits: warp them and bring them to the host (and, with `draws`, each
    row's draw, as a plain step and a draft step make one). Timing the forward alone predicted a batched
    cycle at B = 4 on tiny-shakespeare 35-50% faster than it ran."""
    cache = new_rows_cache(model.model.config, len(prompts_ids), max(len(p) for p in prompts_ids) + width + 1)
    prefill_rows(model, cache, prompts_ids)
    held = list(cache.lengths)
    ids = [[p[-1]] * width for p in prompts_ids]
    gen = torch.Generator().manual_seed(0)

    def once() -> None:
        probs = warp_probs(forward_rows(model, cache, ids, [width] * len(ids)), s).cpu()  # (B, width, V)
        for r in range(len(ids) if draws else 0):
            draw(probs[r, -1], s, gen)
        cache.lengths = list(held)

    once()  # one-off costs (kernels chosen for this shape)
    return _median_time(once, repeats)


def measure_batch_costs(pair: Pair, prompts_ids: list[list[int]], widths: list[int], repeats: int = 5,
                        s: SpecSettings | None = None) -> BatchCosts:
    """This machine's forwards at batch len(prompts_ids), as the cycles run them with settings `s` (default:
    greedy): a plain step, a draft step (each with its draws), and a verify per width."""
    s = s or SpecSettings(temperature=0.0)
    return BatchCosts(len(prompts_ids), time_rows(pair.target, prompts_ids, 1, repeats, s, draws=True),
                      time_rows(pair.draft, prompts_ids, 1, repeats, s, draws=True),
                      {w: time_rows(pair.target, prompts_ids, w, repeats, s) for w in widths})
