"""A file of per-machine measurements on disk: {"format", "version", "entries": {key: measurement}}.

The engine's own measurements (engine/models/linear_paths.py, engine/cycle/capture_choice.py) are
kept this way so that the next run on the same machine reuses them. The file is the engine's but
any process may have damaged it: a file that is not this format and version reads as empty (it is
measured over), each entry is checked by its owner, and writes are atomic (a reader never sees half
a file). A folder that cannot be written only costs a measurement next time.

May import: the standard library and engine.models.presets (the engine's cache folder).
"""
import json
import os
from dataclasses import dataclass
from pathlib import Path

from engine.models.presets import cache_root


@dataclass(frozen=True)
class MeasureFile:
    env_var: str  # names the file when set (tests and servers point it elsewhere)
    file_name: str  # else the file of this name in the engine's cache folder (SPECLAB_CACHE)
    file_format: str
    version: int

    def path(self) -> Path:
        named = os.environ.get(self.env_var)
        return Path(named) if named else cache_root() / self.file_name

    def read(self) -> dict:
        try:
            data = json.loads(self.path().read_text())
        except (OSError, ValueError):
            return {}
        ok = isinstance(data, dict) and data.get("format") == self.file_format and data.get("version") == self.version
        return data["entries"] if ok and isinstance(data.get("entries"), dict) else {}

    def write(self, entries: dict) -> None:
        path = self.path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"format": self.file_format, "version": self.version, "entries": entries},
                                      indent=1))
            os.replace(tmp, path)
        except OSError:
            pass
