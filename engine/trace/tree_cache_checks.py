"""What a tree cycle commits and how both caches roll back after it: the accepted path plus the
next token, cut by the commit rule; the target's compaction to the root and the path; the
draft's (or an EAGLE head's) forwards over the tree, its compaction and catch-up; and, with the
declared teaching fault crop_instead_of_compact, the crop that bug makes instead.
"""
from engine.config import TreeSpec
from engine.trace.check_basics import CacheChain, fail, is_int
from engine.trace.schema import DRAFT_MODEL, EAGLE, ROOT, STATIC_TREE
from engine.trace.shared_checks import check_lengths
from engine.trace.tree_shape_checks import Shape


def check_moves(comp: dict, base: int, where: str, field: str) -> None:
    want = [[src, base + j] for j, src in enumerate(comp["kept_slots"]) if src != base + j]
    if comp["moves"] != want:
        fail(where, f"{field}.moves", f"must be {want}: [from, to] for each kept slot that changes place "
                                      f"(the j-th kept slot moves to {base} + j)")


def crop_kept(base: int, count: int) -> list[int]:
    """What the declared teaching fault crop_instead_of_compact keeps: the first `count` slots from
    the root's, whatever they hold (engine/teaching/faults.py crop_to_length)."""
    return list(range(base, base + count))


def check_target_cache(c: dict, path: list[int], n_committed: int, chain: CacheChain, where: str,
                       crop: bool = False) -> int:
    """Verify appends the root and the N nodes; compaction keeps the root and the path, cut to
    the committed length (with the declared `crop` fault: the first slots, moved nowhere).
    Returns the length after the rollback."""
    t, n = c["target_cache_len"], len(c["tree"]["nodes"])
    check_lengths(t, where, "target_cache_len")
    if t["before"] != chain.target:
        fail(where, "target_cache_len.before", f"must continue the previous cycle's length {chain.target}")
    if c["verify_positions"] != n + 1:
        fail(where, "verify_positions", f"verify runs over [root, {n} nodes] = {n + 1} positions")
    if t["after_append"] != t["before"] + n + 1:
        fail(where, "target_cache_len.after_append", f"verify appends N+1 = {n + 1} positions to {t['before']}")
    keep = c["committed_len_before"] + n_committed - 1
    if t["after_rollback"] != keep:
        fail(where, "target_cache_len.after_rollback", f"must be {keep}: committed length - 1 by the convention")
    base = t["before"]
    comp = c["tree"]["compaction"]["target"]
    kept = ([base] + [base + 1 + p for p in path])[:n_committed]
    if crop and comp["kept_slots"] != crop_kept(base, n_committed):
        fail(where, "tree.compaction.target.kept_slots", f"must be {crop_kept(base, n_committed)}: the declared "
             f"fault crops to the committed length, keeping slots {base}.. whatever they hold")
    if not crop and comp["kept_slots"] != kept:
        fail(where, "tree.compaction.target.kept_slots", f"must be {kept}: the root's slot {base}, then "
             f"{base} + 1 + p for each path node p, cut to the {n_committed} committed tokens")
    check_moves(comp, base, where, "tree.compaction.target")
    return t["after_rollback"]


def draft_fed_range(shape: Shape, spec: TreeSpec, forwards: int) -> tuple[int, int]:
    """Positions the draft's forwards append: the root, then the expanded nodes of each level but
    the deepest (static: all of them; dynamic: a frontier of at most top_k per level, holding
    every node that has children)."""
    if spec.kind == STATIC_TREE:
        fed = 1 + sum(d < spec.max_depth for d in shape.depths)
        return fed, fed
    parents = sum(1 for node in shape.kids if node != ROOT)
    return max(forwards, 1 + parents), 1 + (forwards - 1) * spec.top_k


def draft_kept_range(shape: Shape, spec: TreeSpec, path: list[int], n_committed: int) -> tuple[int, int]:
    """How many slots the draft's compaction keeps: the root and the path nodes it was fed
    (every path node with children was expanded, so fed; static: all but the deepest level)."""
    if spec.kind == STATIC_TREE:
        held = len(path[:spec.max_depth - 1])
        return min(n_committed, 1 + held), min(n_committed, 1 + held)
    held_min = len(path) if not path or shape.children(path[-1]) else len(path) - 1
    return min(n_committed, 1 + held_min), min(n_committed, 1 + len(path))


def check_head_kept(comp: dict, d: dict, where: str) -> None:
    """The EAGLE head's entries after the root's rest on predicted features: its cache is cut back to the
    root's entry and the committed tokens are fed again with true ones (engine/tree/eagle.py), never compacted."""
    if comp["kept_slots"] != [d["before"]] or comp["moves"] != []:
        fail(where, "tree.compaction.draft", f"must be kept_slots [{d['before']}] and no moves: the EAGLE head keeps "
                                             "the root's entry only and is fed the committed tokens again")


def check_draft_kept(comp: dict, d: dict, shape: Shape, spec: TreeSpec, path: list[int], n_committed: int,
                     where: str, crop: bool = False) -> None:
    kept, base, field = comp["kept_slots"], d["before"], "tree.compaction.draft.kept_slots"
    lo, hi = draft_kept_range(shape, spec, path, n_committed)
    if not lo <= len(kept) <= hi:
        fail(where, field, f"keeps the root and the path nodes the draft was fed: {lo}..{hi} slots, got {len(kept)}")
    if not all(is_int(s) for s in kept) or kept[0] != base or any(b <= a for a, b in zip(kept, kept[1:])) \
            or kept[-1] >= d["after_append"]:
        fail(where, field, f"kept slots start at the root's slot {base} (draft_cache_len.before) and increase, "
                           f"below draft_cache_len.after_append {d['after_append']}")
    if crop and kept != crop_kept(base, len(kept)):
        fail(where, field, f"must be {crop_kept(base, len(kept))}: the declared fault crops the draft's cache "
                           "too, keeping the first slots from the root's")
    if not crop and spec.kind == STATIC_TREE and kept != [base] + [base + 1 + p for p in path[:len(kept) - 1]]:
        fail(where, field, f"must be {[base] + [base + 1 + p for p in path[:len(kept) - 1]]}: a static tree's "
                           f"node p sits in the draft's slot {base} + 1 + p (levels fed in order)")
    check_moves(comp, base, where, "tree.compaction.draft")


def check_draft_cache(c: dict, shape: Shape, spec: TreeSpec, path: list[int], n_committed: int,
                      chain: CacheChain, where: str, crop: bool = False,
                      drafter_kind: str = DRAFT_MODEL) -> int | None:
    """The draft's (or the EAGLE head's) forwards over the tree, its compaction, and the catch-up to
    committed length - 1. Returns its length after the rollback (None without a draft cache)."""
    d, tree = c["draft_cache_len"], c["tree"]
    comp = tree["compaction"]["draft"]
    if d is None or chain.draft is None:
        if comp is not None:
            fail(where, "tree.compaction.draft", "must be null: there is no draft cache to compact")
        return None
    if comp is None:
        fail(where, "tree.compaction.draft", "the draft cache is compacted too: kept_slots and moves")
    check_lengths(d, where, "draft_cache_len")
    if d["before"] != chain.draft:
        fail(where, "draft_cache_len.before", f"must continue the previous cycle's length {chain.draft}")
    forwards = tree["draft_forwards"]
    if not is_int(forwards) or not max(shape.depths) <= forwards <= spec.max_depth:
        fail(where, "tree.draft_forwards", f"a tree {max(shape.depths)} deep takes {max(shape.depths)}.."
             f"{spec.max_depth} batched draft forwards (the root, then one per expanded level)")
    lo, hi = draft_fed_range(shape, spec, forwards)
    if not lo <= d["after_append"] - d["before"] <= hi:
        fail(where, "draft_cache_len.after_append", f"the draft's forwards feed the root and the expanded nodes: "
             f"{lo}..{hi} positions after {d['before']}" if lo < hi else f"must be {d['before'] + lo}: the draft "
             f"is fed the root and every node above the deepest level ({lo} positions)")
    if drafter_kind == EAGLE:  # cropped to its root and re-fed, with or without the target's declared fault
        check_head_kept(comp, d, where)
    else:
        check_draft_kept(comp, d, shape, spec, path, n_committed, where, crop)
    keep = c["committed_len_before"] + n_committed - 1
    if d["after_rollback"] != keep:
        fail(where, "draft_cache_len.after_rollback", f"must be {keep}: committed length - 1 by the convention "
                                                      "(compaction, then the catch-up)")
    catch_up = d["before"] + len(comp["kept_slots"]) < keep
    if c["draft_catch_up"] != catch_up:
        fail(where, "draft_catch_up", f"must be {str(catch_up).lower()}: the draft is fed the committed tokens "
                                      "its compacted cache does not hold")
    if not catch_up and c["catch_up_time_s"] != 0:
        fail(where, "catch_up_time_s", "no catch-up ran, so its time is 0")
    return d["after_rollback"]
