"""What the person who runs the server decides, read from environment variables
(docs/running-for-a-class.md lists them with the others):

- SPECLAB_READ_ONLY=1: a read-only class server. No live work at all (no live runs, teaching
  runs, measurements or K sweeps, and no model is loaded); bundled and uploaded traces only.
- SPECLAB_MAX_JOBS=N: how many live jobs run at once on the server (app/ui/job_queue.py).

A value that is not one of these is refused with a one-line message that names the variable,
never guessed at: a mistyped read-only switch must not quietly leave live work on.
"""
import os

READ_ONLY = "SPECLAB_READ_ONLY"
MAX_JOBS = "SPECLAB_MAX_JOBS"
MOST_JOBS = 64  # a sanity bound on SPECLAB_MAX_JOBS: each job holds a model's working memory
ON, OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


class OperatorSettingError(ValueError):
    """An environment variable of the operator's that the app cannot use; its text says which and why."""


def read_only() -> bool:
    value = os.environ.get(READ_ONLY, "").strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    raise OperatorSettingError(f"{READ_ONLY} must be 1 (a read-only class server) or 0, not {value!r}")


def cores() -> int:
    """CPU cores this process may use (a container or taskset may allow fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_max_jobs(n_cores: int) -> int:
    """One job per core, less one core that stays free to draw pages for everyone who is stepping
    through a trace meanwhile; at least one job. On this project's 2-core machines: 1."""
    return max(1, n_cores - 1)


def threads_per_job(limit: int, n_cores: int) -> int:
    """Torch threads of each job: the job slots share the cores less the one that draws pages (all
    page draws share one Python interpreter lock, so about one core). On 2 cores: 1. A job on
    more threads than it has cores runs many times slower (25x measured, app/ui/live_work.py)."""
    return max(1, (n_cores - 1) // limit)


def job_threads(limit: int) -> int | None:
    """threads_per_job on this machine, or None (torch left as it is) when whoever started the
    server chose torch's threads with OMP_NUM_THREADS (bench/live_speed.py --app-threads does)."""
    return None if os.environ.get("OMP_NUM_THREADS") else threads_per_job(limit, cores())


def max_jobs() -> int:
    value = os.environ.get(MAX_JOBS, "").strip()
    if not value:
        return default_max_jobs(cores())
    if not value.isdigit() or not 1 <= int(value) <= MOST_JOBS:
        raise OperatorSettingError(f"{MAX_JOBS} must be a whole number of jobs from 1 to {MOST_JOBS}, not {value!r}")
    return int(value)


def problem() -> str | None:
    """Why the operator's settings cannot be used, or None: checked before every page is drawn."""
    try:
        read_only()
        max_jobs()
    except OperatorSettingError as err:
        return str(err)
    return None


READ_ONLY_WORDS = ("This is a read-only class server: it shows the bundled and uploaded traces and the stored "
                   "results, and runs nothing live.")
