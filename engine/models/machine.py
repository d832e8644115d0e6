"""The machine a measurement was taken on: CPU model, the vector features that change which
kernels run, threads and load. Benchmarks and the engine's own per-machine measurements
(engine/models/linear_paths.py) describe the machine the same way.
"""
import os
import platform
from pathlib import Path

import torch

# The CPU features that decide which float32 kernels oneDNN and MKL pick (AVX2 on an AMD EPYC,
# AVX-512 and AMX on an Intel Xeon of this project's kind: both measured).
FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def cpu_model() -> str:
    for line in _cpuinfo():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_features() -> list[str]:
    """Which of FEATURES the CPU reports (empty where /proc/cpuinfo is not there)."""
    for line in _cpuinfo():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return [f for f in FEATURES if f in flags]
    return []


def load_average() -> float | None:
    """The 1-minute load average: how busy the machine was when a figure was taken."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine_key() -> dict:
    """What a per-machine measurement is valid for: a different CPU, thread count or torch build
    may pick different kernels, so any change means measuring again."""
    return {"cpu": cpu_model(), "features": cpu_features(), "threads": torch.get_num_threads(),
            "torch": torch.__version__}
