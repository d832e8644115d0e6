"""Server answers with per-request metrics: vLLM's metrics.speculative_decoding (summary and detailed) and
SGLang's meta_info and sglext.spec_tokens_details, from tests/server_samples/, changed, read by
`python -m engine metrics FILE` (the per-request reader, the server reader, the explanation).
"""
import json
import random
from functools import lru_cache
from pathlib import Path

from bench.fuzz import mutate
from bench.fuzz.cases import ACCEPT, EITHER, REFUSE, Case
from bench.fuzz.metrics_cli import explain_files
from bench.fuzz.sandbox import Places

KIND = "answers"
ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ("vllm_response.json", "vllm_requests.jsonl", "sglang_requests.jsonl", "sglang_generate.jsonl",
           "sglang_sglext.json")
MENTIONS = ("request", "JSON", "input", "response", "metrics", "speculative", "spec_", "num_")
# vLLM's and SGLang's names for the same counts.
VLLM = {"steps": "num_spec_steps", "drafted": "num_draft_tokens", "accepted": "num_accepted_draft_tokens",
        "rate": "draft_acceptance_rate", "length": "mean_acceptance_length", "histogram": "acceptance_histogram",
        "k": "num_spec_tokens"}
SGLANG = {"steps": "spec_verify_ct", "rate": "spec_accept_rate", "length": "spec_accept_length"}


@lru_cache(maxsize=1)
def samples() -> tuple[tuple[str, str], ...]:
    return tuple((name, (ROOT / "tests" / "server_samples" / name).read_text()) for name in SAMPLES)


def items_of(text: str) -> list:
    data = json.loads(text) if text.lstrip().startswith("{") and "\n{" not in text else None
    return [data] if data is not None else [json.loads(line) for line in text.splitlines() if line.strip()]


def blocks(item: dict) -> list[tuple[dict, dict]]:
    """(the block with the counts, the names it uses) of one response; none for a null block."""
    spec = (item.get("metrics") or {}).get("speculative_decoding")
    if isinstance(spec, dict):
        return [(spec, VLLM)]
    meta = item.get("meta_info") or (item.get("sglext") or {}).get("spec_tokens_details")
    metas = meta if isinstance(meta, list) else [meta] if isinstance(meta, dict) else []
    return [(m, sglang_names(m)) for m in metas]


def sglang_names(meta: dict) -> dict:
    names = dict(SGLANG)
    for role, keys in (("accepted", ("spec_accept_token_num", "spec_num_correct_drafts")),
                       ("drafted", ("spec_draft_token_num", "spec_num_proposed_drafts")),
                       ("histogram", ("spec_accept_histogram", "spec_correct_drafts_histogram"))):
        names[role] = next((k for k in keys if k in meta), keys[0])
    return names


def breaks(block: dict, names: dict, rng: random.Random) -> str:
    """Break one rule a server's own counts keep, in place; the words say which."""
    have = {role: name for role, name in names.items() if block.get(name) is not None}
    edits = [("steps negative", lambda: block.update({names["steps"]: -1})),
             ("steps NaN", lambda: block.update({names["steps"]: float("nan")})),
             ("steps beyond 2**53", lambda: block.update({names["steps"]: 2**60})),
             ("steps true", lambda: block.update({names["steps"]: True})),
             ("rate 1.5", lambda: block.update({names["rate"]: 1.5})),
             ("length 0.5", lambda: block.update({names["length"]: 0.5}))]
    if "accepted" in have and "drafted" in have:
        edits.append(("accepted > drafted", lambda: block.update({names["accepted"]: block[names["drafted"]] + 1})))
    if "rate" in have and "accepted" in have:
        edits.append(("rate disagrees with the counts", lambda: block.update(
            {names["rate"]: min(1.0, block[names["rate"]] + 0.1) if block[names["rate"]] < 0.9 else 0.1})))
    if "histogram" in have:
        hist = block[names["histogram"]]
        if "k" in have:  # SGLang writes no K: a longer histogram only says K is larger
            edits.append(("histogram one entry longer than K + 1", lambda: hist.append(0)))
        edits += [("histogram sums to steps + 1", lambda: hist.__setitem__(0, hist[0] + 1)),
                  ("histogram of one entry", lambda: block.update({names["histogram"]: [hist[0]]}))]
    if "k" in have:
        edits += [("K 0", lambda: block.update({names["k"]: 0})), ("K 65", lambda: block.update({names["k"]: 65}))]
    if "per_step_accepted" in block:
        edits += [("per_step_accepted one short", lambda: block["per_step_accepted"].pop()),
                  ("a step beyond K", lambda: block["per_step_accepted"].__setitem__(0, 99))]
    words, edit = rng.choice(edits)
    edit()
    return words


def zero_steps(block: dict, names: dict) -> str:
    """A request that never verified: every count 0 (the rates would be 0/0)."""
    for role in ("steps", "drafted", "accepted"):
        if role in names:
            block[names[role]] = 0
    for role in ("rate", "length"):
        block.pop(names.get(role, ""), None)
    if isinstance(block.get(names.get("histogram")), list):
        block[names["histogram"]] = [0] * len(block[names["histogram"]])
    for key in ("per_step_accepted", "per_step_drafted"):
        if key in block:
            block[key] = []
    return "every count 0"


def written(items: list, rng: random.Random, valid_styles: bool = False) -> tuple[str, str]:
    """The responses as one JSON object, a JSON list or JSON Lines (CRLF or spaced where valid)."""
    forms = ["list", "jsonl"] + (["one"] if len(items) == 1 else [])
    if valid_styles:
        forms += ["jsonl-crlf", "indented-list", "reordered"] if len(items) > 1 else ["indented-one", "reordered"]
    form = rng.choice(forms)
    if form == "reordered":
        items, form = [mutate.reordered(i, rng) for i in items], "jsonl" if len(items) > 1 else "one"
    if form in ("one", "indented-one"):
        return json.dumps(items[0], indent=2 if form == "indented-one" else None), form
    if form in ("list", "indented-list"):
        return json.dumps(items, indent=1 if form == "indented-list" else None), form
    return ("\r\n" if form == "jsonl-crlf" else "\n").join(json.dumps(i) for i in items) + "\n", form


def make(rng: random.Random, index: int, places: Places) -> Case:
    name, text = rng.choice(samples())
    items = items_of(text)
    with_blocks = [(i, b) for i, item in enumerate(items) for b in blocks(item)]
    family = rng.choices(["valid", "break", "zero", "damage"], weights=[3, 5, 1, 2])[0]
    tag, expect, words = None, ACCEPT, ""
    if family == "break":
        i, (block, names) = rng.choice(with_blocks)
        words, expect = f"request {i + 1}: {breaks(block, names, rng)}", REFUSE
    elif family == "zero":
        for _, (block, names) in with_blocks:
            zero_steps(block, names)
        words, expect, tag = "every request with every count 0", EITHER, "zero-rate"
    elif family == "damage":
        i = rng.randrange(len(items))
        words, expect = f"response {i + 1}: {mutate.swap_random_leaf(items[i], rng)}", EITHER
    data, form = written(items, rng, valid_styles=family == "valid")
    if family == "damage" and rng.random() < 0.5:
        raw, words = mutate.flip_bytes(data.encode("utf-8", "surrogatepass"), rng)
    else:
        raw = data.encode("utf-8", "surrogatepass")
    file = "answers.jsonl" if form.startswith("jsonl") else "answers.json"
    return Case(KIND, index, f"{name} as {form}: {words or 'valid'}", expect, file, "metrics", files={file: raw}, tag=tag,
                mentions=(file, *MENTIONS))


def attempt(case: Case, work: Path) -> str:
    return explain_files([case.source], no_drafts=case.tag == "zero-rate")
