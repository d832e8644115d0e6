"""What a trace's numbers must mean: the invariants `load_trace` checks after the field types.

engine/trace/format.py checks that every field is there with the right JSON type; this module
checks that the numbers agree with each other and with the rules of a cycle (design notes,
"One cycle, exactly" and "Cache conventions"). A trace is untrusted input: one that breaks
an invariant is refused with a message naming the line, the cycle, the field and the rule.

Runs recorded with a deliberate bug (header "faults", see engine/teaching/faults.py `Faults`)
are checked against the bug they declare: a run that keeps its rejected K/V must show
exactly the cache lengths that bug produces, not the correct ones.

Fields this module does not know (a future cache layout's) are ignored. The header's
`drafter` entry says which drafter proposed: a draft model ("model", or no entry in
older traces) proposes exactly K tokens and keeps a cache over the target's positions.
An EAGLE head ("eagle") also proposes K and keeps a cache over the target's positions, but
keeps only entries built on the target's true features (chain_checks.check_eagle_cache).
Prompt lookup and the other-tokenizer draft propose 0..K tokens deterministically (one-hot
rows, so p_draft is 1) and keep no such cache; their `drafter_state` is checked against
what each one does (the n-gram match; the draft's own tokens and cache).

A tree trace (the header's settings has "tree") has tree cycle records instead; their
rules are in tree_checks.py, which check_trace calls for each of its cycles.

The rules live in modules by what they check, each importing only those before it here:
check_basics.py (fail, the tolerances, RunFacts, Progress), shared_checks.py, the tree checks
(tree_checks.py and its parts), header_checks.py, drafter_checks.py, chain_checks.py (one chain
cycle). This module runs them over a whole trace and checks the summary; the names in __all__
stay importable from here, where the reader and the tests have always found them.
"""
import math

from engine.trace.chain_checks import check_cycle
from engine.trace.check_basics import (
    ABS_TOL,
    MAX_TOKEN_ID,
    REL_TOL,
    CacheChain,
    Progress,
    RunFacts,
    close,
    fail,
    is_int,
    is_num,
)
from engine.trace.errors import BrokenInvariant
from engine.trace.header_checks import (
    FAULT_FIELDS,
    MAX_RANK_TEXT,
    MAX_RANKS,
    MAX_VERIFY_WIDTH,
    TREE_FAULT_FIELDS,
    check_header,
)
from engine.trace.metrics import legacy_acceptance, trace_acceptance
from engine.trace.shared_checks import check_text_map
from engine.trace.tree_checks import check_tree_cycle

__all__ = [
    "ABS_TOL", "FAULT_FIELDS", "MAX_RANKS", "MAX_RANK_TEXT", "MAX_TOKEN_ID", "MAX_VERIFY_WIDTH", "REL_TOL",
    "TREE_FAULT_FIELDS", "BrokenInvariant", "CacheChain", "Progress", "RunFacts", "check_cycle", "check_header",
    "check_records", "check_summary", "check_trace", "close", "fail", "is_int", "is_num",
]


def check_summary(s: dict, cycles: list[dict], facts: RunFacts, run: Progress, where: str) -> None:
    """The summary agrees with its cycles; for a tree trace, k is the max depth and the
    acceptance numbers mean what metrics.trace_acceptance says."""
    if not run.finished:
        fail(where, "stop_reason", "a summary follows the cycle that finished the run (EOS or max_new_tokens)")
    if s["generated_token_ids"] != run.generated:
        fail(where, "generated_token_ids", "must be the committed tokens of all cycles, in order")
    if s["num_generated"] != len(run.generated):
        fail(where, "num_generated", f"must be {len(run.generated)}")
    if s["num_cycles"] != len(cycles):
        fail(where, "num_cycles", f"must be {len(cycles)}")
    stop = "eos" if run.generated and run.generated[-1] in facts.eos_ids else "max_new_tokens"
    if s["stop_reason"] != stop:
        fail(where, "stop_reason", f"must be '{stop}'")
    per_pos = s["per_position_acceptance"]
    if len(per_pos) != facts.k or not all(is_num(p) and 0 <= p <= 1 for p in per_pos):
        fail(where, "per_position_acceptance", f"K = {facts.k} rates in [0, 1]")
    m = trace_acceptance(cycles, facts.k)
    if not close(s["acceptance_rate"], m["acceptance_rate"]):
        fail(where, "acceptance_rate", f"disagrees with the cycles: {m['acceptance_rate']:.6g}")
    # A trace written before the lab counted drafts as vLLM does (metrics.legacy_acceptance) still reads:
    # its summary must agree with one definition throughout, and readers recount from the cycles anyway.
    old = legacy_acceptance([c["num_accepted"] for c in cycles], facts.k)
    if not any(agrees(s, each) for each in (m, old)):
        if not close(s["mean_acceptance_length"], m["mean_acceptance_length"]):
            fail(where, "mean_acceptance_length", f"disagrees with the cycles: {m['mean_acceptance_length']:.6g}")
        fail(where, "per_position_acceptance", "disagrees with the cycles")
    if s["wall_time_s"] < 0:
        fail(where, "wall_time_s", "a time cannot be negative")
    rate = len(run.generated) / s["wall_time_s"] if s["wall_time_s"] > 0 else 0.0
    if not math.isclose(s["tokens_per_s"], rate, rel_tol=1e-6, abs_tol=1e-9):
        fail(where, "tokens_per_s", f"must be num_generated / wall_time_s = {rate:.6g}")


def agrees(summary: dict, m: dict) -> bool:
    """The summary's length and per-position curve are those of one definition's numbers `m`."""
    return close(summary["mean_acceptance_length"], m["mean_acceptance_length"]) and all(
        close(a, b) for a, b in zip(summary["per_position_acceptance"], m["per_position_acceptance"]))


def check_trace(header: dict, cycles: list[dict], summary: dict | None, header_line: int,
                cycle_lines: list[int], summary_line: int | None) -> None:
    """Raise BrokenInvariant on the first invariant the trace breaks (fields already type-checked)."""
    facts = check_header(header, f"line {header_line} (header)")
    start = len(facts.prompt_ids) - 1  # prefill caches every prompt token but the last
    run = Progress([], CacheChain(start, start + facts.draft_offset))  # the draft's own prompt may differ
    if facts.vllm:  # vLLM's first cycle is its prefill, from wherever its prefix cache left the request
        run = Progress([], CacheChain(None, None))
    texts: dict[int, str] = {}
    check_text_map(texts, facts.prompt_ids, header["prompt_token_texts"], f"line {header_line} (header)", "prompt_token_texts")
    check_one = check_cycle
    if facts.tree is not None:
        check_one = check_tree_cycle
    for c, line in zip(cycles, cycle_lines):
        check_one(c, facts, run, texts, f"line {line} (cycle {c['cycle']})")
    if summary is not None:
        check_summary(summary, cycles, facts, run, f"line {summary_line} (summary)")


def check_records(header: dict, cycles: list[dict], summary: dict | None) -> None:
    """check_trace for records already in memory, numbered as a file would number them."""
    check_trace(header, cycles, summary, 1, list(range(2, 2 + len(cycles))), len(cycles) + 2)
