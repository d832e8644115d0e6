"""A server-workload folder (manifest.json and answers.jsonl, as `python -m engine client` writes them),
read as untrusted input: only what the replica needs, each field checked for meaning.

The reading is one function, `read_server_workload`, so the client's own reader can replace it.
Every refusal is one line (ServerWorkloadError, a SettingsError: exit code 2) naming the file and field.
"""
import json
from dataclasses import dataclass
from pathlib import Path

from engine.config import SettingsError
from engine.servers.per_request import vllm_request
from engine.servers.server_metrics import ServerMetricsError
from engine.trace.schema import MAX_NEW_TOKENS
from engine.workload.prompts import MAX_REQUESTS, Request, parse_prompts
from engine.workload.requests import UNCATEGORISED

FORMAT = "speclab-server-workload"
VERSION = 1
MANIFEST = "manifest.json"
ANSWERS = "answers.jsonl"
ENDPOINTS = ("chat", "completions")
MAX_MANIFEST_BYTES = 8 * 2**20
MAX_ANSWERS_BYTES = 256 * 2**20  # 2000 answers with their token ids and per-step lists
MAX_IDS = 1_000_000  # token ids in one prompt or answer; the models' context refuses long before
MAX_TOKEN_ID = 2**31 - 1


class ServerWorkloadError(SettingsError):
    """A server-workload folder the replica cannot read: one line, naming the file and the field."""


@dataclass(frozen=True)
class ServerAnswer:
    """One finished request: what was asked, the ids the server read and wrote, and its per-step counts
    (one entry per verify step that drafted at least one token)."""

    request: Request
    prompt_ids: list[int]
    token_ids: list[int]
    drafted_per_step: list[int]
    accepted_per_step: list[int]
    max_tokens: int


@dataclass(frozen=True)
class ServerWorkload:
    folder: Path
    manifest: dict
    speculative_config: dict | None
    temperature: float
    answers: list[ServerAnswer]


def read_json_file(path: Path, limit: int) -> bytes:
    if not path.is_file():
        raise ServerWorkloadError(f"{path}: no such file (a server-workload folder holds {MANIFEST} and {ANSWERS})")
    if path.stat().st_size > limit:
        raise ServerWorkloadError(f"{path}: {path.stat().st_size:,} bytes; at most {limit:,} are read")
    return path.read_bytes()


def parse_json(data: bytes, where: str):
    try:
        return json.loads(data.decode("utf-8"), parse_constant=refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise ServerWorkloadError(f"{where}: not JSON ({type(err).__name__})") from None


def refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def check_manifest(m, where: str) -> dict:
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ServerWorkloadError(f"{where}: not a server workload (format is not {FORMAT!r})")
    if m.get("version") != VERSION:
        raise ServerWorkloadError(f"{where}: version {m.get('version')!r}; this engine reads version {VERSION}")
    if m.get("endpoint") not in ENDPOINTS:
        raise ServerWorkloadError(f"{where}: field 'endpoint' must be one of {', '.join(ENDPOINTS)}")
    if not isinstance(m.get("server"), dict) or not isinstance(m.get("settings"), dict):
        raise ServerWorkloadError(f"{where}: fields 'server' and 'settings' must be JSON objects")
    if m.get("speculative_config") is not None and not isinstance(m["speculative_config"], dict):
        raise ServerWorkloadError(f"{where}: field 'speculative_config' must be a JSON object or null")
    t = m["settings"].get("temperature")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 100:
        raise ServerWorkloadError(f"{where}: field 'settings.temperature' must be a number from 0 to 100")
    return m


def token_ids(value, where: str) -> list[int]:
    if (not isinstance(value, list) or len(value) > MAX_IDS
            or not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in value)):
        raise ServerWorkloadError(f"{where} must be a list of token ids (integers from 0 to {MAX_TOKEN_ID})")
    return value


def answer_ids(answer: dict, endpoint: str, where: str) -> tuple[list[int], list[int]]:
    """(prompt ids, generated ids): vLLM's chat answer keeps the prompt's ids at the top, after its chat
    template; a completion keeps them in its choice. Both need the request's return_token_ids."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ServerWorkloadError(f"{where}: answer.choices must hold exactly one choice (n = 1)")
    holder = answer if endpoint == "chat" else choices[0]
    if holder.get("prompt_token_ids") is None or choices[0].get("token_ids") is None:
        raise ServerWorkloadError(f"{where}: the answer has no prompt_token_ids or token_ids "
                                  "(send the requests with \"return_token_ids\": true)")
    prompt = token_ids(holder["prompt_token_ids"], f"{where}: prompt_token_ids")
    if not prompt:
        raise ServerWorkloadError(f"{where}: prompt_token_ids is empty")
    return prompt, token_ids(choices[0]["token_ids"], f"{where}: choices[0].token_ids")


def per_step(answer: dict, where: str) -> tuple[list[int], list[int]]:
    """(drafted, accepted) per verify step that drafted, checked as `engine metrics` checks them."""
    metrics = answer.get("metrics")
    block = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(block, dict):
        raise ServerWorkloadError(f"{where}: the answer has no metrics.speculative_decoding "
                                  "(serve with --per-request-spec-decode-metrics detailed)")
    try:
        r = vllm_request(block, answer, 1)
    except ServerMetricsError as err:
        raise ServerWorkloadError(f"{where}: {err}") from None
    if r.steps == 0 and r.drafted_per_step is None and r.accepted_per_step is None:
        return [], []  # vLLM writes null, not [], for a request whose lookup never found a match
    if r.drafted_per_step is None or r.accepted_per_step is None:
        raise ServerWorkloadError(f"{where}: metrics.speculative_decoding has no per_step_drafted and "
                                  "per_step_accepted (serve with --per-request-spec-decode-metrics detailed)")
    return r.drafted_per_step, r.accepted_per_step


def the_request(line: dict, endpoint: str, n: int, source: str) -> Request:
    """What was asked, as a prompt file's line: the prompt file's own checks apply to it."""
    body = line.get("request")
    if not isinstance(body, dict):
        raise ServerWorkloadError(f"{source} line {n}: field 'request' must be the JSON body sent")
    asked = {"messages": body.get("messages")} if endpoint == "chat" else {"prompt": body.get("prompt")}
    entry = json.dumps({"id": line.get("id"), "category": line.get("category", UNCATEGORISED)} | asked)
    # One line, numbered as in answers.jsonl: blank lines before it keep its number in the refusal.
    return parse_prompts(b"\n" * (n - 1) + entry.encode("utf-8"), source)[0]


def max_tokens_of(body: dict, where: str) -> int:
    value = body.get("max_tokens")
    if type(value) is not int or not 1 <= value <= MAX_NEW_TOKENS:
        raise ServerWorkloadError(f"{where}: request.max_tokens must be an integer from 1 to {MAX_NEW_TOKENS}")
    return value


def read_answer(raw: bytes, n: int, endpoint: str) -> ServerAnswer:
    where = f"{ANSWERS} line {n}"
    line = parse_json(raw, where)
    if not isinstance(line, dict) or not isinstance(line.get("answer"), dict):
        raise ServerWorkloadError(f"{where}: a line is {{\"id\", \"category\", \"request\", \"answer\", ...}}")
    request = the_request(line, endpoint, n, ANSWERS)
    prompt, generated = answer_ids(line["answer"], endpoint, where)
    drafted, accepted = per_step(line["answer"], where)
    return ServerAnswer(request, prompt, generated, drafted, accepted, max_tokens_of(line["request"], where))


def read_server_workload(folder: str | Path) -> ServerWorkload:
    """The manifest and every finished answer of a server-workload folder, checked."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ServerWorkloadError(f"{folder}: not a folder (a server workload is a folder with {MANIFEST})")
    manifest = check_manifest(parse_json(read_json_file(folder / MANIFEST, MAX_MANIFEST_BYTES), MANIFEST), MANIFEST)
    lines = [(n, raw) for n, raw in enumerate(read_json_file(folder / ANSWERS, MAX_ANSWERS_BYTES).split(b"\n"), 1)
             if raw.strip()]
    if not 1 <= len(lines) <= MAX_REQUESTS:
        raise ServerWorkloadError(f"{ANSWERS}: holds {len(lines):,} answers; a replica runs 1 to {MAX_REQUESTS:,}")
    answers = [read_answer(raw, n, manifest["endpoint"]) for n, raw in lines]
    ids = [a.request.id for a in answers]
    if len(set(ids)) != len(ids):
        raise ServerWorkloadError(f"{ANSWERS}: two answers share an id; each request's id must be its own")
    return ServerWorkload(folder, manifest, manifest["speculative_config"],
                          float(manifest["settings"]["temperature"]), answers)
