"""What a tree trace's cycles must mean: the draft tree, the acceptance walk, the commit, the compaction.

checks.py reads the header and, when its settings has "tree", calls check_tree_header and
then check_tree_cycle for every cycle. format.py has already checked each field's JSON type
(TreeCycleRecord and the TypedDicts of its parts) and held every list to its size limit, so
the loops here are over at most MAX_TREE_NODES nodes.

The record is replayed, not trusted: the walk is re-run from the recorded draws and the
nodes' target probabilities, and must try, accept and reject exactly what the record says;
the committed tokens, the cache lengths and the compaction follow from the walk's path.
A teaching run that declares the fault crop_instead_of_compact (header "faults") is checked
against that bug: both caches keep their first slots from the root's and move nothing.
Each rule raises BrokenInvariant naming the cycle, the field and the rule in one line.

The rules are split by what they check: tree_shape_checks.py (the nodes and siblings),
tree_walk_checks.py (the acceptance walk and the next token) and tree_cache_checks.py (the
commit and the compaction); this module reads the header's tree and runs them on each cycle.
"""
from engine.config import SettingsError, TreeSpec, tree_from_header
from engine.trace.check_basics import CacheChain, Progress, RunFacts, fail
from engine.trace.schema import DRAFT_MODEL, EAGLE
from engine.trace.shared_checks import check_commit, check_text_map, check_times
from engine.trace.tree_cache_checks import check_draft_cache, check_target_cache
from engine.trace.tree_shape_checks import check_frontier, check_nodes, check_siblings, check_tree_top
from engine.trace.tree_walk_checks import check_greedy_tree, check_next, check_path, replay_walk

# ---------------------------------------------------------------- header

def check_tree_header(h: dict, where: str) -> TreeSpec:
    """settings.tree as a TreeSpec, and what a tree run's header must say around it."""
    try:
        spec = tree_from_header(h["settings"]["tree"])
    except SettingsError as err:
        fail(where, "settings.tree", str(err))
    if h["settings"]["k"] != spec.max_depth:
        fail(where, "settings.k", f"a tree run's k is its tree's max depth, {spec.max_depth}")
    kind = h.get("drafter", {}).get("kind", DRAFT_MODEL)
    if kind not in (DRAFT_MODEL, EAGLE):
        fail(where, "drafter.kind", f"trees are drafted by a draft model ('{DRAFT_MODEL}') or an EAGLE head "
                                    f"('{EAGLE}'), not {kind!r}")
    # A teaching run may declare a broken tree rollback (checks.check_faults allows TREE_FAULT_FIELDS
    # only); its compaction records are then checked against that bug (crop_kept below).
    return spec


# ---------------------------------------------------------------- one cycle

def tree_texts(c: dict) -> list[tuple[str, list[int], list[str]]]:
    """Every (field, ids, texts) of a tree cycle, for the one-text-per-id rule."""
    tree = c["tree"]
    pairs = [("tree.nodes", [n["token_id"] for n in tree["nodes"]], [n["text"] for n in tree["nodes"]]),
             ("committed_token_texts", c["committed_token_ids"], c["committed_token_texts"]),
             ("next_token_text", [tree["next_token_id"]], [c["next_token_text"]])]
    for row in tree["target_top"]:
        pairs.append(("tree.target_top", [e["token_id"] for e in row], [e["text"] for e in row]))
    if tree["residual_top"]:
        pairs.append(("tree.residual_top", [e["token_id"] for e in tree["residual_top"]],
                      [e["text"] for e in tree["residual_top"]]))
    return pairs


def check_tree_cycle(c: dict, facts: RunFacts, run: Progress, texts: dict, where: str) -> None:
    """One tree cycle against the contract; advances `run` as checks.check_cycle does."""
    tree, spec = c["tree"], facts.tree
    if run.finished:
        fail(where, "cycle", "a cycle after the one that finished the run")
    prompt_len = len(facts.prompt_ids)
    if c["committed_len_before"] != prompt_len + len(run.generated):
        fail(where, "committed_len_before", f"must be prompt + tokens so far = {prompt_len + len(run.generated)}")
    shape = check_nodes(tree["nodes"], spec, facts, where)
    check_siblings(shape, tree["nodes"], spec, where)
    check_frontier(shape, spec, where)
    check_tree_top(tree, shape, facts, where)
    path, end, kind = replay_walk(tree, shape, where)
    check_path(tree["path"], path, shape, where)
    if c["num_accepted"] != len(path):
        fail(where, "num_accepted", f"must be {len(path)}: the length of the accepted path")
    check_next(tree, shape, end, kind, facts, where)
    if facts.temperature == 0:
        check_greedy_tree(tree, shape, end, where)
    what = f"the {len(path)} tokens of the accepted path plus the {tree['next_token_kind']} token"
    want, finished = check_commit(c, [shape.tokens[p] for p in path], tree["next_token_id"], what, facts, run, where)
    for name, ids, strings in tree_texts(c):
        check_text_map(texts, ids, strings, where, name)
    crop = facts.faults.get("crop_instead_of_compact", False)  # a declared teaching fault (header)
    target_after = check_target_cache(c, path, len(want), run.chain, where, crop)
    draft_after = check_draft_cache(c, shape, spec, path, len(want), run.chain, where, crop, facts.drafter_kind)
    check_times(c, tree["draft_forwards"], facts, where)
    run.chain = CacheChain(target_after, draft_after)
    run.generated += want
    run.finished = finished
