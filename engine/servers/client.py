"""A workload against a live OpenAI-compatible server: every prompt sent, every answer kept, in a server workload folder.

The server is asked what it is (server_info.py), /metrics is scraped before the first request and
after the last, and the requests go out N at a time on threads (the standard library's HTTP: the
engine depends on no HTTP client package). Each answer must carry per-request speculative-decoding
metrics and pass the checks its reader applies (answer_checks.py) before it is written: a folder
this writes, the reader reads. After each request the answer line is flushed, then the manifest
replaced; the first failure stops new requests, the ones in flight finish and are kept, and
`resume=True` sends only the requests not yet done (a failed one is sent again).
"""
import json
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Protocol

from engine.servers import server_workload as sw
from engine.servers.answer_checks import AnswerError, check_record, check_steps_against_tokens
from engine.servers.http_client import ClientError, get, post_json
from engine.servers.per_request import MISSING, read_requests, sglang_blocks, vllm_block
from engine.servers.server_info import SGLANG, VLLM, ServerInfo, merged_config, read_server_info
from engine.servers.server_metrics import ServerMetricsError

# Request i (from 0, in the prompt file's order) is sent with seed * SEED_STRIDE + i, as request i of an
# engine workload runs (engine/workload/manifest.py): each request its own random stream, the same in a replica.
SEED_STRIDE = 100_000
SEED_LIMIT = 2**63
ASK_VLLM = {"return_token_ids": True}  # prompt and completion token ids in the answer
ASK_SGLANG = {"return_spec_tokens_details": True}  # sglext.spec_tokens_details in an OpenAI-compatible answer
NO_METRICS = ("the answer has no per-request speculative-decoding metrics: start vLLM with --speculative-config "
              "and --per-request-spec-decode-metrics detailed (SGLang: with speculative decoding on)")


class PromptRequest(Protocol):
    """One request of a prompt file (engine/workload/prompts.py Request)."""

    line: int
    id: str
    category: str
    prompt: str | None
    messages: tuple[tuple[str, str], ...] | None

    def fingerprint(self) -> str: ...


@dataclass(frozen=True)
class ClientSettings:
    url: str
    endpoint: str = "chat"  # server_workload.ENDPOINTS
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    concurrency: int = 1
    timeout_s: float = 300.0
    retries: int = 2
    model: str | None = None  # the name sent; None: the first of /v1/models

    @property
    def base(self) -> str:
        return self.url.rstrip("/")

    def manifest_settings(self) -> dict:
        return {key: asdict(self)[key] for key in sw.SETTING_RANGES}


def request_seed(seed: int, index: int) -> int:
    return (seed * SEED_STRIDE + index) % SEED_LIMIT


def asked_fields(kind: str) -> dict:
    """What to ask for besides the completion: a vLLM accepts SGLang's field and ignores it (seen on
    0.32.0), but each server is asked only for its own where it is known."""
    return ASK_VLLM if kind == VLLM else ASK_SGLANG if kind == SGLANG else ASK_VLLM | ASK_SGLANG


def body_of(r: PromptRequest, index: int, s: ClientSettings, model: str, kind: str) -> dict:
    body = {"model": model, "max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p,
            "seed": request_seed(s.seed, index)}
    if s.endpoint == "chat":
        turns = r.messages if r.messages is not None else (("user", r.prompt),)
        body["messages"] = [{"role": role, "content": content} for role, content in turns]
    else:
        body["prompt"] = r.prompt
    return body | asked_fields(kind)


def check_prompts_fit_endpoint(requests: list[PromptRequest], s: ClientSettings, source: str) -> None:
    if s.endpoint == "completions":
        for r in requests:
            if r.messages is not None:
                raise ClientError(f"{source} line {r.line}: a conversation (messages) needs --endpoint chat")


def new_manifest(s: ClientSettings, info: ServerInfo, model: str, config: dict | None, source: str | None,
                 prompts_name: str, planned: int) -> dict:
    return {"format": sw.FORMAT, "version": sw.VERSION, "url": s.base, "endpoint": s.endpoint,
            "server": {"kind": info.kind, "version": info.version, "model": model, "model_root": info.model_root,
                       "max_model_len": info.max_model_len},
            "speculative_config": config, "speculative_config_source": source,
            "settings": s.manifest_settings(), "seed_stride": SEED_STRIDE, "prompts": prompts_name,
            "planned_requests": planned, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "requests": [], "scrapes": {"before": None, "after": None}}


RESUME_SAME = ("endpoint", "speculative_config")
RESUME_SAME_SETTINGS = ("max_tokens", "temperature", "top_p", "seed")


def resume_differs(old: dict, new: dict, requests: list[PromptRequest]) -> str | None:
    """What differs between the folder's run and this command's, if anything (the url may change: a server moves)."""
    for key in RESUME_SAME:
        if old.get(key) != new[key]:
            return key
    for key in RESUME_SAME_SETTINGS:
        if old["settings"].get(key) != new["settings"][key]:
            return f"settings.{key}"
    if old["server"].get("model") != new["server"]["model"]:
        return "server.model"
    prints = {r.id: r.fingerprint() for r in requests}
    if any(prints.get(e["id"]) != e.get("fingerprint") for e in old["requests"]):
        return "requests (the prompt file changed)"
    return None


def kept_answers(folder: Path, manifest: dict) -> list[dict]:
    """The answer lines a killed run left that its manifest calls done, each once; the rest is sent again."""
    done = {e["id"] for e in manifest["requests"] if e["status"] == sw.DONE}
    path = folder / sw.ANSWERS
    kept, seen = [], set()
    if path.is_file():
        for line in sw.read_capped(path, sw.MAX_ANSWERS_BYTES).split(b"\n"):
            try:
                record = json.loads(line)
            except ValueError:
                continue  # the line a kill cut off
            rid = record.get("id") if isinstance(record, dict) else None
            if isinstance(rid, str) and rid in done and rid not in seen:
                seen.add(rid)
                kept.append(record)
    manifest["requests"] = [e for e in manifest["requests"] if e["status"] == sw.FAILED or e["id"] in seen]
    return kept


def start_folder(folder: Path, manifest: dict, resume: bool, requests: list[PromptRequest]) -> dict:
    """The manifest to continue from: the new one, or with resume the folder's, checked against it."""
    if not resume:
        if folder.exists() and any(folder.iterdir()):
            held = (folder / sw.MANIFEST).exists()
            raise ClientError(f"--out {folder} {'holds a workload: add --resume to continue it' if held else 'is not empty'}, "
                              "or name a new folder")
        folder.mkdir(parents=True, exist_ok=True)
        sw.write_manifest(folder, manifest)
        return manifest
    if not (folder / sw.MANIFEST).is_file():
        raise ClientError(f"--resume: {folder} holds no {sw.MANIFEST} to continue")
    old = sw.read_manifest(folder)
    differs = resume_differs(old, manifest, requests)
    if differs:
        raise ClientError(f"--resume: {folder} was started with other {differs}; run it in a new folder")
    sw.write_answers(folder, kept_answers(folder, old))
    old |= {key: manifest[key] for key in ("url", "settings", "prompts", "planned_requests")}
    old["scrapes"] = old["scrapes"] | {"after": None}  # taken again when this run ends
    sw.write_manifest(folder, old)
    return old


def scrape(s: ClientSettings, folder: Path, name: str) -> str | None:
    """/metrics into the folder; None where the server has none."""
    data = get(f"{s.base}/metrics", s.timeout_s, s.retries)
    if data is None:
        return None
    if len(data) > sw.MAX_SCRAPE_BYTES:
        raise ClientError(f"{s.base}/metrics: larger than {sw.MAX_SCRAPE_BYTES // 2**20} MiB")
    (folder / name).write_bytes(data)
    return name


def has_spec_metrics(answer: dict) -> bool:
    block = vllm_block(answer)
    return (block is not MISSING and block is not None) or sglang_blocks(answer) is not MISSING


def checked_record(record: dict, manifest: dict, url: str) -> None:
    """The answer passes what the folder's reader will check, or the request fails (naming the URL)."""
    if not has_spec_metrics(record["answer"]):
        raise ClientError(f"{url}: {NO_METRICS}")
    try:
        completion = check_record(record, manifest["endpoint"], manifest["settings"],
                                  manifest["server"].get("max_model_len"), f"{url} request {record['id']}")
        r = read_requests([record["answer"] | {"id": record["id"]}]).requests[0]
        check_steps_against_tokens(r, completion, f"{url} request {record['id']}")
    except AnswerError as err:
        raise ClientError(str(err)) from None
    except ServerMetricsError as err:
        raise ClientError(f"{url} request {record['id']}: {err}") from None


@dataclass
class ClientRun:
    """One command's requests against one folder; `send(i)` is one request, start to its manifest line."""

    s: ClientSettings
    folder: Path
    manifest: dict
    requests: list[PromptRequest]
    kind: str
    on_request: Callable[[dict], None] | None
    lock: threading.Lock

    @property
    def url(self) -> str:
        return self.s.base + sw.ENDPOINTS[self.s.endpoint]

    def send(self, index: int) -> None:
        r = self.requests[index]
        body = body_of(r, index, self.s, self.manifest["server"]["model"], self.kind)
        started = time.perf_counter()
        try:
            answer = post_json(self.url, body, self.s.timeout_s, self.s.retries)
            record = {"id": r.id, "category": r.category, "request": body, "answer": answer,
                      "elapsed_s": time.perf_counter() - started}
            checked_record(record, self.manifest, self.url)
        except ClientError as err:
            self.finish(index, None, str(err))
            raise
        self.finish(index, record, None)

    def finish(self, index: int, record: dict | None, error: str | None) -> None:
        r = self.requests[index]
        entry = {"id": r.id, "category": r.category, "status": sw.DONE if error is None else sw.FAILED,
                 "error": None if error is None else sw.printable(error), "index": index, "line": r.line,
                 "fingerprint": r.fingerprint()}
        with self.lock:  # one writer at a time: the answer line first, then the manifest that calls it done
            if record is not None:
                sw.append_answer(self.folder, record)
            entries = [e for e in self.manifest["requests"] if e["id"] != r.id] + [entry]
            self.manifest["requests"] = sorted(entries, key=lambda e: e.get("index", sw.MAX_REQUESTS))
            sw.write_manifest(self.folder, self.manifest)
        if self.on_request:
            self.on_request(entry)


def pending(manifest: dict, requests: list[PromptRequest]) -> list[int]:
    done = {e["id"] for e in manifest["requests"] if e["status"] == sw.DONE}
    return [i for i, r in enumerate(requests) if r.id not in done]


def send_all(run: ClientRun, todo: list[int]) -> None:
    """Up to `concurrency` requests in flight; the first failure stops new ones and is raised once the rest finish."""
    pool = ThreadPoolExecutor(max_workers=run.s.concurrency, thread_name_prefix="speclab-client")
    queue, running, failure = list(todo), set(), None
    try:
        while (queue and failure is None) or running:
            while queue and failure is None and len(running) < run.s.concurrency:
                running.add(pool.submit(run.send, queue.pop(0)))
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            failure = failure or first_error(finished)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if failure is not None:
        raise failure


def first_error(finished: set[Future]) -> BaseException | None:
    return next((f.exception() for f in finished if f.exception() is not None), None)


def run_client(requests: list[PromptRequest], s: ClientSettings, folder: str | Path, *, prompts_name: str,
               speculative_config: dict | None = None, resume: bool = False,
               on_request: Callable[[dict], None] | None = None) -> dict:
    """Send every request not yet done into `folder`; the final manifest. ClientError (one line) on failure,
    after the finished requests are written."""
    folder = Path(folder)
    check_prompts_fit_endpoint(requests, s, prompts_name)
    info = read_server_info(s.base, s.timeout_s, s.retries)
    model = s.model or info.model
    if model is None:
        raise ClientError(f"{s.base}/v1/models: names no model; give the model's name with --model")
    config, source = merged_config(info.speculative_config, speculative_config, s.base)
    manifest = start_folder(folder, new_manifest(s, info, model, config, source, prompts_name, len(requests)),
                            resume, requests)
    if manifest["scrapes"]["before"] is None or not (folder / sw.BEFORE).is_file():
        manifest["scrapes"]["before"] = scrape(s, folder, sw.BEFORE)
        sw.write_manifest(folder, manifest)
    run = ClientRun(s, folder, manifest, requests, info.kind, on_request, threading.Lock())
    try:
        send_all(run, pending(manifest, requests))
    except ClientError as err:
        raise ClientError(f"{err} (the finished requests are kept in {folder}: the same command with --resume "
                          "continues)") from None
    manifest["scrapes"]["after"] = scrape(s, folder, sw.AFTER) if manifest["scrapes"]["before"] else None
    sw.write_manifest(folder, manifest)
    return manifest
