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


def explain_files(files: list[str]) -> str:
    """The report printed for the files; Refused when a reader refused them; BadOutput for a NaN shown."""
    args = build_parser().parse_args(["metrics", *files])
    printed = io.StringIO()
    try:
        with redirect_stdout(printed):
            cmd_metrics(args)
    except (ServerMetricsError, SettingsError) as err:
        raise Refused(str(err)) from None
    check_printed(printed.getvalue())
    return printed.getvalue()


def check_printed(printed: str) -> None:
    bad = NOT_A_NUMBER.search(printed)
    if bad:
        raise BadOutput(f"the report shows {bad.group(0)!r}: ...{printed[max(0, bad.start() - 80): bad.end() + 20]!r}")
