"""One line of a server workload's answers.jsonl, checked for meaning as untrusted input.

A line is {"id", "category", "request": the JSON body sent, "answer": the server's JSON answer,
"elapsed_s"}. The request must be the one the manifest's settings make; the answer must hold one
choice whose token ids are whole numbers in a tokenizer's range, as many as the usage says, no more
than max_tokens asked for; its speculative-decoding counts are checked by per_request.py's reader,
and against the tokens: every verify step commits its accepted draft tokens and one more, and
only the last step's may be cut (by max_tokens or a stop), so steps + accepted is at most the
completion tokens + K.
"""
import math

from engine.servers.server_metrics import ServerMetricsError, ServerRequest, short

MAX_TOKEN_ID = 2**24  # vocabularies run to ~262k entries; beyond this an id is no token
MAX_ELAPSED_S = 7 * 24 * 3600.0
RECORD_KEYS = ("id", "category", "request", "answer", "elapsed_s")


class AnswerError(ServerMetricsError):
    """An answers.jsonl line that is not what the client wrote, said in one line (the caller names the file)."""


def field(d: dict, key: str, kind: type, where: str):
    value = d.get(key)
    if not isinstance(value, kind):
        raise AnswerError(f"{where}: field {key!r} is {short(value)}, not {kind.__name__}")
    return value


def token_ids(value, where: str, what: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_TOKEN_ID:
        raise AnswerError(f"{where}: {what} is {short(value)}, not a list of token ids")
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < MAX_TOKEN_ID:
            raise AnswerError(f"{where}: {what}[{i}] is {short(t)}, not a token id (a whole number from 0 to {MAX_TOKEN_ID - 1})")
    return value


def usage_count(usage, key: str, where: str) -> int | None:
    if not isinstance(usage, dict) or usage.get(key) is None:
        return None
    n = usage[key]
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < MAX_TOKEN_ID:
        raise AnswerError(f"{where}: answer usage.{key} is {short(n)}, not a token count")
    return n


def check_elapsed(value, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= MAX_ELAPSED_S:
        raise AnswerError(f"{where}: field 'elapsed_s' is {short(value)}, not a number of seconds")


def check_request_body(body: dict, endpoint: str, settings: dict, where: str) -> None:
    """The body sent is the one the manifest's settings make (a replica reruns it)."""
    field(body, "model", str, where)
    prompt_key, kind = ("messages", list) if endpoint == "chat" else ("prompt", str)
    field(body, prompt_key, kind, f"{where}: request")
    for key in ("max_tokens", "temperature", "top_p"):
        if body.get(key) != settings[key]:
            raise AnswerError(f"{where}: request {key} is {short(body.get(key))} but the manifest's settings say "
                              f"{short(settings[key])}")


def check_answer(answer: dict, endpoint: str, max_tokens: int, max_model_len: int | None, where: str) -> int | None:
    """The answer's single choice and token counts; the completion's length in tokens where it says."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise AnswerError(f"{where}: answer choices is {short(choices)}, not one choice (n = 1)")
    choice = choices[0]
    prompt_ids = answer.get("prompt_token_ids") if endpoint == "chat" else choice.get("prompt_token_ids")
    prompt_ids = token_ids(prompt_ids, where, "answer prompt_token_ids")
    out_ids = token_ids(choice.get("token_ids"), where, "answer choices[0].token_ids")
    usage = answer.get("usage")
    completion = usage_count(usage, "completion_tokens", where)
    prompt = usage_count(usage, "prompt_tokens", where)
    if out_ids is not None and completion is not None and len(out_ids) != completion:
        raise AnswerError(f"{where}: answer has {len(out_ids)} token ids but usage.completion_tokens is {completion}")
    if prompt_ids is not None and prompt is not None and len(prompt_ids) != prompt:
        raise AnswerError(f"{where}: answer has {len(prompt_ids)} prompt token ids but usage.prompt_tokens is {prompt}")
    completion = len(out_ids) if completion is None and out_ids is not None else completion
    prompt = len(prompt_ids) if prompt is None and prompt_ids is not None else prompt
    if completion is not None and completion > max_tokens:
        raise AnswerError(f"{where}: answer has {completion} completion tokens, more than max_tokens {max_tokens}")
    if max_model_len and completion is not None and prompt is not None and prompt + completion > max_model_len:
        raise AnswerError(f"{where}: answer has {prompt} + {completion} tokens, more than the server's "
                          f"max_model_len {max_model_len}")
    return completion


def check_record(record, endpoint: str, settings: dict, max_model_len: int | None, where: str) -> int | None:
    """One line's fields (not its id: the folder's reader checks ids against the manifest); its completion length."""
    if not isinstance(record, dict):
        raise AnswerError(f"{where}: a line is a JSON object {{{', '.join(RECORD_KEYS)}}}")
    field(record, "id", str, where)
    field(record, "category", str, where)
    check_elapsed(record.get("elapsed_s"), where)
    check_request_body(field(record, "request", dict, where), endpoint, settings, where)
    return check_answer(field(record, "answer", dict, where), endpoint, settings["max_tokens"], max_model_len, where)


def check_steps_against_tokens(r: ServerRequest, completion: int | None, where: str) -> None:
    """Each step commits accepted + 1 tokens; only the last may be cut, by at most K."""
    if completion is None or r.steps is None or r.accepted is None or r.k is None:
        return
    if r.steps + r.accepted > completion + r.k:
        raise AnswerError(f"{where}: {r.steps} verify steps accepting {r.accepted} draft tokens commit "
                          f"{r.steps + r.accepted} tokens, but the answer has only {completion}")
