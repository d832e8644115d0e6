"""`python -m engine replica FOLDER [--out OUT]`: a server workload run again through the lab's engine,
compared with the server (engine/replica/): greedy requests step by step, sampled ones in aggregate per
draft position. The folder and the server's configuration are read and refused before any model loads;
a line per request as it finishes, then (sampled) a line per position and the overall figures, then the
summary line.

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
    from engine.replica.report import request_line, sampled_lines, sampled_request_line, summary_line
    from engine.replica.run import replica_settings, run_replica
    from engine.replica.server_workload import read_server_workload
    from engine.replica.settings import replica_plan

    server = read_server_workload(args.folder)
    plan = replica_plan(server.speculative_config, server.temperature)  # refused before the models load
    replica_settings(server, plan.k)  # one max_tokens, and settings the engine runs
    out = out_folder(args.folder, args.out)
    line = request_line if server.temperature == 0 else sampled_request_line
    replica = run_replica(server, out, on_request=lambda c: print(line(c), flush=True))
    print("\n".join(sampled_lines(replica.sampled)) if replica.sampled else summary_line(replica.comparisons))
    print(f"replica written to {out} (a workload folder: `python -m engine stats {out}`; {out}/replica.json)")
    return 0
