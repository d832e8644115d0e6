"""The one loop every cycle kind runs in: start a run, run cycles until the budget or EOS, commit, record.

A cycle kind is what differs between the chain on the reference path (reference.py), the
chain kept on the device (fast.py) and the tree (engine/tree/cycle.py). It plugs four steps
into this loop, each with a typed result:
- `start(prompt_ids)`: prefill the caches, start the drafter; returns the run's state, which
  has `committed`, `generated` and `finished` (the driver's) beside the kind's own caches;
- `step(state, gen, record)`: draft, verify once, decide; returns a `CycleStep`, before
  anything is committed;
- `settle(state, step)`: after the commit, roll back or compact each cache and let the
  drafter catch up; returns the cache lengths and layout states as a `Settled`;
- `describe(state, step, committed, texts)`: the record's description fields (`record=True`).
The commit (engine.trace.commit's rule: cut at EOS and at the budget) and the record
(record.py) are the driver's, so they are the same for every kind.
"""
import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from engine.config import SpecSettings, refuse_empty_prompt
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.record import cycle_record
from engine.cycle.step import CycleStep, Settled
from engine.trace.commit import final_tokens


class RunProgress(Protocol):
    """What the driver reads and writes of a kind's run state."""

    committed: list[int]  # the prompt and every committed token
    generated: list[int]  # the committed tokens after the prompt
    finished: bool


class CycleKind(Protocol):
    """One kind of cycle (see the module's docstring); `pair` and `settings` are the run's."""

    pair: Pair
    settings: SpecSettings

    def check(self) -> None: ...  # refuse settings the kind cannot run, before anything starts

    def start(self, prompt_ids: list[int]) -> Any: ...

    def step(self, state: Any, gen: torch.Generator, record: bool) -> CycleStep: ...

    def settle(self, state: Any, step: CycleStep) -> Settled: ...

    def describe(self, state: Any, step: CycleStep, committed: list[int], texts: TokenTexts) -> dict: ...


def start(kind: CycleKind, prompt_ids: list[int]) -> Any:
    """The run's state, prefilled; an empty prompt is refused here for every kind."""
    refuse_empty_prompt(prompt_ids)
    return kind.start(list(prompt_ids))


def commit(state: RunProgress, step: CycleStep, max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    """Make the cycle's tokens final: the accepted ones and the next token, cut at the first EOS and at
    the token budget (engine.trace.commit, the rule the trace checks apply)."""
    budget = max_new_tokens - len(state.generated)
    committed, state.finished = final_tokens(step.accepted_token_ids + [step.next_token_id], budget, eos_ids)
    state.committed += committed
    state.generated += committed
    return committed


def run_one_cycle(kind: CycleKind, state: Any, gen: torch.Generator, cycle: int, texts: TokenTexts,
                  record: bool = True) -> dict:
    """Step, commit, settle; returns the cycle's trace record (without the description when not `record`)."""
    committed_len_before = len(state.committed)
    cycle_start = time.perf_counter()
    step = kind.step(state, gen, record)
    committed = commit(state, step, kind.settings.max_new_tokens, kind.pair.eos_ids)
    settled = kind.settle(state, step)
    cycle_s = time.perf_counter() - cycle_start
    description = kind.describe(state, step, committed, texts) if record else None
    return cycle_record(cycle, committed_len_before, step, committed, state.finished, settled, cycle_s, description)


def generate(kind: CycleKind, prompt_ids: list[int], record: bool = True) -> Iterator[dict]:
    """Check the settings, start the run, then yield one record per cycle until EOS or the token budget."""
    kind.check()
    yield from run_cycles(kind, start(kind, prompt_ids), record)


def run_cycles(kind: CycleKind, state: Any, record: bool = True,
               gen: torch.Generator | None = None) -> Iterator[dict]:
    """The one loop: cycles over a started run until EOS or the budget, one record each; a caller may
    look at `state` between records (the teaching probes do). The run's random draws come from one
    generator seeded from the settings, or from `gen` (the exactness lab draws many runs from one)."""
    gen = gen if gen is not None else torch.Generator().manual_seed(kind.settings.seed)
    texts = TokenTexts(kind.pair.target.tokenizer)
    cycle = 0
    while not state.finished:
        yield run_one_cycle(kind, state, gen, cycle, texts, record)
        cycle += 1
