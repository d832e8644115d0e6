"""The batch benchmarks shipped with the project (bench/results/batch-*.json, written by `python -m bench.batch`),
read and checked for the statistics page and the interview.

Each file holds the machine and one sweep per preset. Every sweep goes through
engine/stats/batch_results.py's checks; a file or sweep that fails them is left out and said so
(`BenchSweeps.skipped`), never shown half-read. The file names are this server's own glob, never a
name a trace or a user gives.
"""
import json
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from app.ui.state import CACHE_TTL_S, ROOT
from engine.stats.batch_results import BatchSweep, batch_sweep_from_json

BENCH_RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True)
class ShippedSweep:
    file: str  # the results file's name
    machine: str  # its CPU model, as the bench recorded it
    sweep: BatchSweep

    @property
    def label(self) -> str:
        return (f"{self.sweep.preset}: {self.sweep.requests} requests of {self.sweep.max_new_tokens} tokens, "
                f"{self.machine} ({self.file})")


@dataclass(frozen=True)
class BenchSweeps:
    sweeps: list[ShippedSweep] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "file: why", one per file or sweep left out


def read_bench_file(path: Path) -> tuple[list[ShippedSweep], list[str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        machine = str(data["machine"].get("cpu", "an unnamed machine"))
        presets = list(data["presets"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return [], [f"{path.name}: not a batch benchmark ({type(err).__name__})"]
    sweeps, skipped = [], []
    for i, entry in enumerate(presets):
        try:
            sweeps.append(ShippedSweep(path.name, machine, batch_sweep_from_json(entry)))
        except ValueError as err:
            skipped.append(f"{path.name}, sweep {i + 1}: {err}")
    return sweeps, skipped


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def _read_all(folder: str, signature: tuple[tuple[str, int, int], ...]) -> BenchSweeps:
    sweeps, skipped = [], []
    for name, _, _ in signature:
        found, left_out = read_bench_file(Path(folder) / name)
        sweeps += found
        skipped += left_out
    return BenchSweeps(sweeps, skipped)


def shipped_sweeps() -> BenchSweeps:
    """Every shipped batch sweep, by file name (re-read when a file changes)."""
    paths = sorted(BENCH_RESULTS.glob("batch-*.json"))
    return _read_all(str(BENCH_RESULTS), tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in paths))


def largest_per_preset(found: BenchSweeps) -> list[ShippedSweep]:
    """Per preset, the sweep with the most requests (the first by file name on a tie), in the order first seen."""
    best: dict[str, ShippedSweep] = {}
    for s in found.sweeps:
        if s.sweep.preset not in best or s.sweep.requests > best[s.sweep.preset].sweep.requests:
            best[s.sweep.preset] = s
    return list(best.values())
