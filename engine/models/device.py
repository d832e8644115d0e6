"""Which device and dtype a model runs on, and the one way this project times a piece of work.

CUDA kernels run asynchronously: a forward returns before the GPU has finished, so a
timing must wait for the device before reading the clock. Every timed step (draft steps,
verify passes, catch-up, calibration, teaching and benchmark loops) goes through `timed`.
"""
import time
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def pick_device(requested: str | None = None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_dtype(device: torch.device, requested: str | None = None) -> torch.dtype:
    """float32 unless asked otherwise, on the GPU too.

    The point of this tool is to watch an exact algorithm. In half precision a verify
    pass over K+1 positions and a one-token decode step round differently, so a near
    tie in the target's argmax can flip and greedy speculation parts from plain greedy
    decoding (measured on an H200 in bfloat16: the chat preset's outputs part after
    32-63 tokens; in float32 they did not). Half precision is there for large pairs.
    """
    if requested is None:
        return torch.float32
    if requested not in DTYPES:
        raise ValueError(f"unknown dtype {requested!r}; choose one of {', '.join(DTYPES)}")
    if DTYPES[requested] != torch.float32 and device.type == "cpu":
        raise ValueError(f"{requested} on the CPU is slow and blurs the greedy-equality check: use float32 there")
    return DTYPES[requested]


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
