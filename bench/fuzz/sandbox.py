"""One case in a child process of its own: forked, limited in time and memory, in a fresh folder.

The parent imported every entry point once; each case forks a child (cheap, copy-on-write) that
lowers its address-space limit to what it has now plus a budget, moves into a fresh working
folder, runs the case and sends its outcome through a pipe. The parent waits on the child's
pidfd with a timeout (no sleep loop) and kills a child that runs past it: a hang.

Each case's working folder lies in a root beside a canary folder. Hostile names in the cases
point into the canary (absolute paths, and '../' climbs out of the working folder); after the
case, the root outside the working folder must be as it was, and inside it only the folder the
entry point may write (an upload folder) may have changed.
"""
import io
import json
import os
import resource
import select
import shutil
import signal
import stat
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench.fuzz.cases import ACCEPTED, CRASH, HANG, MEMORY, REFUSED, Case, Refused

MESSAGE_CHARS = 600  # of a refusal or a crash, kept for the report (the pipe holds far more)
CANARY_FILE = "keep-me.txt"


@dataclass(frozen=True)
class Limits:
    seconds: float = 60.0  # far above any case's real cost: reaching it means a hang
    memory_mib: int = 2048  # address space the child may add to what the parent has


@dataclass(frozen=True)
class Places:
    root: Path  # the working folder's parent
    work: Path  # the case's working folder (its cwd)
    canary: Path  # where hostile names point

    @classmethod
    def make(cls, root: Path) -> "Places":
        places = cls(root, root / "work", root / "canary")
        places.canary.mkdir(parents=True, exist_ok=True)
        (places.canary / CANARY_FILE).write_text("the fuzz harness's canary: nothing may change it\n")
        return places


@dataclass
class Result:
    outcome: str
    message: str = ""  # the refusal's message, or the crash's type, message and place
    output: str = ""  # what an accepted case printed (the end of it)
    outside: list[str] | None = None  # paths written where the case may not write


def fresh_work(places: Places, files: dict[str, bytes]) -> None:
    if places.work.exists():
        shutil.rmtree(places.work)
    places.work.mkdir()
    for name, data in files.items():
        path = places.work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def snapshot(places: Places, allowed: str | None) -> dict[str, tuple]:
    """Every path under the root with its size and modification time, but the folder the case may write."""
    seen = {}
    for folder, dirs, files in os.walk(places.root):
        here = Path(folder)
        if allowed is not None and here == places.work:
            dirs[:] = [d for d in dirs if d != allowed]
        for name in [*dirs, *files]:
            path = here / name
            if allowed is not None and here == places.work and name == allowed:
                continue
            st = path.lstat()
            # A folder's size and time change with its entries, which are listed themselves.
            kept = (st.st_mode,) if stat.S_ISDIR(st.st_mode) else (st.st_mode, st.st_size, st.st_mtime_ns)
            seen[str(path.relative_to(places.root))] = kept
    return seen


def address_space_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def child(attempt: Callable[[Case, Path], str], case: Case, places: Places, limits: Limits, pipe: int) -> None:
    """Run in the forked child: never returns (os._exit), whatever happens."""
    result = Result(CRASH, "the child sent nothing")
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1), os.dup2(devnull, 2)  # Streamlit's bare-mode warnings and the like
        cap = address_space_now() + limits.memory_mib * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.chdir(places.work)
        result = run_case(attempt, case, places)
    except BaseException as err:  # noqa: BLE001 - whatever it is, the parent hears of it
        result = Result(CRASH, f"the harness's child failed: {type(err).__name__}: {err}"[:MESSAGE_CHARS])
    finally:
        try:
            os.write(pipe, json.dumps(result.__dict__).encode("utf-8", "replace"))
        finally:
            os._exit(0)


def run_case(attempt: Callable[[Case, Path], str], case: Case, places: Places) -> Result:
    printed = io.StringIO()
    try:
        with redirect_stdout(printed), redirect_stderr(printed):
            output = attempt(case, places.work) or ""
        return Result(ACCEPTED, output=(output + printed.getvalue())[-MESSAGE_CHARS:])
    except Refused as err:
        return Result(REFUSED, str(err)[:MESSAGE_CHARS * 4])
    except MemoryError:
        return Result(MEMORY, "MemoryError")
    except BaseException as err:  # noqa: BLE001 - anything but the reader's own refusal is a crash
        frames = traceback.extract_tb(err.__traceback__)
        where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
        return Result(CRASH, f"{type(err).__name__}: {err}{where}"[:MESSAGE_CHARS])


def run_forked(attempt: Callable[[Case, Path], str], case: Case, places: Places, limits: Limits) -> Result:
    """The case's result from a forked child, or HANG when it outlives the time limit."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        child(attempt, case, places, limits, write_end)
    os.close(write_end)
    try:
        ended = wait_for_exit(pid, limits.seconds)
        if not ended:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if not ended:
            return Result(HANG, f"still running after {limits.seconds:g} s")
        data = read_all(read_end)
    finally:
        os.close(read_end)
    if not data:
        return Result(CRASH, f"the child died without an answer ({exit_words(status)})")
    return Result(**json.loads(data))


def wait_for_exit(pid: int, seconds: float) -> bool:
    """Whether the child exited within `seconds`: its pidfd becomes readable when it does."""
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(seconds * 1000))
    finally:
        os.close(pidfd)


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def exit_words(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.WEXITSTATUS(status)}"
