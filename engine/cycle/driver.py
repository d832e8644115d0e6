"""The one loop every cycle kind runs in: start, run cycles over B rows until every row has finished, commit,
admit, record.

A cycle kind is what differs between the chain on the reference path (reference.py), the chain kept on
the device (fast.py), the tree (engine/tree/cycle.py) and the batched chain (engine/batch/cycle.py). The
loop is row-shaped: a kind runs B rows at once (`RowsKind`); a kind of one row (`CycleKind`, every kind
but the batch) runs through it as B = 1, wrapped by `OneRow`. A kind plugs its steps into the loop, each
with a typed result:
- `step`: draft, verify once, decide, for every row; one `CycleStep` per row (None for an idle row,
  one that finished and holds its slot), before anything is committed;
- `settle`: after the commit, roll back or compact each cache and let the drafter catch up; one
  `Settled` per row (an idle row's too: its lengths stay);
- `describe`: one row's record description fields (`record=True`).
What the loop owns is the same for every kind: each row's generator, the commit (engine.trace.commit's
rule: cut at EOS and at the row's budget), the records (trace_record.py), idle rows, and admission (a finished
row takes the next request the caller hands it: continuous batching).
"""
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from engine.config import SpecSettings, refuse_empty_prompt
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.step import CycleStep, Settled
from engine.cycle.trace_record import cycle_record
from engine.trace.commit import final_tokens


class RunProgress(Protocol):
    """What the driver reads and writes of one row's run state."""

    committed: list[int]  # the prompt and every committed token
    generated: list[int]  # the committed tokens after the prompt
    finished: bool


class CycleKind(Protocol):
    """A kind of one row (see the module's docstring); `pair` and `settings` are the run's."""

    pair: Pair
    settings: SpecSettings

    def check(self) -> None: ...  # refuse settings the kind cannot run, before anything starts

    def start(self, prompt_ids: list[int]) -> Any: ...  # the run's state, a RunProgress, prefilled

    def step(self, state: Any, gen: torch.Generator, record: bool) -> CycleStep: ...

    def settle(self, state: Any, step: CycleStep) -> Settled: ...

    def describe(self, state: Any, step: CycleStep, committed: list[int], texts: TokenTexts) -> dict: ...


class RowsKind(Protocol):
    """A kind of B rows: the loop's own interface (the batch implements it; `OneRow` wraps a CycleKind)."""

    pair: Pair
    settings: SpecSettings

    def rows(self, state: Any) -> list[RunProgress]: ...

    def step(self, state: Any, gens: list[torch.Generator | None], record: bool) -> list[CycleStep | None]: ...

    def settle(self, state: Any, steps: list[CycleStep | None]) -> list[Settled]: ...

    def describe(self, state: Any, row: int, step: CycleStep, committed: list[int], texts: TokenTexts) -> dict: ...

    def admit(self, state: Any, row: int, prompt_ids: list[int], budget: int) -> None: ...  # a finished row's next


@dataclass
class OneRow:
    """A one-row kind as the loop sees it: B = 1, its state the row's progress."""

    kind: CycleKind

    @property
    def pair(self) -> Pair:
        return self.kind.pair

    @property
    def settings(self) -> SpecSettings:
        return self.kind.settings

    def rows(self, state: Any) -> list[RunProgress]:
        return [state]

    def step(self, state: Any, gens: list[torch.Generator | None], record: bool) -> list[CycleStep | None]:
        return [self.kind.step(state, gens[0], record)]

    def settle(self, state: Any, steps: list[CycleStep | None]) -> list[Settled]:
        return [self.kind.settle(state, steps[0])]

    def describe(self, state: Any, row: int, step: CycleStep, committed: list[int], texts: TokenTexts) -> dict:
        return self.kind.describe(state, step, committed, texts)

    def admit(self, state: Any, row: int, prompt_ids: list[int], budget: int) -> None:
        raise ValueError(f"a {type(self.kind).__name__} runs one request; admission needs a batched kind")


@dataclass
class Row:
    """The loop's own bookkeeping of one row: what it runs, how it draws, its budget."""

    gen: torch.Generator | None  # None for a kind that draws from a stream of its own (the fast path)
    budget: int  # max_new_tokens of the request in the row
    request: Any = None  # the caller's name for that request (a workload's request index)
    cycle: int = 0  # the number the request's next cycle gets in its own trace


@dataclass
class Admission:
    """A request a finished row takes: its prompt, its generator's seed and its budget."""

    prompt_ids: list[int]
    seed: int
    budget: int
    request: Any = None


@dataclass
class Admitted:
    """A request a finished row took after a cycle, and the seconds its prompt took to read."""

    row: int
    request: Any
    prefill_s: float


@dataclass
class RowsCycle:
    """One cycle of every row, as the loop ran it."""

    cycle: int  # the loop's cycle number (a batch's; a single run's equals its record's)
    requests: list[Any]  # what each row ran in this cycle (Row.request), before any admission
    steps: list[CycleStep | None]  # None for an idle row
    committed: list[list[int]]  # what each row made final ([] when idle)
    settled: list[Settled]
    records: list[dict | None]  # each running row's trace record, None for an idle row
    cycle_s: float  # the whole cycle: step, commit, settle (the descriptions after it are not counted)
    admitted: list[Admitted] = field(default_factory=list)  # the requests finished rows took after the cycle


def start(kind: CycleKind, prompt_ids: list[int]) -> Any:
    """The run's state, prefilled; an empty prompt is refused here for every kind."""
    refuse_empty_prompt(prompt_ids)
    return kind.start(list(prompt_ids))


class Accepted(Protocol):
    num_accepted: int
    next_token_id: int


def commit_tokens(draft_tokens: list[int], d: Accepted, budget: int, eos_ids: set[int]) -> tuple[list[int], bool]:
    """Tokens a cycle makes final: the first `d.num_accepted` drafts and the resampled or bonus token, cut at
    the first EOS and at the token budget (engine.trace.commit, the rule the trace checks apply); and whether
    the row has finished."""
    return final_tokens(draft_tokens[:d.num_accepted] + [d.next_token_id], budget, eos_ids)


def commit(progress: RunProgress, step: CycleStep, budget: int, eos_ids: set[int]) -> list[int]:
    """Make one row's cycle final (`commit_tokens`, within what is left of the row's budget)."""
    committed, progress.finished = commit_tokens(step.accepted_token_ids, step, budget - len(progress.generated),
                                                 eos_ids)
    progress.committed += committed
    progress.generated += committed
    return committed


def run_rows_cycle(kind: RowsKind, state: Any, rows: list[Row], cycle: int, texts: TokenTexts,
                   record: bool = True) -> RowsCycle:
    """Step every row, commit each running one, settle; each running row's trace record."""
    progress = kind.rows(state)
    committed_len_before = [len(p.committed) for p in progress]
    cycle_start = time.perf_counter()
    steps = kind.step(state, [row.gen for row in rows], record)
    committed = [[] if step is None else commit(p, step, row.budget, kind.pair.eos_ids)
                 for p, step, row in zip(progress, steps, rows, strict=True)]
    settled = kind.settle(state, steps)
    cycle_s = time.perf_counter() - cycle_start
    records: list[dict | None] = []
    for r, (step, row) in enumerate(zip(steps, rows)):
        if step is None:
            records.append(None)
            continue
        description = kind.describe(state, r, step, committed[r], texts) if record else None
        records.append(cycle_record(row.cycle, committed_len_before[r], step, committed[r], progress[r].finished,
                                    settled[r], cycle_s, description))
        row.cycle += 1
    return RowsCycle(cycle, [row.request for row in rows], steps, committed, settled, records, cycle_s)


def admit_finished(kind: RowsKind, state: Any, rows: list[Row], done: RowsCycle,
                   admit: Callable[[int], Admission | None]) -> None:
    """Each row that finished in `done` takes the request `admit(row)` hands it, if any (continuous batching)."""
    for r, step in enumerate(done.steps):
        if step is None or not kind.rows(state)[r].finished:
            continue
        nxt = admit(r)
        if nxt is None:
            continue
        refuse_empty_prompt(nxt.prompt_ids)
        admitted = time.perf_counter()
        kind.admit(state, r, nxt.prompt_ids, nxt.budget)
        rows[r] = Row(torch.Generator().manual_seed(nxt.seed), nxt.budget, nxt.request)
        done.admitted.append(Admitted(r, nxt.request, time.perf_counter() - admitted))


def run_rows(kind: RowsKind, state: Any, rows: list[Row], record: bool = True,
             admit: Callable[[int], Admission | None] | None = None) -> Iterator[RowsCycle]:
    """The one loop: cycles over started rows until every row has finished, one RowsCycle each; a caller
    may look at `state` between cycles (the teaching probes do). After a cycle, and before it is yielded,
    each row that finished takes the request `admit` hands it (none when `admit` is None)."""
    texts = TokenTexts(kind.pair.target.tokenizer)
    cycle = 0
    while not all(p.finished for p in kind.rows(state)):
        done = run_rows_cycle(kind, state, rows, cycle, texts, record)
        if admit is not None:
            admit_finished(kind, state, rows, done, admit)
        yield done
        cycle += 1


def one_row(kind: CycleKind, gen: torch.Generator | None = None) -> tuple[OneRow, list[Row]]:
    """A one-row kind and its row: the run's draws from one generator seeded from the settings, or `gen`
    (the exactness lab draws many runs from one)."""
    gen = gen if gen is not None else torch.Generator().manual_seed(kind.settings.seed)
    return OneRow(kind), [Row(gen, kind.settings.max_new_tokens)]


def run_one_cycle(kind: CycleKind, state: Any, gen: torch.Generator | None, cycle: int, texts: TokenTexts,
                  record: bool = True) -> dict:
    """One cycle of a one-row run; returns its trace record (without the description when not `record`)."""
    rows_kind = OneRow(kind)
    row = Row(gen, kind.settings.max_new_tokens, cycle=cycle)
    return run_rows_cycle(rows_kind, state, [row], cycle, texts, record).records[0]


def run_cycles(kind: CycleKind, state: Any, record: bool = True,
               gen: torch.Generator | None = None) -> Iterator[dict]:
    """A started one-row run's records, one per cycle until EOS or the budget (`run_rows` with B = 1)."""
    rows_kind, rows = one_row(kind, gen)
    for done in run_rows(rows_kind, state, rows, record):
        yield done.records[0]


def generate(kind: CycleKind, prompt_ids: list[int], record: bool = True) -> Iterator[dict]:
    """Check the settings, start the run, then yield one record per cycle until EOS or the token budget."""
    kind.check()
    yield from run_cycles(kind, start(kind, prompt_ids), record)
