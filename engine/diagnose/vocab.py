"""How much of the target's output a head with a reduced draft vocabulary can never propose.

An EAGLE head (EAGLE-1 with its kept vocabulary, EAGLE-3 with d2t/t2d) drafts only over its own
vocabulary: where the target's next token lies outside it, q of that token is 0, so any draft there
is rejected, whatever the head learned. The share of such tokens in the baseline's own output bounds
the head's acceptance from above, and names the tokens it loses most (a vocabulary chosen from other
text misses the workload's own words)."""
from collections import Counter

from engine.workload.requests import RequestRun

MOST_MISSED = 5  # tokens listed by how often the target emitted them outside the draft vocabulary


def draft_vocab(drafter) -> set[int] | None:
    """Target ids the drafter can propose; None where it drafts over the whole vocabulary (or is no head)."""
    # no torch import here: the app checks a diagnosis against MOST_MISSED without loading torch
    ids = getattr(drafter, "draft_to_target", None)  # (V_draft,) target ids: EAGLE-3
    if ids is None and getattr(drafter, "parts", None) is not None:  # EAGLE-1
        ids = drafter.parts.kept_token_ids
        if ids.numel() == drafter.parts.full_vocab_size:
            return None
    return None if ids is None else set(ids.tolist())


def coverage(vocab: set[int], runs: list[RequestRun], token_text) -> dict:
    """Over every generated token of `runs`: how many lie outside `vocab`, and the most frequent of those."""
    outside: Counter = Counter()
    total = 0
    for run in runs:
        generated = run.trace.summary["generated_token_ids"]
        total += len(generated)
        outside.update(t for t in generated if t not in vocab)
    missed = sum(outside.values())
    return {"draft_vocab_size": len(vocab), "tokens": total, "outside": missed,
            "outside_share": missed / total if total else None,
            "most_missed": [{"token_id": t, "text": token_text(t), "count": n} for t, n in outside.most_common(MOST_MISSED)]}
