"""SGLang's speculative-decoding metrics: /server_info, its gauges, and per-request meta_info.

Names as SGLang writes them (python/sglang/srt, v0.4.x to v0.5.x):
- /server_info (older: /get_server_info): the server's arguments, among them
  speculative_algorithm (EAGLE, EAGLE3, NEXTN = MTP, STANDALONE, NGRAM), speculative_num_steps
  (draft steps per cycle), speculative_eagle_topk and speculative_num_draft_tokens (tree nodes,
  the root included), and internal_states: [{"avg_spec_accept_length", "last_gen_throughput"}]
  per data-parallel rank (older versions put avg_spec_accept_length at the top);
- the Prometheus gauges sglang:spec_accept_length and sglang:spec_accept_rate;
- a /generate response's meta_info: spec_verify_ct (verify passes, i.e. cycles) and
  completion_tokens; newer versions add spec_accept_token_num and spec_draft_token_num (v0.5)
  or spec_num_correct_drafts and spec_num_proposed_drafts, and a histogram of accepted drafts per
  verify pass (spec_accept_histogram, later spec_correct_drafts_histogram); per_request.py reads
  these request by request, and read.py sends responses that carry the counts there.
SGLang's accept length is completion tokens / verify passes: tokens per cycle, bonus included.
"""
from statistics import fmean

from engine.servers.prometheus import Labels, Scrape, series_text
from engine.servers.server_metrics import (
    MAX_POSITIONS,
    MAX_RECORDS,
    ServerMetrics,
    ServerMetricsError,
    check_counts,
    count,
    fraction,
    method_name,
    number,
    short,
)

LENGTH_GAUGE, RATE_GAUGE = "sglang:spec_accept_length", "sglang:spec_accept_rate"
ACCEPTED_KEYS = ("spec_accept_token_num", "spec_num_correct_drafts", "spec_accepted_drafts")
DRAFTED_KEYS = ("spec_draft_token_num", "spec_num_proposed_drafts", "spec_proposed_drafts")
HISTOGRAM_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")  # [j] = verify passes accepting j


def from_gauges(scrape: Scrape) -> ServerMetrics:
    """The gauges, averaged over their ranks (label sets), each rank checked on its own first: an
    average may not hide one rank's impossible value. No counts, no K. A rank whose length gauge
    still reads its initial 0 has drafted nothing yet; with every rank so, nothing was drafted."""
    lengths = rank_values(scrape, LENGTH_GAUGE, MAX_POSITIONS + 1)
    rates = rank_values(scrape, RATE_GAUGE, 1.0)
    idle = {key for key, x in lengths.items() if x == 0}
    for key in idle:
        if rates.get(key, 0.0) != 0:
            raise ServerMetricsError(f"{series_text(LENGTH_GAUGE, key)} is 0 (nothing drafted) but its "
                                     f"{RATE_GAUGE} is {rates[key]:g}")
    busy_lengths = [length_of(x, series_text(LENGTH_GAUGE, key)) for key, x in lengths.items() if key not in idle]
    busy_rates = [x for key, x in rates.items() if key not in idle]
    source = "SGLang /metrics gauges (Prometheus text: the recent average, no counts)"
    notes = ["gauges give no K: enter it"]
    if lengths and not busy_lengths:
        return ServerMetrics(source, drafts=0, notes=[*notes, "every rank's gauges still read 0: nothing drafted yet"])
    if idle:
        notes.append(f"{len(idle)} of {len(lengths)} ranks' gauges still read 0 (nothing drafted there): "
                     "the averages are over the others")
    return ServerMetrics(source, acceptance_length=fmean(busy_lengths) if busy_lengths else None,
                         acceptance_rate=fmean(busy_rates) if busy_rates else None, notes=notes)


def rank_values(scrape: Scrape, name: str, high: float) -> dict[Labels, float]:
    """Each rank's (label set's) value of a gauge, in 0..high."""
    return {key: fraction(x, series_text(name, key), high) for key, x in scrape.series.get(name, {}).items()}


def length_of(value, what: str) -> float:
    x = fraction(value, what, MAX_POSITIONS + 1)
    if x < 1:
        raise ServerMetricsError(f"{what} is {x:g}: a cycle commits at least one token")
    return x


def server_k(info: dict) -> int | None:
    steps = info.get("speculative_num_steps")
    return None if steps is None else k_of(steps, "speculative_num_steps")


def k_of(value, what: str) -> int:
    k = count(value, what)
    if not 1 <= k <= MAX_POSITIONS:
        raise ServerMetricsError(f"{what} is {k}; K must be 1 to {MAX_POSITIONS}")
    return k


def from_server_info(info: dict) -> ServerMetrics:
    states = info.get("internal_states")
    states = states if isinstance(states, list) else []
    lengths = [s["avg_spec_accept_length"] for s in states[:MAX_RECORDS]
               if isinstance(s, dict) and s.get("avg_spec_accept_length") is not None]
    if not lengths and info.get("avg_spec_accept_length") is not None:
        lengths = [info["avg_spec_accept_length"]]
    if not lengths:
        raise ServerMetricsError("this /server_info has no avg_spec_accept_length: is speculative decoding on?")
    throughputs = [number(s["last_gen_throughput"], "last_gen_throughput") for s in states[:MAX_RECORDS]
                   if isinstance(s, dict) and s.get("last_gen_throughput") is not None]
    notes = []
    topk = info.get("speculative_eagle_topk")
    if topk is not None and count(topk, "speculative_eagle_topk") > 1:
        notes.append(f"a tree of top-{int(topk)} drafts: K is its depth (speculative_num_steps), "
                     "and the i.i.d. chain model underestimates what a tree accepts")
    return ServerMetrics(f"SGLang /server_info ({len(lengths)} rank{'s' * (len(lengths) > 1)})",
                         method=method_name(info.get("speculative_algorithm")), k=server_k(info),
                         acceptance_length=fmean(length_of(x, "avg_spec_accept_length") for x in lengths),
                         tokens_per_s=sum(throughputs) if throughputs else None, notes=notes)


def meta_infos(data) -> list[dict]:
    """The meta_info objects of one /generate response, a list of them, or bare meta_info objects."""
    items = data if isinstance(data, list) else [data]
    if len(items) > MAX_RECORDS:
        raise ServerMetricsError(f"{len(items):,} responses; at most {MAX_RECORDS:,} are read")
    out = []
    for item in items:
        meta = item.get("meta_info", item) if isinstance(item, dict) else None
        if not isinstance(meta, dict) or "spec_verify_ct" not in meta:
            raise ServerMetricsError(f"a response without meta_info.spec_verify_ct: {short(item)}")
        out.append(meta)
    return out


def first_key(meta: dict, keys: tuple[str, ...]):
    return next((meta[k] for k in keys if k in meta), None)


def from_requests(data) -> ServerMetrics:
    """Per-request counts added up: cycles = verify passes; accepted = completion tokens - cycles
    (each cycle commits its accepted tokens plus one) unless the response counts them itself."""
    metas = meta_infos(data)
    cycles = sum(count(m["spec_verify_ct"], "spec_verify_ct") for m in metas)
    tokens = sum(count(m.get("completion_tokens", 0), "completion_tokens") for m in metas)
    given = [first_key(m, ACCEPTED_KEYS) for m in metas]
    drafted = [first_key(m, DRAFTED_KEYS) for m in metas]
    notes = []
    if all(a is not None for a in given):
        accepted = sum(count(a, "accepted draft tokens") for a in given)
    else:
        accepted = max(0, tokens - cycles)
        notes.append("accepted tokens = completion tokens - verify passes (each pass commits one token more "
                     "than it accepts; the first token, from prefill, is counted as accepted)")
    draft_tokens = sum(count(d, "drafted tokens") for d in drafted) if all(d is not None for d in drafted) else None
    check_counts(cycles, draft_tokens, accepted)
    if cycles == 0:
        raise ServerMetricsError("spec_verify_ct is 0 in every response: nothing was verified")
    return ServerMetrics(f"SGLang per-request meta_info ({len(metas)} request{'s' * (len(metas) > 1)})",
                         drafts=cycles, draft_tokens=draft_tokens, accepted_tokens=accepted, notes=notes)
