"""A workload, opened from its folder or from a zip of it (an upload, a bundled example).

Only `manifest.json` and the request files it lists (request-NNNN.jsonl, checked by the
manifest) are ever read: a zip member or a folder's file is looked up by that exact name. A vLLM
capture's folder has its own manifest; engine/workload/captured.py reads it as a workload.
Each trace is checked as any trace is (engine/trace), then against its manifest entry: the
same settings, the same request, the same summary. A zip's sizes are checked before reading.
"""
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from engine.trace.batch_reader import BATCH_TRACE, MAX_BATCH_TRACE_BYTES, check_against_workload, loads_batch_trace
from engine.trace.format import MAX_TRACE_BYTES, loads_trace
from engine.trace.record_types import Trace
from engine.workload.captured import CAPTURE_FORMAT, capture_workload, is_capture
from engine.workload.manifest import (
    DONE,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Entry,
    WorkloadError,
    batch_rows,
    loads_manifest,
    request_seed,
)
from engine.workload.requests import RequestRun
from engine.workload.zip_checks import open_checked_zip, read_entry


@dataclass
class Workload:
    """A workload's manifest, its requests, and the traces of those that are done (read on demand)."""

    source: str
    manifest: dict
    entries: list[Entry]
    read: Callable[[str], bytes]  # a listed file's bytes
    _traces: dict = field(default_factory=dict, repr=False)

    @property
    def done(self) -> list[Entry]:
        return [e for e in self.entries if e.status == DONE]

    def entry(self, request_id: str) -> Entry:
        for e in self.entries:
            if e.id == request_id:
                return e
        raise WorkloadError(f"{self.source}: no request {request_id!r}")

    def trace(self, e: Entry) -> Trace:
        if e.status != DONE:
            raise WorkloadError(f"{self.source}: request {e.id!r} is {e.status}, it has no trace")
        if e.file not in self._traces:
            where = f"{self.source}/{e.file}"
            trace = loads_trace(self.read(e.file), source=where)
            check_against_entry(trace, e, self.manifest, where)
            self._traces[e.file] = trace
        return self._traces[e.file]

    def batch_trace(self) -> dict | None:
        """A batched workload's batch.jsonl (engine/trace/batch_reader.py), checked against its requests' own
        traces; None for a workload that ran one request at a time (its manifest names no batch)."""
        if "batch" not in self.manifest:
            return None
        if BATCH_TRACE not in self._traces:
            where = f"{self.source}/{BATCH_TRACE}"
            batch = loads_batch_trace(self.read(BATCH_TRACE), where)
            if batch["header"]["rows"] != batch_rows(self.manifest):  # the lanes view draws one lane per row
                raise WorkloadError(f"{where}: the batch has {batch['header']['rows']} rows, the manifest says "
                                    f"{batch_rows(self.manifest)}")
            check_against_workload(batch, {e.index: [c["num_accepted"] for c in self.trace(e).cycles]
                                           for e in self.done}, where, requests=len(self.manifest["requests"]))
            self._traces[BATCH_TRACE] = batch
        return self._traces[BATCH_TRACE]

    def outcome(self) -> tuple:
        """What the workload decoded, without its timings or how it was run: each request with its
        summary's counts. Two workloads with one outcome draw identical acceptance everywhere (the
        same greedy requests run one at a time and batched, for one), though their files differ."""
        counted = ("num_cycles", "num_generated", "acceptance_rate", "mean_acceptance_length", "stop_reason")
        return tuple((e.id, e.category, e.fingerprint, e.status,
                      tuple((e.summary or {}).get(name) for name in counted)) for e in self.entries)

    def runs(self) -> list[RequestRun]:
        """Every finished request with its trace, in the prompt file's order (what statistics read)."""
        return [RequestRun(e.id, e.category, e.file, self.trace(e)) for e in self.done]


def check_against_entry(trace: Trace, e: Entry, manifest: dict, where: str) -> None:
    """A trace belongs to its entry: the manifest's settings, its request, its summary."""
    if not trace.complete:
        raise WorkloadError(f"{where}: the manifest says done but the trace has no summary line")
    request = trace.header.get("request")
    if request != {"id": e.id, "category": e.category}:
        raise WorkloadError(f"{where}: the trace is of request {request!r}, the manifest says {e.id!r}")
    ran_in = (trace.header.get("batch") or {}).get("rows")
    if ran_in != batch_rows(manifest):
        raise WorkloadError(f"{where}: the trace says it ran {in_words(ran_in)}, the manifest {in_words(batch_rows(manifest))}")
    settings = dict(manifest["settings"])
    if settings.get("seed") is None:  # each request ran with the seed its client sent (a vLLM capture)
        settings["seed"] = trace.header["settings"]["seed"]
    elif isinstance(settings.get("seed"), int):  # its own seed (manifest.py SEED_STRIDE); the rest as the manifest's
        settings["seed"] = request_seed(settings["seed"], e.index, manifest.get("seed_stride"))
    if trace.header["settings"] != settings:
        raise WorkloadError(f"{where}: its settings differ from the manifest's (the seed: request {e.index} runs "
                            f"with {settings.get('seed')!r})")
    s = trace.summary
    if (s["num_generated"], len(trace.cycles), len(trace.header["prompt_token_ids"])) != (
            e.summary["num_generated"], e.summary["num_cycles"], e.summary["prompt_tokens"]):
        raise WorkloadError(f"{where}: its tokens and cycles differ from the manifest's summary")


def in_words(rows: int | None) -> str:
    return "alone, not in a batch" if rows is None else f"in a batch of {rows} rows"


def limit_of(name: str) -> int:
    """The most bytes read of a workload's file."""
    return {MANIFEST: MAX_MANIFEST_BYTES, BATCH_TRACE: MAX_BATCH_TRACE_BYTES}.get(name, MAX_TRACE_BYTES)


def open_workload(path: str | Path) -> Workload:
    """A workload folder (with manifest.json) or a .zip of one."""
    path = Path(path)
    if path.is_dir():
        return open_folder(path)
    if path.is_file() and zipfile.is_zipfile(path):
        return open_zip(path.read_bytes(), path.name)
    raise WorkloadError(f"{path}: neither a workload folder (with {MANIFEST}) nor a zip of one")


def open_folder(folder: Path) -> Workload:
    def read(name: str) -> bytes:
        path = folder / name  # a name the manifest check allowed: request-NNNN.jsonl or manifest.json
        if not path.is_file():
            raise WorkloadError(f"{folder}: {name} is missing")
        size = path.stat().st_size
        if size > limit_of(name):
            raise WorkloadError(f"{folder}/{name}: {size:,} bytes is too large")
        return path.read_bytes()

    return Workload(str(folder), *read_manifest(read, str(folder)))


def open_zip(data: bytes, source: str) -> Workload:
    """A zip of a workload folder: its files at the top or inside one folder (as zipping a folder makes).
    The whole zip is checked first (engine/workload/zip_checks.py): every entry's name and type, and its bytes."""
    archive = open_checked_zip(data, source, limit_of)
    members = {info.filename: info for info in archive.infolist() if not info.is_dir()}
    prefix = zip_prefix(members, source)

    def read(name: str) -> bytes:
        info = members.get(prefix + name)
        if info is None:
            raise WorkloadError(f"{source}: {name} is missing")
        return read_entry(archive, info, limit_of(name), source)

    return Workload(source, *read_manifest(read, source))


def read_manifest(read: Callable[[str], bytes], source: str) -> tuple[dict, list[Entry], Callable[[str], bytes]]:
    """The manifest, its requests and the reader of their files; a vLLM capture's folder is read as the
    workload it stands for (engine/workload/captured.py)."""
    manifest, entries = loads_manifest(read(MANIFEST), source, other_formats=(CAPTURE_FORMAT,))
    if is_capture(manifest):
        return capture_workload(manifest, read, source)
    return manifest, entries, read


def zip_prefix(members: dict, source: str) -> str:
    """"" when manifest.json is at the zip's top, "NAME/" when the zip holds one folder with it."""
    places = [name[: -len(MANIFEST)] for name in members if name == MANIFEST or name.endswith("/" + MANIFEST)]
    places = [p for p in places if p.count("/") <= 1]
    if len(places) != 1:
        raise WorkloadError(f"{source}: a workload zip holds exactly one {MANIFEST}, at its top or in one folder")
    return places[0]


def zip_folder(folder: str | Path) -> bytes:
    """The zip of a workload folder, as the app offers it for download and the bundled examples ship."""
    workload = open_folder(Path(folder))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr(MANIFEST, json.dumps(workload.manifest, ensure_ascii=False, indent=1))
        for e in workload.done:
            z.writestr(e.file, workload.read(e.file))
        if workload.batch_trace() is not None:  # read and checked first: a zip never ships a broken one
            z.writestr(BATCH_TRACE, workload.read(BATCH_TRACE))
    return buffer.getvalue()
