"""Tree traces are read and checked as strictly as chain traces.

The valid traces are built by hand in tests/tree_samples.py (a plain-Python walk over
hand-chosen numbers, correct by construction). Each hostile case changes one thing and
must be refused with a one-line TraceError naming the line, the field and the rule.
"""
import copy
import json
import math
import re

import pytest

from engine.mode import RunMode
from engine.trace import TraceError, loads_trace
from engine.trace.format import (
    CHAIN_ONLY_FIELDS,
    CYCLE_FIELDS,
    MAX_DEPTH,
    SLOT_COMPACTION_FIELDS,
    TREE_COMPACTION_FIELDS,
    TREE_CYCLE_FIELDS,
    TREE_FIELDS,
    TREE_NODE_FIELDS,
    TREE_TRY_FIELDS,
    TreeCycleRecord,
)
from tests.checks import assert_self_consistent
from tests.tree_samples import (
    BASE_TRACE,
    dumps,
    dynamic_tree_trace,
    greedy_tree_trace,
    sample_tree_trace,
    text_of,
    tok,
    wide_dynamic_tree_trace,
)

SAMPLES = {"static-tree": lambda: sample_tree_trace(), "static-layout": lambda: sample_tree_trace("static"),
           "paged-layout": lambda: sample_tree_trace("paged"), "dynamic-tree": dynamic_tree_trace,
           "greedy": greedy_tree_trace, "wide-dynamic-tree": wide_dynamic_tree_trace}


@pytest.mark.parametrize("name", SAMPLES)
def test_a_hand_built_tree_trace_loads(name):
    records = SAMPLES[name]()
    trace = loads_trace(dumps(records))
    assert trace.is_tree and trace.complete and len(trace.cycles) == len(records) - 2
    assert trace.k == records[0]["settings"]["k"]
    assert_self_consistent(trace)  # the same checks on records in memory (check_records)


ENGINE_RUNS = [("static:3,2,1", 1.0, "paged"), ("dynamic:top_k=3,depth=4,nodes=10", 0.0, "static"),
               ("static:2,2", 0.7, "dynamic")]


def test_an_engine_tree_run_loads_and_one_edit_breaks_it(tmp_path):
    """Real tree runs on tiny random models (engine/tree/cycle.py, skipped until it is merged) pass
    every check, and the checks still bite on the engine's own records."""
    pytest.importorskip("engine.tree.cycle")
    from engine.config import SpecSettings, parse_tree
    from engine.run import run_to_trace
    from tests.tiny import noisy_pair
    pair = noisy_pair(1, noise=0.2)
    for i, (text, temperature, layout) in enumerate(ENGINE_RUNS):
        spec = parse_tree(text)
        s = SpecSettings(k=spec.max_depth, temperature=temperature, max_new_tokens=24, seed=i, cache_layout=layout,
                         block_size=4)
        path = tmp_path / f"run-{i}.jsonl"
        run_to_trace(pair, "the cat sat on", s, path, RunMode(tree=spec))
        trace = loads_trace(path.read_text(encoding="utf-8"))
        assert trace.is_tree and trace.complete and trace.k == spec.max_depth
        records = [trace.header, *trace.cycles, trace.summary]
        tree(records, 0)["nodes"][0]["score"] += 1.0
        with pytest.raises(TraceError, match=r"cycle 0\): field 'tree.nodes\[0\].score'"):
            loads_trace(dumps(records))


def test_the_samples_cover_every_way_a_walk_ends():
    cycles = sample_tree_trace()[1:-1] + dynamic_tree_trace()[1:-1]
    kinds = {(c["tree"]["next_token_kind"], len(c["tree"]["path"]) > 0) for c in cycles}
    assert kinds == {("residual", True), ("bonus", True), ("residual", False)}
    assert any(c["draft_catch_up"] for c in cycles) and any(c["tree"]["compaction"]["draft"]["moves"] for c in cycles)
    assert any(len(c["committed_token_ids"]) < len(c["tree"]["path"]) + 1 for c in cycles)  # the budget cut
    assert dynamic_tree_trace()[-1]["stop_reason"] == "eos"


def test_the_summary_of_a_tree_trace_means_tokens_per_cycle_and_nodes_used():
    """Worked out from the hand cycles: paths of 2, 3, 0 and 2 nodes out of 10, 3, 6 and 3 drafted."""
    s = loads_trace(dumps(sample_tree_trace())).summary
    assert s["mean_acceptance_length"] == pytest.approx(1 + (2 + 3 + 0 + 2) / 4)
    assert s["acceptance_rate"] == pytest.approx(7 / 22)
    assert s["per_position_acceptance"] == pytest.approx([3 / 4, 3 / 4, 1 / 4])
    assert s["generated_text"] == "bfzklmnuvw"


def test_an_incomplete_tree_trace_keeps_its_cycles():
    text = dumps(sample_tree_trace()[:-1])
    assert len(loads_trace(text, allow_incomplete=True).cycles) == 4
    with pytest.raises(TraceError, match="no summary"):
        loads_trace(text)


def test_odd_texts_and_unknown_fields_are_still_valid():
    """Token text reaches HTML later; any string is legal here (one text per id), as in a chain trace."""
    records = sample_tree_trace()
    odd = "<script>alert(1)</script>\u2028"
    token = tok("b")
    for c in records[1:-1]:
        for n in c["tree"]["nodes"]:
            n["text"] = odd if n["token_id"] == token else n["text"]
            n["note"] = {"future": [1, 2]}
        for row in c["tree"]["target_top"]:
            for e in row:
                e["text"] = odd if e["token_id"] == token else e["text"]
        c["committed_token_texts"] = [odd if t == token else x
                                      for t, x in zip(c["committed_token_ids"], c["committed_token_texts"])]
    loads_trace(dumps(records, ensure_ascii=True))
    loads_trace(dumps(records))


def test_the_record_types_are_derived_and_share_the_chain_fields():
    assert list(TREE_CYCLE_FIELDS) == [k for k in TreeCycleRecord.__annotations__ if k in TreeCycleRecord.__required_keys__]
    shared = {k: v for k, v in TREE_CYCLE_FIELDS.items() if k != "tree"}
    assert shared == {k: v for k, v in CYCLE_FIELDS.items() if k in shared}  # same names, same types
    assert sorted(CHAIN_ONLY_FIELDS) == sorted([
        "draft_token_ids", "p_draft", "accept_prob", "u", "beta", "rejected_position", "resampled_token_id",
        "bonus_token_id", "residual_top", "target_top", "draft_top", "draft_token_texts", "p_target"])
    assert set(TREE_NODE_FIELDS) == {"token_id", "text", "parent", "depth", "q", "score", "p"}


def test_tree_records_nest_within_the_limit():
    def depth(v) -> int:
        kids = list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else []
        return 1 + max((depth(k) for k in kids), default=0) if isinstance(v, (dict, list)) else 0
    deepest = max(depth(r) for r in sample_tree_trace("paged"))
    assert deepest == 6 and deepest < MAX_DEPTH  # cycle > tree > compaction > target > moves > one move


# ---------------------------------------------------------------- hostile tree traces

def cycle(records: list[dict], i: int) -> dict:
    return records[1 + i]


def tree(records: list[dict], i: int) -> dict:
    return records[1 + i]["tree"]


def set_node(records, i, n, **fields):
    tree(records, i)["nodes"][n].update(fields)


def reparent(records, i, n, parent):
    """Node n of cycle i moved under `parent`, its score following (only the shape changes)."""
    nodes = tree(records, i)["nodes"]
    nodes[n].update(parent=parent, score=nodes[parent]["score"] + math.log(nodes[n]["q"]))


def committed_swapped(r):
    c = cycle(r, 0)
    c["committed_token_ids"][1:] = c["committed_token_ids"][:0:-1]
    c["committed_token_texts"] = [text_of(t) for t in c["committed_token_ids"]]


def half_accepted_at_t0(r):
    """Greedy cycle 0 accepts node 0 (p 1): make its p 0.5, consistently everywhere but the T=0 rule."""
    t = tree(r, 0)
    t["nodes"][0]["p"] = 0.5
    t["tried"][0].update(p_residual=0.5, u=0.3)
    t["target_top"][0][0]["p"] = 0.5


def extra_node(r, i, parent, token):
    t = tree(r, i)
    depth = 1 if parent == -1 else t["nodes"][parent]["depth"] + 1
    base = 0.0 if parent == -1 else t["nodes"][parent]["score"]
    t["nodes"].append({"token_id": token, "text": text_of(token), "parent": parent, "depth": depth, "q": 0.01,
                       "score": base + math.log(0.01), "p": 0.0})
    t["target_top"].append([])


def q_raised(r):
    """The dynamic sample's node 2 (a leaf, the second child of node 0) made likelier than node 1."""
    set_node(r, 0, 2, q=0.9, score=math.log(0.5) + math.log(0.9))


def next_is_rejected(r):
    t = tree(r, 0)
    t["next_token_id"] = tok("j")
    cycle(r, 0)["next_token_text"] = "j"


def rejected_listed_in_residual(r):
    t = tree(r, 0)
    t["residual_top"] = [e if e["token_id"] != tok("j") else {**e, "residual": 0.4} for e in t["residual_top"]]


def tree_in_chain_trace(r):
    r[:] = [json.loads(line) for line in BASE_TRACE.read_text(encoding="utf-8").splitlines() if line.strip()]
    r[1]["tree"] = copy.deepcopy(sample_tree_trace()[1]["tree"])


def nest(depth: int):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


def cycle_after_finish(r):
    extra = copy.deepcopy(r[-2])
    extra["cycle"] += 1
    r.insert(len(r) - 1, extra)


def nodes_times(r, n):
    t = tree(r, 0)
    t["nodes"] = [copy.deepcopy(t["nodes"][0]) for _ in range(n)]


S, G, D = "static", "greedy", "dynamic"
BUILD = {S: sample_tree_trace, G: greedy_tree_trace, D: dynamic_tree_trace, "wide": wide_dynamic_tree_trace,
         "static-layout": lambda: sample_tree_trace("static"), "paged-layout": lambda: sample_tree_trace("paged")}
HOSTILE = [  # (name, sample, edit, a distinctive part of the message)
    # the tree
    ("parent-is-itself", S, lambda r: set_node(r, 0, 3, parent=3), r"tree.nodes\[3\].parent.*no cycle"),
    ("parent-later", S, lambda r: set_node(r, 0, 2, parent=5), r"earlier node 0..1"),
    ("parent-below-root", S, lambda r: set_node(r, 0, 0, parent=-2), r"tree.nodes\[0\].parent"),
    ("depth-wrong", S, lambda r: set_node(r, 0, 2, depth=3), r"tree.nodes\[2\].depth': must be 2: one more than"),
    ("deeper-than-spec", S, lambda r: extra_node(r, 1, 2, tok("A")), r"deeper than the static:2,2,1 tree's max depth 3"),
    ("not-level-by-level", S, lambda r: extra_node(r, 1, -1, tok("A")), r"numbered level by level"),
    ("too-many-children", S, lambda r: reparent(r, 0, 7, 2), r"node 2 \(depth 2\) has 2 children.*at most 1"),
    ("too-many-nodes-dynamic", D, lambda r: (extra_node(r, 0, -1, tok("A")), extra_node(r, 0, -1, tok("B"))),
     r"holds at most 5"),
    ("expanded-beyond-frontier", "wide", lambda r: extra_node(r, 0, 4, tok("h")),
     r"3 nodes at depth 2 have children; .* at most top_k = 2 per level"),
    ("duplicate-siblings", S, lambda r: set_node(r, 0, 1, token_id=tok("a"), text="a"), r"sibling tokens must be distinct"),
    ("siblings-out-of-order", D, q_raised, r"most likely first"),
    ("score-not-sum-of-log-q", S, lambda r: set_node(r, 0, 2, score=-0.1), r"score': must be .*sum of log q"),
    ("q-zero", S, lambda r: set_node(r, 0, 9, q=0.0), r"q': the draft proposed a token it gives probability 0"),
    ("p-above-one", S, lambda r: set_node(r, 0, 9, p=1.5), r"p': a probability must lie in \[0, 1\]"),
    ("siblings-mass-above-one", S, lambda r: set_node(r, 0, 0, p=0.8), r"their p sum to more than 1"),
    ("target-top-disagrees", S, lambda r: set_node(r, 0, 0, p=0.45), r"lists node 0's token .* the node records p=0.45"),
    ("target-top-row-missing", S, lambda r: tree(r, 0)["target_top"].pop(), r"tree.target_top': needs 11 rows"),
    # the walk
    ("accepted-against-draw", S, lambda r: tree(r, 0)["tried"][1].update(u=0.7), r"draw says reject"),
    ("rejected-against-draw", S, lambda r: tree(r, 0)["tried"][0].update(u=0.1), r"draw says accept"),
    ("renormalisation-wrong", S, lambda r: tree(r, 0)["tried"][1].update(p_residual=0.3), r"residual renormalised"),
    ("first-try-not-p", S, lambda r: tree(r, 0)["tried"][0].update(p_residual=0.45), r"first try reads the target"),
    ("u-out-of-range", S, lambda r: tree(r, 0)["tried"][0].update(u=1.0), r"u': a uniform draw must lie in \[0, 1\)"),
    ("tried-skips-sibling", S, lambda r: tree(r, 0)["tried"].pop(0), r"tried\[0\].node': must be node 0: .*tried in order"),
    ("tried-stops-early", S, lambda r: tree(r, 0)["tried"].pop(), r"stops before the walk does"),
    ("tried-after-end", S, lambda r: tree(r, 0)["tried"].append(
        {"node": 9, "p_residual": 0.5, "u": 0.1, "accepted": True}), r"tried after the walk ended"),
    ("path-not-chain", S, lambda r: tree(r, 0)["path"].__setitem__(1, 6), r"path\[1\]': 6 is not a child of node 1"),
    ("path-not-the-accepted", S, lambda r: tree(r, 0).update(path=[0, 2]), r"must be the accepted tried nodes"),
    ("num-accepted-wrong", S, lambda r: cycle(r, 0).update(num_accepted=3), r"num_accepted': must be 2"),
    ("bonus-with-children", S, lambda r: tree(r, 0).update(next_token_kind="bonus", residual_top=None),
     r"must be 'residual'.*a bonus only where the walk reaches a node without children"),
    ("residual-at-leaf", S, lambda r: tree(r, 1).update(next_token_kind="residual"), r"must be 'bonus'"),
    ("next-kind-unknown", S, lambda r: tree(r, 0).update(next_token_kind="sampled"), r"'bonus' or 'residual'"),
    ("residual-missing", S, lambda r: tree(r, 0).update(residual_top=None), r"records its residual"),
    ("residual-for-bonus", S, lambda r: tree(r, 1).update(residual_top=tree(r, 0)["residual_top"]),
     r"residual_top is null"),
    ("next-is-rejected-child", S, next_is_rejected, r"rejected child's: its residual probability is 0"),
    ("rejected-kept-in-residual", S, rejected_listed_in_residual, r"a rejected child leaves the residual"),
    ("greedy-accepts-half", G, half_accepted_at_t0, r"temperature 0: .*accepted node's p is 1"),
    ("greedy-rejects-half", G, lambda r: (set_node(r, 2, 0, p=0.5), tree(r, 2)["tried"][0].update(p_residual=0.5, u=0.7)),
     r"temperature 0: .*rejected node's p is 0"),
    ("greedy-untried-half", G, lambda r: (set_node(r, 2, 1, p=0.5), tree(r, 2)["target_top"][1][0].update(p=0.5)),
     r"temperature 0: .*so p is 0 or 1"),
    ("greedy-next-not-argmax", G, lambda r: tree(r, 2)["target_top"].__setitem__(0, [
        {"token_id": tok("a"), "text": "a", "p": 1.0}]), r"temperature 0: the next token is the target's argmax"),
    # the commit
    ("committed-not-path-plus-next", S, committed_swapped, r"committed_token_ids': must be the 2 tokens of the accepted path"),
    ("committed-past-budget", S, lambda r: (cycle(r, 3)["committed_token_ids"].append(tok("y")),
                                            cycle(r, 3)["committed_token_texts"].append("y")), r"budget of 2"),
    ("finished-flipped", S, lambda r: cycle(r, 0).update(finished=True), r"finished': must be false"),
    ("committed-len-not-chained", S, lambda r: cycle(r, 1).update(committed_len_before=cycle(r, 1)["committed_len_before"] + 1),
     r"cycle 1\): field 'committed_len_before': must be prompt \+ tokens so far"),
    ("cycle-after-finish", S, cycle_after_finish, r"a cycle after the one that finished the run"),
    ("text-twice", S, lambda r: set_node(r, 0, 4, text="E"), r"token 104 is written 'E' here and 'e' elsewhere"),
    # caches and compaction
    ("verify-positions", S, lambda r: cycle(r, 0).update(verify_positions=10),
     r"verify_positions': verify runs over \[root, 10 nodes\]"),
    ("target-after-append", S, lambda r: cycle(r, 0)["target_cache_len"].update(
        after_append=cycle(r, 0)["target_cache_len"]["after_append"] - 1), r"appends N\+1 = 11"),
    ("target-after-rollback", S, lambda r: cycle(r, 0)["target_cache_len"].update(
        after_rollback=cycle(r, 0)["target_cache_len"]["after_rollback"] + 1), r"target_cache_len.after_rollback': must be"),
    ("kept-slots-wrong", S, lambda r: tree(r, 0)["compaction"]["target"]["kept_slots"].__setitem__(1, 8),
     r"compaction.target.kept_slots': must be"),
    ("moves-wrong", S, lambda r: tree(r, 0)["compaction"]["target"]["moves"].pop(), r"compaction.target.moves': must be"),
    ("draft-kept-wrong", S, lambda r: tree(r, 0)["compaction"]["draft"]["kept_slots"].__setitem__(2, 12),
     r"compaction.draft.kept_slots': must be \[7, 9, 13\]"),
    ("draft-kept-beyond-path", D, lambda r: tree(r, 0)["compaction"]["draft"].update(kept_slots=[7, 8, 10, 11]),
     r"draft.kept_slots': keeps the root and the path nodes the draft was fed: 2..3 slots"),
    ("draft-kept-not-increasing", D, lambda r: tree(r, 0)["compaction"]["draft"].update(kept_slots=[7, 10, 8]),
     r"kept slots start at the root's slot 7 .* and increase"),
    ("draft-fed-too-few", D, lambda r: cycle(r, 0)["draft_cache_len"].update(after_append=9),
     r"draft_cache_len.after_append': the draft's forwards feed the root and the expanded nodes: 3..5"),
    ("draft-moves-wrong", D, lambda r: tree(r, 0)["compaction"]["draft"].update(moves=[]), r"compaction.draft.moves"),
    ("draft-compaction-missing", S, lambda r: tree(r, 0)["compaction"].update(draft=None), r"draft cache is compacted too"),
    ("draft-after-append", S, lambda r: cycle(r, 0)["draft_cache_len"].update(
        after_append=cycle(r, 0)["draft_cache_len"]["after_append"] + 1), r"draft_cache_len.after_append': must be"),
    ("draft-after-rollback", S, lambda r: cycle(r, 1)["draft_cache_len"].update(
        after_rollback=cycle(r, 1)["draft_cache_len"]["after_rollback"] - 1), r"draft_cache_len.after_rollback"),
    ("draft-catch-up-flipped", S, lambda r: cycle(r, 1).update(draft_catch_up=False), r"draft_catch_up': must be true"),
    ("draft-forwards-too-many", S, lambda r: (tree(r, 0).update(draft_forwards=4),
                                              cycle(r, 0)["draft_step_times_s"].append(0.001)),
     r"a tree 3 deep takes 3..3 batched draft forwards"),
    ("step-times-miscounted", S, lambda r: cycle(r, 0)["draft_step_times_s"].append(0.001), r"one time per draft step: 3"),
    ("time-negative", S, lambda r: cycle(r, 0).update(verify_time_s=-1.0), r"verify_time_s': a measured time must be positive"),
    ("catch-up-time-without-catch-up", S, lambda r: cycle(r, 0).update(catch_up_time_s=0.5), r"no catch-up ran"),
    ("static-layout-state", "static-layout", lambda r: cycle(r, 0)["target_cache_layout_state"]["after_rollback"].update(
        write_position=20), r"target_cache_layout_state.after_rollback': write_position must equal"),
    ("paged-layout-state", "paged-layout", lambda r: cycle(r, 1)["draft_cache_layout_state"]["after_append"].update(
        block_table=[0]), r"draft_cache_layout_state.after_append': the block table"),
    # the summary
    ("summary-rate", S, lambda r: r[-1].update(acceptance_rate=0.5), r"acceptance_rate': disagrees with the cycles"),
    ("summary-length", S, lambda r: r[-1].update(mean_acceptance_length=3.0), r"mean_acceptance_length': disagrees"),
    # the header
    ("tree-kind-unknown", S, lambda r: r[0]["settings"].update(tree={"kind": "bushy", "branching": [2]}),
     r"line 1: field 'settings.tree': settings.tree must name a kind"),
    ("branching-not-a-list", S, lambda r: r[0]["settings"].update(tree={"kind": "static", "branching": "2,2,1"}),
     r"settings.tree': a static settings.tree has exactly kind and a branching list"),
    ("branching-bool", S, lambda r: r[0]["settings"]["tree"].update(branching=[True, 2, 1]), r"branching must be an integer"),
    ("nodes-zero", D, lambda r: r[0]["settings"]["tree"].update(nodes=0), r"settings.tree': nodes must be between 1 and 64"),
    ("nodes-above-64", D, lambda r: r[0]["settings"]["tree"].update(top_k=16, depth=32, nodes=65),
     r"settings.tree': nodes must be between 1 and 64"),
    ("tree-extra-key", D, lambda r: r[0]["settings"]["tree"].update(branching=[2]), r"exactly kind, top_k, depth and nodes"),
    ("k-not-max-depth", S, lambda r: r[0]["settings"].update(k=4), r"settings.k': a tree run's k is its tree's max depth, 3"),
    ("faults-declared", S, lambda r: r[0].update(faults={"keep_rejected_kv": True}),
     r"faults.keep_rejected_kv': unknown fault; known: crop_instead_of_compact"),
    ("crop-fault-claimed", S, lambda r: r[0].update(faults={"crop_instead_of_compact": True}),
     r"tree.compaction.target.kept_slots': must be \[\d+, \d+(, \d+)*\]: the declared fault crops"),
    ("drafter-not-a-model", S, lambda r: r[0].update(drafter={"kind": "prompt-lookup", "min_ngram": 1, "max_ngram": 3}),
     r"trees are drafted by a draft model"),
    # structure and types
    ("chain-field-in-tree-record", S, lambda r: cycle(r, 0).update(u=[0.5]), r"field 'u': a tree cycle has no chain field"),
    ("tree-record-in-chain-trace", S, tree_in_chain_trace, r"field 'tree': a chain trace's cycle holds no tree"),
    ("tree-header-dropped", S, lambda r: r[0]["settings"].pop("tree"), r"missing field 'draft_token_ids'"),
    ("tree-missing", S, lambda r: cycle(r, 0).pop("tree"), r"missing field 'tree'"),
    ("nodes-empty", S, lambda r: tree(r, 0).update(nodes=[]), r"a tree holds 1..64 nodes, got 0"),
    ("nodes-huge", S, lambda r: nodes_times(r, 5000), r"a tree holds 1..64 nodes, got 5000"),
    ("nodes-over-spec", S, lambda r: [extra_node(r, 1, 0, t) for t in range(40, 48)], r"holds at most 10"),
    ("tried-huge", S, lambda r: tree(r, 0).update(tried=tree(r, 0)["tried"] * 1000), r"tree.tried': at most 10 entries"),
    ("moves-huge", S, lambda r: tree(r, 0)["compaction"]["target"].update(moves=[[1, 2]] * 10**4),
     r"compaction.target.moves': at most 11 entries"),
    ("node-not-object", S, lambda r: tree(r, 0)["nodes"].__setitem__(0, [1, 2]), r"tree.nodes\[0\]' should be an object"),
    ("node-field-missing", S, lambda r: tree(r, 0)["nodes"][0].pop("score"), r"missing field 'tree.nodes\[0\].score'"),
    ("node-text-not-a-string", S, lambda r: set_node(r, 0, 0, text=5), r"field 'tree.nodes\[0\].text' should be str"),
    ("top-text-not-a-string", S, lambda r: tree(r, 0)["target_top"][0][0].update(text=None),
     r"tree.target_top\[0\]': entries are \{token_id, text, p\}"),
    ("residual-text-not-a-string", S, lambda r: tree(r, 0)["residual_top"][0].update(text=["x"]),
     r"tree.residual_top': entries are \{token_id, text, p_target, residual\}"),
    ("accepted-not-bool", S, lambda r: tree(r, 0)["tried"][0].update(accepted=0), r"tree.tried\[0\].accepted' should be bool"),
    ("compaction-draft-retyped", S, lambda r: tree(r, 0)["compaction"].update(draft=[1]),
     r"'tree.compaction.draft' should be dict/null"),
    ("token-outside-vocab", S, lambda r: set_node(r, 0, 9, token_id=259), r"token_id': a token id must be an integer in 0..258"),
    ("deeply-nested-node", S, lambda r: set_node(r, 0, 0, note=nest(13)), r"nests more than 16 levels"),
]


def test_every_tree_field_retyped_is_refused_naming_it():
    """Every field of the tree record's TypedDicts, given each JSON type it does not allow."""
    from tests.hostile import wrong_values
    places = ([(lambda r: cycle(r, 0), name, allowed) for name, allowed in TREE_CYCLE_FIELDS.items() if name != "type"]
              + [(lambda r: tree(r, 0), name, allowed) for name, allowed in TREE_FIELDS.items()]
              + [(lambda r: tree(r, 0)["nodes"][3], name, allowed) for name, allowed in TREE_NODE_FIELDS.items()]
              + [(lambda r: tree(r, 0)["tried"][1], name, allowed) for name, allowed in TREE_TRY_FIELDS.items()]
              + [(lambda r: tree(r, 0)["compaction"], name, allowed) for name, allowed in TREE_COMPACTION_FIELDS.items()]
              + [(lambda r: tree(r, 0)["compaction"]["draft"], name, allowed)
                 for name, allowed in SLOT_COMPACTION_FIELDS.items()])
    base = sample_tree_trace()
    refused = 0
    for place, name, allowed in places:
        for value in wrong_values(allowed):
            records = copy.deepcopy(base)
            place(records)[name] = value
            with pytest.raises(TraceError) as err:
                loads_trace(dumps(records))
            assert "\n" not in str(err.value) and name in str(err.value), (name, value, str(err.value))
            refused += 1
    assert refused > 100


def test_there_are_enough_hostile_cases():
    assert len(HOSTILE) >= 25 and len({name for name, *_ in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize("name, sample, edit, message", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_tree_trace_is_refused_in_one_line(name, sample, edit, message):
    records = BUILD[sample]()
    loads_trace(dumps(records))  # the base is valid: the refusal below is the edit's
    edit(records)
    with pytest.raises(TraceError) as err:
        loads_trace(dumps(records), source="hostile.jsonl")
    text = str(err.value)
    assert "\n" not in text and text.startswith("hostile.jsonl line "), text
    assert "field '" in text or "nests" in text, text
    assert re.search(message, text), text
