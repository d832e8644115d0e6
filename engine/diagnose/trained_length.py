"""How much an EAGLE head drafted past the longest sequence it was trained on, and what it accepted there.

A head trained on sequences of at most N tokens never attended over positions N and later: what it drafts
there rests on nothing it learnt. Training tools cut sequences to a fixed length (SpecForge's --max-length,
for one), so a head served on longer contexts than it saw is an easy mismatch to miss. The head's folder
may say N (engine/drafters/speculators_format.py, "trained_positions"); a trace records it in the header's
draft entry. Each draft token is counted where it stands: draft i of a cycle that starts with n committed
tokens would be token n + i - 1 (0-based), so it lies past the trained length when n + i - 1 >= N.

Counts only, so the app can check that they add up (accepted at most drafted) without loading torch.
"""
from engine.workload.requests import RequestRun

MAX_TRAINED_POSITIONS = 10_000_000  # mirror of speculators_format.MAX_TRAINED_POSITIONS (no torch here)


def trained_positions(runs: list[RequestRun]) -> int | None:
    """The length the traces' head was trained on; None where no header says it, or the headers disagree."""
    found = {(r.trace.header.get("draft") or {}).get("trained_positions") for r in runs}
    if len(found) != 1:
        return None
    value = found.pop()
    ok = isinstance(value, int) and not isinstance(value, bool) and 2 <= value <= MAX_TRAINED_POSITIONS
    return value if ok else None


def past_trained_length(runs: list[RequestRun], trained: int) -> dict:
    """Draft tokens within and past `trained` positions over every cycle of `runs`, and how many were accepted."""
    counts = {"drafted_within": 0, "accepted_within": 0, "drafted_past": 0, "accepted_past": 0,
              "requests": len(runs), "requests_past": 0}
    for run in runs:
        committed = len(run.trace.header["prompt_token_ids"])
        went_past = False
        for cycle in run.trace.cycles:
            for i in range(1, len(cycle["draft_token_ids"]) + 1):
                side = "past" if committed + i - 1 >= trained else "within"
                went_past |= side == "past"
                counts[f"drafted_{side}"] += 1
                counts[f"accepted_{side}"] += i <= cycle["num_accepted"]
            committed += len(cycle["committed_token_ids"])
        counts["requests_past"] += went_past
    return counts


def trained_length_report(arms: dict[str, list[RequestRun]]) -> dict | None:
    """For each arm (the baseline, the longer-context experiment), the counts against the head's trained
    length; None where the baseline's head does not say it."""
    trained = trained_positions(arms.get("baseline", []))
    if trained is None:
        return None
    return {"trained_positions": trained,
            "arms": {name: past_trained_length(runs, trained) for name, runs in arms.items() if runs}}
