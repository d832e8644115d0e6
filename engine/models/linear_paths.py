"""Which linear-layer path runs each forward width, measured on the machine the engine runs on.

A float32 model on the CPU can run its linear layers three ways here: as loaded (`F.linear`, which
goes to the BLAS torch was built with, MKL on x86), through engine/models/cpu_linear.py's
packed oneDNN twin, or through engine/models/f32_rows_kernel.py's C kernel, which reads each weight
once for all rows (absent where no C compiler built it: the curve then times two paths and says why
in `absent`). Which one is faster depends on the CPU and on the number of rows:
- AMD EPYC, 2 cores: a 5-position chat verify cost 0.8 target steps packed, 2.0 as loaded
  (bench/results/verify-cost-*.md);
- Intel Xeon with AVX-512 and AMX, 2 cores: 1.31-1.45 steps packed against 1.10-1.55 as
  loaded, so the packed path lost there.
A bfloat16 model has two of them, as loaded and the rows kernel on its bfloat16 weights (oneDNN's packing
here takes float32 only); on a CPU without native bfloat16 products torch's bfloat16 F.linear is slower than
float32 at 2-6 rows, where the rows kernel reads half float32's bytes.
So the engine times every path at every width from 1 to `WIDTHS` on the machine, once, and runs
each width on the fastest: no width is slower than the model as loaded (up to timing noise).
Before the rows path's forwards are timed, its kernel's variants (an ISA and where the weights are
prefetched to: f32_rows_kernel.VARIANTS) are timed on the model's own products at every width, and each
width runs the fastest: on a 2-core AMD EPYC (Zen 4) the AVX2 tiles prefetching into L2 were the fastest at
most widths (5 rows cost about what 1 did), where on an Intel Xeon with AMX the AVX-512 tiles into L1, the
kernel's first choice, had been the faster ISA (its L2 variants not yet measured there).
The timings are eager forwards. A compiled forward (--capture compile) runs the rows twin at the widths
where it was chosen here (LoadedModel.compiled_module_for) and the module as loaded elsewhere, whose
linear layers inductor packs itself.

The measurement is kept on disk (`SPECLAB_LINEAR_PATHS`, else linear-paths.json in the engine's cache
folder, ~/.cache/speclab or `SPECLAB_CACHE`) under a key of the
machine (engine/models/machine.py: CPU model, vector features, threads, torch version) and the
shapes of the module that runs (the model as loaded, or the engine's own decoder on its weights under
--decoder own: another type and fused shapes, so its own entry), so the next run on the same machine
and model reuses it. A damaged cache file is measured over, never trusted; so is a noisy measurement
(QUIET_SPREAD): it chooses the paths of the run that took it, and the next run measures again.
"""
import hashlib
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch

from engine.models import cpu_linear, f32_rows_kernel
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.models.machine import load_average, machine_key
from engine.models.measure_cache import MeasureFile
from engine.trace.schema import AS_LOADED, LINEAR_PATHS, PACKED, REQUIRED_LINEAR_PATHS, ROWS, WEIGHTS_FLOAT32

PATHS = LINEAR_PATHS
WIDTHS = 9  # widths 1..9: every verify for K = 1..8, the draft's one-token steps and its two-token catch-up
CONTEXT = 64  # cached positions during the timings: the ranking of the paths barely moves with it
REPEATS = 5
# A measurement whose noisiest timing spread wider than this (middle half over median) is used for the
# run that took it but never kept: on a busy 2-core machine (load 6) a chat step measured 275 ms instead
# of ~25 ms and the paths' order at a width flipped from repeat to repeat.
QUIET_SPREAD = 0.25
CACHE_FORMAT = "speclab-linear-paths"
# 2: the rows path joined; 3: its kernel's variants are timed too; 4: it reads a 16-bit checkpoint's weights from
# their exact 16-bit copy, so a curve timed on the float32 weights underrates it (older curves: measured again)
CACHE_VERSION = 4


def fastest_variants(widths: list[int], rows_seconds: dict[str, list[float]]) -> dict[int, str]:
    """The rows kernel's fastest variant at each width; a tie goes to the earlier timed (the default)."""
    names = list(rows_seconds)
    return {w: min(names, key=lambda v: (rows_seconds[v][i], names.index(v))) for i, w in enumerate(widths)} if names else {}


def run_rows_variants(loaded: LoadedModel, chosen: dict[int, str]) -> None:
    """`loaded`'s rows twin runs each width on the variant named for it (LoadedModel.rows_variants)."""
    loaded.rows_variants = {w: f32_rows_kernel.VARIANTS[v] for w, v in chosen.items()}


@dataclass(frozen=True)
class PathCurve:
    """Median seconds of one forward per path and width, and the path chosen per width."""

    machine: dict
    model: str  # model_fingerprint()
    widths: list[int]
    seconds: dict[str, list[float]]  # path -> one median per width
    measured: str  # when (UTC)
    spread: float = 0.0  # the noisiest timing's middle half over its median (spread_of)
    load: float | None = None  # the machine's 1-minute load average when the measurement began
    absent: dict[str, str] = field(default_factory=dict)  # path -> why it was not timed here (no C compiler)
    # the rows kernel's variants (f32_rows_kernel.VARIANTS names) -> median seconds of the model's products per
    # width; empty where the rows path was not timed
    rows_seconds: dict[str, list[float]] = field(default_factory=dict)

    @property
    def quiet(self) -> bool:
        """Steady enough to keep for later runs; a noisy one serves this run only."""
        return self.spread <= QUIET_SPREAD

    def chosen(self) -> dict[int, str]:
        """The fastest timed path at each width; a tie goes to the earlier in PATHS (as loaded first)."""
        return {w: min(self.seconds, key=lambda p: (self.seconds[p][i], PATHS.index(p)))
                for i, w in enumerate(self.widths)}

    def rows_variants(self) -> dict[int, str]:
        return fastest_variants(self.widths, self.rows_seconds)

    def to_dict(self) -> dict:
        variants = {"rows_variants": {str(w): v for w, v in self.rows_variants().items()}} if self.rows_seconds else {}
        return {**asdict(self), "chosen": {str(w): p for w, p in self.chosen().items()}, "kept": self.quiet, **variants}


def model_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of the architecture and every parameter's shape and dtype: what the timings depend on."""
    shapes = [(name, tuple(p.shape), str(p.dtype)) for name, p in model.named_parameters()]
    return hashlib.sha256(repr((type(model).__name__, shapes)).encode()).hexdigest()[:16]


def applies(loaded: LoadedModel) -> bool:
    """There is a choice to make: a CPU model running its float weights with at least two paths here (float32:
    as loaded, packed and, where it builds, rows; bfloat16: as loaded and rows). A model on int4 weights has
    one path (engine/models/gguf_linear.py): the paths here give the same distribution and may be swapped per
    width; int4 is another distribution."""
    return (loaded.weights == WEIGHTS_FLOAT32 and loaded.fast_linear and loaded.device.type == "cpu"
            and len(paths_for(loaded)[0]) > 1)


REASON_CHARS = 300  # a compiler's message can run to pages; the stored curve keeps its start
PACKED_FLOAT32_ONLY = "the packed path runs float32 weights only"


def available_paths() -> tuple[tuple[str, ...], dict[str, str]]:
    """The paths this machine can time for a float32 model, and why any other is absent (the rows kernel
    needs a C compiler)."""
    why = f32_rows_kernel.unavailable()
    return (PATHS, {}) if why is None else (REQUIRED_LINEAR_PATHS, {ROWS: why[:REASON_CHARS]})


def paths_for(loaded: LoadedModel) -> tuple[tuple[str, ...], dict[str, str]]:
    """The paths `loaded` can run here, and why any other is absent: available_paths() for a float32 model
    whose packed twin builds; as loaded and rows for a bfloat16 one (oneDNN's packing here takes float32)."""
    if cpu_linear.available(loaded.base):
        return available_paths()
    why = f32_rows_kernel.unavailable()
    if loaded.dtype != torch.bfloat16 or why is not None:
        return (AS_LOADED,), {PACKED: PACKED_FLOAT32_ONLY, ROWS: why or "the rows kernel takes float32 and bfloat16"}
    return (AS_LOADED, ROWS), {PACKED: PACKED_FLOAT32_ONLY}


def spread_of(times: list[float]) -> float:
    """The middle half of the timings as a fraction of their median: how noisy they were."""
    q1, _, q3 = statistics.quantiles(times, n=4)
    return (q3 - q1) / statistics.median(times)


def time_paths(loaded: LoadedModel, widths: list[int], repeats: int,
               paths: tuple[str, ...] = REQUIRED_LINEAR_PATHS) -> dict[str, list[list[float]]]:
    """Every path's timings of a forward over each width, from the same cache length each time.

    Round-robin over (path, width): a slow spell of the machine lands on both paths and every
    width alike, instead of making one path look slower."""
    ids = [i % loaded.full_vocab_size for i in range(1, CONTEXT + max(widths) + 1)]
    cache = loaded.new_cache()
    loaded.fill(ids[:CONTEXT], cache)
    times = {p: [[] for _ in widths] for p in paths}
    saved = loaded.linear_paths
    try:
        for round_number in range(repeats + 1):  # round 0 warms up and is not kept
            for path in paths:
                loaded.linear_paths = {w: path for w in widths}
                for i, w in enumerate(widths):
                    elapsed = timed(partial(loaded.forward, ids[CONTEXT:CONTEXT + w], cache), loaded.device)[1]
                    cache.crop(-w)  # back to CONTEXT positions (a negative crop removes that many)
                    if round_number:
                        times[path][i].append(elapsed)
    finally:
        loaded.linear_paths = saved
    return times


def linear_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def time_rows_variants(loaded: LoadedModel, widths: list[int], repeats: int) -> dict[str, list[list[float]]]:
    """Each rows-kernel variant's timings of all the model's linear products over each width, round-robin over
    (variant, width) as time_paths. The products alone: the variant changes nothing else in a forward."""
    layers = linear_layers(loaded.base)
    weights = [f32_rows_kernel.weight_read(layer.weight) for layer in layers]  # what a RowsLinear reads
    gen = torch.Generator().manual_seed(0)
    xs = {(w, k): torch.randn(w, k, generator=gen).to(loaded.dtype)  # (w, K) for each K the layers take
          for w in widths for k in {layer.in_features for layer in layers}}
    variants = f32_rows_kernel.candidate_variants(loaded.dtype)
    times = {v: [[] for _ in widths] for v in variants}

    def products(variant: int, width: int) -> None:
        for layer, weight in zip(layers, weights):
            bias = None if layer.bias is None else layer.bias.detach()
            f32_rows_kernel.linear(xs[(width, layer.in_features)], weight, bias, variant)
    with torch.no_grad():
        for round_number in range(repeats + 1):  # round 0 warms up and is not kept
            for v in variants:
                for i, w in enumerate(widths):
                    elapsed = timed(partial(products, f32_rows_kernel.VARIANTS[v], w), loaded.device)[1]
                    if round_number:
                        times[v][i].append(elapsed)
    return times


def measure(loaded: LoadedModel, repeats: int = REPEATS) -> PathCurve:
    widths = list(range(1, WIDTHS + 1))
    load = load_average()
    paths, absent = paths_for(loaded)
    rows_times = time_rows_variants(loaded, widths, repeats) if ROWS in paths else {}
    rows_seconds = {v: [statistics.median(t) for t in rows_times[v]] for v in rows_times}
    # the rows path's forwards below run its fastest variant at each width
    run_rows_variants(loaded, fastest_variants(widths, rows_seconds))
    times = time_paths(loaded, widths, repeats, paths)
    seconds = {p: [statistics.median(t) for t in times[p]] for p in times}
    # the noisiest of every timing, the variants' too: a choice made on a busy machine is not kept
    spread = max(spread_of(t) for timings in (*times.values(), *rows_times.values()) for t in timings)
    return PathCurve(machine_key(), model_fingerprint(loaded.base), widths, seconds,
                     time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), round(spread, 4), load, absent, rows_seconds)


# ---------------------------------------------------------------- the cache on disk

CACHE = MeasureFile("SPECLAB_LINEAR_PATHS", "linear-paths.json", CACHE_FORMAT, CACHE_VERSION)


def cache_file() -> Path:
    """SPECLAB_LINEAR_PATHS names the file; else it lies in the engine's cache folder (SPECLAB_CACHE)."""
    return CACHE.path()


def entry_key(machine: dict, fingerprint: str) -> str:
    return json.dumps([machine, fingerprint], sort_keys=True)


def curve_from_dict(d: object, paths: tuple[str, ...] = PATHS, variants: list[str] | None = None) -> PathCurve | None:
    """A stored curve, or None when any part of it is not what measure() writes for `paths` (and, where the rows
    path was timed, for the kernel `variants` this machine runs now)."""
    try:
        widths = [int(w) for w in d["widths"]]
        if set(d["seconds"]) != set(paths):
            return None  # timed other paths than this machine has now (a compiler came or went)
        seconds = {p: [float(x) for x in d["seconds"][p]] for p in paths}
        ok = widths == list(range(1, len(widths) + 1)) and all(
            len(v) == len(widths) and all(0 < x < 60 for x in v) for v in seconds.values())
        spread = float(d.get("spread", 0.0))
        ok = ok and 0 <= spread <= QUIET_SPREAD  # a stored curve was quiet, or it is not trusted
        absent = {str(p): str(why) for p, why in dict(d.get("absent", {})).items()}
        rows_seconds = {str(v): [float(x) for x in t] for v, t in dict(d.get("rows_seconds", {})).items()}
        if ROWS in paths:  # timed the variants this machine runs now (SPECLAB_F32_ROWS_ISA may force one)
            ok = ok and list(rows_seconds) == (variants or []) and all(
                len(t) == len(widths) and all(0 < x < 60 for x in t) for t in rows_seconds.values())
        return PathCurve(dict(d["machine"]), str(d["model"]), widths, seconds, str(d["measured"]), spread,
                         absent=absent, rows_seconds=rows_seconds) if ok else None
    except (KeyError, TypeError, ValueError):
        return None


def curve_for(loaded: LoadedModel) -> PathCurve:
    """This machine's curve for the model: from the disk cache, or measured now and stored."""
    key = entry_key(machine_key(), model_fingerprint(loaded.base))
    entries = CACHE.read()
    paths = paths_for(loaded)[0]
    variants = f32_rows_kernel.candidate_variants(loaded.dtype) if ROWS in paths else None
    curve = curve_from_dict(entries.get(key), paths, variants)
    if curve is None:
        curve = measure(loaded)
        if curve.quiet:
            CACHE.write({**CACHE.read(), key: asdict(curve)})
    return curve


def settle_if_unchosen(loaded: LoadedModel) -> None:
    """`settle` where nothing chose the model's paths yet (a run that did not calibrate). The compiled fast
    path calls it before compiling a fixed-shape forward: there an unchosen width is the module as loaded, whose
    products inductor leaves to MKL, and on a 2-core AMD EPYC with AVX2 only that made a 3-position chat
    verify 76.8 ms against a 38 ms step (a/e 0.65), where the rows twin the measurement chooses took 1.18
    steps at 5 positions (bench/results/fast-chat-cpu-compiled-own-amd-epyc-avx2.md,
    step-limit-chat-w5-amd-epyc-avx2.md)."""
    if loaded.linear_paths is None and loaded.device.type == "cpu":
        settle(loaded)


def settle(loaded: LoadedModel) -> dict | None:
    """Set `loaded` to run each width on its faster path; return what a trace header records
    (None where there is no choice: a GPU, another dtype, or the packed path turned off)."""
    if not applies(loaded):
        return None
    curve = curve_for(loaded)
    loaded.linear_paths = curve.chosen()
    run_rows_variants(loaded, curve.rows_variants())
    return curve.to_dict()
