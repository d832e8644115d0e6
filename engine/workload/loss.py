"""Where a workload loses its draft tokens: the worst requests, the worst cycles, and the draft
tokens the target rejected (which texts, which kinds, how sure each model was).

`loss_stats(runs, rows)` (rows: the per-request rows) returns the workload statistics' "loss" entry:
{"worst_requests": [...], "worst_cycles": [...], "rejected_tokens": {...}}. The rejected-token
figures read a chain record's per-position fields (draft_token_texts, p_draft, p_target,
rejected_position); a tree record has none (its walk tries siblings, not one token per
position), so tree requests are counted as skipped there, and their cycles still rank by lost nodes.
At temperature 0 both models' distributions are one-hot (p_draft 1, p_target 0 at every rejection),
so "greedy" says so and "top_pairs" pairs each rejected text with the token the target chose instead.

May import: engine.trace and the standard library. Never torch or streamlit.
"""
import unicodedata
from collections import Counter

from engine.trace.metrics import drafted
from engine.workload.requests import UNCATEGORISED, RequestRun

WORST = 10  # rows in each worst-of list
TOP_TOKENS = 20  # most often rejected texts listed
MAX_POINTS = 2000  # (p_draft, p_target) points kept for a scatter chart: more draws nothing new
EXAMPLES = 3  # places each often-rejected text is linked from
TOKEN_CLASSES = ("whitespace", "punctuation", "digits", "word", "special", "other")
# Unicode categories counted as punctuation: P* and the math, currency and modifier symbols.
# Not So (emoji, and U+FFFD, which a byte-level tokenizer shows for part of a character): "other".
PUNCTUATION = {"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk"}


def token_class(text: str) -> str:
    """A draft token's kind, from its text: "whitespace" (only spaces or newlines), "special"
    (a control token such as <|im_end|> or a byte token <0x0A>, or no text), and, on the text
    without its leading or trailing space (a word token usually carries one), "punctuation"
    (punctuation, math, currency symbols only), "digits", "word" (letters, maybe with digits, ' - _), else "other"."""
    if text == "" or (text.startswith("<") and text.endswith(">") and len(text) > 2 and " " not in text):
        return "special"
    core = text.strip()
    if core == "":
        return "whitespace"
    if all(unicodedata.category(ch) in PUNCTUATION for ch in core):
        return "punctuation"
    if core.isdigit():
        return "digits"
    if any(ch.isalpha() for ch in core) and all(ch.isalnum() or ch in "'-_" for ch in core):
        return "word"
    return "other"


def worst_requests(rows: list[dict]) -> list[dict]:
    """The requests with the lowest acceptance rate (those that drafted something), lowest first,
    each with how far it lies below the workload's median; ties by workload order."""
    measured = sorted((r for r in rows if r["acceptance_rate"] is not None),
                      key=lambda r: r["acceptance_rate"])  # stable: ties keep workload order
    keep = ("id", "category", "file", "cycles", "draft_tokens", "accepted_tokens", "acceptance_rate",
            "mean_acceptance_length", "below_median")
    return [{name: r[name] for name in keep} for r in measured[:WORST]]


def rejection(cycle: dict) -> dict | None:
    """A chain cycle's rejected draft token: its position, text and both probabilities; None when
    every drafted token passed (or for a tree cycle, which records no per-position fields)."""
    position = cycle.get("rejected_position")
    if position is None or "draft_token_texts" not in cycle:
        return None
    i = position - 1
    # The accepted tokens, then the target's in the rejected one's place (a record built by hand may lack them).
    committed = cycle.get("committed_token_texts", [])
    return {"rejected_position": position, "text": cycle["draft_token_texts"][i],
            "target_text": committed[i] if i < len(committed) else None,
            "p_draft": cycle["p_draft"][i], "p_target": cycle["p_target"][i]}


def cycle_loss(run: RequestRun, order: int, cycle: dict) -> dict:
    """One cycle's loss: drafted but not kept tokens (a rejection discards its token and every
    one after it; a tree discards every node off the accepted path)."""
    rejected = rejection(cycle)
    row = {"request": run.id, "category": run.category or UNCATEGORISED, "file": run.file, "request_index": order,
           "cycle": cycle["cycle"], "drafted": drafted(cycle), "accepted": cycle["num_accepted"],
           "lost": drafted(cycle) - cycle["num_accepted"], "committed_len_before": cycle["committed_len_before"]}
    return row | (rejected or {"rejected_position": None, "text": None, "target_text": None, "p_draft": None,
                               "p_target": None})


def worst_cycles(runs: list[RequestRun]) -> list[dict]:
    """The cycles that lost the most draft tokens; ties: the lowest p_target at the rejected token
    first (the target was surest the draft was wrong), then workload and cycle order. The
    "cycle" entry is the record's index in its trace, which the stepper opens."""
    losses = [cycle_loss(run, order, c) for order, run in enumerate(runs) for c in run.trace.cycles]
    losses = [row for row in losses if row["lost"] > 0]
    losses.sort(key=lambda r: (-r["lost"], r["p_target"] if r["p_target"] is not None else 2.0,
                               r["request_index"], r["cycle"]))
    return losses[:WORST]


def spread_points(points: list[dict], cap: int) -> list[dict]:
    """At most `cap` points taken evenly over the list, so a long workload's scatter still shows
    every request's part rather than only the first requests'."""
    if len(points) <= cap:
        return points
    return [points[i * len(points) // cap] for i in range(cap)]


def tested_texts(cycle: dict) -> list[str]:
    """The draft texts the target tested: the accepted ones and the rejected one, not those after."""
    texts = cycle["draft_token_texts"]
    return texts[:cycle["num_accepted"] + 1] if cycle.get("rejected_position") is not None else texts


def class_table(rejected: Counter, tested: Counter) -> dict:
    """Per token class: rejections, tests, and the share of tests that failed (None if never tested)."""
    return {name: {"rejected": rejected[name], "tested": tested[name],
                   "rate": rejected[name] / tested[name] if tested[name] else None} for name in TOKEN_CLASSES}


def is_greedy(runs: list[RequestRun]) -> bool:
    """Whether every request ran at temperature 0 (one-hot distributions: p-values say nothing)."""
    return bool(runs) and all(r.trace.header.get("settings", {}).get("temperature") == 0 for r in runs)


def top_pairs(pairs: Counter, examples: dict[tuple, list[dict]]) -> list[dict]:
    """The most frequent (rejected draft text, the target's token instead), most frequent first."""
    top = sorted(pairs.items(), key=lambda item: (-item[1], item[0][0], item[0][1] or ""))[:TOP_TOKENS]
    return [{"text": draft, "target_text": target, "count": count, "examples": examples[(draft, target)]}
            for (draft, target), count in top]


def rejected_tokens(runs: list[RequestRun]) -> dict:
    """Every rejected draft position of the chain requests, aggregated."""
    texts, pairs, rejected_classes, tested_classes, points = Counter(), Counter(), Counter(), Counter(), []
    examples: dict[str, list[dict]] = {}  # a few places each text was rejected, for links into the stepper
    pair_examples: dict[tuple, list[dict]] = {}
    chain = [r for r in runs if not r.trace.is_tree]
    for run in chain:
        for c in run.trace.cycles:
            tested_classes.update(token_class(t) for t in tested_texts(c))
            found = rejection(c)
            if found is None:
                continue
            texts[found["text"]] += 1
            where = {"request": run.id, "file": run.file, "cycle": c["cycle"]}
            if len(examples.setdefault(found["text"], [])) < EXAMPLES:
                examples[found["text"]].append(where)
            pair = (found["text"], found["target_text"])
            pairs[pair] += 1
            if len(pair_examples.setdefault(pair, [])) < EXAMPLES:
                pair_examples[pair].append(where)
            rejected_classes[token_class(found["text"])] += 1
            points.append({"p_draft": found["p_draft"], "p_target": found["p_target"]} | where)
    top = sorted(texts.items(), key=lambda item: (-item[1], item[0]))[:TOP_TOKENS]
    n = len(points)
    return {
        "rejections": n, "skipped_tree_requests": len(runs) - len(chain), "greedy": is_greedy(chain),
        "top_tokens": [{"text": text, "count": count, "class": token_class(text), "examples": examples[text]}
                       for text, count in top],
        "top_pairs": top_pairs(pairs, pair_examples),
        "classes": class_table(rejected_classes, tested_classes),
        "mean_p_draft": sum(p["p_draft"] for p in points) / n if n else None,
        "mean_p_target": sum(p["p_target"] for p in points) / n if n else None,
        "points": spread_points(points, MAX_POINTS), "points_cap": MAX_POINTS,
    }


def loss_stats(runs: list[RequestRun], rows: list[dict]) -> dict:
    """The workload statistics' "loss" entry (module docstring)."""
    return {"worst_requests": worst_requests(rows), "worst_cycles": worst_cycles(runs),
            "rejected_tokens": rejected_tokens(runs)}
