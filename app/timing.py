"""Server time of the most recent script runs of this process, newest last.

main.py appends one number per run; the speed test reads them (AppTest runs the app
in the test's own process), and a developer can too.
"""
from collections import deque

RECENT_RUNS_MS: deque[float] = deque(maxlen=100)
