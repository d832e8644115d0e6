"""engine/workload/stats.py, loss.py, intervals.py and report.py on hand-built traces with known answers.

Each trace is built from minimal records (only the fields the statistics read); one test reads
a bundled trace to tie the workload figures to the trace's own summary.
"""
import json
import time
from pathlib import Path

import pytest

from engine.stats.analysis import best_k, trace_stats
from engine.trace import load_trace
from engine.trace.record_types import Trace
from engine.workload.intervals import request_intervals
from engine.workload.loss import spread_points, token_class
from engine.workload.report import format_workload_stats
from engine.workload.requests import UNCATEGORISED, RequestRun
from engine.workload.stats import CONTEXT_EDGES, context_bin, workload_stats

TRACES = Path(__file__).resolve().parent.parent / "assets" / "traces"


def chain_cycle(index: int, accepted: int, k: int = 4, drafted: int | None = None, context: int = 10,
                texts: list[str] | None = None, p_target: list[float] | None = None) -> dict:
    """A chain cycle record that drafted `drafted` (default K) tokens and accepted the first `accepted`."""
    n = k if drafted is None else drafted
    return {"cycle": index, "committed_len_before": context, "draft_token_ids": list(range(n)),
            "draft_token_texts": texts or [f" w{j}" for j in range(n)], "p_draft": [0.9] * n,
            "p_target": p_target or [0.5] * n, "num_accepted": accepted,
            "rejected_position": accepted + 1 if accepted < n else None,
            "committed_token_ids": [7] * (accepted + 1)}


def make_trace(cycles: list[dict], k: int = 4, wall: float = 1.0, header: dict | None = None) -> Trace:
    generated = sum(len(c["committed_token_ids"]) for c in cycles)
    return Trace({"settings": {"k": k}, "prompt_token_ids": [1, 2, 3], **(header or {})}, cycles,
                 {"num_generated": generated, "wall_time_s": wall})


def request(rid: str, category: str, accepted: list[int], k: int = 4, wall: float = 1.0, **cycle_args) -> RequestRun:
    cycles = [chain_cycle(i, a, k, **cycle_args) for i, a in enumerate(accepted)]
    return RequestRun(rid, category, f"{rid}.jsonl", make_trace(cycles, k, wall))


def two_requests() -> list[RequestRun]:
    return [request("a", "chat", [4, 0, 2], wall=1.0), request("b", "code", [1, 1], wall=3.0)]


# ---------------------------------------------------------------- counts

def test_two_categories_give_the_exact_rates():
    stats = workload_stats(two_requests(), bootstrap_samples=50)
    assert stats["requests"] == 2 and list(stats["categories"]) == ["chat", "code"]
    chat, code, overall = stats["categories"]["chat"], stats["categories"]["code"], stats["overall"]
    assert (chat["cycles"], chat["draft_tokens"], chat["accepted_tokens"]) == (3, 12, 6)
    assert chat["acceptance_rate"] == 0.5 and chat["mean_acceptance_length"] == 3.0
    assert code["acceptance_rate"] == 0.25 and code["mean_acceptance_length"] == 2.0
    assert overall["acceptance_rate"] == pytest.approx(8 / 20) and overall["mean_acceptance_length"] == pytest.approx(2.6)
    assert overall["tokens_per_s"] == pytest.approx((9 + 4) / 4.0)  # generated tokens / summed wall time
    assert chat["tokens_per_s"] == 9.0 and code["tokens_per_s"] == pytest.approx(4 / 3)


def test_conditional_acceptance_and_histogram_count_cycles():
    overall = workload_stats(two_requests(), bootstrap_samples=0)["overall"]  # accepted: 4, 0, 2, 1, 1
    assert [(r["position"], r["reached"], r["accepted"]) for r in overall["conditional_acceptance"]] == [
        (1, 5, 4), (2, 4, 2), (3, 2, 1), (4, 1, 1)]
    assert [r["rate"] for r in overall["conditional_acceptance"]] == [0.8, 0.5, 0.5, 1.0]
    assert overall["accepted_histogram"] == [1, 2, 1, 0, 1]
    assert overall["intervals"] is None  # bootstrap_samples=0 skips them


def test_per_request_rows_and_distance_below_the_median():
    rows = workload_stats(two_requests(), bootstrap_samples=0)["per_request"]
    a, b = rows
    assert (a["id"], a["category"], a["file"], a["cycles"], a["draft_tokens"], a["accepted_tokens"]) == (
        "a", "chat", "a.jsonl", 3, 12, 6)
    assert a["accepted_per_cycle"] == [4, 0, 2] and b["accepted_per_cycle"] == [1, 1]
    assert a["generated_tokens"] == 9 and a["prompt_tokens"] == 3 and a["tokens_per_s"] == 9.0
    assert a["below_median"] == pytest.approx(0.375 - 0.5) and b["below_median"] == pytest.approx(0.125)


def test_a_cycle_that_drafted_fewer_than_k_leaves_the_rest_unobserved():
    cycles = [chain_cycle(0, 2, drafted=2), chain_cycle(1, 0, drafted=0), chain_cycle(2, 4)]
    run = RequestRun("p", "lookup", "p.jsonl", make_trace(cycles))
    stats = workload_stats([run], bootstrap_samples=0)
    overall = stats["overall"]
    assert overall["draft_tokens"] == 6 and overall["accepted_tokens"] == 6 and overall["acceptance_rate"] == 1.0
    # position 3: only the full cycle drafted it; the 2-token cycle accepted all it drafted and is not a rejection
    assert [(r["reached"], r["accepted"]) for r in overall["conditional_acceptance"]] == [(2, 2), (2, 2), (1, 1), (1, 1)]
    assert stats["loss"]["rejected_tokens"]["rejections"] == 0 and stats["loss"]["worst_cycles"] == []


def test_context_length_bins_use_the_fixed_edges():
    cycles = [chain_cycle(0, 4, context=10), chain_cycle(1, 0, context=200), chain_cycle(2, 2, context=300),
              chain_cycle(3, 1, context=5000)]
    other = RequestRun("b", "chat", "b.jsonl", make_trace([chain_cycle(0, 3, context=250)]))
    bins = workload_stats([RequestRun("a", "chat", "a.jsonl", make_trace(cycles)), other],
                          bootstrap_samples=0)["context_length"]
    assert [(b["low"], b["high"], b["cycles"], b["requests"]) for b in bins] == [
        (0, 128, 1, 1), (128, 256, 2, 2), (256, 512, 1, 1), (4096, 8192, 1, 1)]
    assert bins[1]["accepted_tokens"] == 3 and bins[1]["acceptance_rate"] == pytest.approx(3 / 8)
    assert bins[1]["mean_acceptance_length"] == 2.5
    assert context_bin(127) == 0 and context_bin(128) == 1 and context_bin(10 ** 7) == len(CONTEXT_EDGES) - 1


# ---------------------------------------------------------------- intervals

def interval_width(runs: list[RequestRun], name: str = "acceptance_rate") -> float:
    low, high = workload_stats(runs, bootstrap_samples=400)["overall"]["intervals"][name]
    return high - low


def test_requests_that_disagree_give_a_wider_interval():
    same = [request(f"s{i}", "c", [2] * 10) for i in range(6)]
    split = [request(f"d{i}", "c", [9 if i % 2 else 1] * 10, k=10) for i in range(6)]  # 0.9 and 0.1
    assert interval_width(same) < 1e-12 and interval_width(same, "mean_acceptance_length") < 1e-12
    assert interval_width(split) > 0.2 and interval_width(split, "mean_acceptance_length") > 2.0
    low, high = workload_stats(split, bootstrap_samples=400)["overall"]["intervals"]["acceptance_rate"]
    assert low < 0.5 < high


def test_one_request_has_a_point_interval_and_a_seed_fixes_the_draws():
    one = workload_stats([request("a", "c", [4, 0, 2])])["overall"]
    assert one["intervals"]["acceptance_rate"] == [0.5, 0.5] and one["intervals"]["mean_acceptance_length"] == [3.0, 3.0]
    runs = [request(f"r{i}", "c", [i % 5, 4 - i % 3]) for i in range(12)]
    first, again = workload_stats(runs, seed=3), workload_stats(runs, seed=3)
    assert first["overall"]["intervals"] == again["overall"]["intervals"]
    assert workload_stats(runs, seed=4)["overall"]["intervals"] != first["overall"]["intervals"]


def test_the_bootstrap_is_fast_enough_for_a_hundred_requests():
    counts = [(40, 160, i % 100) for i in range(100)]
    start = time.perf_counter()
    request_intervals(counts, 1000, 0)
    assert time.perf_counter() - start < 2.0  # about 0.05 s alone; slack for a shared CPU


# ---------------------------------------------------------------- loss

@pytest.mark.parametrize("text, kind", [
    ("   ", "whitespace"), ("\n\n", "whitespace"), (",", "punctuation"), (" .", "punctuation"), ("$", "punctuation"),
    (" 2024", "digits"), ("7", "digits"), (" the", "word"), ("don't", "word"), ("x2", "word"),
    ("<|im_end|>", "special"), ("<0x0A>", "special"), ("", "special"), ("a.", "other"), ("\ufffd", "other")])
def test_token_classes(text, kind):
    assert token_class(text) == kind


def test_worst_requests_and_cycles_are_ordered():
    runs = [request("good", "c", [4, 4]), request("bad", "c", [0, 1]), request("mid", "c", [2, 2]),
            RequestRun("tie", "c", "tie.jsonl", make_trace([chain_cycle(0, 0, p_target=[0.1] * 4)]))]
    loss = workload_stats(runs, bootstrap_samples=0)["loss"]
    assert [r["id"] for r in loss["worst_requests"]] == ["tie", "bad", "mid", "good"]
    assert loss["worst_requests"][0]["below_median"] == pytest.approx(0.3125 - 0.0)  # median of 0, 0.125, 0.5, 1
    # four lost tokens in two cycles: the one whose target gave the rejected token 0.1 comes first
    worst = [(c["request"], c["cycle"], c["lost"]) for c in loss["worst_cycles"]]
    assert worst == [("tie", 0, 4), ("bad", 0, 4), ("bad", 1, 3), ("mid", 0, 2), ("mid", 1, 2)]
    assert loss["worst_cycles"][0]["p_target"] == 0.1 and loss["worst_cycles"][0]["file"] == "tie.jsonl"


def test_rejected_tokens_are_aggregated_by_text_and_class():
    texts = [" the", ",", "42", "\n"]
    runs = [request("a", "c", [0, 1, 1, 3], texts=texts), request("b", "c", [1, 4], texts=texts)]
    rejected = workload_stats(runs, bootstrap_samples=0)["loss"]["rejected_tokens"]
    assert rejected["rejections"] == 5
    top = [{k: t[k] for k in ("text", "count", "class")} for t in rejected["top_tokens"]]
    assert top == [{"text": ",", "count": 3, "class": "punctuation"},  # ties: by text
                   {"text": "\n", "count": 1, "class": "whitespace"},
                   {"text": " the", "count": 1, "class": "word"}]
    # each text links to where it was rejected (request, its file, the cycle the stepper opens)
    assert rejected["top_tokens"][0]["examples"] == [{"request": "a", "file": "a.jsonl", "cycle": 1},
                                                     {"request": "a", "file": "a.jsonl", "cycle": 2},
                                                     {"request": "b", "file": "b.jsonl", "cycle": 0}]
    classes = rejected["classes"]  # tested: the positions up to and including the rejected one
    assert classes["punctuation"] == {"rejected": 3, "tested": 5, "rate": 0.6}
    assert classes["word"] == {"rejected": 1, "tested": 6, "rate": 1 / 6}
    assert classes["digits"] == {"rejected": 0, "tested": 2, "rate": 0.0}
    assert classes["other"] == {"rejected": 0, "tested": 0, "rate": None}
    assert rejected["mean_p_draft"] == pytest.approx(0.9) and rejected["mean_p_target"] == pytest.approx(0.5)
    assert rejected["points"][0] == {"p_draft": 0.9, "p_target": 0.5, "request": "a", "file": "a.jsonl", "cycle": 0}
    points = [{"i": i} for i in range(5000)]
    assert len(spread_points(points, 2000)) == 2000 and spread_points(points, 2000)[-1]["i"] > 4990



def greedy_request(rid: str, cycles: list[tuple[list[str], int, list[str]]]) -> RequestRun:
    """A temperature-0 request: per cycle, the draft texts, how many passed, and the committed texts
    (the passed ones, then the target's token at the rejection)."""
    records = [chain_cycle(i, accepted, texts=drafts, p_target=[1.0] * accepted + [0.0] * (4 - accepted))
               | {"p_draft": [1.0] * 4, "committed_token_texts": committed}
               for i, (drafts, accepted, committed) in enumerate(cycles)]
    return RequestRun(rid, "c", f"{rid}.jsonl", make_trace(records, header={"settings": {"k": 4, "temperature": 0.0}}))


def test_at_temperature_0_each_rejected_token_is_paired_with_the_targets():
    drafts = [" the", "\n", ",", "x"]
    runs = [greedy_request("a", [(drafts, 1, [" the", " a"]), (drafts, 0, [" a"])]),
            greedy_request("b", [(drafts, 1, [" the", " a"]), (drafts, 2, [" the", "\n", "."])])]
    loss = workload_stats(runs, bootstrap_samples=0)["loss"]
    rejected = loss["rejected_tokens"]
    assert rejected["greedy"] and rejected["rejections"] == 4
    pairs = [(t["text"], t["target_text"], t["count"]) for t in rejected["top_pairs"]]
    assert pairs == [("\n", " a", 2), (" the", " a", 1), (",", ".", 1)]  # most frequent first, ties by text
    assert rejected["top_pairs"][0]["examples"] == [{"request": "a", "file": "a.jsonl", "cycle": 0},
                                                    {"request": "b", "file": "b.jsonl", "cycle": 0}]
    assert {(c["request"], c["cycle"]): c["target_text"] for c in loss["worst_cycles"]}[("b", 1)] == "."
    sampled = workload_stats([request("s", "c", [1, 2])], bootstrap_samples=0)["loss"]["rejected_tokens"]
    assert not sampled["greedy"]  # no temperature 0 in its settings: its p-values are kept and drawn


# ---------------------------------------------------------------- edges

def test_empty_workloads_categories_and_requests_do_not_break():
    empty = workload_stats([])
    assert empty["requests"] == 0 and empty["categories"] == {} and empty["overall"]["acceptance_rate"] is None
    assert empty["overall"]["intervals"] is None and empty["median_acceptance_rate"] is None
    no_cycles = RequestRun("z", "", "z.jsonl", make_trace([]))
    stats = workload_stats([no_cycles, request("a", "chat", [1])])
    group = stats["categories"][UNCATEGORISED]
    assert group["cycles"] == 0 and group["acceptance_rate"] is None and group["mean_acceptance_length"] is None
    assert group["intervals"] == {"confidence": 0.95, "samples": 1000, "acceptance_rate": None,
                                  "mean_acceptance_length": None}
    assert stats["per_request"][0]["below_median"] is None and stats["median_acceptance_rate"] == 0.25
    for s in (empty, stats):
        assert json.loads(json.dumps(s)) == s
        assert "WORKLOAD" in format_workload_stats(s)


def tree_cycle(index: int, depths: list[int], path: list[int]) -> dict:
    nodes = [{"depth": d} for d in depths]
    return {"cycle": index, "committed_len_before": 20, "num_accepted": len(path),
            "committed_token_ids": [7] * (len(path) + 1), "tree": {"nodes": nodes, "path": path}}


def test_a_tree_request_counts_its_nodes_as_drafted():
    cycles = [tree_cycle(0, [1, 1, 2, 3], [0, 2, 3]), tree_cycle(1, [1, 1, 2], [])]
    tree = RequestRun("t", "tree", "t.jsonl", make_trace(cycles, k=3, header={"settings": {"k": 3, "tree": {}}}))
    stats = workload_stats([tree])
    overall = stats["overall"]
    assert overall["draft_tokens"] == 7 and overall["accepted_tokens"] == 3 and overall["acceptance_rate"] == 3 / 7
    assert [(r["reached"], r["accepted"]) for r in overall["conditional_acceptance"]] == [(2, 1), (1, 1), (1, 1)]
    assert overall["speedup"] is None and overall["best_k"] is None
    assert stats["loss"]["rejected_tokens"]["skipped_tree_requests"] == 1
    assert [c["lost"] for c in stats["loss"]["worst_cycles"]] == [3, 1]


# ---------------------------------------------------------------- real traces

def test_one_bundled_trace_as_a_workload_matches_its_summary():
    trace = load_trace(TRACES / "chat-greedy-k4.jsonl")
    stats = workload_stats([RequestRun("sky", "chat", "chat-greedy-k4.jsonl", trace)])
    overall = stats["overall"]
    assert overall["acceptance_rate"] == pytest.approx(trace.summary["acceptance_rate"])
    assert overall["mean_acceptance_length"] == pytest.approx(trace.summary["mean_acceptance_length"])
    assert overall["tokens_per_s"] == pytest.approx(trace.summary["tokens_per_s"])
    single = trace_stats(trace)  # one calibrated request: the pooled speed is the trace's own
    assert overall["speedup"]["measured"] == pytest.approx(single.speed.measured)
    assert overall["best_k"] == best_k(single.advice).k
    assert json.loads(json.dumps(stats)) == stats


def test_a_bundled_tree_trace_matches_its_summary():
    trace = load_trace(TRACES / "chat-tree-static-greedy.jsonl")
    overall = workload_stats([RequestRun("t", "tree", "t.jsonl", trace)], bootstrap_samples=10)["overall"]
    assert overall["acceptance_rate"] == pytest.approx(trace.summary["acceptance_rate"])
    assert overall["mean_acceptance_length"] == pytest.approx(trace.summary["mean_acceptance_length"])


def test_the_report_shows_every_section():
    text = format_workload_stats(workload_stats(two_requests(), bootstrap_samples=50))
    for heading in ("WORKLOAD: 2 requests", "BY CATEGORY", "CONDITIONAL ACCEPTANCE", "DRAFT TOKENS ACCEPTED PER DRAFT",
                    "CONTEXT LENGTH", "WORST REQUESTS", "WORST CYCLES", "REJECTED DRAFT TOKENS"):
        assert heading in text
    assert "chat" in text and "code" in text and "0.400" in text
