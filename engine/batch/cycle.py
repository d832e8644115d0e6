"""The batched chain's cycle kind: B requests in one cycle, each row exact on its own (gpt-fast style steps).

`BatchedChainCycle` is a row-shaped kind of the one driver (engine/cycle/driver.py), which owns the
generators, the commit, idle rows, admission and the records, as for every other kind. One cycle:
1. the drafter proposes K tokens for every row through its row interface (`propose_rows`: the draft
   model's batched steps, then the d_K step that makes a catch-up unnecessary);
2. `verify_rows`: one target forward over every row's [last committed, d1..dK];
3. per active row, the engine's one ratio test (engine/cycle/ratio_test.py) on that row's
   distributions with that row's generator;
4. (the driver commits each row: cut at the first EOS and at the row's budget)
5. `settle`: both caches of each row back to its committed length - 1 (the engine's convention:
   the last committed token opens the next cycle), each row to its own length.

Randomness is per row: row r draws from its own CPU generator, in the order the single-request
reference path draws (K draft draws, then one per tested position, then the resampled or bonus
token), so a row equals the single-request run with that seed up to float32 rounding of the
batched kernels. At temperature 0 each row's output is plain greedy decoding of its prompt.

A row that finished (its budget or an EOS) becomes idle: it keeps its slot in every batched forward
(fed its last token, appending nothing), decides nothing, and is counted. Each row of a cache is a
static buffer of the batch's capacity: its stale slots are the row's own rejected K/V, or an earlier
request's in that row. Every row of a cycle shares its draft steps, its verify and its d_K forward,
so each row's record gives the batch's times.
"""
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from engine.batch.report import BatchCycle, batch_cycle, row_outputs
from engine.config import SettingsError, SpecSettings, refuse_empty_prompt
from engine.cycle.driver import Admission, Row, RowsCycle, run_rows
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.ratio_test import Decision, accept_reject
from engine.cycle.step import CycleStep, Settled
from engine.cycle.trace_record import describe_cycle, shown_tensors
from engine.drafters.model import RowsProposal
from engine.kv.layouts import CacheFullError, run_capacity, static_layout_state
from engine.kv.rows import (
    RowsKVCache,
    check_batchable,
    forward_rows,
    new_rows_cache,
    num_layers_of,
    prefill_row,
    prefill_rows,
    roll_back_row,
)
from engine.models.device import timed
from engine.models.sampling import warp_probs
from engine.trace.format import CacheLengths
from engine.trace.schema import MAX_NEW_TOKENS


@dataclass
class BatchRow:
    """One row's progress (the driver's RunProgress): its request's prompt and committed tokens."""

    committed: list[int]  # the prompt and every committed token
    generated: list[int] = field(default_factory=list)  # the committed tokens after the prompt
    finished: bool = False
    target_high_water: int = 0  # one past the highest slot written in the row, by any request it ran
    draft_high_water: int = 0


@dataclass
class BatchState:
    """What persists between cycles: every row's progress and both ragged caches."""

    rows: list[BatchRow]
    target_cache: RowsKVCache
    draft_cache: RowsKVCache  # the drafter's state for every row

    def active(self) -> list[bool]:
        return [not row.finished for row in self.rows]


@dataclass
class BatchTimes:
    """The times every row of one cycle shares."""

    draft_s: float  # the K+1 batched draft forwards and each row's draws
    verify_s: float  # the one batched target forward and its warping
    draft_step_s: list[float]  # (K,) each batched draft step (part of draft_s)
    draft_feed_s: float  # the d_K forward (part of draft_s)


@dataclass
class BatchRowStep:
    """What one running row's settle and describe need of the cycle."""

    row: int
    decision: Decision
    p_draft: torch.Tensor  # (K, V) warped, on the CPU
    p_target: torch.Tensor  # (K+1, V) warped, on the CPU
    target_before: int
    target_appended: int
    draft_before: int
    draft_appended: int  # after the K steps and the d_K step
    times: BatchTimes


# ---------------------------------------------------------------- refusals and capacity

def check_batch_pair(pair: Pair) -> None:
    """Refuse a pair this batched cycle cannot run exactly, with the reason (before anything is written)."""
    drafter = pair.drafter
    if not hasattr(drafter, "propose_rows") or pair.draft is None or drafter.model is not pair.draft:
        raise SettingsError("batched speculation runs the draft-model drafter only (no lookup, EAGLE or trees yet)")
    if drafter.mis_set or drafter.greedy_proposals or not drafter.crop_rejected or not drafter.catch_up:
        raise SettingsError("batched speculation runs a correctly set draft model only (no planted mis-setting or fault)")
    for model in (pair.target, pair.draft):
        try:
            check_batchable(model)
            num_layers_of(model.model.config)
        except ValueError as err:
            raise SettingsError(str(err)) from None


def check_batch(pair: Pair, prompts_ids: list[list[int]], budgets: list[int]) -> None:
    """Refuse what this batched cycle cannot run exactly, with the reason."""
    check_batch_pair(pair)
    if not prompts_ids or len(prompts_ids) != len(budgets):
        raise SettingsError(f"one budget per prompt: {len(prompts_ids)} prompts, {len(budgets)} budgets")
    for prompt in prompts_ids:
        refuse_empty_prompt(prompt)
    if any(isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_NEW_TOKENS for b in budgets):
        raise SettingsError(f"every row's max_new_tokens must be an integer between 1 and {MAX_NEW_TOKENS}, got {budgets}")


def batch_capacity(prompts_ids: list[list[int]], k: int, budgets: list[int]) -> int:
    """Slots per row: the longest row's peak (engine.kv.layouts.run_capacity). An idle row keeps writing
    fillers at its final length .. + K, which that bound covers."""
    return max(run_capacity(len(p), k, b) for p, b in zip(prompts_ids, budgets, strict=True))


# ---------------------------------------------------------------- the kind

@dataclass
class BatchedChainCycle:
    """The chain's cycle over B rows; `capacity`: slots per row, when requests that join later need more
    than the first prompts do. `settings.seed` is not read (each row's generator is the driver's), nor
    `settings.cache_layout` (each row is a static buffer of engine/kv/rows.py)."""

    pair: Pair
    settings: SpecSettings
    capacity: int = 0

    def check(self) -> None:
        check_batch_pair(self.pair)

    def start(self, prompts_ids: list[list[int]], budgets: list[int]) -> BatchState:
        """Check, allocate both ragged caches and prefill them, each prompt read alone."""
        check_batch(self.pair, prompts_ids, budgets)
        self.capacity = max(self.capacity, batch_capacity(prompts_ids, self.settings.k, budgets))
        target_cache = new_rows_cache(self.pair.target.model.config, len(prompts_ids), self.capacity)
        prefill_rows(self.pair.target, target_cache, prompts_ids)
        draft_cache = self.pair.drafter.start_rows(prompts_ids, self.capacity)
        rows = [BatchRow(list(p), target_high_water=len(p) - 1, draft_high_water=len(p) - 1) for p in prompts_ids]
        return BatchState(rows, target_cache, draft_cache)

    def rows(self, state: BatchState) -> list[BatchRow]:
        return state.rows

    def admit(self, state: BatchState, row: int, prompt_ids: list[int], budget: int) -> None:
        """Continuous batching: a finished row takes a new request. Its prompt is read alone and copied into
        the row's slots of both caches, while the other rows wait."""
        if not state.rows[row].finished:
            raise ValueError(f"row {row} is still running its request")
        check_batch(self.pair, [prompt_ids], [budget])
        need = run_capacity(len(prompt_ids), self.settings.k, budget)
        if need > state.target_cache.capacity:
            raise CacheFullError(f"a request of {len(prompt_ids)} prompt tokens and {budget} new ones needs {need} "
                                 f"slots; the batch holds {state.target_cache.capacity} per row")
        prefill_row(self.pair.target, state.target_cache, row, prompt_ids)
        self.pair.drafter.admit_row(state.draft_cache, row, prompt_ids)
        old = state.rows[row]
        state.rows[row] = BatchRow(list(prompt_ids), target_high_water=old.target_high_water,
                                   draft_high_water=old.draft_high_water)

    def step(self, state: BatchState, gens: list[torch.Generator | None], record: bool) -> list[CycleStep | None]:
        s, active = self.settings, state.active()
        target_before, draft_before = list(state.target_cache.lengths), list(state.draft_cache.lengths)
        last = [row.committed[-1] for row in state.rows]
        proposal, draft_s = timed(lambda: self.pair.drafter.propose_rows(state.draft_cache, last, active, s.k, s, gens),
                                  self.pair.draft.device)
        p_target, verify_s = timed(lambda: verify_rows(self, state, last, proposal, active), self.pair.target.device)
        times = BatchTimes(draft_s, verify_s, proposal.step_times_s, proposal.feed_s)
        steps: list[CycleStep | None] = []
        for r, running in enumerate(active):
            if not running:
                steps.append(None)
                continue
            tokens = proposal.token_ids[r]
            d = accept_reject(tokens, proposal.p_draft[r], p_target[r], gens[r])
            detail = BatchRowStep(r, d, proposal.p_draft[r], p_target[r], target_before[r],
                                  state.target_cache.lengths[r], draft_before[r], state.draft_cache.lengths[r], times)
            steps.append(CycleStep(tokens[:d.num_accepted], d.next_token_id, list(tokens), s.k + 1,
                                   list(proposal.step_times_s), verify_s, None, detail))
        return steps

    def settle(self, state: BatchState, steps: list[CycleStep | None]) -> list[Settled]:
        """Each running row's caches back to its committed length - 1; an idle row's lengths stay."""
        settled = []
        for r, step in enumerate(steps):
            if step is None:
                held = CacheLengths(before=state.target_cache.lengths[r], after_append=state.target_cache.lengths[r],
                                    after_rollback=state.target_cache.lengths[r])
                settled.append(Settled(held, dict(held), {}, False, 0.0))
                continue
            keep = len(state.rows[r].committed) - 1
            roll_back_row(state.target_cache, r, keep)
            self.pair.drafter.roll_back_row(state.draft_cache, r, state.rows[r].committed)
            settled.append(settle_row(state.rows[r], step.detail, keep, self.settings.k, state.target_cache.capacity))
        return settled

    def describe(self, state: BatchState, row: int, step: CycleStep, committed: list[int], texts: TokenTexts) -> dict:
        d: BatchRowStep = step.detail
        decision, tokens = d.decision, step.draft_token_ids
        shown = shown_tensors(tokens, d.p_draft, d.p_target, decision.residual_probs, decision.num_accepted,
                              decision.next_token_id, self.settings.trace_top_k)
        return describe_cycle({name: t.tolist() for name, t in shown.items()}, tokens, decision.num_accepted,
                              decision.next_token_id, decision.accept_prob, decision.u, committed, texts)


def verify_rows(kind: BatchedChainCycle, state: BatchState, last: list[int], proposal: RowsProposal,
                active: list[bool]) -> torch.Tensor:
    """One target forward over every row's [last committed, d1..dK]: warped (B, K+1, V) on the CPU."""
    ids = [[t, *d] for t, d in zip(last, proposal.token_ids)]
    width = kind.settings.k + 1
    logits = forward_rows(kind.pair.target, state.target_cache, ids, [width * a for a in active])
    return warp_probs(logits, kind.settings).cpu()


def settle_row(row: BatchRow, d: BatchRowStep, keep: int, k: int, capacity: int) -> Settled:
    """One running row's cache lengths and static layout states for its record. The record counts K draft
    steps (the d_K forward is the catch-up when all K pass, as a single run's), and the row's buffers'
    high water marks include the d_K step's slot."""
    draft_appended = d.draft_before + k

    def target_state(length: int) -> dict:
        row.target_high_water = max(row.target_high_water, length)
        return static_layout_state(length, row.target_high_water, capacity)

    def draft_state(length: int) -> dict:
        row.draft_high_water = max(row.draft_high_water, length)
        return static_layout_state(length, row.draft_high_water, capacity)

    target = {moment: target_state(n) for moment, n in
              (("before", d.target_before), ("after_append", d.target_appended), ("after_rollback", keep))}
    draft = {"before": draft_state(d.draft_before), "after_append": draft_state(draft_appended)}
    row.draft_high_water = max(row.draft_high_water, d.draft_appended)  # the d_K forward's slot
    draft["after_rollback"] = draft_state(keep)
    return Settled(CacheLengths(before=d.target_before, after_append=d.target_appended, after_rollback=keep),
                   CacheLengths(before=d.draft_before, after_append=draft_appended, after_rollback=keep),
                   {"target_cache_layout_state": target, "draft_cache_layout_state": draft},
                   keep > draft_appended, d.times.draft_feed_s)


# ---------------------------------------------------------------- running a batch through the driver

@dataclass
class Batch:
    """A started batch: the kind, its state and the driver's rows (each row's generator and budget)."""

    kind: BatchedChainCycle
    state: BatchState
    rows: list[Row]


def start_batch(pair: Pair, prompts_ids: list[list[int]], s: SpecSettings, seeds: list[int],
                max_new_tokens: list[int] | None = None, capacity: int = 0, requests: list | None = None) -> Batch:
    """Check, allocate and prefill; row r draws from a generator seeded with seeds[r] and runs
    max_new_tokens[r] tokens (default: s.max_new_tokens for all); `requests` names what each row runs."""
    budgets = list(max_new_tokens) if max_new_tokens is not None else [s.max_new_tokens] * len(prompts_ids)
    if len(seeds) != len(prompts_ids):
        raise SettingsError(f"one seed per prompt: {len(prompts_ids)} prompts, {len(seeds)} seeds")
    kind = BatchedChainCycle(pair, s, capacity)
    state = kind.start(prompts_ids, budgets)
    names = requests if requests is not None else list(range(len(prompts_ids)))
    rows = [Row(torch.Generator().manual_seed(seed), budget, name) for seed, budget, name in zip(seeds, budgets, names)]
    return Batch(kind, state, rows)


def run_batch(batch: Batch, record: bool = False,
              admit: Callable[[int], Admission | None] | None = None) -> Iterator[RowsCycle]:
    """The batch's cycles through the one driver loop, until every row has finished."""
    return run_rows(batch.kind, batch.state, batch.rows, record, admit)


def batched_speculative_generate(pair: Pair, prompts_ids: list[list[int]], s: SpecSettings, seeds: list[int],
                                 max_new_tokens: list[int] | None = None) -> Iterator[BatchCycle]:
    """Yield one `BatchCycle` per cycle until every row has finished (its budget or an EOS)."""
    for done in run_batch(start_batch(pair, prompts_ids, s, seeds, max_new_tokens)):
        yield batch_cycle(done)


def batched_generate(pair: Pair, prompts_ids: list[list[int]], s: SpecSettings, seeds: list[int],
                     max_new_tokens: list[int] | None = None) -> tuple[list[list[int]], list[BatchCycle]]:
    """Run the batch to the end: each row's generated tokens, and every cycle's report."""
    cycles = list(batched_speculative_generate(pair, prompts_ids, s, seeds, max_new_tokens))
    return row_outputs(cycles), cycles
