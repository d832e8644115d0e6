"""Server time of the most recent script runs of this process, newest last.

main.py appends one pair of numbers per run: wall-clock milliseconds, and the CPU
milliseconds the script thread itself used (on a shared, busy machine the wall time
also counts waiting for a core). The speed test reads them (AppTest runs the app in
the test's own process), and a developer can too.
"""
import time
from collections import deque

RECENT_RUNS_MS: deque[float] = deque(maxlen=100)
RECENT_RUNS_CPU_MS: deque[float] = deque(maxlen=100)


class RunTimer:
    """Start at the top of a script run; `stop()` records it."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.thread_time()

    def stop(self) -> None:
        RECENT_RUNS_MS.append((time.perf_counter() - self.wall) * 1000)
        RECENT_RUNS_CPU_MS.append((time.thread_time() - self.cpu) * 1000)
