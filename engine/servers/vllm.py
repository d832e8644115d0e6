"""vLLM's speculative-decoding counters, from /metrics, from `llm.get_metrics()` and from its log.

Names and meanings as in vLLM V1 (vllm/v1/spec_decode/metrics.py, v0.10):
- vllm:spec_decode_num_drafts: cycles (one per request per step that drafted);
- vllm:spec_decode_num_draft_tokens / _num_accepted_tokens: drafted and accepted draft tokens;
- vllm:spec_decode_num_accepted_tokens_per_pos{position="i"}: cycles that accepted position i
  (0-based), which needs every position before it accepted too;
- the log line every interval: "SpecDecoding metrics: Mean acceptance length: 2.50, Accepted
  throughput: ... tokens/s, Drafted throughput: ... tokens/s, Accepted: N tokens, Drafted: N
  tokens, Per-position acceptance rate: 0.800, 0.500, Avg Draft acceptance rate: 50.0%".
"""
import re

from engine.servers.prometheus import Scrape, difference
from engine.servers.server_metrics import (
    MAX_POSITIONS,
    MAX_RECORDS,
    ServerMetrics,
    ServerMetricsError,
    check_counts,
    check_text_size,
    count,
    fraction,
    number,
    per_position_rates,
    short,
)

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATED = "vllm:generation_tokens"  # every token the server generated, speculative or not
COUNTERS = [DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS, GENERATED]


def from_counts(source: str, values: dict[str, float], per_pos: dict[int, float] | None,
                window_s: float | None = None) -> ServerMetrics:
    """A record from vLLM's four counters (summed over engines); positions must run 0..K-1 without a gap."""
    if DRAFTS not in values:
        raise ServerMetricsError(f"{source} has no {DRAFTS} counter: is speculative decoding on?")
    drafts = count(values[DRAFTS], DRAFTS)
    draft_tokens = count(values[DRAFT_TOKENS], DRAFT_TOKENS) if DRAFT_TOKENS in values else None
    accepted = count(values[ACCEPTED], ACCEPTED) if ACCEPTED in values else None
    check_counts(drafts, draft_tokens, accepted)
    rates, k = None, None
    if per_pos:
        missing = sorted(set(range(max(per_pos) + 1)) - set(per_pos))
        if missing:
            raise ServerMetricsError(f"{PER_POS} lacks position {missing[0]}: vLLM writes positions 0 to K-1, "
                                     "so part of the scrape is missing")
        counts = [count(per_pos[p], f"{PER_POS}{{position={p}}}") for p in range(len(per_pos))]
        rates, k = per_position_rates(counts, drafts), len(counts)
        if accepted is not None and accepted > drafts * k:
            raise ServerMetricsError(f"{accepted} accepted tokens in {drafts} drafts of K={k}: more than K per draft")
    tokens_per_s = None
    if window_s and GENERATED in values:
        tokens_per_s = count(values[GENERATED], GENERATED) / window_s
    return ServerMetrics(source, k=k, drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
                         per_position=rates, window_s=window_s, tokens_per_s=tokens_per_s)


def from_scrapes(scrapes: list[Scrape]) -> ServerMetrics:
    """One scrape (counts since the server started) or two (counts between them)."""
    if len(scrapes) == 1:
        s = scrapes[0]
        return from_counts("vLLM /metrics (Prometheus text, one scrape: counts since the server started)",
                           s.values, s.by_position.get(PER_POS))
    if len(scrapes) != 2:
        raise ServerMetricsError(f"{len(scrapes)} scrapes: give one, or two of one server (earlier first)")
    d = difference(scrapes[0], scrapes[1], COUNTERS)
    window = "" if d.window_s is None else f", {d.window_s:g} s apart"
    return from_counts(f"vLLM /metrics (Prometheus text, the difference of two scrapes{window})",
                       d.values, d.by_position.get(PER_POS), d.window_s)


# ---------------------------------------------------------------- llm.get_metrics()

def from_get_metrics(data) -> ServerMetrics:
    """`json.dumps([dataclasses.asdict(m) for m in llm.get_metrics()])`: a list of
    {"name", "labels", "value"} (Counter, Gauge) or {"name", "labels", "values"} (Vector: the
    per-position counts, one list entry per position) as vllm/v1/metrics/reader.py defines them."""
    if not isinstance(data, list) or len(data) > MAX_RECORDS:
        raise ServerMetricsError(f"a get_metrics() dump is a list of at most {MAX_RECORDS:,} metrics")
    values: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for m in data:
        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
            raise ServerMetricsError(f"a get_metrics() entry is {short(m)}, not an object with a name")
        name = m["name"]
        if name == PER_POS:
            vector = m.get("values")
            if not isinstance(vector, list) or len(vector) > MAX_POSITIONS:
                raise ServerMetricsError(f"{PER_POS} needs a list of at most {MAX_POSITIONS} values")
            for p, v in enumerate(vector):
                per_pos[p] = per_pos.get(p, 0.0) + number(v, f"{PER_POS}[{p}]")
        elif name in COUNTERS:
            values[name] = values.get(name, 0.0) + number(m.get("value"), name)
    return from_counts("vLLM llm.get_metrics() (offline, counts since the engine started)", values, per_pos)


# ---------------------------------------------------------------- log lines

LOG_MARK = "SpecDecoding metrics:"
LOG_FIELDS = {  # field of one log line -> its pattern (vLLM writes them in this order, but each is read alone)
    "length": r"Mean acceptance length:\s*([0-9.eE+-]+)",
    "accepted_per_s": r"Accepted throughput:\s*([0-9.eE+-]+)\s*tokens/s",
    "accepted": r"Accepted:\s*([0-9]+)\s*tokens",
    "drafted": r"Drafted:\s*([0-9]+)\s*tokens",
    "per_position": r"Per-position acceptance rate:\s*((?:[0-9.]+\s*,\s*)*[0-9.]+)",
}


def from_log(text: str) -> ServerMetrics:
    """Every 'SpecDecoding metrics:' line of a vLLM log, added up (each covers one logging interval).

    A line gives accepted and drafted tokens exactly, but not the number of drafts: that is
    accepted / (the sum of its per-position rates), since those rates sum to accepted / drafts;
    the rates are rounded to 3 decimals, so the drafts are an estimate (a note says so).
    """
    check_text_size(text)
    lines = [line for line in text.splitlines() if LOG_MARK in line][:MAX_RECORDS]
    if not lines:
        raise ServerMetricsError(f"no '{LOG_MARK}' line in the log")
    drafts = drafted = accepted = 0
    weighted: list[float] = []  # per position: rate x drafts, summed over lines
    seconds = 0.0
    for n, line in enumerate(lines, start=1):
        f = log_fields(line, n)
        line_drafts = drafts_of_line(f, n)
        drafts, drafted, accepted = drafts + line_drafts, drafted + f["drafted"], accepted + f["accepted"]
        if len(f["per_position"]) > len(weighted):
            weighted += [0.0] * (len(f["per_position"]) - len(weighted))
        for i, r in enumerate(f["per_position"]):
            weighted[i] += r * line_drafts
        if f.get("accepted_per_s"):
            seconds += f["accepted"] / f["accepted_per_s"]
    check_counts(drafts, drafted, accepted)
    rates = [min(1.0, w / drafts) for w in weighted] if drafts and weighted else None
    return ServerMetrics(f"vLLM log ({len(lines)} 'SpecDecoding metrics' line{'s' * (len(lines) > 1)})",
                         k=len(rates) if rates else None, drafts=drafts, draft_tokens=drafted,
                         accepted_tokens=accepted, per_position=rates, window_s=seconds or None,
                         tokens_per_s=accepted / seconds if seconds else None,
                         notes=["drafts estimated from the rounded per-position rates of each log line",
                                *(["tokens/s counts accepted draft tokens only (what the log reports)"]
                                  if seconds else [])])


def log_fields(line: str, n: int) -> dict:
    found = {key: re.search(pattern, line) for key, pattern in LOG_FIELDS.items()}
    if not found["accepted"] or not found["drafted"]:
        raise ServerMetricsError(f"log line {n} has no 'Accepted: N tokens, Drafted: N tokens'")
    f = {"accepted": count(int(found["accepted"].group(1)), f"line {n} Accepted"),
         "drafted": count(int(found["drafted"].group(1)), f"line {n} Drafted"),
         "per_position": [], "length": None, "accepted_per_s": None}
    if found["per_position"]:
        raw = [float(x) for x in found["per_position"].group(1).split(",")]
        if len(raw) > MAX_POSITIONS:
            raise ServerMetricsError(f"log line {n} has {len(raw)} positions; at most {MAX_POSITIONS} are read")
        f["per_position"] = [fraction(x, f"line {n} per-position rate") for x in raw]
    if found["length"]:
        f["length"] = fraction(float(found["length"].group(1)), f"line {n} mean acceptance length", MAX_POSITIONS + 1)
    if found["accepted_per_s"]:
        f["accepted_per_s"] = number(float(found["accepted_per_s"].group(1)), f"line {n} accepted throughput")
    return f


def drafts_of_line(f: dict, n: int) -> int:
    """accepted / sum(per-position rates), else accepted / (mean length - 1); 0 when nothing was accepted."""
    per_draft = sum(f["per_position"]) or ((f["length"] - 1) if f["length"] else 0.0)
    if f["accepted"] == 0:
        return 0 if not f["per_position"] else max(1, round(f["drafted"] / len(f["per_position"])))
    if per_draft <= 0:
        raise ServerMetricsError(f"log line {n} accepted {f['accepted']} tokens but gives no per-position rates "
                                 "or acceptance length to count its drafts by")
    return max(1, round(f["accepted"] / per_draft))

