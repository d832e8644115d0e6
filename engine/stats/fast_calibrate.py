"""Step-time calibration on the fast path's own forwards, for `run --fast --k auto` and `run --fast --calibrate`.

calibrate.py times the reference path's forwards: eager, over a dynamic cache. The fast path calls
other code (engine/cycle/fast_forward.py): fixed-shape forwards over static caches, eager, compiled
or replayed as CUDA graphs, with sampling on the device. On a CPU the two differ in just what the K
advisor weighs. Compiled, a one-token step loses its Python between layers and a wider forward may
run on another kernel, so the verify's cost in steps is not the eager one
(bench/results/compiled-widths-*.md). An advisor fed eager times would choose K for a run that
does not happen.

So this module times the forwards the run will call, built once over the caches the run will use
(`FastForwards`); the pilot, the speculative run at the advised K and plain decoding reuse them.
That matters under --capture compile, where each forward width costs a compile (tens of seconds
for the chat target on a 2-core CPU), and only the widths a chain up to the pilot's K needs are
timed: 1 to K+1.

The result has calibrate.py's fields (engine/trace/header_checks.py check_calibration), plus
"capture": the capture mode whose forwards were timed, which a trace's fast_path must match.

May import: torch, engine.config, engine.cycle, engine.kv, engine.models, engine.stats.calibrate.
"""
import statistics
from dataclasses import dataclass, replace
from functools import partial

import torch

from engine.config import SpecSettings
from engine.cycle.fast import FastModels, FastPlainModel
from engine.cycle.fast_forward import FixedForward, new_fast_cache
from engine.cycle.fast_sampling import draw_on_device
from engine.cycle.pair import Pair
from engine.kv.layouts import StaticKVCache, layout_for_run
from engine.kv.ops import prefill
from engine.models.device import timed
from engine.models.sampling import warp_probs
from engine.stats.calibrate import context_of_length, run_cache_len

U_FOR_TIMING = 0.5  # any uniform: a draw costs the same whichever token it picks


@dataclass
class FastForwards:
    """Both static caches and the forwards a fast run may call: the draft's one-token forward and the
    target's forward at each width, built (on CUDA captured, on a CPU compiled on first call) once."""

    capture: str
    capacity: int
    target_cache: StaticKVCache
    draft_cache: StaticKVCache
    draft: FixedForward
    target: dict[int, FixedForward]  # width -> forward

    def models_for(self, k: int) -> FastModels:
        """A chain's models at K, on these caches and forwards (K+1 must be one of the widths)."""
        return FastModels(k, self.capture, self.capacity, self.target_cache, self.draft_cache, self.draft,
                          self.target[k + 1])

    def plain_model(self) -> FastPlainModel:
        """Plain decoding on the target's cache and one-token forward."""
        return FastPlainModel(self.capacity, self.target_cache, self.capture, self.target[1])


@torch.no_grad()  # not inference mode: the run resets these caches in place outside it (FastModels.reset)
def build_forwards(pair: Pair, context: list[int], widths: list[int], capacity: int, capture: str) -> FastForwards:
    """Both caches prefilled with all of `context` but its last token, and the forwards built on them
    (a CUDA graph is captured over buffers that exist, so after the prefill), as FastModels builds its own."""
    caches = {m.name: new_fast_cache(m, capacity) for m in (pair.target, pair.draft)}
    for m in (pair.target, pair.draft):
        prefill(m, context, caches[m.name])
    target_cache, draft_cache = caches[pair.target.name], caches[pair.draft.name]
    with torch.inference_mode():
        return FastForwards(capture, capacity, target_cache, draft_cache,
                            FixedForward(pair.draft, draft_cache, 1, capture),
                            {w: FixedForward(pair.target, target_cache, w, capture) for w in widths})


@torch.no_grad()
def refill(pair: Pair, forwards: FastForwards, context: list[int]) -> None:
    """Both caches holding all of `context` but its last token, in the buffers the forwards were built on."""
    for m, cache in ((pair.target, forwards.target_cache), (pair.draft, forwards.draft_cache)):
        reset_to(cache, 0)
        prefill(m, context, cache)


def reset_to(cache: StaticKVCache, length: int) -> None:
    """Back to `length` cached positions: later slots are stale and masked, as after a rollback."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(length)


def target_pass(forwards: FastForwards, ids: torch.Tensor, s: SpecSettings, keep: int, draw: bool) -> None:
    """The target over ids (W,) and warped, as a verify is; with `draw`, a token drawn, as a plain step is."""
    probs = warp_probs(forwards.target[ids.shape[0]](ids), s)  # (W, V)
    if draw:
        draw_on_device(probs[-1], torch.full((), U_FOR_TIMING, device=ids.device), s.temperature == 0)
    reset_to(forwards.target_cache, keep)


def draft_steps(forwards: FastForwards, ids: torch.Tensor, s: SpecSettings, keep: int, k: int) -> list[float]:
    """K draft steps, each warped and drawn as the fast cycle's propose does, timed one by one."""
    u = torch.full((), U_FOR_TIMING, device=ids.device)

    def step() -> None:
        draw_on_device(warp_probs(forwards.draft(ids[:1])[-1], s), u, s.temperature == 0)

    times = []
    for _ in range(k):
        times.append(timed(step, ids.device)[1])
        reset_to(forwards.draft_cache, keep)
    return times


def time_fast_forwards(forwards: FastForwards, context: list[int], s: SpecSettings, repeats: int) -> dict:
    """Median seconds of: each target width (warped), the target's step (width 1, warped and drawn), and the
    draft step where a cycle meets it, right after a target pass over K+1 positions (as calibrate.py's
    time_draft_in_cycle, for the same reason: back to back, the draft's weights stay in the CPU's caches),
    over `repeats` rounds (time_fast_rounds), each quantity its own median. Read instead as the median of
    each round's ratio to the one-position forward, the ratios the K advisor weighs were no steadier over
    repeated calibrations on a 2-core AMD EPYC (bench/fast_step_times.py)."""
    return separate_medians(time_fast_rounds(forwards, context, s, repeats))


def separate_medians(rounds: list[dict]) -> dict:
    """Each quantity's own median over rounds."""
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


@torch.inference_mode()
def time_fast_rounds(forwards: FastForwards, context: list[int], s: SpecSettings, repeats: int) -> list[dict]:
    """`repeats` rounds of time_fast_forwards' quantities, each timed once a round, round-robin, so a slow spell of
    the machine lands on every quantity of a round; round 0 warms up (and compiles) and is not returned."""
    device = forwards.target_cache.layers[0].cumulative_length.device
    keep = len(context) - 1
    widest = max(forwards.target)
    feed = torch.tensor(([context[-1]] + context_of_length(context, widest))[:widest], device=device)
    k = max(1, min(s.k, widest - 1))
    rounds = []
    for _ in range(repeats + 1):
        one = {w: timed(partial(target_pass, forwards, feed[:w], s, keep, False), device)[1] for w in forwards.target}
        one["step"] = timed(partial(target_pass, forwards, feed[:1], s, keep, True), device)[1]
        target_pass(forwards, feed[:k + 1], s, keep, False)  # untimed: what streams the target through the caches
        one["draft"] = statistics.mean(draft_steps(forwards, feed, s, keep, k))
        rounds.append(one)
    return rounds[1:]


def calibration_of(forwards: FastForwards, cache_len: int, times: dict, repeats: int) -> dict:
    """The header's calibration (engine/trace/header_checks.py check_calibration) from time_fast_forwards' times."""
    widths = sorted(forwards.target)
    return {"cache_len": cache_len, "repeats": repeats, "threads": torch.get_num_threads(),
            "target_step_s": times["step"], "draft_step_s": times["draft"],
            "verify_positions": widths, "verify_s": [times[w] for w in widths], "capture": forwards.capture}


def calibrate_on(pair: Pair, forwards: FastForwards, prompt_ids: list[int], s: SpecSettings, repeats: int = 7) -> dict:
    """The calibration of forwards already built, for another prompt of a run of `s` (a benchmark over prompts
    builds, and compiles, them once)."""
    cache_len = run_cache_len(prompt_ids, s)
    context = context_of_length(prompt_ids, cache_len + 1)
    refill(pair, forwards, context)
    return calibration_of(forwards, cache_len, time_fast_forwards(forwards, context, s, repeats), repeats)


def forwards_capacity(prompt_ids: list[int], s: SpecSettings) -> int:
    """Positions a run of `s` (any K up to s.k) on this prompt needs, and the calibration's widest forward."""
    return max(layout_for_run(replace(s, cache_layout="static"), len(prompt_ids)).capacity,
               run_cache_len(prompt_ids, s) + s.k + 1)


def calibrate_fast(pair: Pair, prompt_ids: list[int], s: SpecSettings, capture: str, repeats: int = 7,
                   capacity: int = 0) -> tuple[dict, FastForwards]:
    """(calibration, forwards) for a fast run of `s` (its K the widest chain to time, its max_new_tokens the
    run's) at the run's mean cache length; the forwards' caches hold a run of any K up to s.k on this prompt,
    or on any prompt whose run fits `capacity` positions, when that is more (a workload's longest)."""
    cache_len = run_cache_len(prompt_ids, s)
    context = context_of_length(prompt_ids, cache_len + 1)
    capacity = max(capacity, forwards_capacity(prompt_ids, s))
    forwards = build_forwards(pair, context, list(range(1, s.k + 2)), capacity, capture)
    return calibration_of(forwards, cache_len, time_fast_forwards(forwards, context, s, repeats), repeats), forwards
