"""`python -m engine stats` and `python -m engine metrics`: reading what was written or scraped.

`stats FILE` prints a trace's acceptance, cost and speed (or vLLM's Prometheus counters with
--prometheus); `stats FOLDER|ZIP` a workload's statistics (or one JSON object with --json); a folder
`engine client` wrote gets its server workload's statistics and both totals.
`metrics FILE...` explains a vLLM, SGLang or TensorRT-LLM server's speculative-decoding metrics,
optionally against a trace. Refusals raise SettingsError; engine/cli/__init__.py prints them.

May import the engine's readers and reports: engine.trace, engine.stats, engine.servers,
engine.workload, engine.config. Loads no model.
"""
import json
import os

from engine.config import SettingsError
from engine.trace.format import load_trace
from engine.trace.schema import MAX_K


def cmd_stats(args) -> int:
    if is_workload(args.trace):
        return cmd_workload_stats(args)
    if args.json:
        raise SettingsError("--json reads a workload (a folder or a zip of one); for a trace use the text report")
    trace = load_trace(args.trace, allow_incomplete=True)
    if args.prometheus:
        from engine.servers.export import prometheus_text
        print(prometheus_text(trace), end="")
        return 0
    from engine.stats.report import format_stats
    print(format_stats(trace))
    return 0


def is_workload(path: str) -> bool:
    return os.path.isdir(path) or path.endswith(".zip")


def cmd_workload_stats(args) -> int:
    from engine.servers.server_workload import is_server_workload
    if is_server_workload(args.trace):
        return cmd_server_workload_stats(args)
    from engine.workload.folder import open_workload
    from engine.workload.report import format_workload_stats
    from engine.workload.stats import workload_stats

    if args.prometheus:
        raise SettingsError("--prometheus reads one trace, not a workload")
    workload = open_workload(args.trace)
    stats = workload_stats(workload.runs())
    print(json.dumps(stats, ensure_ascii=False) if args.json else format_workload_stats(stats))
    return 0


def cmd_server_workload_stats(args) -> int:
    """A folder `engine client` wrote: the per-request views, and the requests' sum against the server's counters."""
    from engine.servers.server_workload import open_server_workload
    from engine.workload.server_report import format_server_workload_stats
    from engine.workload.server_stats import server_workload_stats

    if args.prometheus:
        raise SettingsError("--prometheus reads one trace, not a server workload")
    stats = server_workload_stats(open_server_workload(args.trace))
    print(json.dumps(stats, ensure_ascii=False) if args.json else format_server_workload_stats(stats))
    return 0


def read_metrics_files(files: list[str]) -> list[str]:
    """The files' text, each refused above the readers' size limit before it is read whole."""
    from engine.servers.read import decode
    from engine.servers.server_metrics import MAX_INPUT_BYTES, check_text_size
    texts = []
    for name in files:
        with open(name, "rb") as f:
            data = f.read(MAX_INPUT_BYTES + 1)
        check_text_size(data, name)
        texts.append(decode(data, name))
    return texts


def cmd_metrics(args) -> int:
    from engine.servers.explain import calibrated_costs, entered_costs, explain
    from engine.servers.read import read_requests_text, read_texts
    from engine.servers.report import format_report, format_requests
    from engine.servers.request_stats import requests_stats
    from engine.stats.analysis import trace_stats

    if args.k is not None and not 1 <= args.k <= MAX_K:
        raise SettingsError(f"--k {args.k}: K must be 1 to {MAX_K}")
    texts = read_metrics_files(args.files)
    requests = read_requests_text(texts[0]) if len(texts) == 1 else None  # per-request output: shown one by one
    record = read_texts(texts)
    trace = trace_stats(load_trace(args.trace, allow_incomplete=True)) if args.trace else None
    k = args.k or record.k
    costs = None
    if args.c is not None:
        costs = entered_costs(args.c, args.verify_steps)
    elif trace is not None and trace.calibration is not None and k:
        costs = calibrated_costs(trace.calibration, k)
    if requests is not None:
        print(format_requests(requests_stats(requests)))
        print("\n" + "=" * 8 + " THE REQUESTS ADDED UP, EXPLAINED AS ONE SERVER'S COUNTS " + "=" * 8 + "\n")
    print(format_report(explain(record, args.k, costs, args.verify_steps), trace))
    return 0
