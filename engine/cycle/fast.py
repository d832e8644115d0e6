"""The fast path: a speculative cycle that stays on the device, over static caches.

What differs from engine/cycle/reference.py (the reference path), and why:
- Both models write into a static, preallocated cache (engine/kv/layouts.py); a forward
  has a fixed shape (the draft on 1 token, the target on K+1), so on CUDA it can be
  captured once as a CUDA graph (or compiled) and replayed, which removes the Python and
  kernel-launch cost that dominates small models on a GPU.
- Warping, sampling, the ratio test, the residual and the bonus token are tensor ops on
  the device. Nothing inside a cycle reads a value back to the host: the number of
  accepted tokens, the next token and the rollback position stay device tensors. The
  host learns what happened through one copy per cycle (`copy_to_host`), of the trace
  data (or, untraced, of the tokens alone), which it needs anyway to stop at EOS.
- Random draws come from the same CPU generator as the reference path, drawn ahead as
  one stream of uniforms (torch.rand(n) yields the same numbers as n single draws). A
  device-side offset consumes them in the reference's order: K draft draws (none when
  greedy), one per tested position, one for the resampled or bonus token. With the same
  seed and settings, in float32 on the CPU, the tokens and every recorded probability
  equal the reference path's over a static cache; on a GPU, kernels round differently and
  a near tie can flip a token (bench/gpu_checks.py reports where).
- The draft is fed d_K in every cycle (gpt-fast's "fill last token into draft model"),
  one fixed-shape step instead of a data-dependent catch-up: when a token is rejected
  the extra K/V entry is rolled back with the rest. `draft_catch_up` in the trace still
  says whether the draft needed d_K (all K accepted); `catch_up_time_s` is that step's
  time, spent in every cycle.

What the two paths share: the record (engine/cycle/record.py: this path picks the shown
numbers out on the device before its one copy), the commit rule (engine/trace/commit.py)
and plain decoding's loop (reference.decode_plain, here with a device-side step).

Teaching faults and other acceptance rules are not supported here: they exist to show
the reference path going wrong.
"""
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import torch

from engine.config import SpecSettings
from engine.cycle.record import CycleTimes, cycle_record, describe_cycle, shown_tensors
from engine.cycle.reference import Pair, TokenTexts, decode_plain
from engine.kv.layouts import CacheLayout, StaticKVCache, StaticKVLayer, layout_for_run, new_cache, roll_back_static
from engine.kv.ops import prefill
from engine.models.loading import LoadedModel
from engine.models.sampling import warp_probs
from engine.trace.commit import final_tokens
from engine.trace.format import CacheLengths

CAPTURE_MODES = ("none", "graph", "compile")


# ---------------------------------------------------------------- choosing the path

@dataclass(frozen=True)
class FastPlan:
    capture: str  # none | graph | compile
    message: str  # one line for the user: what runs and why


def plan_fast_path(device: torch.device, capture: str | None = None) -> FastPlan:
    """CUDA graphs on CUDA; elsewhere the same device-resident cycle, eager, with the reason."""
    if capture is not None and capture not in CAPTURE_MODES:
        raise ValueError(f"unknown capture mode {capture!r}; choose one of {', '.join(CAPTURE_MODES)}")
    if device.type == "cuda":
        capture = capture or "graph"
        how = {"graph": "captured as CUDA graphs", "compile": "compiled with torch.compile",
               "none": "run eagerly"}[capture]
        return FastPlan(capture, f"fast path: on {device}, fixed-shape forwards over static caches {how}; "
                                 "sampling and the ratio test stay on the GPU, one host copy per cycle")
    if capture not in (None, "none"):
        raise ValueError(f"capture mode {capture!r} needs a CUDA device, not {device}")
    return FastPlan("none", f"fast path: no CUDA device ({device}), so no CUDA graphs: running the same "
                            "device-resident cycle eagerly over static caches (same tokens as without --fast)")


# ---------------------------------------------------------------- random draws, ahead of time

class UniformStream:
    """The reference path's uniforms, drawn ahead from its CPU generator and kept on the device.

    `offset` (a device scalar) is how many the run has consumed; a cycle reads a window
    after it and advances it by the number the reference path would have drawn.
    """

    def __init__(self, seed: int, count: int, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.values = torch.rand(count, generator=gen).to(device)  # (count,) float32
        self.offset = torch.zeros((), dtype=torch.long, device=device)

    def window(self, width: int) -> torch.Tensor:
        """The next `width` uniforms (clamped at the end; a run never reads past what it drew)."""
        idx = (self.offset + torch.arange(width, device=self.offset.device)).clamp(max=self.values.numel() - 1)
        return self.values[idx]  # (width,)

    def advance(self, used: torch.Tensor) -> None:
        self.offset.add_(used)


def uniforms_needed(s: SpecSettings) -> int:
    """Most draws a run can make: every cycle commits at least one token and draws at most 2K+1."""
    return s.max_new_tokens * (2 * s.k + 1) + 1


# ---------------------------------------------------------------- sampling as tensor ops

def sample_on_device(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """engine.models.sampling.sample with the draw given: inverse CDF in float64, no host read. Returns a () long."""
    cdf = probs.double().cumsum(-1)  # (V,)
    point = (u.double() * cdf[-1]).reshape(1)
    index = torch.searchsorted(cdf, point, right=True)[0]
    positions = torch.arange(probs.shape[-1], device=probs.device)
    last_possible = torch.where(probs > 0, positions, -1).max()  # rounding put the point at the very top
    return torch.where(index >= probs.shape[-1], last_possible, index)


def draw_on_device(probs: torch.Tensor, u: torch.Tensor, greedy: bool) -> torch.Tensor:
    """The next token: argmax when greedy (the draw is not spent), else a sample."""
    return probs.argmax(-1) if greedy else sample_on_device(probs, u)


def residual_on_device(p_target_row: torch.Tensor, p_draft_row: torch.Tensor) -> torch.Tensor:
    """engine.models.sampling.residual without the branch: the target's row when nothing is left to owe."""
    diff = torch.clamp(p_target_row - p_draft_row, min=0.0)  # (V,)
    total = diff.sum()
    return torch.where(total <= 1e-12, p_target_row, diff / total)


@dataclass
class DeviceDecision:
    """The ratio test's outcome, every field a device tensor."""

    num_accepted: torch.Tensor  # () long, 0..K
    accept_prob: torch.Tensor  # (K,) min(1, p_target/p_draft)
    u_test: torch.Tensor  # (K,) the draws of positions 1..K (only the first min(n+1, K) are used)
    next_token: torch.Tensor  # () long: resampled or bonus
    residual: torch.Tensor  # (V,) the distribution the next token came from
    draws_used: torch.Tensor  # () long: uniforms this cycle consumed


def decide_on_device(draft_tokens: torch.Tensor, p_draft: torch.Tensor, p_target: torch.Tensor,
                     u: torch.Tensor, draft_draws: int) -> DeviceDecision:
    """The left-to-right ratio test, resample and bonus of engine.cycle.reference.accept_reject, batched.

    draft_tokens (K,), p_draft (K, V), p_target (K+1, V), u: this cycle's window of uniforms
    (2K+1,), whose first `draft_draws` went to the draft.
    """
    k = draft_tokens.shape[0]
    idx = torch.arange(k, device=draft_tokens.device)
    accept_prob = torch.clamp(p_target[idx, draft_tokens] / p_draft[idx, draft_tokens], max=1.0)  # (K,)
    u_test = u[draft_draws: draft_draws + k]  # (K,)
    passes = (u_test < accept_prob).long()  # strict '<' as in the reference
    num_accepted = passes.cumprod(0).sum()  # () the run of passes from position 1
    tested = torch.clamp(num_accepted + 1, max=k)
    row = torch.clamp(num_accepted, max=k - 1)
    res = residual_on_device(p_target.index_select(0, row.reshape(1))[0], p_draft.index_select(0, row.reshape(1))[0])
    final = torch.where(num_accepted == k, p_target[k], res)  # (V,)
    u_final = u.index_select(0, (draft_draws + tested).reshape(1))[0]
    next_token = sample_on_device(final, u_final)
    return DeviceDecision(num_accepted, accept_prob, u_test, next_token, res, draft_draws + tested + 1)


# ---------------------------------------------------------------- fixed-shape forwards

class FastStaticLayer(StaticKVLayer):
    """The static layer without its eager capacity check, which reads the position back to the
    host; the fast path checks capacity on the host from lengths it already knows."""

    def update(self, key_states, value_states, *args, **kwargs):
        return super(StaticKVLayer, self).update(key_states, value_states, *args, **kwargs)


def new_fast_cache(model: LoadedModel, capacity: int) -> StaticKVCache:
    cache = new_cache(CacheLayout("static", capacity), model.model.config)
    for layer in cache.layers:
        layer.__class__ = FastStaticLayer
        layer.cumulative_length = layer.cumulative_length.to(model.device)  # the mask reads it before the first write
    return cache


def causal_mask(cache: StaticKVCache, width: int) -> torch.Tensor:
    """(1, 1, T, capacity) bool, True where query t may attend: slots up to its own position.

    Built from the write position on the device. Given a ready 4-D mask, transformers skips its
    own mask building, whose static-cache branch reads the position back to the host
    (`q_offset == 0`), which a CUDA graph cannot capture. The logits are bit-identical.
    """
    layer = cache.layers[0]
    query_positions = layer.cumulative_length + torch.arange(width, device=layer.cumulative_length.device)  # (T,)
    slots = torch.arange(cache.capacity, device=query_positions.device)  # (capacity,)
    return (slots[None, :] <= query_positions[:, None])[None, None]


def logits_of(model: LoadedModel, ids: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
    """ids (T,) full-vocabulary ids -> full-vocabulary float32 logits (T, V), appending T K/V entries."""
    rows = ids if model.full_to_row is None else model.full_to_row[ids]
    out = model.runner_for(ids.shape[0])(input_ids=rows.reshape(1, -1), attention_mask=causal_mask(cache, ids.shape[0]),
                                         use_cache=True, **{model.cache_arg: cache})
    return model.full_vocab_logits(out.logits[0])


class FixedForward:
    """One model's forward at one width over its static cache: eager, a CUDA graph, or compiled.

    A graph replays the kernels recorded at capture, reading its input from `self.ids` and the
    write position from the cache's own device tensors, so one capture serves every cycle.
    """

    def __init__(self, model: LoadedModel, cache: StaticKVCache, width: int, capture: str) -> None:
        self.model, self.cache, self.width, self.capture = model, cache, width, capture
        self.fn: Callable[[torch.Tensor], torch.Tensor] = lambda ids: logits_of(model, ids, cache)
        if capture == "compile":
            self.fn = torch.compile(self.fn, mode="reduce-overhead", fullgraph=False, dynamic=False)
        if capture == "graph":
            self._capture_graph()

    def _positions(self) -> list[torch.Tensor]:
        return [layer.cumulative_length.clone() for layer in self.cache.layers]

    def _restore(self, saved: list[torch.Tensor]) -> None:
        for layer, length in zip(self.cache.layers, saved):
            layer.cumulative_length.copy_(length)

    def _capture_graph(self) -> None:
        """Warm up on a side stream, then capture; the cache position is restored after each
        (the slots written meanwhile lie after it: stale, masked, overwritten by the next append)."""
        saved = self._positions()
        self.ids = torch.zeros(self.width, dtype=torch.long, device=self.model.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.fn(self.ids)
                self._restore(saved)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.fn(self.ids)  # (width, V), rewritten by every replay
        self._restore(saved)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.capture == "compile":
            torch.compiler.cudagraph_mark_step_begin()  # a new step: the previous outputs may be overwritten
        if self.capture != "graph":
            return self.fn(ids)
        self.ids.copy_(ids)
        self.graph.replay()
        return self.out


# ---------------------------------------------------------------- timing without a sync

class Clock:
    """Marks inside a cycle: CUDA events on a GPU (read after the cycle's one copy), perf_counter elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        """Seconds between consecutive marks; call after the host copy (the events have completed)."""
        if self.cuda:
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


# ---------------------------------------------------------------- one cycle on the device

@dataclass
class FastState:
    """What persists between cycles: the host's committed ids, both caches, the device's last token."""

    committed: list[int]
    target_cache: StaticKVCache
    draft_cache: StaticKVCache
    last_token: torch.Tensor  # () long on the device: the next cycle's first input
    uniforms: UniformStream
    draft_forward: FixedForward
    target_forward: FixedForward
    generated: list[int]
    finished: bool = False
    draft_high_water: int = 0  # one past the highest draft slot written (the extra d_K step)
    target_high_water: int = 0


def roll_back_on_device(cache: StaticKVCache, keep: torch.Tensor) -> None:
    """gpt-fast rollback with the position a device tensor: the next append starts at `keep`."""
    for layer in cache.layers:
        layer.cumulative_length.copy_(keep)


def propose_on_device(state: FastState, s: SpecSettings, u: torch.Tensor, clock: Clock
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """K draft steps then the d_K step; returns tokens (K,) and their distributions (K, V)."""
    greedy = s.temperature == 0
    feed, tokens, dists = state.last_token, [], []
    for i in range(s.k):
        probs = warp_probs(state.draft_forward(feed.reshape(1))[-1], s)  # (V,)
        feed = draw_on_device(probs, u[i], greedy)
        tokens.append(feed)
        dists.append(probs)
        clock.mark()
    state.draft_forward(feed.reshape(1))  # d_K into the draft's cache; rolled back unless all pass
    clock.mark()
    return torch.stack(tokens), torch.stack(dists)


def device_cycle(state: FastState, s: SpecSettings, clock: Clock) -> dict:
    """Draft, verify, test, roll back, all as device work; returns device tensors for the one copy."""
    k = s.k
    u = state.uniforms.window(2 * k + 1)  # (2K+1,)
    clock.mark()
    draft_tokens, p_draft = propose_on_device(state, s, u, clock)  # (K,), (K, V)
    p_target = warp_probs(state.target_forward(torch.cat([state.last_token.reshape(1), draft_tokens])), s)  # (K+1, V)
    clock.mark()
    d = decide_on_device(draft_tokens, p_draft, p_target, u, 0 if s.temperature == 0 else k)
    state.uniforms.advance(d.draws_used)
    proposed = torch.cat([draft_tokens, d.next_token.reshape(1)])  # (K+1,) d1..dK, then the next token
    state.last_token = d.next_token  # the last committed token opens the next cycle
    keep = len(state.committed) - 1 + d.num_accepted + 1  # committed length - 1, a device scalar
    roll_back_on_device(state.target_cache, keep)
    roll_back_on_device(state.draft_cache, keep)
    return {"draft_tokens": draft_tokens, "p_draft": p_draft, "p_target": p_target, "decision": d,
            "proposed": proposed}


def trace_tensors(out: dict, s: SpecSettings, record: bool) -> dict[str, torch.Tensor]:
    """What the host needs from a cycle, as device tensors; with `record`, the trace's numbers too."""
    d: DeviceDecision = out["decision"]
    head = {"proposed": out["proposed"], "num_accepted": d.num_accepted}
    if not record:
        return head
    row = torch.clamp(d.num_accepted, max=s.k - 1)  # the rejected position when there is one
    return {**head, "accept_prob": d.accept_prob, "u": d.u_test,
            **shown_tensors(out["draft_tokens"], out["p_draft"], out["p_target"], d.residual, row, d.next_token,
                            s.trace_top_k)}


def copy_to_host(tensors: dict[str, torch.Tensor]) -> dict[str, list | int | float]:
    """The cycle's one device-to-host copy (and so its one sync): every tensor packed into one
    float64 buffer (token ids up to 2^53 are exact), copied, and split again on the host into
    plain Python numbers and lists, each at its tensor's own precision."""
    flat = torch.cat([t.reshape(-1).double() for t in tensors.values()]).cpu()
    out, start = {}, 0
    for name, t in tensors.items():
        n = t.numel()
        part = flat[start:start + n].reshape(t.shape)
        out[name] = (part.long() if not t.is_floating_point() else part.to(t.dtype)).tolist()
        start += n
    return out


# ---------------------------------------------------------------- the host side of a cycle

def static_state(position: int, high_water: int, capacity: int) -> dict:
    return {"write_position": position, "stale_slots": max(high_water, position) - position, "capacity": capacity}


@dataclass
class FastModels:
    """Both static caches and both fixed-shape forwards, built (captured) once and reused by later
    runs of the same K whose peak length fits: a benchmark should not pay for a capture per prompt."""

    k: int
    capture: str
    capacity: int
    target_cache: StaticKVCache
    draft_cache: StaticKVCache
    draft_forward: FixedForward | None = None
    target_forward: FixedForward | None = None

    @classmethod
    def empty(cls, pair: Pair, k: int, capacity: int, capture: str = "none") -> "FastModels":
        return cls(k, capture, capacity, new_fast_cache(pair.target, capacity), new_fast_cache(pair.draft, capacity))

    def fits(self, s: SpecSettings, prompt_len: int) -> bool:
        return s.k == self.k and layout_for_run(s, prompt_len).capacity <= self.capacity

    def reset(self) -> None:
        """Every position free again (the buffers are kept: a captured graph points at them)."""
        for cache in (self.target_cache, self.draft_cache):
            for layer in cache.layers:
                layer.cumulative_length.zero_()
                layer.high_water = 0

    def build_forwards(self, pair: Pair) -> None:
        """After a prefill (the buffers exist): eager wrappers, or a capture / compile on CUDA."""
        if self.target_forward is None:
            with torch.inference_mode():
                self.draft_forward = FixedForward(pair.draft, self.draft_cache, 1, self.capture)
                self.target_forward = FixedForward(pair.target, self.target_cache, self.k + 1, self.capture)


def start_fast_run(pair: Pair, prompt_ids: list[int], s: SpecSettings, capture: str = "none",
                   models: FastModels | None = None) -> FastState:
    """Prefill both static caches, draw the run's uniforms, build (on CUDA: capture) both forwards.

    `models` from an earlier run are reused when they fit (same K, enough capacity)."""
    if not prompt_ids:
        raise ValueError("the prompt is empty: at least one token is needed to start decoding")
    if models is None:
        models = FastModels.empty(pair, s.k, layout_for_run(s, len(prompt_ids)).capacity, capture)
    elif not models.fits(s, len(prompt_ids)):
        raise ValueError(f"these fast-path models hold K={models.k} and {models.capacity} positions; "
                         f"this run needs K={s.k} and {layout_for_run(s, len(prompt_ids)).capacity}")
    models.reset()
    for model, cache in ((pair.target, models.target_cache), (pair.draft, models.draft_cache)):
        prefill(model, prompt_ids, cache)
    models.build_forwards(pair)
    device = pair.target.device
    last = torch.tensor(prompt_ids[-1], dtype=torch.long, device=device)
    n = len(prompt_ids) - 1
    return FastState(list(prompt_ids), models.target_cache, models.draft_cache, last,
                     UniformStream(s.seed, uniforms_needed(s), device), models.draft_forward, models.target_forward,
                     [], draft_high_water=n, target_high_water=n)


def check_fast_settings(s: SpecSettings, rule=None, pair: Pair | None = None) -> SpecSettings:
    """The settings the fast path runs (a static cache), or a clear refusal."""
    from engine.cycle.reference import RATIO_TEST
    from engine.drafters.model import ModelDrafter
    if rule is not None and rule is not RATIO_TEST:
        raise ValueError("the fast path runs the correct algorithm only: teaching faults need the reference path")
    if pair is not None and (pair.draft is None or type(pair.drafter) is not ModelDrafter):
        raise ValueError(f"the fast path drafts with a draft model only; the {pair.drafter.settings().get('kind')!r} "
                         "drafter runs on the normal path (drop --fast)")
    return s if s.cache_layout == "static" else replace(s, cache_layout="static")


def settle_on_host(state: FastState, committed: list[int], n_acc: int, before: int, k: int) -> dict:
    """The host's side of a cycle's caches: commit, fix the position after a cut (the last
    cycle), keep the stale-slot counts; returns both static caches' layout fields."""
    capacity = state.target_cache.capacity
    target_before = static_state(before, state.target_high_water, capacity)
    draft_before = static_state(before, state.draft_high_water, capacity)
    target_appended = static_state(before + k + 1, state.target_high_water, capacity)
    draft_appended = static_state(before + k, state.draft_high_water, capacity)  # after K draft steps
    state.target_high_water = max(state.target_high_water, before + k + 1)
    state.draft_high_water = max(state.draft_high_water, before + k + 1)  # the d_K step wrote one more
    state.committed += committed
    state.generated += committed
    keep = len(state.committed) - 1
    if len(committed) != n_acc + 1:  # cut at EOS or the budget: the last cycle, fix the position on the host
        for cache in (state.target_cache, state.draft_cache):
            roll_back_static(cache, keep)
    for cache, hw in ((state.target_cache, state.target_high_water), (state.draft_cache, state.draft_high_water)):
        for layer in cache.layers:  # so the cache's own stale-slot count agrees with the trace
            layer.high_water = max(layer.high_water, hw)
    return {"target_cache_layout_state": {"before": target_before, "after_append": target_appended,
                                          "after_rollback": static_state(keep, state.target_high_water, capacity)},
            "draft_cache_layout_state": {"before": draft_before, "after_append": draft_appended,
                                         "after_rollback": static_state(keep, state.draft_high_water, capacity)}}


@torch.inference_mode()
def run_fast_cycle(pair: Pair, state: FastState, s: SpecSettings, cycle: int, texts: TokenTexts,
                   record: bool = True) -> dict:
    """One cycle: device work, one copy, then the host builds the same record as engine.cycle.reference.run_cycle."""
    k, before = s.k, len(state.committed) - 1
    capacity = state.target_cache.capacity
    if before + k + 1 > capacity:
        raise RuntimeError(f"static cache full: {before + k + 1} positions needed, {capacity} preallocated")
    clock = Clock(pair.target.device)
    start = time.perf_counter()
    out = device_cycle(state, s, clock)
    host = copy_to_host(trace_tensors(out, s, record))  # the one sync of the cycle
    cycle_time = time.perf_counter() - start
    proposed, n_acc = host["proposed"], host["num_accepted"]  # proposed: d1..dK, then the next token
    budget = s.max_new_tokens - len(state.generated)
    committed, state.finished = final_tokens(proposed[:n_acc] + proposed[-1:], budget, pair.eos_ids)
    layout_fields = settle_on_host(state, committed, n_acc, before, k)
    keep = len(state.committed) - 1
    steps = clock.intervals()  # K draft steps, the d_K step, the verify
    description = None
    if record:
        description = describe_cycle(host, proposed[:k], n_acc, proposed[k], host["accept_prob"],
                                     host["u"][: min(n_acc + 1, k)], committed, texts)
    return cycle_record(
        cycle, before + 1, proposed[:k], n_acc, committed, state.finished,
        CacheLengths(before=before, after_append=before + k + 1, after_rollback=keep),
        CacheLengths(before=before, after_append=before + k, after_rollback=keep),
        layout_fields, n_acc == k, CycleTimes(steps[:k], steps[k + 1], steps[k], cycle_time), None, description)


def fast_generate(pair: Pair, prompt_ids: list[int], s: SpecSettings, record: bool = True,
                  capture: str = "none", models: FastModels | None = None) -> Iterator[dict]:
    """Yield one record per cycle until EOS or max_new_tokens, like engine.cycle.reference.speculative_generate."""
    s = check_fast_settings(s, pair=pair)
    texts = TokenTexts(pair.target.tokenizer)
    state = start_fast_run(pair, prompt_ids, s, capture, models)
    cycle = 0
    while not state.finished:
        yield run_fast_cycle(pair, state, s, cycle, texts, record)
        cycle += 1


# ---------------------------------------------------------------- plain decoding on the same path

@dataclass
class FastPlainModel:
    """The target's static cache and one-token forward for plain decoding, reusable across runs."""

    capacity: int
    cache: StaticKVCache
    capture: str = "none"
    step: FixedForward | None = None

    @classmethod
    def empty(cls, target: LoadedModel, capacity: int, capture: str = "none") -> "FastPlainModel":
        return cls(capacity, new_fast_cache(target, capacity), capture)


@torch.inference_mode()
def fast_plain_decode(target: LoadedModel, prompt_ids: list[int], s: SpecSettings, eos_ids: set[int],
                      capture: str = "none", model: FastPlainModel | None = None) -> list[int]:
    """engine.cycle.reference.target_generate on the fast path: one-token forwards over a static cache,
    sampling on the device, one copy at the end. It decodes max_new_tokens tokens and cuts at
    the first EOS afterwards (no per-token sync to stop early)."""
    needed = len(prompt_ids) + s.max_new_tokens + 1
    model = model or FastPlainModel.empty(target, needed, capture)
    if needed > model.capacity:
        raise ValueError(f"this run needs {needed} positions; the plain fast-path cache holds {model.capacity}")
    for layer in model.cache.layers:
        layer.cumulative_length.zero_()
    prefill(target, prompt_ids, model.cache)
    if model.step is None:
        model.step = FixedForward(target, model.cache, 1, model.capture)
    draws = iter(UniformStream(s.seed, s.max_new_tokens, target.device).values)  # one per token (unused when greedy)

    def step(last: torch.Tensor) -> torch.Tensor:  # (), stays on the device
        return draw_on_device(warp_probs(model.step(last.reshape(1))[-1], s), next(draws), s.temperature == 0)
    last = torch.tensor(prompt_ids[-1], dtype=torch.long, device=target.device)
    out = decode_plain(step, last, s.max_new_tokens, lambda token: False)  # no per-token sync to stop at EOS
    tokens = torch.stack(out).tolist() if out else []  # the one copy
    return final_tokens(tokens, s.max_new_tokens, eos_ids)[0]
