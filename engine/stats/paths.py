"""Which linear path ran each forward width, as a calibrated CPU trace's header records it
(engine/models/linear_paths.py measured it on the machine of the run)."""
from dataclasses import dataclass

from engine.trace.schema import AS_LOADED, PACKED


@dataclass(frozen=True)
class PathRow:
    model: str  # "target" or "draft"
    width: int  # positions in the forward (a verify over K+1 positions has width K+1)
    as_loaded_s: float
    packed_s: float
    runs: str  # the path chosen: the faster one

    @property
    def saving(self) -> float:
        """How much faster the chosen path is than the other, as a fraction of the other."""
        slow = max(self.as_loaded_s, self.packed_s)
        return 1 - min(self.as_loaded_s, self.packed_s) / slow


def path_rows(header: dict) -> list[PathRow]:
    """One row per model and width; empty for a trace without the field (GPU runs, older traces)."""
    rows = []
    for model, curve in (header.get("linear_paths") or {}).items():
        for i, w in enumerate(curve["widths"]):
            rows.append(PathRow(model, w, curve["seconds"][AS_LOADED][i], curve["seconds"][PACKED][i],
                                curve["chosen"][str(w)]))
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
    lines = [f"LINEAR PATH PER WIDTH (measured on {machine_words(header)}; the faster one runs)",
             "  model   width  as loaded   packed    runs"]
    for r in rows:
        lines.append(f"  {r.model:<6}  {r.width:>5}  {r.as_loaded_s * 1000:>7.3f} ms  {r.packed_s * 1000:>7.3f} ms  {r.runs}")
    noisy = noisy_words(header)
    return lines + ([f"  {noisy}"] if noisy else [])
