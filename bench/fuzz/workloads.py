"""Workload folders and zips: the golden batched workload, the bundled workloads and the bundled
diagnoses' arms (cut to a few requests where that keeps them valid), changed, opened by `open_zip`
or `open_workload` (or `python -m engine stats`), then read whole: `Workload.runs()` and
`batch_trace()`, which read lazily.
"""
import json
import random
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bench.fuzz import batch, mutate, traces, workload_zips
from bench.fuzz.cases import ACCEPT, EITHER, REFUSE, Case, Refused
from bench.fuzz.cli import run_cli
from bench.fuzz.sandbox import Places
from engine.trace.errors import TraceError
from engine.workload.folder import open_workload, open_zip

KIND = "workloads"
ROOT = Path(__file__).resolve().parents[2]
MANIFEST = "manifest.json"
ZIP, FOLDER = "case.zip", "case-folder"


@dataclass(frozen=True)
class Sample:
    name: str
    files: dict  # flat names -> bytes
    weight: float

    @property
    def manifest(self) -> dict:
        return json.loads(self.files[MANIFEST])

    @property
    def batched(self) -> bool:
        return "batch" in self.manifest


def unzipped(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {n.rsplit("/", 1)[-1]: z.read(n) for n in z.namelist() if not n.endswith("/")}


@lru_cache(maxsize=1)
def samples() -> tuple[Sample, ...]:
    golden = ROOT / "tests" / "golden" / "batched_workload"
    files = {p.name: traces.clocked(p.read_bytes()) if p.name.startswith("request-") else p.read_bytes()
             for p in golden.iterdir()}
    found = [Sample("golden/batched_workload", files, 6.0)]
    for path in sorted((ROOT / "assets" / "workloads").glob("*.zip")):
        found.append(Sample(path.name, unzipped(path), 0.3 if "batch" in path.name else 2.0))
    for path in sorted((ROOT / "assets" / "diagnoses").glob("*--*.zip")):
        found.append(Sample(path.name, unzipped(path), 0.2))
    return tuple(found)


def files_of(sample: Sample, rng: random.Random) -> tuple[dict[str, bytes], dict]:
    """The sample's files, an unbatched one cut to its first 1 to 3 requests (still a valid workload)."""
    manifest = sample.manifest
    if sample.batched:
        return dict(sample.files), manifest
    manifest["requests"] = manifest["requests"][: rng.randint(1, 3)]
    files = {MANIFEST: json.dumps(manifest, indent=1).encode()}
    files.update({e["file"]: sample.files[e["file"]] for e in manifest["requests"] if e["status"] == "done"})
    return files, manifest


def done(manifest: dict) -> list[int]:
    return [i for i, e in enumerate(manifest["requests"]) if e["status"] == "done"]


# ---------------------------------------------------------------- the manifest and the traces

def manifest_breaks(m: dict, rng: random.Random, places: Places) -> tuple[str, str | None]:
    """Break one rule of the manifest in place; the words and the known defect it hits."""
    reqs, i = m["requests"], rng.choice(done(m))
    e = reqs[i]
    edits = [
        ("version 2", lambda: m.update(version=2), None),
        ("another format", lambda: m.update(format="speclab-other"), None),
        ("settings.k 0", lambda: m["settings"].update(k=0), None),
        ("seed_stride 7", lambda: m.update(seed_stride=7), None),
        ("settings.temperature moved", lambda: m["settings"].update(temperature=m["settings"]["temperature"] + 0.25), None),
        ("a file outside", lambda: e.update(file=rng.choice(["../canary/keep-me.txt", f"{places.canary}/keep-me.txt",
                                                              "request-0001.jsonl/../../x"])), None),
        ("status unknown", lambda: e.update(status="finished"), None),
        ("acceptance_rate 1.5", lambda: e["summary"].update(acceptance_rate=1.5), None),
        ("num_cycles + 1", lambda: e["summary"].update(num_cycles=e["summary"]["num_cycles"] + 1), None),
        ("num_generated -1", lambda: e["summary"].update(num_generated=-1), None),
        ("mean_acceptance_length K + 2", lambda: e["summary"].update(mean_acceptance_length=m["settings"]["k"] + 2), None),
        ("an id the trace does not have", lambda: e.update(id=e["id"] + "-other"), None),
        ("index wrong", lambda: e.update(index=i + 1), None),
        ("no requests", lambda: m.update(requests=[]), None),
        ("summary key missing", lambda: e["summary"].pop("stop_reason"), None),
        ("wall time NaN", lambda: e["summary"].update(wall_time_s=float("nan")), None),
    ]
    if len(reqs) > 1:
        edits.append(("two ids the same", lambda: reqs[1 - (i > 0)].update(id=reqs[i]["id"]), None))
    if "batch" in m:
        edits.append(("batch rows + 1", lambda: m["batch"].update(rows=m["batch"]["rows"] + 1), "batch-rows"))
    words, edit, tag = rng.choice(edits)
    edit()
    return f"manifest {words}", tag


def broken(files: dict[str, bytes], manifest: dict, rng: random.Random, places: Places) -> tuple[str, str, str | None]:
    """One rule broken in place: the manifest's, a done request's trace, or the batch trace's."""
    where = rng.choice(["manifest", "manifest", "trace", "swap"] + (["batch", "batch"] if "batch" in manifest else []))
    if where == "manifest":
        words, tag = manifest_breaks(manifest, rng, places)
        files[MANIFEST] = json.dumps(manifest).encode()
        return words, REFUSE, tag
    if where == "batch":
        sample = batch.Sample("batch", files["batch.jsonl"], {}, len(manifest["requests"]))
        files["batch.jsonl"], expect, words, tag = batch.batch_change(rng, sample)
        return f"batch.jsonl: {words}", expect, tag
    name = manifest["requests"][rng.choice(done(manifest))]["file"]
    if where == "swap" and len(done(manifest)) > 1:
        other = manifest["requests"][rng.choice([i for i in done(manifest) if manifest["requests"][i]["file"] != name])]
        files[name], files[other["file"]] = files[other["file"]], files[name]
        return f"{name} and {other['file']} swapped", REFUSE, None
    change = rng.choice([traces.invariant_break, traces.line_change, traces.cut_file])(
        rng, traces.Sample(name, files[name]))
    files[name] = change.data
    return f"{name}: {change.words.split(': ', 1)[1]}", change.expect, None


def valid_files(files: dict[str, bytes], manifest: dict, rng: random.Random) -> str:
    style = rng.choice(["as-is", "manifest-reordered", "manifest-compact", "manifest-ascii", "traces-crlf"])
    if style == "manifest-reordered":
        files[MANIFEST] = json.dumps(mutate.reordered(manifest, rng), indent=rng.choice([None, 2, "\t"])).encode()
    elif style in ("manifest-compact", "manifest-ascii"):
        files[MANIFEST] = json.dumps(manifest, separators=(",", ":"), ensure_ascii=style.endswith("ascii")).encode()
    elif style == "traces-crlf":
        for name in files:
            if name.startswith("request-"):
                files[name] = files[name].replace(b"\n", b"\r\n")
    return style


# ---------------------------------------------------------------- a case

@dataclass
class Change:
    files: dict  # the workload's files (a folder), or
    zip: bytes | None  # the zip to read
    expect: str
    words: str
    tag: str | None = None
    batch_only: bool = False  # only batch.jsonl changed (`engine stats` reads the requests' traces, not it)


def workload_change(rng: random.Random, places: Places, zipped_only: bool = False) -> Change:
    weights = [s.weight for s in samples()]
    sample = rng.choices(samples(), weights=weights)[0]
    files, manifest = files_of(sample, rng)
    family = rng.choices(["valid", "broken", "zip-damage", "unsafe", "bomb", "noise"], weights=[3, 5, 2, 2, 1, 1])[0]
    as_zip = zipped_only or family in ("zip-damage", "unsafe", "bomb") or rng.random() < 0.6
    head = f"{sample.name}, {len(done(manifest))} requests"
    if family in ("valid", "broken"):
        words, expect, tag = (valid_files(files, manifest, rng), ACCEPT, None) if family == "valid" else \
            broken(files, manifest, rng, places)
        batch_only = words.startswith("batch.jsonl")
        if not as_zip:
            return Change(files, None, expect, f"{head}, folder: {words}", tag, batch_only)
        data, how = workload_zips.valid_zip(files, rng)
        return Change({}, data, expect, f"{head}, {how}: {words}", tag, batch_only)
    if family == "zip-damage":
        data, words, expect = workload_zips.damaged_zip(files, manifest, rng)
        return Change({}, data, expect, f"{head}: {words}", "zip-damage")
    if family == "unsafe":
        data, words = workload_zips.unsafe_zip(files, rng, places)
        return Change({}, data, REFUSE, f"{head}: {words}", "zip-unsafe")
    if family == "bomb":
        data, words, expect = workload_zips.bomb_zip(files, manifest, rng)
        return Change({}, data, expect, f"{head}: {words}", "zip-damage", batch_only=words.startswith("batch.jsonl"))
    if as_zip:
        data, words = mutate.flip_bytes(zipped(files, rng), rng)
        return Change({}, data, EITHER, f"{head}, zip: {words}", "zip-damage")
    name = rng.choice(sorted(files))
    files[name], words = mutate.flip_bytes(files[name], rng)
    return Change(files, None, EITHER, f"{head}, folder: {name} {words}")


def zipped(files: dict[str, bytes], rng: random.Random) -> bytes:
    return workload_zips.valid_zip(files, rng)[0]


def make(rng: random.Random, index: int, places: Places) -> Case:
    change = workload_change(rng, places)
    cli = rng.random() < 0.15
    if cli and change.batch_only:
        change.expect = EITHER
    if change.zip is None:
        files = {f"{FOLDER}/{name}": data for name, data in change.files.items()}
        return Case(KIND, index, change.words, change.expect, FOLDER, "cli" if cli else "open_workload", files=files,
                    tag=change.tag)
    call = "cli" if cli else rng.choice(["open_zip", "open_workload"])
    return Case(KIND, index, change.words, change.expect, ZIP, call, files={ZIP: change.zip} if call != "open_zip" else {},
                data=change.zip if call == "open_zip" else b"", tag=change.tag)


def read_whole(workload) -> str:
    runs = workload.runs()
    batch_trace = workload.batch_trace()
    cycles = sum(len(r.trace.cycles) for r in runs)
    return f"{len(runs)} requests, {cycles} cycles, batch trace: {batch_trace is not None}"


def attempt(case: Case, work: Path) -> str:
    if case.call == "cli":
        return run_cli(["stats", case.source])
    try:
        workload = open_zip(case.data, case.source) if case.call == "open_zip" else open_workload(case.source)
        return read_whole(workload)
    except TraceError as err:
        raise Refused(str(err)) from None
