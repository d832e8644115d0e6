"""Stale K/V that corrupts and stale K/V that does not: the rollback page's side-by-side.

A run that "keeps the rejected K/V" (the teaching fault) leaves rejected entries *inside*
the attended range: the cache length never moves back, so the next query attends to them
and every later token is written at a shifted position. A static cache also keeps
rejected K/V in memory, but *past* its write position: a query at position p attends to
slots 0..p only (the causal mask), so those slots get an attention weight of exactly 0
and the next append overwrites them. This module runs the correct engine on a static
cache and measures, after every cycle, how much attention its stale slots receive.
"""
from dataclasses import dataclass

import torch

from engine.config import SpecSettings
from engine.cycle.driver import run_cycles
from engine.cycle.pair import Pair
from engine.cycle.reference import ChainCycle, start_run
from engine.kv.layouts import roll_back_static
from engine.models.loading import LoadedModel
from engine.teaching.runs import eager_attention


@dataclass
class StaticCycle:
    cycle: int
    write_position: int  # = committed length - 1: the slots 0..write_position-1 are attended
    stale_slots: int  # rejected K/V left at write_position.. (before the next append overwrites them)
    attention_on_stale: float  # the target's attention from the next position on those slots (mean over layers, heads)
    attention_on_attended: float  # ... and on the attended slots, for contrast (sums to ~1 with the new position)


@dataclass
class StaticRun:
    generated: list[int]
    cycles: list[StaticCycle]


@torch.inference_mode()
def attention_over_buffer(m: LoadedModel, cache, token_id: int) -> torch.Tensor:
    """Attention of one new position over every slot of a static buffer: (capacity,), mean over layers and heads.

    The probe writes `token_id` at the write position (the token the next cycle writes
    there too) and then moves the position back, as a rollback would.
    """
    position = cache.write_position()
    ids = m.model_input([token_id])
    with eager_attention(m.model):
        out = m.model(input_ids=ids, use_cache=True, output_attentions=True, **{m.cache_arg: cache})
    roll_back_static(cache, position)
    return torch.stack([a[0, :, -1, :].float() for a in out.attentions]).mean(dim=(0, 1)).cpu()  # (capacity,)


def static_run(pair: Pair, prompt_ids: list[int], s: SpecSettings) -> StaticRun:
    """The correct engine on a static cache, with the attention its stale slots get after every cycle."""
    s = SpecSettings(**{**s.to_dict(), "cache_layout": "static"})
    state = start_run(pair, prompt_ids, s)
    cycles: list[StaticCycle] = []
    for rec in run_cycles(ChainCycle(pair, s), state, record=False):
        cache = state.target_cache
        stale = cache.stale_slots()
        weights = attention_over_buffer(pair.target, cache, state.committed[-1])
        pos = cache.write_position()  # the probe's own slot is `pos`; stale slots now start at pos + 1
        cycles.append(StaticCycle(rec["cycle"], pos, stale, float(weights[pos + 1: pos + stale].sum()),
                                  float(weights[:pos].sum())))
    return StaticRun(list(state.generated), cycles)
