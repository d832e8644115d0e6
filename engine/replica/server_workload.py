"""A server workload as the replica reads it: the folder opened by the client's own reader
(engine/servers/server_workload.py checks every file, field and count), then, per answer, what a
replica needs and the client does not require: the server's prompt and output ids
(`"return_token_ids": true`) and the per-step lists (`--per-request-spec-decode-metrics detailed`).

Every refusal is one line (ServerWorkloadError) naming the file and the request.
"""
import json
from dataclasses import dataclass
from pathlib import Path

from engine.servers.server_metrics import ServerRequest
from engine.servers.server_workload import ANSWERS, ServerWorkloadError, open_server_workload
from engine.workload.prompts import Request, parse_prompts

__all__ = ["ANSWERS", "ServerAnswer", "ServerWorkload", "ServerWorkloadError", "read_server_workload"]


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


def answer_ids(answer: dict, endpoint: str, where: str) -> tuple[list[int], list[int]]:
    """(prompt ids, generated ids), already checked as token ids by the client's reader: vLLM's chat answer
    keeps the prompt's ids at the top, after its chat template; a completion keeps them in its choice."""
    choice = answer["choices"][0]
    prompt = (answer if endpoint == "chat" else choice).get("prompt_token_ids")
    if prompt is None or choice.get("token_ids") is None:
        raise ServerWorkloadError(f"{where}: the answer has no prompt_token_ids or token_ids "
                                  "(send the requests with \"return_token_ids\": true)")
    if not prompt:
        raise ServerWorkloadError(f"{where}: prompt_token_ids is empty")
    return prompt, choice["token_ids"]


def per_step(r: ServerRequest, where: str) -> tuple[list[int], list[int]]:
    """(drafted, accepted) per verify step that drafted."""
    if r.steps == 0 and r.drafted_per_step is None and r.accepted_per_step is None:
        return [], []  # vLLM writes null, not [], for a request whose lookup never found a match
    if r.drafted_per_step is None or r.accepted_per_step is None:
        raise ServerWorkloadError(f"{where}: metrics.speculative_decoding has no per_step_drafted and "
                                  "per_step_accepted (serve with --per-request-spec-decode-metrics detailed)")
    return r.drafted_per_step, r.accepted_per_step


def the_request(record: dict, endpoint: str) -> Request:
    """What was asked, as a prompt file's line: the prompt file's own checks apply to it."""
    body = record["request"]
    asked = {"messages": body["messages"]} if endpoint == "chat" else {"prompt": body["prompt"]}
    entry = json.dumps({"id": record["id"], "category": record["category"]} | asked)
    return parse_prompts(entry.encode("utf-8"), f"{ANSWERS} request {record['id']!r}")[0]


def read_server_workload(folder: str | Path) -> ServerWorkload:
    """The manifest and every finished answer of a server-workload folder, checked."""
    opened = open_server_workload(folder)
    m = opened.manifest
    endpoint, max_tokens = m["endpoint"], m["settings"]["max_tokens"]
    answers = []
    for record, r in zip(opened.answers, opened.requests.requests, strict=True):
        where = f"{Path(folder) / ANSWERS} request {record['id']!r}"
        prompt, generated = answer_ids(record["answer"], endpoint, where)
        drafted, accepted = per_step(r, where)
        answers.append(ServerAnswer(the_request(record, endpoint), prompt, generated, drafted, accepted, max_tokens))
    return ServerWorkload(opened.folder, m, m["speculative_config"], float(m["settings"]["temperature"]), answers)
