"""When a tensor-parallel run fails: who says so, and in one line.

A run over N ranks can fail in two ways. The group breaks: a rank died (its sockets close
and the others' next collective fails at once) or stopped answering (the others' next
collective gives up after the group's timeout). Every surviving rank then sees an error,
the same event N-1 times, so rank 0 alone reports it. Or one rank fails on its own: it could
not load its shard, or ran out of memory; that rank alone knows why, so it says so, prefixed
with its rank. torchrun then stops the other ranks and adds its own report below.

torchrun stops the surviving ranks with SIGTERM as soon as one exits with an error. Rank 0
turns that signal into an error of its own, so it still writes its one line and keeps the
finished cycles in the partial trace.
"""
import re
import signal
import sys

import torch.distributed as dist

from engine.parallel.world import RankError, current_world, launched_rank

# What gloo and NCCL say when a peer is gone or silent (their errors are plain RuntimeErrors).
GROUP_FAILURE_MARKS = ("Connection closed by peer", "Connection reset by peer", "Timed out waiting",
                       "Broken pipe", "NCCL", "ProcessGroup", "gloo")


class GroupError(RuntimeError):
    """The group as a whole failed (a rank died or hung); rank 0 reports it, the others stay silent."""


def is_group_failure(err: BaseException) -> bool:
    if isinstance(err, GroupError):
        return True
    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    return isinstance(err, RuntimeError) and not isinstance(err, RankError) and any(
        mark in str(err) for mark in GROUP_FAILURE_MARKS)


def short_reason(err: BaseException) -> str:
    """The backend's message without its source location, first sentence only."""
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", " ".join(str(err).split()))
    return text.split(". ")[0].rstrip(".") or type(err).__name__


def broken_group(err: BaseException, timeout_s: float, where: str) -> GroupError:
    """The one-line error rank 0 reports when a collective failed."""
    return GroupError(f"the tensor-parallel group broke {where}: a rank died or did not answer within "
                      f"--tp-timeout {timeout_s:g} s ({short_reason(err)})")


def speaker(err: BaseException) -> str | None:
    """The prefix this process prints `err` with, or None when another rank reports it.

    A plain process and rank 0 speak; another rank speaks only of its own failures after it
    joined the group (before that, every rank parsed the same command line and fails alike)."""
    rank = launched_rank()
    if rank is None or rank == 0:
        return ""
    if isinstance(err, KeyboardInterrupt):  # torchrun passes Ctrl-C to every rank
        return None
    if isinstance(err, RankError):
        return f"rank {rank}: "
    if current_world() is None or is_group_failure(err):
        return None
    return f"rank {rank}: "


def stop_on_sigterm() -> None:
    """On rank 0: torchrun's SIGTERM becomes a GroupError, once. If an error is already on its way
    (the signal lands in an except, finally or __exit__ block, where sys.exc_info() is set), the
    signal is ignored: that error is the one to report, and a second one would end it in a traceback."""
    def handler(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if sys.exc_info()[1] is None:
            raise GroupError("torchrun stopped rank 0 (SIGTERM): another rank failed or the run was cancelled; "
                             "torchrun's report names the rank")
    signal.signal(signal.SIGTERM, handler)


def quiet_sigterm() -> None:
    """While the error is being written: a late SIGTERM must not cut it off with a traceback."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
