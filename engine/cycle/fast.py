"""The fast path: a speculative cycle that stays on the device, over static caches.

What differs from engine/cycle/reference.py (the reference path), and why:
- Both models write into a static, preallocated cache (engine/kv/layouts.py); a forward
  has a fixed shape (the draft on 1 token, the target on K+1), so on CUDA it can be
  captured once as a CUDA graph (or compiled) and replayed, which removes the Python and
  kernel-launch cost that dominates small models on a GPU. On the CPU it can be compiled
  (--capture compile): inductor's C++ for the whole forward, with no Python between layers.
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
  equal the reference path's over a static cache; on a GPU, or compiled on the CPU (inductor
  fuses and blocks the arithmetic its own way), kernels round differently and a near tie can
  flip a token (bench/gpu_checks.py reports where on a GPU; tests/test_fast_compile.py bounds
  the difference on the CPU).
- The draft is fed d_K only after a full accept, as on the reference path: one more
  one-token step of the same forward, on the host's side of the cycle (`settle`), once
  its one copy has said that all K were accepted and all K+1 tokens committed (not when
  EOS or the token budget cut the last cycle: then the draft's K steps already cover the
  committed tokens). gpt-fast instead feeds d_K in every cycle, which keeps a cycle's
  device work one fixed sequence; on a CPU that extra step is a draft forward in every
  cycle (2.3 ms of a 26 ms chat cycle at K=2 on a 2-core AMD EPYC), paid for nothing
  whenever a token was rejected, and the host learns the outcome anyway before the next
  cycle starts.

What the two paths share: the driver's loop, commit and record (engine/cycle/driver.py,
trace_record.py: this path picks the shown numbers out on the device before its one copy; the
cycle kind here is `FastChainCycle`) and plain decoding's loop (plain.py decode_plain, here
with a device-side step). Its sampling is in fast_sampling.py, its forwards in fast_forward.py.

Teaching faults and other acceptance rules are not supported here: they exist to show
the reference path going wrong (the run mode, engine/mode.py, refuses them).
"""

from dataclasses import dataclass, replace
from typing import Iterator

import torch

from engine.config import SpecSettings, check_capture
from engine.cycle import driver
from engine.cycle.fast_forward import Clock, FixedForward, new_fast_cache
from engine.cycle.fast_sampling import DeviceDecision, UniformStream, decide_on_device, draw_on_device, uniforms_needed
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.plain import decode_plain
from engine.cycle.step import CycleStep, Settled
from engine.cycle.trace_record import describe_cycle, shown_tensors
from engine.drafters.model import ModelDrafter
from engine.drafters.refusals import MIS_SET_CHAIN_ONLY
from engine.kv.layouts import StaticKVCache, layout_for_run, roll_back_static, static_layout_state
from engine.kv.ops import prefill
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.models.sampling import warp_probs
from engine.trace.commit import final_tokens
from engine.trace.format import CacheLengths

# ---------------------------------------------------------------- choosing the path

@dataclass(frozen=True)
class FastPlan:
    capture: str  # none | graph | compile
    message: str  # one line for the user: what runs and why


def plan_fast_path(device: torch.device, capture: str | None = None) -> FastPlan:
    """CUDA graphs on CUDA; elsewhere the same device-resident cycle, eager unless compiling was asked, with the reason.

    On the CPU, "compile" runs both models' forwards as inductor's C++ (engine/cycle/fast_forward.py);
    whether that pays depends on the CPU and the model (bench/step_limit.py measures it), and each
    width and cache capacity costs a compile, so it is asked for, never the default."""
    check_capture(capture)
    if device.type == "cuda":
        capture = capture or "graph"
        how = {"graph": "captured as CUDA graphs", "compile": "compiled with torch.compile",
               "none": "run eagerly"}[capture]
        return FastPlan(capture, f"fast path: on {device}, fixed-shape forwards over static caches {how}; "
                                 "sampling and the ratio test stay on the GPU, one host copy per cycle")
    if capture == "graph":
        raise ValueError(f"capture mode 'graph' needs a CUDA device, not {device}")
    if capture == "compile":
        return FastPlan("compile", f"fast path: on {device}, fixed-shape forwards over static caches compiled by "
                                   "torch.compile (inductor's C++, weights frozen in); the first cycle waits for "
                                   "each model's compile, tens of seconds on a small CPU")
    return FastPlan("none", f"fast path: no CUDA device ({device}), so no CUDA graphs: running the same "
                            "device-resident cycle eagerly over static caches (same tokens as without --fast)")


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
    draft_high_water: int = 0  # one past the highest draft slot written (d_K's, after a full accept)
    target_high_water: int = 0


def roll_back_on_device(cache: StaticKVCache, keep: torch.Tensor) -> None:
    """gpt-fast rollback with the position a device tensor: the next append starts at `keep`."""
    for layer in cache.layers:
        layer.cumulative_length.copy_(keep)


def propose_on_device(state: FastState, s: SpecSettings, u: torch.Tensor, clock: Clock
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """K draft steps; returns tokens (K,) and their distributions (K, V). The draft's cache grows by K:
    it holds every position up to d_{K-1}, not d_K itself (see `catch_up_on_host`)."""
    greedy = s.temperature == 0
    feed, tokens, dists = state.last_token, [], []
    for i in range(s.k):
        probs = warp_probs(state.draft_forward(feed.reshape(1))[-1], s)  # (V,)
        feed = draw_on_device(probs, u[i], greedy)
        tokens.append(feed)
        dists.append(probs)
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
    # the draft wrote K positions, one short of `keep` after a full accept: the host feeds it d_K then
    roll_back_on_device(state.draft_cache, torch.clamp(keep, max=len(state.committed) - 1 + k))
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


def start_fast_state(pair: Pair, prompt_ids: list[int], s: SpecSettings, capture: str = "none",
                     models: FastModels | None = None) -> FastState:
    """Prefill both static caches, draw the run's uniforms, build (on CUDA: capture) both forwards.

    `models` from an earlier run are reused when they fit (same K, enough capacity)."""
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
    # an inference tensor, as every later cycle's first token (drawn inside a cycle) is: a compiled draft
    # forward guards on its input's dispatch keys, and a normal tensor here recompiled it at the next call
    with torch.inference_mode():
        last = torch.tensor(prompt_ids[-1], dtype=torch.long, device=device)
    n = len(prompt_ids) - 1
    return FastState(list(prompt_ids), models.target_cache, models.draft_cache, last,
                     UniformStream(s.seed, uniforms_needed(s), device), models.draft_forward, models.target_forward,
                     [], draft_high_water=n, target_high_water=n)


def static_settings(s: SpecSettings) -> SpecSettings:
    """The settings the fast path runs: its caches are static."""
    return s if s.cache_layout == "static" else replace(s, cache_layout="static")


def settle_on_host(state: FastState, num_committed: int, n_acc: int, before: int, k: int, feeds_d_k: bool) -> dict:
    """The host's side of a cycle's caches after the commit: fix the position after a cut (the last
    cycle), keep the stale-slot counts (`feeds_d_k`: the draft is about to be fed d_K, one slot past its
    K steps); returns both static caches' layout fields."""
    capacity = state.target_cache.capacity
    target_before = static_layout_state(before, state.target_high_water, capacity)
    draft_before = static_layout_state(before, state.draft_high_water, capacity)
    target_appended = static_layout_state(before + k + 1, state.target_high_water, capacity)
    draft_appended = static_layout_state(before + k, state.draft_high_water, capacity)  # after K draft steps
    state.target_high_water = max(state.target_high_water, before + k + 1)
    state.draft_high_water = max(state.draft_high_water, before + k + int(feeds_d_k))
    keep = len(state.committed) - 1
    if num_committed != n_acc + 1:  # cut at EOS or the budget: the last cycle, fix the position on the host
        for cache in (state.target_cache, state.draft_cache):
            roll_back_static(cache, keep)
    for cache, hw in ((state.target_cache, state.target_high_water), (state.draft_cache, state.draft_high_water)):
        for layer in cache.layers:  # so the cache's own stale-slot count agrees with the trace
            layer.high_water = max(layer.high_water, hw)
    return {"target_cache_layout_state": {"before": target_before, "after_append": target_appended,
                                          "after_rollback": static_layout_state(keep, state.target_high_water, capacity)},
            "draft_cache_layout_state": {"before": draft_before, "after_append": draft_appended,
                                         "after_rollback": static_layout_state(keep, state.draft_high_water, capacity)}}


def catch_up_on_host(state: FastState, last_draft_token: torch.Tensor) -> float:
    """After a full accept, d_K (1,) into the draft's cache, which then holds the committed length - 1
    positions as the target's does; the step's seconds, its device work included."""
    _, seconds = timed(lambda: state.draft_forward(last_draft_token), last_draft_token.device)
    return seconds


@dataclass
class FastDetail:
    """What the host holds of a fast cycle after its one copy."""

    host: dict  # the copied tensors as Python numbers (trace_tensors' names)
    before: int  # committed length - 1 before the cycle: both caches' length
    last_draft_token: torch.Tensor  # (1,) d_K on the device, fed to the draft after a full accept


@dataclass
class FastChainCycle:
    """The chain's cycle kept on the device: device work, one copy, then the host's bookkeeping.
    `models` from an earlier run are reused when they fit (same K, enough capacity)."""

    pair: Pair
    settings: SpecSettings
    capture: str = "none"
    models: FastModels | None = None

    def check(self) -> None:
        if self.pair.draft is None or type(self.pair.drafter) is not ModelDrafter:
            raise ValueError(f"the fast path drafts with a draft model only; the "
                             f"{self.pair.drafter.settings().get('kind')!r} drafter runs on the normal path (drop --fast)")
        if self.pair.drafter.mis_set:  # its device cycle drafts with the draft model as the request warps it
            raise ValueError(MIS_SET_CHAIN_ONLY)

    def start(self, prompt_ids: list[int]) -> FastState:
        return start_fast_state(self.pair, prompt_ids, self.settings, self.capture, self.models)

    @torch.inference_mode()
    def step(self, state: FastState, gen: torch.Generator, record: bool) -> CycleStep:
        s, k, before = self.settings, self.settings.k, len(state.committed) - 1
        capacity = state.target_cache.capacity
        if before + k + 1 > capacity:
            raise RuntimeError(f"static cache full: {before + k + 1} positions needed, {capacity} preallocated")
        clock = Clock(self.pair.target.device)
        out = device_cycle(state, s, clock)
        host = copy_to_host(trace_tensors(out, s, record))  # the one sync of the cycle
        proposed, n_acc = host["proposed"], host["num_accepted"]  # proposed: d1..dK, then the next token
        steps = clock.intervals()  # K draft steps, the verify
        return CycleStep(proposed[:n_acc], proposed[k], proposed[:k], k + 1, steps[:k], steps[k], None,
                         FastDetail(host, before, out["draft_tokens"][-1:]))

    @torch.inference_mode()
    def settle(self, state: FastState, step: CycleStep) -> Settled:
        d: FastDetail = step.detail
        k, n_acc, before = self.settings.k, len(step.accepted_token_ids), d.before
        keep = len(state.committed) - 1
        # The draft needs d_K exactly when its K steps (up to before + K) fall short of the committed
        # length - 1: all K accepted and the bonus committed too. A cycle cut at EOS or the budget
        # commits fewer, so no catch-up, as on the reference path (ModelDrafter.roll_back).
        needs_d_k = keep > before + k
        layout_fields = settle_on_host(state, len(state.committed) - 1 - before, n_acc, before, k, needs_d_k)
        catch_up_s = catch_up_on_host(state, d.last_draft_token) if needs_d_k else 0.0
        return Settled(CacheLengths(before=before, after_append=before + k + 1, after_rollback=keep),
                       CacheLengths(before=before, after_append=before + k, after_rollback=keep),
                       layout_fields, needs_d_k, catch_up_s)

    def describe(self, state: FastState, step: CycleStep, committed: list[int], texts: TokenTexts) -> dict:
        host, k, n_acc = step.detail.host, self.settings.k, len(step.accepted_token_ids)
        return describe_cycle(host, step.draft_token_ids, n_acc, step.next_token_id, host["accept_prob"],
                              host["u"][: min(n_acc + 1, k)], committed, texts)


def start_fast_run(pair: Pair, prompt_ids: list[int], s: SpecSettings, capture: str = "none",
                   models: FastModels | None = None) -> FastState:
    """A fast run's state, prefilled, for callers that run cycles one by one."""
    return driver.start(FastChainCycle(pair, s, capture, models), prompt_ids)


def run_fast_cycle(pair: Pair, state: FastState, s: SpecSettings, cycle: int, texts: TokenTexts,
                   record: bool = True) -> dict:
    """One fast cycle through the driver (its draws come from the run's own stream, not a generator)."""
    return driver.run_one_cycle(FastChainCycle(pair, s), state, None, cycle, texts, record)


def fast_generate(pair: Pair, prompt_ids: list[int], s: SpecSettings, record: bool = True,
                  capture: str = "none", models: FastModels | None = None) -> Iterator[dict]:
    """Yield one record per cycle until EOS or max_new_tokens, like engine.cycle.reference.speculative_generate."""
    return driver.generate(FastChainCycle(pair, static_settings(s), capture, models), prompt_ids, record)


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
