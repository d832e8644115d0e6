"""The batched speculative cycle for the draft-model drafter, chains only (gpt-fast style: one step per function).

One cycle for B rows:
1. `draft_rows`: K batched draft forwards of one token per row; each active row draws its
   token from its own warped distribution with its own generator. Then one more forward feeds
   d_K (gpt-fast's "fill last token into draft model", as the fast path does): every row's draft
   cache then holds the positions up to d_K, so a row that accepts all K needs no catch-up and
   a row that rejects earlier just rolls back further. Every forward has the same shape.
2. `verify_rows`: one target forward over every row's [last committed, d1..dK].
3. `decide_rows`: per row, the engine's one ratio test (engine.cycle.reference.accept_reject:
   left to right, residual at the first rejection, bonus after K passes) on that row's
   distributions with that row's generator.
4. `commit_rows`: per row, the engine's commit rule (reference.commit_tokens: cut at the first
   EOS and at the row's budget).
5. `roll_back_rows`: both caches of each row back to its committed length - 1 (the engine's
   convention: the last committed token opens the next cycle), each row to its own length.

Randomness is per row: row r draws from a CPU generator seeded with seeds[r], in the order the
single-request reference path draws (K draft draws, then one per tested position, then the
resampled or bonus token), so a row equals the single-request run with that seed up to float32
rounding of the batched kernels. At temperature 0 no draw decides anything and each row's
output is plain greedy decoding of its prompt.

A row that finished (its budget or an EOS) becomes idle: it keeps its slot in every batched
forward (fed its last token, appending nothing), decides nothing, and is counted in the records.
`settings.seed` and `settings.cache_layout` are not read: the seeds are per row, the layout is
engine/batch/cache.py's.
"""
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from engine.batch.cache import RowsKVCache, new_rows_cache, num_layers_of, roll_back_row, write_row
from engine.batch.forward import check_batchable, forward_rows
from engine.batch.records import BatchCycle, RowCycle, row_outputs
from engine.config import SettingsError, SpecSettings, refuse_empty_prompt
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.record import describe_cycle, shown_tensors
from engine.cycle.reference import Decision, accept_reject, commit_tokens
from engine.drafters.model import ModelDrafter
from engine.kv.layouts import CacheFullError, attended_kv, run_capacity
from engine.kv.ops import prefill
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.models.sampling import draw, warp_probs
from engine.trace.format import CacheLengths
from engine.trace.schema import MAX_NEW_TOKENS


@dataclass
class BatchState:
    """What persists between cycles: per row the committed ids, budget, generator; both ragged caches."""

    pair: Pair
    settings: SpecSettings
    committed: list[list[int]]  # per row: the prompt and every committed token
    budgets: list[int]  # per row: max_new_tokens
    gens: list[torch.Generator]
    target_cache: RowsKVCache
    draft_cache: RowsKVCache
    prompt_lens: list[int] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)

    def generated(self, row: int) -> list[int]:
        return self.committed[row][self.prompt_lens[row]:]

    def active(self) -> list[bool]:
        return [not f for f in self.finished]


@dataclass
class Drafted:
    token_ids: list[list[int]]  # (B, K); an idle row's are fillers, never tested
    p_draft: torch.Tensor  # (B, K, V) warped, on the CPU
    step_times_s: list[float] = field(default_factory=list)  # (K,) each batched draft step, its draws included
    feed_s: float = 0.0  # the d_K forward (a single run's catch-up after a full accept)


# ---------------------------------------------------------------- starting a batch

def check_batch_pair(pair: Pair) -> None:
    """Refuse a pair this batched cycle cannot run exactly, with the reason (before anything is written)."""
    drafter = pair.drafter
    if not isinstance(drafter, ModelDrafter) or pair.draft is None or drafter.model is not pair.draft:
        raise SettingsError("batched speculation runs the draft-model drafter only (no lookup, EAGLE or trees yet)")
    if drafter.mis_set or drafter.greedy_proposals or not drafter.crop_rejected or not drafter.catch_up:
        raise SettingsError("batched speculation runs a correctly set draft model only (no planted mis-setting or fault)")
    for model in (pair.target, pair.draft):
        try:
            check_batchable(model)
            num_layers_of(model.model.config)
        except ValueError as err:
            raise SettingsError(str(err)) from None


def check_batch(pair: Pair, prompts_ids: list[list[int]], seeds: list[int], budgets: list[int]) -> None:
    """Refuse what this batched cycle cannot run exactly, with the reason."""
    check_batch_pair(pair)
    if not prompts_ids or not len(prompts_ids) == len(seeds) == len(budgets):
        raise SettingsError(f"one seed and one budget per prompt: {len(prompts_ids)} prompts, {len(seeds)} seeds, "
                            f"{len(budgets)} budgets")
    for prompt in prompts_ids:
        refuse_empty_prompt(prompt)
    if any(isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_NEW_TOKENS for b in budgets):
        raise SettingsError(f"every row's max_new_tokens must be an integer between 1 and {MAX_NEW_TOKENS}, got {budgets}")


def batch_capacity(prompts_ids: list[list[int]], k: int, budgets: list[int]) -> int:
    """Slots per row: the longest row's peak (engine.kv.layouts.run_capacity). An idle row keeps writing
    fillers at its final length .. + K, which that bound covers."""
    return max(run_capacity(len(p), k, b) for p, b in zip(prompts_ids, budgets, strict=True))


def prefill_row(model: LoadedModel, cache: RowsKVCache, row: int, prompt_ids: list[int]) -> None:
    """Row `row` caches every prompt token but the last (it opens the first cycle): the prompt is read alone,
    by the engine's prefill of one sequence, and copied into the row's slots."""
    if len(prompt_ids) > 1:
        write_row(cache, row, attended_kv(prefill(model, prompt_ids)))
    else:
        cache.lengths[row] = 0  # nothing to read: the one prompt token opens the first cycle


def prefill_rows(model: LoadedModel, cache: RowsKVCache, prompts_ids: list[list[int]]) -> None:
    """Every row's prompt, each read alone (`prefill_row`). A prefill is compute-bound, so one forward over
    prompts padded to the longest would only add work: with prompts of 35 to 250 positions, a padded batch
    of 16 reads half as many positions again as the prompts hold."""
    for row, prompt_ids in enumerate(prompts_ids):
        prefill_row(model, cache, row, prompt_ids)


def start_batch(pair: Pair, prompts_ids: list[list[int]], s: SpecSettings, seeds: list[int],
                max_new_tokens: list[int] | None = None, capacity: int | None = None) -> BatchState:
    """Check, allocate both ragged caches and prefill them; one generator per row. `capacity`: slots
    per row, when requests that join later (`admit_row`) need more than these prompts do."""
    budgets = list(max_new_tokens) if max_new_tokens is not None else [s.max_new_tokens] * len(prompts_ids)
    check_batch(pair, prompts_ids, seeds, budgets)
    capacity = max(capacity or 0, batch_capacity(prompts_ids, s.k, budgets))
    b = len(prompts_ids)
    target_cache = new_rows_cache(pair.target.model.config, b, capacity)
    draft_cache = new_rows_cache(pair.draft.model.config, b, capacity)
    prefill_rows(pair.target, target_cache, prompts_ids)
    prefill_rows(pair.draft, draft_cache, prompts_ids)
    return BatchState(pair, s, [list(p) for p in prompts_ids], budgets,
                      [torch.Generator().manual_seed(seed) for seed in seeds], target_cache, draft_cache,
                      [len(p) for p in prompts_ids], [False] * b)


def admit_row(state: BatchState, row: int, prompt_ids: list[int], seed: int, budget: int) -> None:
    """Continuous batching: a finished row takes a new request. Its prompt is read alone (the engine's
    prefill of one sequence) and copied into the row's slots of both caches, while the other rows
    wait; the row gets a fresh generator seeded with `seed`, as the request's single run would."""
    if not state.finished[row]:
        raise ValueError(f"row {row} is still running its request")
    check_batch(state.pair, [prompt_ids], [seed], [budget])
    need = run_capacity(len(prompt_ids), state.settings.k, budget)
    if need > state.target_cache.capacity:
        raise CacheFullError(f"a request of {len(prompt_ids)} prompt tokens and {budget} new ones needs {need} "
                             f"slots; the batch holds {state.target_cache.capacity} per row")
    for model, cache in ((state.pair.target, state.target_cache), (state.pair.draft, state.draft_cache)):
        prefill_row(model, cache, row, prompt_ids)
    state.committed[row], state.prompt_lens[row], state.budgets[row] = list(prompt_ids), len(prompt_ids), budget
    state.gens[row], state.finished[row] = torch.Generator().manual_seed(seed), False


# ---------------------------------------------------------------- one cycle, step by step

def last_tokens(state: BatchState) -> list[int]:
    return [c[-1] for c in state.committed]


def appends(state: BatchState) -> list[int]:
    """Positions each row appends per input token: 1 when active, 0 when idle."""
    return [int(a) for a in state.active()]


def draw_rows(probs: torch.Tensor, state: BatchState, fillers: list[int]) -> list[int]:
    """Each active row's token from its (V,) distribution with its own generator; an idle row keeps its filler."""
    s = state.settings
    return [draw(probs[r], s, state.gens[r]) if active else fillers[r] for r, active in enumerate(state.active())]


def draft_step(state: BatchState, fed: list[int], fillers: list[int]) -> tuple[torch.Tensor, list[int]]:
    """One batched draft forward of one token per row: the warped (B, V) distributions on the CPU and each row's draw."""
    logits = forward_rows(state.pair.draft, state.draft_cache, [[t] for t in fed], appends(state))  # (B, 1, V)
    probs = warp_probs(logits[:, -1], state.settings).cpu()
    return probs, draw_rows(probs, state, fillers)


def draft_rows(state: BatchState) -> Drafted:
    """K batched draft steps, then the d_K step; a row of the draft cache advances only while the row is active."""
    s, draft, cache = state.settings, state.pair.draft, state.draft_cache
    feed, fillers, tokens, dists, times = last_tokens(state), last_tokens(state), [], [], []
    for _ in range(s.k):
        (probs, feed), seconds = timed(lambda fed=feed: draft_step(state, fed, fillers), draft.device)
        tokens.append(feed)
        dists.append(probs)
        times.append(seconds)
    # d_K, rolled back unless all pass
    _, feed_s = timed(lambda: forward_rows(draft, cache, [[t] for t in feed], appends(state), logits=False), draft.device)
    return Drafted([list(row) for row in zip(*tokens)], torch.stack(dists, dim=1), times, feed_s)


def verify_rows(state: BatchState, drafted: Drafted) -> torch.Tensor:
    """One target forward over every row's [last committed, d1..dK]: warped (B, K+1, V) on the CPU."""
    ids = [[last, *d] for last, d in zip(last_tokens(state), drafted.token_ids)]
    width = state.settings.k + 1
    logits = forward_rows(state.pair.target, state.target_cache, ids, [width * a for a in appends(state)])
    return warp_probs(logits, state.settings).cpu()


def decide_rows(state: BatchState, drafted: Drafted, p_target: torch.Tensor) -> list[Decision | None]:
    """The engine's ratio test (reference.accept_reject) per active row, with the row's generator."""
    return [accept_reject(drafted.token_ids[r], drafted.p_draft[r], p_target[r], state.gens[r]) if active else None
            for r, active in enumerate(state.active())]


def commit_rows(state: BatchState, drafted: Drafted, decisions: list[Decision | None]) -> list[list[int]]:
    """Each active row's final tokens (reference.commit_tokens: cut at EOS and at its budget)."""
    out = []
    for r, d in enumerate(decisions):
        if d is None:
            out.append([])
            continue
        budget = state.budgets[r] - len(state.generated(r))
        committed, finished = commit_tokens(drafted.token_ids[r], d, budget, state.pair.eos_ids)
        state.committed[r] += committed
        state.finished[r] = finished
        out.append(committed)
    return out


def roll_back_rows(state: BatchState, rows: list[int]) -> None:
    """Both caches of each given row back to its committed length - 1."""
    for r in rows:
        keep = len(state.committed[r]) - 1
        roll_back_row(state.target_cache, r, keep)
        roll_back_row(state.draft_cache, r, keep)


# ---------------------------------------------------------------- records and the loop

def row_record(r: int, drafted: Drafted, p_target: torch.Tensor, d: Decision | None, committed: list[int],
               finished: bool, lengths: dict[str, list[int]], committed_len_before: int,
               texts: TokenTexts | None, n_top: int) -> RowCycle:
    """Row r's part of the cycle's record; `lengths` holds both caches' per-row lengths at each stage.
    With `texts`, also the description a single run's trace gives its cycle (engine/cycle/record.py)."""
    target = CacheLengths(before=lengths["target_before"][r], after_append=lengths["target_appended"][r],
                          after_rollback=lengths["target_after"][r])
    draft = CacheLengths(before=lengths["draft_before"][r], after_append=lengths["draft_appended"][r],
                         after_rollback=lengths["draft_after"][r])
    if d is None:
        return RowCycle(r, True, target_cache_len=target, draft_cache_len=draft, finished=True,
                        committed_len_before=committed_len_before)
    tokens = drafted.token_ids[r]
    idx = torch.arange(len(tokens))
    description = None
    if texts is not None:
        shown = shown_tensors(tokens, drafted.p_draft[r], p_target[r], d.residual_probs, d.num_accepted,
                              d.next_token_id, n_top)
        description = describe_cycle({name: t.tolist() for name, t in shown.items()}, list(tokens), d.num_accepted,
                                     d.next_token_id, d.accept_prob, d.u, committed, texts)
    return RowCycle(r, False, list(tokens), drafted.p_draft[r][idx, tokens].tolist(), p_target[r][idx, tokens].tolist(),
                    d.accept_prob, d.u, d.num_accepted, d.next_token_id, committed, finished, target, draft,
                    committed_len_before, description)


def run_batch_cycle(state: BatchState, cycle: int, texts: TokenTexts | None = None) -> BatchCycle:
    """Draft, verify, decide, commit, roll back, for every row; returns the cycle's record (with each
    active row's trace description when `texts` is given)."""
    start = time.perf_counter()
    device = state.pair.target.device
    lengths = {"target_before": list(state.target_cache.lengths), "draft_before": list(state.draft_cache.lengths)}
    committed_before = [len(c) for c in state.committed]
    was_active = state.active()
    drafted, draft_s = timed(lambda: draft_rows(state), state.pair.draft.device)
    p_target, verify_s = timed(lambda: verify_rows(state, drafted), device)
    lengths.update(target_appended=list(state.target_cache.lengths), draft_appended=list(state.draft_cache.lengths))
    decisions = decide_rows(state, drafted, p_target)
    committed = commit_rows(state, drafted, decisions)
    roll_back_rows(state, [r for r, a in enumerate(was_active) if a])
    lengths.update(target_after=list(state.target_cache.lengths), draft_after=list(state.draft_cache.lengths))
    rows = [row_record(r, drafted, p_target, decisions[r], committed[r], state.finished[r], lengths,
                       committed_before[r], texts, state.settings.trace_top_k) for r in range(len(decisions))]
    total = time.perf_counter() - start
    return BatchCycle(cycle, rows, draft_s, verify_s, max(0.0, total - draft_s - verify_s), drafted.step_times_s,
                      drafted.feed_s)


def batched_speculative_generate(pair: Pair, prompts_ids: list[list[int]], s: SpecSettings, seeds: list[int],
                                 max_new_tokens: list[int] | None = None) -> Iterator[BatchCycle]:
    """Yield one `BatchCycle` per cycle until every row has finished (its budget or an EOS).
    `max_new_tokens` gives each row its own budget (default: s.max_new_tokens for all)."""
    state = start_batch(pair, prompts_ids, s, seeds, max_new_tokens)
    cycle = 0
    while not all(state.finished):
        yield run_batch_cycle(state, cycle)
        cycle += 1


def batched_generate(pair: Pair, prompts_ids: list[list[int]], s: SpecSettings, seeds: list[int],
                     max_new_tokens: list[int] | None = None) -> tuple[list[list[int]], list[BatchCycle]]:
    """Run the batch to the end: each row's generated tokens, and every cycle's record."""
    cycles = list(batched_speculative_generate(pair, prompts_ids, s, seeds, max_new_tokens))
    return row_outputs(cycles), cycles
