"""The command line (`python -m engine stats|metrics ...`) called in the child, as a user runs it.

`engine.cli.main` prints every error as one line and returns 2. With SPECLAB_DEBUG=1 it re-raises
the errors it does not know (anything but SettingsError, TraceError, ValueError, OSError and the
model errors), so those show up as crashes here instead of hiding behind exit code 2.
"""
import io
import os
from contextlib import redirect_stderr, redirect_stdout

from bench.fuzz.cases import Refused
from engine.cli import main as cli_main


class BadOutput(Exception):
    """The command succeeded but printed something it never should (a NaN, an infinity)."""


def run_cli(argv: list[str]) -> str:
    """What the command printed when it succeeded; Refused with its error line when it exited with 2."""
    os.environ["SPECLAB_DEBUG"] = "1"
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli_main(argv)
    if code == 2:
        raise Refused(err.getvalue().strip().removeprefix("error: "))
    if code != 0:
        raise BadOutput(f"exit code {code}: {err.getvalue().strip()[:200]}")
    return out.getvalue()
