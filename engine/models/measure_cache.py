"""A file of per-machine measurements on disk: {"format", "version", "entries": {key: measurement}}.

The engine's own measurements (engine/models/linear_paths.py, engine/cycle/capture_choice.py) are
kept this way so that the next run on the same machine reuses them. The file is the engine's but
any process may have damaged it: a file that is not this format and version reads as empty (it is
measured over), each entry is checked by its owner, and writes are atomic (a reader never sees half
a file). A folder that cannot be written only costs a measurement next time.

May import: the standard library.
"""
import json
import os
from pathlib import Path


def read_entries(path: Path, file_format: str, version: int) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    ok = isinstance(data, dict) and data.get("format") == file_format and data.get("version") == version
    return data["entries"] if ok and isinstance(data.get("entries"), dict) else {}


def write_entries(path: Path, file_format: str, version: int, entries: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"format": file_format, "version": version, "entries": entries}, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass
