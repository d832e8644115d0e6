"""`python -m engine replica FOLDER [--out OUT]`: a server workload run again through the lab's engine,
compared with the server step by step (engine/replica/). The folder and the server's configuration are
read and refused before any model loads; a line per request as it finishes, then the summary line.

May import everything in the engine.
"""
from pathlib import Path

from engine.config import SettingsError

DEFAULT_OUT = "replica"  # inside the server workload's folder


def out_folder(folder: str, out: str | None) -> Path:
    """--out, or FOLDER/replica; a folder that is new or empty (a replica never mixes with another run)."""
    path = Path(out) if out else Path(folder) / DEFAULT_OUT
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise SettingsError(f"--out {path} is not an empty folder: name a new one")
    return path


def cmd_replica(args) -> int:
    from engine.replica.report import request_line, summary_line
    from engine.replica.run import one_budget, run_replica
    from engine.replica.server_workload import read_server_workload
    from engine.replica.settings import replica_plan

    server = read_server_workload(args.folder)
    replica_plan(server.speculative_config, server.temperature)  # refused before the models load
    one_budget(server.answers)
    out = out_folder(args.folder, args.out)
    replica = run_replica(server, out, on_request=lambda c: print(request_line(c), flush=True))
    print(summary_line(replica.comparisons))
    print(f"replica written to {out} (a workload folder: `python -m engine stats {out}`; {out}/replica.json)")
    return 0
