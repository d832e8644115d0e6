"""Whether the fast path on the CPU runs its forwards compiled or eager, measured on this machine.

torch.compile on the CPU (engine/cycle/fast_forward.py compile_forward) removes the Python between
layers and lets inductor pack the weights, but whether a cycle gets faster depends on the CPU, the
pair and the dtype: bench/results/step-limit-*.md has it from 1.0x to 1.7x on one target step.
And each model's compile costs tens of seconds on a small CPU. So `run --fast --capture auto`
times one cycle's forwards (K one-token draft steps and one verify over K+1 positions) both ways,
once per machine, pair, dtype and K, and keeps the faster; a tie (within TIE_MARGIN) stays eager,
which costs no compile.

The measurement is kept on disk (`SPECLAB_CAPTURE_CHOICE`, else capture-choice.json in the engine's
cache folder) under a key of the machine (engine/models/machine.py), both modules' fingerprints
(engine/models/linear_paths.py model_fingerprint of the module that is compiled: which decoder,
dtype and weights path, every weight's shape) and K. As with the
linear paths, a damaged file is measured over, and a noisy measurement (QUIET_SPREAD) decides the
run that took it but is not kept.

May import: torch, engine.models, engine.kv, engine.cycle.fast_forward.
"""
import json
import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial

import torch

from engine.cycle.fast_forward import FixedForward, new_fast_cache
from engine.kv.ops import prefill
from engine.models.device import timed
from engine.models.linear_paths import QUIET_SPREAD, model_fingerprint, spread_of
from engine.models.loading import LoadedModel
from engine.models.machine import load_average, machine_key
from engine.models.measure_cache import MeasureFile

CAPTURES = ("none", "compile")
CONTEXT = 64  # cached positions while timing, as engine/models/linear_paths.py times its paths
REPEATS = 7
TIE_MARGIN = 0.05  # compiled must be this much faster: compiling costs a wait, eager costs nothing
CACHE_FORMAT = "speclab-capture-choice"
CACHE_VERSION = 1


@dataclass(frozen=True)
class CaptureTimes:
    """Median seconds of one cycle's forwards per capture mode, and the first calls' seconds of the compiled ones."""

    machine: dict
    models: str  # "target fingerprint/draft fingerprint"
    k: int
    cycle_s: dict[str, float]  # capture -> K draft steps + one verify
    compile_s: float  # the compiled forwards' first calls, the compile itself
    measured: str  # when (UTC)
    spread: float = 0.0  # the noisiest timing's middle half over its median
    load: float | None = None

    @property
    def quiet(self) -> bool:
        return self.spread <= QUIET_SPREAD

    def chosen(self) -> str:
        faster = self.cycle_s["compile"] < self.cycle_s["none"] * (1 - TIE_MARGIN)
        return "compile" if faster else "none"

    def describe(self) -> dict:
        """What a trace header's fast_path records of the choice (engine/trace/header_checks.py checks it)."""
        return {"cycle_s": dict(self.cycle_s), "compile_s": self.compile_s, "kept": self.quiet}


def models_fingerprint(target: LoadedModel, draft: LoadedModel) -> str:
    """What the compiled forwards run (the compiled modules: decoder, dtype, float or int4 weights), both models."""
    return f"{model_fingerprint(target.compiled_module)}/{model_fingerprint(draft.compiled_module)}"


def pair_key(target: LoadedModel, draft: LoadedModel, k: int) -> str:
    return json.dumps([machine_key(), models_fingerprint(target, draft), k], sort_keys=True)


@torch.inference_mode()  # the static caches are written in place
def time_cycles(target: LoadedModel, draft: LoadedModel, k: int, repeats: int) -> tuple[dict, float]:
    """({capture: one cycle's forward times}, compile seconds), each capture over its own static caches.

    Round-robin over the captures, so a slow spell of the machine lands on both."""
    ids = torch.tensor([i % target.full_vocab_size for i in range(1, CONTEXT + 1)])
    runs = {}
    compile_s = 0.0
    for capture in CAPTURES:
        caches = {m.name: new_fast_cache(m, CONTEXT + k + 2) for m in (target, draft)}
        for m in (target, draft):
            prefill(m, ids.tolist(), caches[m.name])
        forwards = (FixedForward(draft, caches[draft.name], 1, capture),
                    FixedForward(target, caches[target.name], k + 1, capture))
        started = time.perf_counter()
        one_cycle(forwards, caches, ids, k)  # the first call compiles
        if capture == "compile":
            compile_s = time.perf_counter() - started
        runs[capture] = (forwards, caches)
    times = {capture: [] for capture in CAPTURES}
    for _ in range(repeats):
        for capture, (forwards, caches) in runs.items():
            times[capture].append(timed(partial(one_cycle, forwards, caches, ids, k), target.device)[1])
    return times, compile_s


def one_cycle(forwards: tuple[FixedForward, FixedForward], caches: dict, ids: torch.Tensor, k: int) -> None:
    """K draft steps and one verify from CONTEXT cached positions, then back to CONTEXT."""
    draft_forward, target_forward = forwards
    for _ in range(k):
        draft_forward(ids[:1])
    target_forward(ids[:k + 1])
    for cache in caches.values():
        for layer in cache.layers:
            layer.cumulative_length.fill_(CONTEXT)


def measure(target: LoadedModel, draft: LoadedModel, k: int, repeats: int = REPEATS) -> CaptureTimes:
    load = load_average()
    times, compile_s = time_cycles(target, draft, k, repeats)
    return CaptureTimes(machine_key(), models_fingerprint(target, draft), k,
                        {c: statistics.median(t) for c, t in times.items()}, round(compile_s, 3),
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        round(max(spread_of(t) for t in times.values()), 4), load)


# ---------------------------------------------------------------- the cache on disk

CACHE = MeasureFile("SPECLAB_CAPTURE_CHOICE", "capture-choice.json", CACHE_FORMAT, CACHE_VERSION)


def times_from_dict(d: object) -> CaptureTimes | None:
    """A stored measurement, or None when any part of it is not what measure() writes (or it was noisy)."""
    try:
        cycle_s = {c: float(d["cycle_s"][c]) for c in CAPTURES}
        spread = float(d.get("spread", 0.0))
        ok = all(0 < s < 60 for s in cycle_s.values()) and 0 <= spread <= QUIET_SPREAD
        times = CaptureTimes(dict(d["machine"]), str(d["models"]), int(d["k"]), cycle_s, float(d["compile_s"]),
                             str(d["measured"]), spread)
        return times if ok and times.compile_s >= 0 else None
    except (KeyError, TypeError, ValueError):
        return None


def capture_times(target: LoadedModel, draft: LoadedModel, k: int) -> CaptureTimes:
    """This machine's measurement for the pair and K: from the disk cache, or measured now and kept if quiet."""
    key = pair_key(target, draft, k)
    times = times_from_dict(CACHE.read().get(key))
    if times is None:
        times = measure(target, draft, k)
        if times.quiet:
            CACHE.write({**CACHE.read(), key: asdict(times)})
    return times
