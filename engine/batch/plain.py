"""Plain batched decoding on the engine's ragged cache: what batched speculation is measured against.

One target forward of one token per row per step, each row drawing its next token from the
target's warped distribution with its own generator (engine.models.sampling.draw, as plain
decoding of one request does: greedy at temperature 0). A finished row (its budget or an EOS)
stays in every forward, appending nothing, as in the batched cycle: `idle_row_steps` counts them.
"""
import time
from dataclasses import dataclass

import torch

from engine.batch.cache import new_rows_cache
from engine.batch.cycle import prefill_rows
from engine.batch.forward import forward_rows
from engine.config import SpecSettings
from engine.kv.layouts import run_capacity
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.models.sampling import draw, warp_probs


@dataclass
class PlainBatch:
    outputs: list[list[int]]  # each row's generated tokens
    steps: int  # batched forwards after the prefill
    idle_row_steps: int  # row slots spent on finished rows
    prefill_s: float = 0.0  # reading the prompts (engine/batch/cycle.py prefill_rows)
    decode_s: float = 0.0  # the steps after it, their draws included


@torch.inference_mode()
def batched_plain_generate(target: LoadedModel, prompts_ids: list[list[int]], s: SpecSettings, seeds: list[int],
                           eos_ids: set[int], max_new_tokens: list[int] | None = None) -> PlainBatch:
    """Decode every row plainly, B rows per forward, until each has its budget or an EOS."""
    budgets = list(max_new_tokens) if max_new_tokens is not None else [s.max_new_tokens] * len(prompts_ids)
    cache = new_rows_cache(target.model.config, len(prompts_ids),
                           max(run_capacity(len(p), 1, b) for p, b in zip(prompts_ids, budgets)))
    _, prefill_s = timed(lambda: prefill_rows(target, cache, prompts_ids), target.device)
    decoding = time.perf_counter()
    gens = [torch.Generator().manual_seed(seed) for seed in seeds]
    last = [p[-1] for p in prompts_ids]
    outputs: list[list[int]] = [[] for _ in prompts_ids]
    done = [False] * len(prompts_ids)
    steps = idle = 0
    while not all(done):
        probs = warp_probs(forward_rows(target, cache, [[t] for t in last], [int(not d) for d in done])[:, -1], s)
        probs = probs.cpu()  # (B, V)
        for r in range(len(last)):
            if done[r]:
                idle += 1
                continue
            last[r] = draw(probs[r], s, gens[r])
            outputs[r].append(last[r])
            done[r] = len(outputs[r]) >= budgets[r] or last[r] in eos_ids
        steps += 1
    return PlainBatch(outputs, steps, idle, prefill_s, time.perf_counter() - decoding)  # each step ends on the host
