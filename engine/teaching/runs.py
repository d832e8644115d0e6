"""Correct and deliberately broken speculative runs side by side, for the teaching pages.

The broken modes live in `teaching_faults.Faults`; this module is the only caller that sets
them, and it never writes a trace file, so a broken run cannot be mistaken for a real
one. Each run is replayed with a mirror of both KV caches: for every cache cell we know
which token's K/V it holds and where that token sits in the committed sequence, so the
page can point at stale cells. After each cycle we probe the models at the next
position twice: once from the run's cache, once from a fresh prefill of the committed
sequence. A correct cache gives the same distribution up to float rounding.
"""
import copy
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from engine.config import SpecSettings
from engine.cycle.driver import run_cycles
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.plain import target_generate
from engine.cycle.reference import ChainCycle, RunState, start_run
from engine.kv.ops import cache_len, crop, prefill
from engine.models.loading import LoadedModel
from engine.stats.repeats import Repeated, repeat_timed
from engine.teaching.faults import NO_FAULTS, Faults
from engine.trace.metrics import acceptance_metrics
from engine.trace.schema import WEIGHTS_FLOAT32

CORRECT, KEEP_REJECTED, SKIP_CATCH_UP = "correct", "keep_rejected_kv", "skip_draft_catch_up"
MODES: dict[str, Faults] = {
    CORRECT: NO_FAULTS,
    KEEP_REJECTED: Faults(keep_rejected_kv=True),
    SKIP_CATCH_UP: Faults(skip_draft_catch_up=True),
}
MODE_LABELS = {
    CORRECT: "correct engine",
    KEEP_REJECTED: "broken: keeps rejected K/V",
    SKIP_CATCH_UP: "broken: forgets the draft catch-up",
}

# Status of one cache cell against the committed sequence.
IN_PLACE, STALE, SHIFTED = "in place", "stale", "shifted"
DRIFT_FLOOR = 1e-9  # distances below this are float noise; plotted at the floor


@dataclass(frozen=True)
class Cell:
    """One cache cell: whose K/V it holds and where that token belongs."""

    token_id: int
    source: int | None  # position of the token in the committed sequence; None if never committed


@dataclass
class CacheView:
    """A cache after a cycle, cell by cell, judged against the committed sequence."""

    token_ids: list[int]
    status: list[str]  # IN_PLACE, STALE or SHIFTED per cell
    missing: list[int]  # committed positions that no cell holds (a skipped catch-up)

    @property
    def num_stale(self) -> int:
        return self.status.count(STALE)


@dataclass
class CycleProbe:
    """One cycle of a run and what its caches make the models predict next."""

    cycle: int
    num_accepted: int
    rejected_position: int | None
    committed_len: int
    committed_token_ids: list[int]
    target_cache: CacheView
    draft_cache: CacheView
    target_tv: float  # total variation: cached vs fresh-prefill next-token distribution
    target_kl: float  # KL(fresh || cached)
    draft_tv: float
    draft_kl: float
    target_argmax_differs: bool
    attention: list[float]  # target's attention to each target cache cell (mean over layers, heads)

    @property
    def stale_attention(self) -> float:
        """Share of the target's attention that lands on stale cells."""
        return sum(a for a, s in zip(self.attention, self.target_cache.status) if s == STALE)


@dataclass
class RunLog:
    mode: str
    generated: list[int]
    cycles: list[CycleProbe]
    acceptance_rate: float
    mean_acceptance_length: float


@dataclass
class Comparison:
    """The correct run and both broken runs on one prompt, settings and seed."""

    prompt_ids: list[int]
    settings: dict
    reference: list[int] | None  # plain target decoding; only token-comparable when greedy
    runs: dict[str, RunLog]
    texts: dict[int, str] = field(default_factory=dict)  # decoded text of every id shown


# ---------------------------------------------------------------- mirroring the caches

def _source(i: int, token: int, base: int, num_accepted: int, committed: list[int]) -> int | None:
    """Committed position of draft token i (0-based), or None if it was not committed."""
    pos = base + i
    if i < num_accepted and pos < len(committed) and committed[pos] == token:
        return pos
    return None


def mirror_cycle(target_cells: list[Cell], draft_cells: list[Cell], rec: dict,
                 before: list[int], after: list[int]) -> tuple[list[Cell], list[Cell]]:
    """Replay one cycle's cache appends and rollback on the cell mirrors.

    The target appended [last committed, d1..dK] in verification; the draft appended
    [last committed, d1..d(K-1)] while proposing. Both were then cut to the recorded
    rollback length, and the draft may have been fed committed tokens it never saw.
    """
    base, n, drafts = len(before), rec["num_accepted"], rec["draft_token_ids"]
    fed = [Cell(before[-1], base - 1)]
    target = target_cells + fed + [Cell(t, _source(i, t, base, n, after)) for i, t in enumerate(drafts)]
    draft = draft_cells + fed + [Cell(t, _source(i, t, base, n, after)) for i, t in enumerate(drafts[:-1])]
    t_len, d_len = rec["target_cache_len"], rec["draft_cache_len"]
    target = target[: t_len["after_rollback"]]
    draft = draft[: min(d_len["after_append"], d_len["after_rollback"])]
    draft += [Cell(after[p], p) for p in range(len(draft), d_len["after_rollback"])]  # catch-up
    assert len(target) == t_len["after_rollback"] and len(draft) == d_len["after_rollback"]
    return target, draft


def judge_cells(cells: list[Cell], committed: list[int]) -> CacheView:
    """Mark each cell in place, stale (never committed) or shifted (right token, wrong position)."""
    status = [STALE if c.source is None else IN_PLACE if c.source == p else SHIFTED
              for p, c in enumerate(cells)]
    held = {c.source for c in cells}
    missing = [p for p in range(len(committed) - 1) if p not in held]
    return CacheView([c.token_id for c in cells], status, missing)


# ---------------------------------------------------------------- probing the next position

_ATTENTION_LOCK = threading.Lock()


@contextmanager
def eager_attention(model: torch.nn.Module):
    """Switch to the eager attention kernel, the only one that returns attention weights.

    The model may be shared (the app caches it per process), so the switch is held
    under a lock and always undone; eager and SDPA give the same outputs up to rounding.
    """
    with _ATTENTION_LOCK:
        before = model.config._attn_implementation
        model.set_attn_implementation("eager")
        try:
            yield
        finally:
            model.set_attn_implementation(before)


@torch.inference_mode()
def attention_to_cache(m: LoadedModel, cache, token_id: int) -> list[float]:
    """Attention weights (mean over layers and heads) of the next position on each cache cell."""
    ids = torch.tensor([[token_id]], device=m.device)
    if m.full_to_row is not None:
        ids = m.full_to_row[ids]
    with eager_attention(m.model):
        out = m.model(input_ids=ids, use_cache=True, output_attentions=True, **{m.cache_arg: cache})
    crop(cache, cache_len(cache) - 1)  # leave the cache as the run left it
    weights = torch.stack([a[0, :, -1, :].float() for a in out.attentions]).mean(dim=(0, 1))  # (cells+1,)
    return weights[:-1].cpu().tolist()  # the last key is the new position itself


@torch.inference_mode()
def next_distribution_from_cache(m: LoadedModel, cache, committed: list[int]) -> torch.Tensor:
    """The model's next-token distribution (temperature 1, unwarped) computed from `cache`."""
    logits = m.forward([committed[-1]], cache)[-1]
    crop(cache, cache_len(cache) - 1)
    return torch.softmax(logits, dim=-1).cpu()


@torch.inference_mode()
def next_distribution_fresh(m: LoadedModel, committed: list[int]) -> torch.Tensor:
    """The same distribution from a fresh pass over the whole committed sequence (no reused cache)."""
    logits = m.forward(committed, m.new_cache())[-1]
    return torch.softmax(logits, dim=-1).cpu()


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    return float(0.5 * (p - q).abs().sum())


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p || q) in nats; q is floored so a zero where p has mass stays finite."""
    mask = p > 0
    return float((p[mask] * (p[mask].log() - q[mask].clamp(min=1e-30).log())).sum().clamp(min=0.0))


# ---------------------------------------------------------------- one traced run

def probe_cycle(pair: Pair, state: RunState, rec: dict, target_cells: list[Cell],
                draft_cells: list[Cell]) -> CycleProbe:
    committed = state.committed
    t_cached = next_distribution_from_cache(pair.target, state.target_cache, committed)
    t_fresh = next_distribution_fresh(pair.target, committed)
    d_cached = next_distribution_from_cache(pair.draft, state.draft_cache, committed)
    d_fresh = next_distribution_fresh(pair.draft, committed)
    k = len(rec["draft_token_ids"])
    return CycleProbe(
        cycle=rec["cycle"], num_accepted=rec["num_accepted"],
        rejected_position=rec["num_accepted"] + 1 if rec["num_accepted"] < k else None,
        committed_len=len(committed), committed_token_ids=list(rec["committed_token_ids"]),
        target_cache=judge_cells(target_cells, committed), draft_cache=judge_cells(draft_cells, committed),
        target_tv=total_variation(t_fresh, t_cached), target_kl=kl_divergence(t_fresh, t_cached),
        draft_tv=total_variation(d_fresh, d_cached), draft_kl=kl_divergence(d_fresh, d_cached),
        target_argmax_differs=int(t_fresh.argmax()) != int(t_cached.argmax()),
        attention=attention_to_cache(pair.target, state.target_cache, committed[-1]),
    )


def traced_run(pair: Pair, prompt_ids: list[int], s: SpecSettings, mode: str,
               on_progress: Callable[[float], None] | None = None) -> RunLog:
    """Run the engine in `mode` (see MODES) and probe both caches after every cycle;
    `on_progress` hears the share of the new tokens generated so far."""
    state = start_run(pair, prompt_ids)
    target_cells = [Cell(t, p) for p, t in enumerate(prompt_ids[:-1])]
    draft_cells = list(target_cells)
    probes: list[CycleProbe] = []
    before = list(state.committed)
    for rec in run_cycles(ChainCycle(pair, s, MODES[mode]), state, record=False):
        target_cells, draft_cells = mirror_cycle(target_cells, draft_cells, rec, before, state.committed)
        probes.append(probe_cycle(pair, state, rec, target_cells, draft_cells))
        if on_progress:
            on_progress(min(1.0, len(state.generated) / max(s.max_new_tokens, 1)))
        before = list(state.committed)
    m = acceptance_metrics([p.num_accepted for p in probes], s.k)
    return RunLog(mode, list(state.generated), probes, m["acceptance_rate"], m["mean_acceptance_length"])


def compare_runs(pair: Pair, prompt_ids: list[int], s: SpecSettings,
                 on_progress: Callable[[float], None] | None = None) -> Comparison:
    """All three modes on one prompt, settings and seed, plus plain target decoding.

    `on_progress` hears the share of the work done (each mode a third; the plain reference is quick)."""
    report = on_progress or (lambda fraction: None)
    runs = {}
    for i, mode in enumerate(MODES):
        runs[mode] = traced_run(pair, prompt_ids, s, mode, lambda f, i=i: report((i + f) / len(MODES)))
    reference = target_generate(pair.target, prompt_ids, s, pair.eos_ids)
    texts = TokenTexts(pair.target.tokenizer)
    ids = set(prompt_ids) | set(reference)
    for run in runs.values():
        ids |= set(run.generated)
        for c in run.cycles:
            ids |= set(c.target_cache.token_ids) | set(c.draft_cache.token_ids)
    return Comparison(list(prompt_ids), s.to_dict(), reference, runs, {i: texts(i) for i in sorted(ids)})


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where a and b differ (a length difference counts), else None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---------------------------------------------------------------- cost of verification

@torch.inference_mode()
def forward_times(m: LoadedModel, prefix_ids: list[int], max_positions: int,
                  repeats: int = 7) -> list[Repeated]:
    """Time of one forward over n = 1..max_positions new positions after a cached prefix,
    each warmed up once and repeated (engine/stats/repeats.py: median and spread).

    Each timed call appends n positions to the prefix's cache and is cropped back, the
    way a verification pass is.
    """
    cache = prefill(m, prefix_ids)
    keep = cache_len(cache)
    feed = (list(prefix_ids) * max_positions)[-max_positions:]  # any real tokens will do

    def one_pass(n: int) -> None:
        m.forward(feed[:n], cache)
        crop(cache, keep)

    # engine.models.device.timed times each repeat (waiting for a GPU's queued work); repeats adds the spread
    return [repeat_timed(lambda n=n: one_pass(n), repeats, warmup=1, device=m.device)
            for n in range(1, max_positions + 1)]


# ---------------------------------------------------------------- greedy and floating point

@dataclass
class NumericsCheck:
    dtype: str
    max_abs_logit_diff: float  # stepwise vs batched, over the checked positions
    smallest_top2_gap: float  # closest near-tie among the checked positions (logits)
    argmax_flips: int  # positions where the two ways pick different greedy tokens
    positions: int


@torch.inference_mode()
def batched_vs_stepwise(m: LoadedModel, ids: list[int], positions: int) -> NumericsCheck:
    """Logits of the last `positions` tokens computed one decode step at a time vs in one
    verification-style pass over all of them. Mathematically equal; the kernels add
    numbers in a different order, so the results can differ in the last bits."""
    prefix, tail = ids[: len(ids) - positions], ids[len(ids) - positions:]
    step_cache, batch_cache = m.new_cache(), m.new_cache()
    m.forward(prefix, step_cache)
    m.forward(prefix, batch_cache)
    stepwise = torch.cat([m.forward([t], step_cache) for t in tail])  # (P, V)
    batched = m.forward(tail, batch_cache)  # (P, V)
    top2 = torch.topk(batched, 2, dim=-1).values
    return NumericsCheck(str(m.dtype).removeprefix("torch."), float((stepwise - batched).abs().max()),
                         float((top2[:, 0] - top2[:, 1]).min()),
                         int((stepwise.argmax(-1) != batched.argmax(-1)).sum()), positions)


def low_precision_copy(m: LoadedModel, dtype: torch.dtype = torch.bfloat16) -> LoadedModel:
    """A copy of a (small) model in half precision, where the rounding differences grow. The original's twins,
    own decoder and measured paths are not carried over: they hold or were measured on its float32 weights."""
    model = copy.deepcopy(m.model).to(dtype)
    copied = replace(m, model=model, dtype=dtype, linear_paths=None, rows_variants=None, weights=WEIGHTS_FLOAT32,
                     gguf_weights=None, _twin=None, _rows_twin=None, _own=None, _int4_twin=None, _own_int4=None, _bf16_rows=None)
    copied.use_decoder(m.decoder_asked)
    return copied
