"""A server workload folder (`python -m engine client`): the format, written and read back as untrusted input.

    FOLDER/manifest.json  {"format": "speclab-server-workload", "version": 1, "url", "endpoint",
        "server": {"kind", "version", "model", "model_root", "max_model_len"},
        "speculative_config": {...} | null, "speculative_config_source": "server_info+user" | "server_info" | "user" | null,
        "settings": {"max_tokens", "temperature", "top_p", "seed", "concurrency", "timeout_s", "retries"},
        "seed_stride", "prompts": NAME, "planned_requests": N, "created",
        "requests": [{"id", "category", "status": "done" | "failed", "error", "index", "line", "fingerprint"}],
        "scrapes": {"before": "metrics-before.prom" | null, "after": "metrics-after.prom" | null}}
    FOLDER/answers.jsonl  one line per done request: {"id", "category", "request", "answer", "elapsed_s"}
    FOLDER/metrics-before.prom, FOLDER/metrics-after.prom  /metrics before the first request and after the last

The manifest lists the requests tried so far (pending ones are not listed; planned_requests says how
many the prompt file holds), and is replaced in one step after each. Every file it may name is one
of the fixed names above, so a manifest never points outside its folder. Reading checks the
manifest's fields, every answer line (answer_checks.py), that the done requests and the answers
are the same ids once each, and each answer's per-request metrics (per_request.py).
"""
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from engine.servers.answer_checks import AnswerError, check_record, check_steps_against_tokens
from engine.servers.per_request import read_requests
from engine.servers.server_info import KINDS
from engine.servers.server_metrics import ServerMetricsError, ServerRequests, short

FORMAT = "speclab-server-workload"
VERSION = 1
MANIFEST = "manifest.json"
ANSWERS = "answers.jsonl"
BEFORE, AFTER = "metrics-before.prom", "metrics-after.prom"
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
DONE, FAILED = "done", "failed"
CONFIG_SOURCES = ("server_info+user", "server_info", "user", None)
MAX_MANIFEST_BYTES = 8 * 2**20
MAX_ANSWERS_BYTES = 256 * 2**20  # 2000 answers of a long completion with its token ids
MAX_SCRAPE_BYTES = 4 * 2**20  # engine/servers/server_metrics.py MAX_INPUT_BYTES
MAX_REQUESTS = 2000  # engine/workload/prompts.py: a prompt file holds at most this many
MAX_NAME = 100  # an id or a category (engine/workload/prompts.py MAX_NAME_CHARS)
MAX_TEXT = 2000  # a URL, an error, a model path
SETTING_RANGES = {"max_tokens": (1, 2**20), "temperature": (0.0, 100.0), "top_p": (0.0, 1.0), "seed": (0, 2**63),
                  "concurrency": (1, 256), "timeout_s": (0.0, 86400.0), "retries": (0, 100)}
WHOLE_SETTINGS = ("max_tokens", "seed", "concurrency", "retries")


class ServerWorkloadError(ServerMetricsError):
    """A server workload folder that cannot be read, said in one line naming the file."""


@dataclass(frozen=True)
class ServerWorkload:
    folder: Path
    manifest: dict
    answers: list[dict]  # answers.jsonl's lines, in the file's order
    requests: ServerRequests  # their per-request metrics, ids and categories the manifest's
    completion_tokens: list[int | None]  # each answer's, in the same order
    before: str | None  # the /metrics scrapes' text, where the folder holds them
    after: str | None


# ---------------------------------------------------------------- writing

def printable(message: str) -> str:
    """An error as the manifest may hold it: one printable line of at most MAX_TEXT characters."""
    return "".join(c if c.isprintable() else "?" for c in " ".join(message.split()))[:MAX_TEXT]


def write_manifest(folder: Path, manifest: dict) -> None:
    """Replace the manifest in one step: a kill leaves the old one or the new one, never half."""
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(tmp, folder / MANIFEST)


def append_answer(folder: Path, record: dict) -> None:
    """One line, flushed to disk before the manifest calls its request done."""
    with open(folder / ANSWERS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_answers(folder: Path, records: list[dict]) -> None:
    """Replace answers.jsonl in one step (a resume keeps only the lines its manifest calls done)."""
    tmp = folder / (ANSWERS + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, folder / ANSWERS)


# ---------------------------------------------------------------- reading

def read_capped(path: Path, most: int) -> bytes:
    if path.is_symlink() or not path.is_file():
        raise ServerWorkloadError(f"{path}: not a plain file")
    with open(path, "rb") as f:
        data = f.read(most + 1)
    if len(data) > most:
        raise ServerWorkloadError(f"{path}: larger than {most // 2**20} MiB")
    return data


def parse_json(data: bytes, where: str):
    try:
        return json.loads(data.decode("utf-8"), parse_constant=refuse_constant)
    except UnicodeDecodeError:
        raise ServerWorkloadError(f"{where}: not UTF-8 text") from None
    except RecursionError:
        raise ServerWorkloadError(f"{where}: JSON nested too deeply") from None
    except ValueError as err:
        raise ServerWorkloadError(f"{where}: malformed JSON ({short(str(err))})") from None


def refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def is_server_workload(path: str | Path) -> bool:
    """Whether a folder's manifest says it is a server workload (the engine's workloads say another format)."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return False
    try:
        with open(manifest, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return f'"format": "{FORMAT}"'.encode() in head or f'"format":"{FORMAT}"'.encode() in head


def text(value, where: str, key: str, most: int = MAX_TEXT, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > most or not value.isprintable():
        raise ServerWorkloadError(f"{where}: field {key!r} is {short(value)}, not printable text of at most {most} characters")
    return value


def setting(settings: dict, key: str, where: str) -> float:
    value, (low, high) = settings.get(key), SETTING_RANGES[key]
    whole = key in WHOLE_SETTINGS
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) \
            or not math.isfinite(value) or not low <= value <= high:
        kind = "a whole number" if whole else "a number"
        raise ServerWorkloadError(f"{where}: field 'settings.{key}' is {short(value)}, not {kind} from {low} to {high}")
    return value


def check_manifest(m, where: str) -> None:
    """Every field the reader and the stats use, for meaning."""
    if not isinstance(m, dict):
        raise ServerWorkloadError(f"{where}: not a JSON object")
    if m.get("format") != FORMAT or m.get("version") != VERSION:
        raise ServerWorkloadError(f"{where}: format {short(m.get('format'))} version {short(m.get('version'))}; "
                                  f"this reads {FORMAT} version {VERSION}")
    text(m.get("url"), where, "url", optional=False)
    text(m.get("prompts"), where, "prompts", MAX_NAME * 3, optional=False)
    if "/" in m["prompts"] or "\\" in m["prompts"]:
        raise ServerWorkloadError(f"{where}: field 'prompts' is {short(m['prompts'])}: a file name, not a path")
    if m.get("endpoint") not in ENDPOINTS:
        raise ServerWorkloadError(f"{where}: field 'endpoint' is {short(m.get('endpoint'))}, not one of {', '.join(ENDPOINTS)}")
    check_server(m.get("server"), where)
    config = m.get("speculative_config")
    if config is not None and (not isinstance(config, dict) or len(json.dumps(config)) > MAX_TEXT):
        raise ServerWorkloadError(f"{where}: field 'speculative_config' is {short(config)}, not an object or null")
    source = m.get("speculative_config_source")
    if source not in CONFIG_SOURCES or (config is None) != (source is None):
        raise ServerWorkloadError(f"{where}: field 'speculative_config_source' is {short(source)}, "
                                  "not where the config came from")
    settings = m.get("settings")
    if not isinstance(settings, dict):
        raise ServerWorkloadError(f"{where}: field 'settings' is {short(settings)}, not an object")
    for key in SETTING_RANGES:
        setting(settings, key, where)
    check_scrapes(m.get("scrapes"), where)
    check_entries(m.get("requests"), where)
    planned = m.get("planned_requests")
    if planned is not None and (isinstance(planned, bool) or not isinstance(planned, int) or not 0 < planned <= MAX_REQUESTS):
        raise ServerWorkloadError(f"{where}: field 'planned_requests' is {short(planned)}, not a number of requests")


def check_server(server, where: str) -> None:
    if not isinstance(server, dict):
        raise ServerWorkloadError(f"{where}: field 'server' is {short(server)}, not an object")
    if server.get("kind") not in KINDS:
        raise ServerWorkloadError(f"{where}: field 'server.kind' is {short(server.get('kind'))}, not one of {', '.join(KINDS)}")
    for key in ("version", "model", "model_root"):
        text(server.get(key), where, f"server.{key}")
    n = server.get("max_model_len")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= 2**31):
        raise ServerWorkloadError(f"{where}: field 'server.max_model_len' is {short(n)}, not a token count")


def check_scrapes(scrapes, where: str) -> None:
    if not isinstance(scrapes, dict) or set(scrapes) != {"before", "after"}:
        raise ServerWorkloadError(f"{where}: field 'scrapes' is {short(scrapes)}, not {{\"before\", \"after\"}}")
    for key, name in (("before", BEFORE), ("after", AFTER)):
        if scrapes[key] not in (None, name):  # a fixed name: a manifest never points outside its folder
            raise ServerWorkloadError(f"{where}: field 'scrapes.{key}' is {short(scrapes[key])}; it may only be {name!r} or null")


def check_entries(entries, where: str) -> None:
    if not isinstance(entries, list) or len(entries) > MAX_REQUESTS:
        raise ServerWorkloadError(f"{where}: field 'requests' is {short(entries)}, not a list of at most {MAX_REQUESTS}")
    seen = set()
    for n, e in enumerate(entries):
        w = f"{where}: requests[{n}]"
        if not isinstance(e, dict):
            raise ServerWorkloadError(f"{w} is {short(e)}, not an object")
        rid = text(e.get("id"), w, "id", MAX_NAME, optional=False)
        text(e.get("category"), w, "category", MAX_NAME, optional=False)
        if rid in seen:
            raise ServerWorkloadError(f"{w}: id {short(rid)} is listed twice")
        seen.add(rid)
        if e.get("status") not in (DONE, FAILED):
            raise ServerWorkloadError(f"{w}: field 'status' is {short(e.get('status'))}, not {DONE!r} or {FAILED!r}")
        if (e["status"] == FAILED) != (e.get("error") is not None):
            raise ServerWorkloadError(f"{w}: a failed request has an error, a done one none")
        text(e.get("error"), w, "error")
        index = e.get("index")  # the client's own fields; a folder another tool wrote may lack them
        if index is not None and (isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_REQUESTS):
            raise ServerWorkloadError(f"{w}: field 'index' is {short(index)}, not a request's place in the prompt file")
        text(e.get("fingerprint"), w, "fingerprint", MAX_NAME)


def read_manifest(folder: Path) -> dict:
    where = str(folder / MANIFEST)
    m = parse_json(read_capped(folder / MANIFEST, MAX_MANIFEST_BYTES), where)
    check_manifest(m, where)
    return m


def read_answer_lines(folder: Path, m: dict) -> tuple[list[dict], list[int | None]]:
    """answers.jsonl's lines, each checked, exactly the manifest's done requests once each."""
    path = folder / ANSWERS
    done = {e["id"]: e["category"] for e in m["requests"] if e["status"] == DONE}
    if not path.exists() and not done:
        return [], []
    raw = read_capped(path, MAX_ANSWERS_BYTES)
    if raw and not raw.endswith(b"\n"):
        raise ServerWorkloadError(f"{path}: the last line is cut off (a killed run: `engine client --resume` repairs it)")
    records, completions, seen = [], [], set()
    max_len = m["server"].get("max_model_len")
    for n, line in enumerate(raw.split(b"\n")[:-1] if raw else [], start=1):
        where = f"{path} line {n}"
        record = parse_json(line, where)
        try:
            completion = check_record(record, m["endpoint"], m["settings"], max_len, where)
        except AnswerError as err:
            raise ServerWorkloadError(str(err)) from None
        rid = record["id"]
        if rid not in done:
            raise ServerWorkloadError(f"{where}: id {short(rid)} is not a done request of the manifest")
        if rid in seen:
            raise ServerWorkloadError(f"{where}: id {short(rid)} is answered twice")
        if record["category"] != done[rid]:
            raise ServerWorkloadError(f"{where}: category {short(record['category'])} but the manifest says {short(done[rid])}")
        seen.add(rid)
        record_metrics(record, completion, where)
        records.append(record)
        completions.append(completion)
    missing = [rid for rid in done if rid not in seen]
    if missing:
        raise ServerWorkloadError(f"{path}: no answer for request {short(missing[0])}, which the manifest calls done")
    order = {rid: n for n, rid in enumerate(done)}  # the manifest's (the prompt file's) order, not the finishing order
    pairs = sorted(zip(records, completions), key=lambda p: order[p[0]["id"]])
    return [p[0] for p in pairs], [p[1] for p in pairs]


def item_of(record: dict) -> dict:
    """An answer as per_request.py reads it, carrying the manifest's id and category."""
    return record["answer"] | {"id": record["id"], "category": record["category"]}


def record_metrics(record: dict, completion: int | None, where: str) -> None:
    """One answer's per-request metrics, read alone so that a refusal names its line, and held against its tokens."""
    try:
        requests = read_requests([item_of(record)])
        if not requests.requests:  # the client keeps only answers that carry the metrics
            raise ServerMetricsError("the answer's metrics.speculative_decoding is null")
        check_steps_against_tokens(requests.requests[0], completion, where)
    except AnswerError as err:
        raise ServerWorkloadError(str(err)) from None
    except ServerMetricsError as err:
        raise ServerWorkloadError(f"{where}: {str(err).replace('request 1 ', '', 1)}") from None


def read_scrape(folder: Path, name: str | None) -> str | None:
    if name is None:
        return None
    data = read_capped(folder / name, MAX_SCRAPE_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ServerWorkloadError(f"{folder / name}: not UTF-8 text") from None


def open_server_workload(folder: str | Path) -> ServerWorkload:
    """The folder, every file checked; ServerWorkloadError (one line) for the first thing wrong."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ServerWorkloadError(f"{folder}: not a folder")
    m = read_manifest(folder)
    records, completions = read_answer_lines(folder, m)
    if not records:
        raise ServerWorkloadError(f"{folder / MANIFEST}: no request is done yet (`engine client --resume` continues)")
    requests = read_requests([item_of(record) for record in records])  # each line read alone already
    return ServerWorkload(folder, m, records, requests, completions,
                          read_scrape(folder, m["scrapes"]["before"]), read_scrape(folder, m["scrapes"]["after"]))
