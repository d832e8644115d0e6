"""`python -m engine metrics FILE...` as its command function runs it (engine/cli/stats.py `cmd_metrics`):
the per-request reader, the server reader, the explanation and the report, with exceptions left as
they are, so the kind can tell the readers' refusals from anything else.
"""
import io
import re
from contextlib import redirect_stdout

from bench.fuzz.cases import Refused
from bench.fuzz.cli import BadOutput
from engine.cli import build_parser
from engine.cli.stats import cmd_metrics
from engine.config import SettingsError
from engine.servers.server_metrics import ServerMetricsError

NOT_A_NUMBER = re.compile(r"\b(nan|inf|infinity)\b", re.IGNORECASE)
# A rate the report prints as a number: with no draft in the window, each of these is 0/0 and must read n/a.
RATE_SHOWN = re.compile(r"(acceptance rate|acceptance length|per-position acceptance|conditional[^:\n]*|alpha): -?[0-9]+\.[0-9]")


def explain_files(files: list[str], no_drafts: bool = False) -> str:
    """The report printed for the files; Refused when a reader refused them; BadOutput for a NaN shown, or,
    for input with no draft at all (`no_drafts`), for any rate shown as a number."""
    args = build_parser().parse_args(["metrics", *files])
    printed = io.StringIO()
    try:
        with redirect_stdout(printed):
            cmd_metrics(args)
    except (ServerMetricsError, SettingsError) as err:
        raise Refused(str(err)) from None
    check_printed(printed.getvalue())
    rate = RATE_SHOWN.search(printed.getvalue()) if no_drafts else None
    if rate:
        raise BadOutput(f"no draft in the input, yet the report shows {rate.group(0)!r}: a rate of 0/0")
    return printed.getvalue()


def check_printed(printed: str) -> None:
    bad = NOT_A_NUMBER.search(printed)
    if bad:
        raise BadOutput(f"the report shows {bad.group(0)!r}: ...{printed[max(0, bad.start() - 80): bad.end() + 20]!r}")
