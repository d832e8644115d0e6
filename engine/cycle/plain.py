"""Plain decoding, what speculation is measured against: the target alone, one token per forward.

One loop (`decode_plain`) for every way of running it; only the step differs:
- `target_generate`: one request on the reference path (a one-token forward over its cache);
- `batched_plain_generate`: B requests in one forward per step over the ragged rows cache
  (engine/kv/rows.py), each row drawing with its own generator (greedy at temperature 0). A
  finished row (its budget or an EOS) stays in every forward, appending nothing, as in the batched
  cycle: `idle_row_steps` counts them;
- the fast path's device-side step (engine/cycle/fast.py fast_plain_decode).
"""
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch
from transformers import DynamicCache

from engine.config import SpecSettings
from engine.kv.layouts import run_capacity
from engine.kv.ops import prefill
from engine.kv.rows import forward_rows, new_rows_cache, prefill_rows
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.models.sampling import draw, warp_probs

Token = TypeVar("Token")  # an int on the host, a device scalar on the fast path, a list of ints for a batch


def decode_plain(step: Callable[[Token], Token], last: Token, max_new_tokens: int,
                 stop: Callable[[Token], bool]) -> list[Token]:
    """Plain (target-only) decoding's one loop: `step` turns the last token into the next, until
    max_new_tokens or a token `stop` ends the run on. The step is all that differs between the
    reference path, the sweep, a batch and the fast path (which stops nowhere: no per-token sync)."""
    out = []
    while len(out) < max_new_tokens:
        last = step(last)
        out.append(last)
        if stop(last):
            break
    return out


def target_step(target: LoadedModel, cache: DynamicCache, s: SpecSettings) -> Callable[[int], int]:
    """One plain decoding step of the target over `cache`, one forward per token, with the
    run's own generator (seeded from the settings, as a speculative run's)."""
    gen = torch.Generator().manual_seed(s.seed)
    return lambda last: draw(warp_probs(target.forward([last], cache)[-1], s), s, gen)


def target_generate(target: LoadedModel, prompt_ids: list[int], s: SpecSettings,
                    eos_ids: set[int]) -> list[int]:
    """Plain autoregressive decoding of the target alone, one token per forward."""
    step = target_step(target, prefill(target, prompt_ids), s)
    return decode_plain(step, prompt_ids[-1], s.max_new_tokens, lambda t: t in eos_ids)


@dataclass
class PlainBatch:
    outputs: list[list[int]]  # each row's generated tokens
    steps: int  # batched forwards after the prefill
    idle_row_steps: int  # row slots spent on finished rows
    prefill_s: float = 0.0  # reading the prompts (engine/kv/rows.py prefill_rows)
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
    outputs: list[list[int]] = [[] for _ in prompts_ids]
    done = [False] * len(prompts_ids)
    idle = [0]

    def step(last: list[int]) -> list[int]:
        probs = warp_probs(forward_rows(target, cache, [[t] for t in last], [int(not d) for d in done])[:, -1], s)
        probs = probs.cpu()  # (B, V)
        idle[0] += sum(done)
        nxt = list(last)
        for r in range(len(last)):
            if not done[r]:
                nxt[r] = draw(probs[r], s, gens[r])
                outputs[r].append(nxt[r])
                done[r] = len(outputs[r]) >= budgets[r] or nxt[r] in eos_ids
        return nxt

    steps = decode_plain(step, [p[-1] for p in prompts_ids], max(budgets), lambda last: all(done))
    return PlainBatch(outputs, len(steps), idle[0], prefill_s, time.perf_counter() - decoding)  # each step ends on the host
