"""Which device and dtype a model runs on, and the one way this project times a piece of work.

CUDA kernels run asynchronously: a forward returns before the GPU has finished, so a
timing must wait for the device before reading the clock. Every timed step (draft steps,
verify passes, catch-up, calibration, teaching and benchmark loops) goes through `timed`.
"""
import time
from typing import Callable, TypeVar

import torch

from engine.models.machine import cpu_features

T = TypeVar("T")


def pick_device(requested: str | None = None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# CPU features with bfloat16 arithmetic in hardware (engine/models/machine.py reads them): without
# one, a bfloat16 product is converted to float32 and back, slower than float32 itself.
NATIVE_BF16 = ("avx512_bf16", "amx_bf16")


def pick_dtype(device: torch.device, requested: str | None = None, cpu_flags: list[str] | None = None) -> torch.dtype:
    """float32 unless asked otherwise, on the GPU too.

    The point of this tool is to watch an exact algorithm. In half precision a verify
    pass over K+1 positions and a one-token decode step round differently, so a near
    tie in the target's argmax can flip and greedy speculation parts from plain greedy
    decoding (measured on an H200 in bfloat16: the chat preset's outputs part after
    32-63 tokens; in float32 they did not). Half precision is there for large pairs,
    and for the CPU's memory limit: bfloat16 weights are half the bytes a step reads,
    allowed on a CPU with bfloat16 in hardware (NATIVE_BF16; `cpu_flags` defaults to this
    machine's) or, on any other, where the rows kernel builds (engine/models/f32_rows_kernel.py:
    it widens each bfloat16 weight to float32 as it reads it, where torch's own bfloat16
    products there were slower than float32). float16 has no fast CPU kernels here and stays GPU only.
    """
    if requested is None:
        return torch.float32
    if requested not in DTYPES:
        raise ValueError(f"unknown dtype {requested!r}; choose one of {', '.join(DTYPES)}")
    if DTYPES[requested] == torch.float32 or device.type != "cpu":
        return DTYPES[requested]
    flags = cpu_features() if cpu_flags is None else cpu_flags
    if requested == "bfloat16" and any(f in flags for f in NATIVE_BF16):
        return torch.bfloat16
    if requested == "bfloat16":
        from engine.models.f32_rows_kernel import unavailable
        why = unavailable()
        if why is None:
            return torch.bfloat16
        raise ValueError("bfloat16 on this CPU: it has no bfloat16 instructions (avx512_bf16 or AMX), and the rows "
                         f"kernel that reads bfloat16 weights without them could not be built ({' '.join(why.split())}), "
                         "so every product would be converted and run slower than float32; use float32 there")
    raise ValueError(f"{requested} on the CPU is slow and blurs the greedy-equality check: use float32 there "
                     "(or bfloat16)")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], T], device: torch.device | None = None) -> tuple[T, float]:
    """Run fn; return its result and the wall seconds it took, the device's queued work included."""
    start = time.perf_counter()
    result = fn()
    if device is not None:
        sync(device)
    return result, time.perf_counter() - start
