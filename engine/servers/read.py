"""Which server wrote an input, told from its content, and the record its reader yields.

JSON (one document, or one per line) is vLLM's get_metrics() dump, vLLM's or SGLang's per-request
metrics (responses: per_request.py), SGLang's /server_info, or TensorRT-LLM's iteration stats,
told apart by their keys; per-request input also gives its requests one by one (read_requests_text); text with a
'SpecDecoding metrics:' line is a vLLM log; anything else must be Prometheus text naming vLLM's
counters or SGLang's gauges, and two scrapes must both hold one server's (check_pair). Nothing
here evaluates or unpickles anything: json and prometheus_client's text parser only.
"""
import json

from engine.servers import per_request, sglang, tensorrt, vllm
from engine.servers.prometheus import ONE_RUN, Scrape, parse_scrape
from engine.servers.request_stats import to_server_metrics
from engine.servers.server_metrics import (
    MAX_RECORDS,
    ServerMetrics,
    ServerMetricsError,
    ServerRequests,
    check_text_size,
    short,
)

KNOWN = ("vLLM's /metrics (vllm:spec_decode_* counters), llm.get_metrics() as JSON, its 'SpecDecoding "
         "metrics' log lines or responses with metrics.speculative_decoding; SGLang's /server_info, /metrics "
         "gauges, /generate responses (meta_info) or sglext.spec_tokens_details; TensorRT-LLM's /metrics JSON")


def decode(data: bytes, name: str = "the input") -> str:
    check_text_size(data, name)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ServerMetricsError(f"{name} is not UTF-8 text") from None


def load_json(text: str):
    """One JSON document, or one per line (JSON Lines); None when the text is not JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ServerMetricsError("the JSON is nested too deeply to be a metrics file") from None
    except ValueError:
        pass
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or len(lines) > MAX_RECORDS or not all(line.lstrip()[:1] in "{[" for line in lines):
        return None
    try:
        return [json.loads(line) for line in lines]
    except RecursionError:
        raise ServerMetricsError("the JSON is nested too deeply to be a metrics file") from None
    except ValueError as err:
        raise ServerMetricsError(f"a line is not JSON: {short(str(err))}") from None


def from_json(data) -> ServerMetrics:
    first = data[0] if isinstance(data, list) and data else data
    if isinstance(first, dict) and isinstance(first.get("name"), str) and first["name"].startswith("vllm:"):
        return vllm.from_get_metrics(data)
    if isinstance(data, list) and any(isinstance(i, dict) and tensorrt.SPEC in i for i in data[:MAX_RECORDS]):
        return tensorrt.from_iterations(data)
    if isinstance(data, dict) and tensorrt.SPEC in data:
        return tensorrt.from_iterations(data)
    server = per_request.kind(data)
    if server == "vLLM":
        return to_server_metrics(per_request.read_requests(data))
    if server == "SGLang":
        requests = per_request.read_requests(data)
        if "sglext" not in first and any(r.accepted is None for r in requests.requests):
            return sglang.from_requests(data)  # older SGLang: accepted tokens derived from completion tokens
        return to_server_metrics(requests)
    if isinstance(first, dict) and "meta_info" in first:
        return sglang.from_requests(data)  # refuses it, naming spec_verify_ct
    if isinstance(data, dict) and ({"internal_states", "avg_spec_accept_length", "speculative_algorithm"} & set(data)):
        return sglang.from_server_info(data)
    raise ServerMetricsError(f"JSON, but not a speculative-decoding metrics file this reads ({KNOWN})")


def server_of(scrape: Scrape) -> str | None:
    """Which server's speculative-decoding metrics a scrape holds; None when it holds none."""
    if vllm.DRAFTS in scrape.series:
        return "vLLM"
    if {sglang.LENGTH_GAUGE, sglang.RATE_GAUGE} & set(scrape.series):
        return "SGLang"
    return None


def check_pair(scrapes: list[Scrape]) -> str:
    """The server both scrapes of a pair come from: a pair of two servers' metrics, or one with an
    empty side, has no meaningful difference (an empty scrape is not a scrape of zeros)."""
    kinds = [server_of(s) for s in scrapes]
    for i, which in enumerate(("first", "second")):
        if kinds[i] is None and kinds[1 - i] is not None:
            what = "is empty" if not scrapes[i].series else "has no speculative-decoding metrics"
            raise ServerMetricsError(f"the {which} scrape {what}, while the other is {kinds[1 - i]}'s: {ONE_RUN}")
    if kinds[0] != kinds[1]:
        raise ServerMetricsError(f"the first scrape is {kinds[0]}'s and the second {kinds[1]}'s: {ONE_RUN}")
    return kinds[0]


def from_prometheus(texts: list[str]) -> ServerMetrics:
    scrapes = [parse_scrape(t) for t in texts]
    kind = check_pair(scrapes) if len(scrapes) == 2 else server_of(scrapes[0])
    if kind == "vLLM":
        return vllm.from_scrapes(scrapes)
    if kind == "SGLang":
        if len(scrapes) > 1:
            raise ServerMetricsError("SGLang's gauges are averages already: give one scrape, not two")
        return sglang.from_gauges(scrapes[0])
    raise ServerMetricsError(f"no speculative-decoding metrics found; this reads {KNOWN}")


def json_of(text: str):
    """The JSON of a text that opens like JSON (refused when it is not JSON); None for any other text."""
    if text.lstrip()[:1] not in ("{", "["):
        return None
    data = load_json(text)
    if data is None:  # a brace opens no Prometheus text or log: say what is wrong with the JSON
        try:
            json.loads(text)
        except ValueError as err:
            raise ServerMetricsError(f"the input opens like JSON but is not JSON: {short(str(err))}") from None
    return data


def read_requests_text(text: str) -> ServerRequests | None:
    """The requests one by one when the text is vLLM's or SGLang's per-request output, else None."""
    check_text_size(text)
    data = json_of(text)
    if data is None or per_request.kind(data) is None:
        return None
    return per_request.read_requests(data)


def read_text(text: str) -> ServerMetrics:
    """The record of one input, whatever server wrote it."""
    return read_texts([text])


def read_texts(texts: list[str]) -> ServerMetrics:
    """One input, or two Prometheus scrapes of one vLLM server (the earlier first)."""
    if not texts or len(texts) > 2:
        raise ServerMetricsError("give one metrics input, or two Prometheus scrapes of one server")
    for t in texts:
        check_text_size(t)
    if not any(t.strip() for t in texts):
        raise ServerMetricsError("the input is empty")
    if len(texts) == 1:
        text = texts[0]
        data = json_of(text)
        if data is not None:
            return from_json(data)
        if vllm.LOG_MARK in text:
            return vllm.from_log(text)
    return from_prometheus(texts)
