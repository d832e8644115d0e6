"""`python -m engine` under torchrun, with one rank made to fail on purpose (tests/test_tensor_parallel.py).

    torchrun ... -m tests.tp_fault --fault kill --rank 1 --after 3 -- run --tp 2 ...

Started as a module from the repository root (`-m tests.tp_fault`), so the root is on sys.path
and `engine` imports as is; importing it sets the offline default (engine/__init__.py).

The chosen rank runs the real command line; after carrying out its `after`-th rollback it
either kills itself with SIGKILL (a crash: its sockets close) or sleeps for an hour (a hang:
it stays alive and silent). The other ranks run the command line untouched.
"""
import argparse
import os
import signal
import sys
import time

from engine.cli import main
from engine.parallel import mirror


def fail_after(rollbacks: int, fault: str) -> None:
    """Make this rank's follower fail once it has carried out `rollbacks` rollbacks."""
    apply = mirror.Follower.apply
    done = []

    def failing_apply(self, op: mirror.Op) -> bool:
        result = apply(self, op)
        if op.kind == mirror.ROLL_BACK:
            done.append(op.a)
            if len(done) == rollbacks:
                if fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(3600)  # hang: alive, silent; torchrun's SIGTERM ends it
        return result
    mirror.Follower.apply = failing_apply


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=["kill", "hang"], required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--after", type=int, required=True)
    parser.add_argument("engine_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if int(os.environ["RANK"]) == args.rank:
        fail_after(args.after, args.fault)
    argv = args.engine_args[1:] if args.engine_args[:1] == ["--"] else args.engine_args
    sys.exit(main(argv))
