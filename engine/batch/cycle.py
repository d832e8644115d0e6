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

from engine.batch.cache import RowsKVCache, new_rows_cache, roll_back_row
from engine.batch.forward import check_batchable, forward_rows
from engine.batch.records import BatchCycle, RowCycle, row_outputs
from engine.config import SettingsError, SpecSettings, refuse_empty_prompt
from engine.cycle.pair import Pair
from engine.cycle.reference import Decision, accept_reject, commit_tokens
from engine.drafters.model import ModelDrafter
from engine.kv.layouts import run_capacity
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


# ---------------------------------------------------------------- starting a batch

def check_batch(pair: Pair, prompts_ids: list[list[int]], seeds: list[int], budgets: list[int]) -> None:
    """Refuse what this batched cycle cannot run exactly, with the reason."""
    drafter = pair.drafter
    if not isinstance(drafter, ModelDrafter) or pair.draft is None or drafter.model is not pair.draft:
        raise SettingsError("batched speculation runs the draft-model drafter only (no lookup, EAGLE or trees yet)")
    if drafter.mis_set or drafter.greedy_proposals or not drafter.crop_rejected or not drafter.catch_up:
        raise SettingsError("batched speculation runs a correctly set draft model only (no planted mis-setting or fault)")
    if not prompts_ids or not len(prompts_ids) == len(seeds) == len(budgets):
        raise SettingsError(f"one seed and one budget per prompt: {len(prompts_ids)} prompts, {len(seeds)} seeds, "
                            f"{len(budgets)} budgets")
    for prompt in prompts_ids:
        refuse_empty_prompt(prompt)
    if any(isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_NEW_TOKENS for b in budgets):
        raise SettingsError(f"every row's max_new_tokens must be an integer between 1 and {MAX_NEW_TOKENS}, got {budgets}")
    check_batchable(pair.target)
    check_batchable(pair.draft)


def batch_capacity(prompts_ids: list[list[int]], k: int, budgets: list[int]) -> int:
    """Slots per row: the longest row's peak (engine.kv.layouts.run_capacity). An idle row keeps writing
    fillers at its final length .. + K, which that bound covers."""
    return max(run_capacity(len(p), k, b) for p, b in zip(prompts_ids, budgets, strict=True))


def prefill_rows(model: LoadedModel, cache: RowsKVCache, prompts_ids: list[list[int]]) -> None:
    """Cache every prompt token but the last (it opens the first cycle), all rows in one forward;
    shorter rows are padded at the end, and the padding's slots stay stale (never attended)."""
    heads = [p[:-1] for p in prompts_ids]
    width = max(len(h) for h in heads)
    if width == 0:
        return
    padded = [h + [h[-1] if h else p[-1]] * (width - len(h)) for h, p in zip(heads, prompts_ids)]
    forward_rows(model, cache, padded, [len(h) for h in heads], logits=False)


def start_batch(pair: Pair, prompts_ids: list[list[int]], s: SpecSettings, seeds: list[int],
                max_new_tokens: list[int] | None = None) -> BatchState:
    """Check, allocate both ragged caches and prefill them; one generator per row."""
    budgets = list(max_new_tokens) if max_new_tokens is not None else [s.max_new_tokens] * len(prompts_ids)
    check_batch(pair, prompts_ids, seeds, budgets)
    capacity = batch_capacity(prompts_ids, s.k, budgets)
    b = len(prompts_ids)
    target_cache = new_rows_cache(pair.target.model.config, b, capacity)
    draft_cache = new_rows_cache(pair.draft.model.config, b, capacity)
    prefill_rows(pair.target, target_cache, prompts_ids)
    prefill_rows(pair.draft, draft_cache, prompts_ids)
    return BatchState(pair, s, [list(p) for p in prompts_ids], budgets,
                      [torch.Generator().manual_seed(seed) for seed in seeds], target_cache, draft_cache,
                      [len(p) for p in prompts_ids], [False] * b)


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


def draft_rows(state: BatchState) -> Drafted:
    """K batched draft steps, then the d_K step; a row of the draft cache advances only while the row is active."""
    s, draft, cache = state.settings, state.pair.draft, state.draft_cache
    feed, fillers, tokens, dists = last_tokens(state), last_tokens(state), [], []
    for _ in range(s.k):
        probs = warp_probs(forward_rows(draft, cache, [[t] for t in feed], appends(state))[:, -1], s).cpu()  # (B, V)
        feed = draw_rows(probs, state, fillers)
        tokens.append(feed)
        dists.append(probs)
    forward_rows(draft, cache, [[t] for t in feed], appends(state), logits=False)  # d_K, rolled back unless all pass
    return Drafted([list(row) for row in zip(*tokens)], torch.stack(dists, dim=1))


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
               finished: bool, lengths: dict[str, list[int]]) -> RowCycle:
    """Row r's part of the cycle's record; `lengths` holds both caches' per-row lengths at each stage."""
    target = CacheLengths(before=lengths["target_before"][r], after_append=lengths["target_appended"][r],
                          after_rollback=lengths["target_after"][r])
    draft = CacheLengths(before=lengths["draft_before"][r], after_append=lengths["draft_appended"][r],
                         after_rollback=lengths["draft_after"][r])
    if d is None:
        return RowCycle(r, True, target_cache_len=target, draft_cache_len=draft, finished=True)
    tokens = drafted.token_ids[r]
    idx = torch.arange(len(tokens))
    return RowCycle(r, False, list(tokens), drafted.p_draft[r][idx, tokens].tolist(), p_target[r][idx, tokens].tolist(),
                    d.accept_prob, d.u, d.num_accepted, d.next_token_id, committed, finished, target, draft)


def run_batch_cycle(state: BatchState, cycle: int) -> BatchCycle:
    """Draft, verify, decide, commit, roll back, for every row; returns the cycle's record."""
    start = time.perf_counter()
    device = state.pair.target.device
    lengths = {"target_before": list(state.target_cache.lengths), "draft_before": list(state.draft_cache.lengths)}
    was_active = state.active()
    drafted, draft_s = timed(lambda: draft_rows(state), state.pair.draft.device)
    p_target, verify_s = timed(lambda: verify_rows(state, drafted), device)
    lengths.update(target_appended=list(state.target_cache.lengths), draft_appended=list(state.draft_cache.lengths))
    decisions = decide_rows(state, drafted, p_target)
    committed = commit_rows(state, drafted, decisions)
    roll_back_rows(state, [r for r, a in enumerate(was_active) if a])
    lengths.update(target_after=list(state.target_cache.lengths), draft_after=list(state.draft_cache.lengths))
    rows = [row_record(r, drafted, p_target, decisions[r], committed[r], state.finished[r], lengths)
            for r in range(len(decisions))]
    total = time.perf_counter() - start
    return BatchCycle(cycle, rows, draft_s, verify_s, max(0.0, total - draft_s - verify_s))


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
