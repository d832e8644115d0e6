"""Which linear path ran each forward width, as a calibrated CPU trace's header records it
(engine/models/linear_paths.py measured it on the machine of the run), and which weights the
target ran on (engine/models/gguf_linear.py), and which decoder made each model's distributions
(engine/models/llama.py, --decoder own), and how the fast path ran its forwards (engine/cycle/fast_forward.py)."""
from dataclasses import dataclass

from engine.trace.schema import ACTIVATIONS, AS_LOADED, DECODER_OWN, GGUF_WEIGHTS, PACKED, ROWS, WEIGHTS_FLOAT32


def target_weights(header: dict) -> str:
    """The target's weights path: WEIGHTS_FLOAT32 for traces that do not say (they ran the model as loaded)."""
    return (header.get("target_weights") or {}).get("path", WEIGHTS_FLOAT32)


def weights_words(header: dict) -> str:
    """The target's weights in words: which distribution the trace's ratio tests followed."""
    w = header.get("target_weights")
    if not w:
        return "the model as loaded (this trace does not record a weights path)"
    if w["path"] not in GGUF_WEIGHTS:
        dtype = header.get("dtype") or "float32"  # the model as loaded is in the run's dtype (--dtype)
        return f"{WEIGHTS_FLOAT32}: the model as loaded" if dtype == "float32" else f"the model as loaded, in {dtype}"
    layers = ", ".join(f"{n} {kind}" for kind, n in w["tensor_types"].items())
    floats = f", {w['float_layers']} kept in float" if w["float_layers"] else ""
    activations = "8-bit activations, each block of 32 rounded as llama.cpp does" \
        if ACTIVATIONS[w["path"]] == "int8" else "float32 activations"
    return (f"{w['path']}: the blocks of {w['file']} as stored ({layers} linear layers{floats}; "
            f"{w['weight_bytes'] / 1e6:.1f} MB read per forward), {activations}")


def decoder_words(header: dict) -> str | None:
    """Which code made each model's distributions, in words; None for a trace without the field
    (its models ran on Hugging Face's modules)."""
    decoder = header.get("decoder")
    if not decoder:
        return None

    def words(entry: dict) -> str:
        if entry["ran"] == DECODER_OWN:
            return "the engine's own decoder"
        return "Hugging Face's modules" + (f" ({entry['fallback']})" if "fallback" in entry else "")
    return "; ".join(f"{role} on {words(entry)}" for role, entry in decoder.items())


CAPTURE_WORDS = {"none": "eager", "graph": "captured as CUDA graphs",
                 "compile": "compiled with torch.compile"}


def ran_compiled(header: dict) -> bool:
    """The cycles ran compiled (--fast --capture compile, or auto's choice): step times measured on the
    reference path's eager forwards would not be their costs (its own calibration times the compiled ones:
    engine/stats/fast_calibrate.py)."""
    return (header.get("fast_path") or {}).get("capture") == "compile"


def calibration_words(header: dict) -> str | None:
    """Which forwards the header's step times timed, in words; None without a calibration. `run --fast
    --k auto` times the fast path's own (engine/stats/fast_calibrate.py), every other run the reference
    path's."""
    cal = header.get("calibration")
    if not cal:
        return None
    if cal.get("capture") is None:
        return "the reference path's forwards, eager over a dynamic cache"
    return "the fast path's own forwards, the ones its cycles ran"  # forward_words says how they ran


def forward_words(header: dict) -> str | None:
    """How the fast path ran the forwards, in words, with the measurement that chose it under
    --capture auto; None for a trace of the reference path (no `fast_path`)."""
    fast = header.get("fast_path")
    if not fast:
        return None
    words = f"the fast path, its fixed-shape forwards {CAPTURE_WORDS[fast['capture']]}"
    measured = fast.get("measured")
    if measured:
        cycle = measured["cycle_s"]
        words += (f" (chosen on the machine of the run: one cycle's forwards took {cycle['none'] * 1000:.1f} ms eager, "
                  f"{cycle['compile'] * 1000:.1f} ms compiled)")
    return words


@dataclass(frozen=True)
class PathRow:
    model: str  # "target" or "draft"
    width: int  # positions in the forward (a verify over K+1 positions has width K+1)
    as_loaded_s: float
    packed_s: float | None  # None for a bfloat16 model: oneDNN's packing here takes float32 only
    runs: str  # the path chosen: the fastest one
    rows_s: float | None = None  # the rows kernel; None where the curve did not time it (older traces, no compiler)
    # the rows kernel's fastest variant at this width (an ISA, prefetching into L1 or "-l2" L2); None where the
    # curve did not time the variants (older traces, no compiler)
    rows_variant: str | None = None

    @property
    def saving(self) -> float:
        """How much faster the chosen path is than the slowest, as a fraction of the slowest."""
        times = [t for t in (self.as_loaded_s, self.packed_s, self.rows_s) if t is not None]
        return 1 - min(times) / max(times)


def path_rows(header: dict) -> list[PathRow]:
    """One row per model and width; empty for a trace without the field (GPU runs, older traces)."""
    rows = []
    for model, curve in (header.get("linear_paths") or {}).items():
        for i, w in enumerate(curve["widths"]):
            seconds = curve["seconds"]
            rows.append(PathRow(model, w, seconds[AS_LOADED][i], seconds[PACKED][i] if PACKED in seconds else None,
                                curve["chosen"][str(w)], seconds[ROWS][i] if ROWS in seconds else None,
                                (curve.get("rows_variants") or {}).get(str(w))))
    return rows


def machine_words(header: dict) -> str | None:
    """Where the paths were measured, in words: the CPU, its vector features, threads, torch."""
    curve = next(iter((header.get("linear_paths") or {}).values()), None)
    if curve is None:
        return None
    m = curve["machine"]
    features = ", ".join(m.get("features") or []) or "no AVX2"
    return f"{m['cpu']} ({features}), {m.get('threads', '?')} threads, torch {m['torch']}"


def noisy_words(header: dict) -> str | None:
    """Said when a curve was measured under load: it chose this run's paths but was not kept."""
    noisy = {role: c for role, c in (header.get("linear_paths") or {}).items() if c.get("kept") is False}
    if not noisy:
        return None
    worst = max(c.get("spread", 0.0) for c in noisy.values())
    return (f"The {' and '.join(noisy)} paths were measured on a busy machine (timings spread up to {worst:.0%}): "
            "they chose this run's paths, were not kept, and the next run measures again.")


def path_lines(header: dict) -> list[str]:
    rows = path_rows(header)
    lines = [f"LINEAR PATH PER WIDTH (measured on {machine_words(header)}; the fastest one runs)",
             "  model   width  as loaded   packed      rows        rows variant  runs"]
    for r in rows:
        rows_ms, packed_ms = ("-" if t is None else f"{t * 1000:.3f} ms" for t in (r.rows_s, r.packed_s))
        lines.append(f"  {r.model:<6}  {r.width:>5}  {r.as_loaded_s * 1000:>7.3f} ms  {packed_ms:>10}  "
                     f"{rows_ms:>10}  {r.rows_variant or '-':<12}  {r.runs}")
    noisy, absent = noisy_words(header), absent_words(header)
    return lines + ([f"  {noisy}"] if noisy else []) + ([f"  {absent}"] if absent else [])


def absent_words(header: dict) -> str | None:
    """Said when a path could not be timed on the machine of the run (the rows kernel without a C compiler,
    the packed path for a bfloat16 model)."""
    absent = sorted({f"{p} ({why})" for c in (header.get("linear_paths") or {}).values()
                     for p, why in (c.get("absent") or {}).items()})
    return f"Not timed on this machine: {'; '.join(absent)}." if absent else None
