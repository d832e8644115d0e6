"""HTTP to a live server with the standard library only: GET and POST of JSON, a timeout, retries.

A server's answers are untrusted: every body is read up to a size cap, and a JSON answer must be
one JSON object. Connection errors, timeouts and 5xx answers are retried (the server may be busy or
restarting); a 4xx answer is not (the same request would be refused again). Every failure is one
line naming the URL and what went wrong (ClientError).
"""
import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

MAX_ANSWER_BYTES = 16 * 2**20  # one chat answer with its token ids is tens of kB; /metrics a few hundred
RETRY_PAUSE_S = 0.5  # before the first retry; doubled each time (a server restarting needs seconds)


class ClientError(ValueError):
    """A server that did not answer as it must, said in one line naming the URL."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


def short_text(data: bytes, most: int = 120) -> str:
    """A server's body for an error message: one line, shortened."""
    text = "".join(c if c.isprintable() else "?" for c in " ".join(data.decode("utf-8", "replace").split()))
    return text if len(text) <= most else text[:most - 3] + "..."


def read_capped(answer, url: str) -> bytes:
    data = answer.read(MAX_ANSWER_BYTES + 1)
    if len(data) > MAX_ANSWER_BYTES:
        raise ClientError(f"{url}: the answer is larger than {MAX_ANSWER_BYTES // 2**20} MiB")
    return data


def send_once(url: str, body: bytes | None, timeout_s: float) -> Answer:
    """One request; an HTTP error status is an Answer, a transport failure raises ClientError."""
    headers = {"content-type": "application/json"} if body is not None else {}
    request = urllib.request.Request(url, body, headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return Answer(answer.status, read_capped(answer, url))
    except urllib.error.HTTPError as err:
        with err:
            return Answer(err.code, read_capped(err, url))
    except (TimeoutError, socket.timeout):
        raise ClientError(f"{url}: no answer within {timeout_s:g} s (--timeout)") from None
    except urllib.error.URLError as err:
        raise ClientError(f"{url}: cannot connect ({err.reason}): is the server running?") from None
    except (ConnectionError, OSError) as err:
        raise ClientError(f"{url}: the connection failed ({err})") from None


def retryable(answer: Answer) -> bool:
    return answer.status >= 500


def send(url: str, body: bytes | None, timeout_s: float, retries: int) -> Answer:
    """The answer of the first try that is not a transport failure or a 5xx; after `retries` such tries, the last one's."""
    pause = RETRY_PAUSE_S
    for _ in range(retries):
        try:
            answer = send_once(url, body, timeout_s)
            if not retryable(answer):
                return answer
        except ClientError:
            pass
        time.sleep(pause)  # a pause between tries to a remote server: nothing local to wait on
        pause *= 2
    return send_once(url, body, timeout_s)


def failed(url: str, answer: Answer, tries: int) -> ClientError:
    after = f" after {tries} tries" if tries > 1 and retryable(answer) else ""
    return ClientError(f"{url}: HTTP {answer.status}{after}: {short_text(answer.body)}")


def refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: Python writes them, JSON has none


def json_object(url: str, data: bytes) -> dict:
    try:
        value = json.loads(data, parse_constant=refuse_constant)
    except (ValueError, RecursionError):
        raise ClientError(f"{url}: the answer is not JSON: {short_text(data, 60)}") from None
    if not isinstance(value, dict):
        raise ClientError(f"{url}: the answer is JSON but not an object: {short_text(data, 60)}")
    return value


def post_json(url: str, body: dict, timeout_s: float, retries: int) -> dict:
    """POST a JSON body; the answer's JSON object, or ClientError."""
    answer = send(url, json.dumps(body, ensure_ascii=False).encode("utf-8"), timeout_s, retries)
    if answer.status != 200:
        raise failed(url, answer, retries + 1)
    return json_object(url, answer.body)


def get(url: str, timeout_s: float, retries: int) -> bytes | None:
    """GET a body; None when the server has no such endpoint (404, 405), ClientError for any other failure."""
    answer = send(url, None, timeout_s, retries)
    if answer.status in (404, 405):
        return None
    if answer.status != 200:
        raise failed(url, answer, retries + 1)
    return answer.body


def get_json(url: str, timeout_s: float, retries: int) -> dict | None:
    data = get(url, timeout_s, retries)
    return None if data is None else json_object(url, data)
