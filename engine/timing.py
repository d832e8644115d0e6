"""The one way this project times a piece of work.

CUDA kernels run asynchronously: a forward returns before the GPU has finished, so a
timing must wait for the device before reading the clock. Every timed step (draft steps,
verify passes, catch-up, calibration, teaching and benchmark loops) goes through `timed`.
"""
import time
from typing import Callable, TypeVar

import torch

from .kv import sync

T = TypeVar("T")


def timed(fn: Callable[[], T], device: torch.device | None = None) -> tuple[T, float]:
    """Run fn; return its result and the wall seconds it took, the device's queued work included."""
    start = time.perf_counter()
    result = fn()
    if device is not None:
        sync(device)
    return result, time.perf_counter() - start
