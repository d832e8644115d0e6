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
"""
import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.trace.checks import (
    ABS_TOL,
    REL_TOL,
    CacheChain,
    Progress,
    RunFacts,
    check_lengths,
    check_text_map,
    check_texts,
    check_times,
    check_top,
    close,
    fail,
    is_int,
    is_num,
)
from engine.trace.commit import final_tokens
from engine.trace.schema import DRAFT_MODEL, EAGLE, NEXT_BONUS, NEXT_RESIDUAL, ROOT, STATIC_TREE

if TYPE_CHECKING:
    from engine.config import TreeSpec

# The walk renormalises the target's float32 distribution: after siblings of total target
# mass R were rejected, the engine's r[t] is p / (S - R), where S, the float32 row's own sum,
# is 1 only to within float32 rounding (each of V entries rounded to 2^-24 relative, summed
# pairwise: about 1e-6 for V = 150k; top-k/top-p renormalise once more). Compared with
# p / (1 - R) from the recorded p's, that is a relative error of about |S - 1| / (1 - R),
# growing as the remaining mass 1 - R shrinks. MASS_SLACK bounds |S - 1| with ~100x headroom;
# once the remaining mass is below it, float noise rather than the rule sets r[t] (any value
# in [0, 1] is then possible), so nothing is compared.
MASS_SLACK = 1e-4
SIBLING_MASS_TOL = 1e-3  # distinct siblings' p sum to at most 1: the slack check_top allows a top list


@dataclass(frozen=True)
class Shape:
    """The tree as the checks walk it: (N,) tokens, parents and depths, and each node's children."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    kids: dict[int, list[int]]  # ROOT or a node -> its children, in index (= trial) order

    def children(self, node: int) -> list[int]:
        return self.kids.get(node, [])

    @staticmethod
    def row(node: int) -> int:
        """The target_top row of the distribution after `node` (row 0: after the root)."""
        return 0 if node == ROOT else 1 + node


def name_of(node: int) -> str:
    return "the root" if node == ROOT else f"node {node}"


# ---------------------------------------------------------------- header

def check_tree_header(h: dict, where: str) -> "TreeSpec":
    """settings.tree as a TreeSpec, and what a tree run's header must say around it."""
    # Imported here: engine.config imports engine.trace.schema, which loads this package first.
    from engine.config import SettingsError, tree_from_header
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


# ---------------------------------------------------------------- the tree

def check_token(t, vocab: int | None, where: str, field: str) -> None:
    limit = vocab if vocab is not None else 2**31
    if not is_int(t) or not 0 <= t < limit:
        fail(where, field, f"a token id must be an integer in 0..{limit - 1}, got {t!r:.40}")


def check_node(n: dict, i: int, depths: list[int], nodes: list[dict], spec: "TreeSpec", facts: RunFacts,
               where: str) -> int:
    """Node i against its parent; returns its depth."""
    f = f"tree.nodes[{i}]"
    parent = n["parent"]
    if not (parent == ROOT or 0 <= parent < i):
        fail(where, f"{f}.parent", f"must be {ROOT} (the root) or an earlier node 0..{i - 1}, got {parent}: "
                                   "parents come before children, so the tree has no cycle")
    depth = 1 if parent == ROOT else depths[parent] + 1
    if n["depth"] != depth:
        fail(where, f"{f}.depth", f"must be {depth}: one more than its parent's (1 under the root)")
    if depth > spec.max_depth:
        fail(where, f"{f}.depth", f"{depth} is deeper than the {spec.text()} tree's max depth {spec.max_depth}")
    if depths and depth < depths[-1]:
        fail(where, f"{f}.depth", "nodes are numbered level by level: depth never decreases")
    check_token(n["token_id"], facts.vocab_size, where, f"{f}.token_id")
    for name in ("q", "p"):
        if not 0.0 <= n[name] <= 1.0 + ABS_TOL:
            fail(where, f"{f}.{name}", f"a probability must lie in [0, 1], got {n[name]!r:.40}")
    if n["q"] <= 0:
        fail(where, f"{f}.q", "the draft proposed a token it gives probability 0")
    want = (0.0 if parent == ROOT else nodes[parent]["score"]) + math.log(n["q"])
    if not close(n["score"], want):
        fail(where, f"{f}.score", f"must be its parent's score + log q = {want:.6g} (the sum of log q on its path)")
    return depth


def check_nodes(nodes: list[dict], spec: "TreeSpec", facts: RunFacts, where: str) -> Shape:
    if len(nodes) > spec.max_nodes:
        fail(where, "tree.nodes", f"{len(nodes)} nodes; the {spec.text()} tree holds at most {spec.max_nodes}")
    depths: list[int] = []
    kids: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        depths.append(check_node(n, i, depths, nodes, spec, facts, where))
        kids.setdefault(n["parent"], []).append(i)
    return Shape([n["token_id"] for n in nodes], [n["parent"] for n in nodes], depths, kids)


def check_siblings(shape: Shape, nodes: list[dict], spec: "TreeSpec", where: str) -> None:
    """Per parent: no more children than the spec allows at that depth, distinct tokens,
    the draft's most likely first, and target probabilities that fit in one distribution."""
    for parent, kids in shape.kids.items():
        depth = 0 if parent == ROOT else shape.depths[parent]  # the children are at depth + 1
        limit = spec.branching[depth] if spec.kind == STATIC_TREE else spec.top_k
        if len(kids) > limit:
            fail(where, f"tree.nodes[{kids[limit]}].parent", f"{name_of(parent)} (depth {depth}) has {len(kids)} "
                 f"children; the {spec.text()} tree allows at most {limit} at depth {depth + 1}")
        seen: set[int] = set()
        for a, b in zip(kids, kids[1:]):
            if nodes[b]["q"] > nodes[a]["q"] + ABS_TOL:
                fail(where, f"tree.nodes[{b}].q", f"siblings are ordered as the walk tries them, the draft's most "
                                                  f"likely first: q {nodes[b]['q']:.6g} after {nodes[a]['q']:.6g}")
        for kid in kids:
            if shape.tokens[kid] in seen:
                fail(where, f"tree.nodes[{kid}].token_id", f"sibling tokens must be distinct: {name_of(parent)} "
                                                           f"has token {shape.tokens[kid]} twice")
            seen.add(shape.tokens[kid])
        if sum(nodes[kid]["p"] for kid in kids) > 1.0 + SIBLING_MASS_TOL:
            fail(where, f"tree.nodes[{kids[-1]}].p", f"the children of {name_of(parent)} are distinct tokens of one "
                                                     "target distribution: their p sum to more than 1")


def check_frontier(shape: Shape, spec: "TreeSpec", where: str) -> None:
    """A dynamic tree expands at most top_k nodes of each level (its frontier): only they have children."""
    if spec.kind == STATIC_TREE:
        return
    parents = Counter(shape.depths[node] for node in shape.kids if node != ROOT)
    for depth, count in sorted(parents.items()):
        if count > spec.top_k:
            fail(where, "tree.nodes", f"{count} nodes at depth {depth} have children; the {spec.text()} tree "
                                      f"expands at most top_k = {spec.top_k} per level (its frontier)")


def check_tree_top(tree: dict, shape: Shape, facts: RunFacts, where: str) -> None:
    """N+1 top lists (after the root, then after each node), each agreeing with the p its children record."""
    top = tree["target_top"]
    check_top(top, len(shape.tokens) + 1, facts, where, "tree.target_top", [], [])
    for i, n in enumerate(tree["nodes"]):
        r = shape.row(n["parent"])
        for e in top[r]:
            if e["token_id"] == n["token_id"] and not close(e["p"], n["p"]):
                fail(where, f"tree.target_top[{r}]", f"lists node {i}'s token {n['token_id']} at p={e['p']:.6g}, "
                                                     f"the node records p={n['p']:.6g}")


# ---------------------------------------------------------------- the walk

def expected_residual(p: float, removed: float) -> tuple[float, float] | None:
    """r[t] of a token of target probability p after siblings of mass `removed` were rejected, and
    its relative tolerance; None when so little mass is left that float noise decides (MASS_SLACK)."""
    if p == 0:
        return 0.0, REL_TOL  # a 0-mass token stays 0 in every renormalisation
    remaining = 1.0 - removed  # 1 for the first try: the target's row as it is
    if remaining <= MASS_SLACK:
        return None
    return p / remaining, REL_TOL + MASS_SLACK / remaining


def check_draw(entry: dict, p: float, removed: float, where: str, f: str) -> None:
    """One try: the draw and the residual's probability are in range, the probability is the
    renormalised residual's, and the decision is u < p_residual."""
    u, r = entry["u"], entry["p_residual"]
    if not 0.0 <= u < 1.0:
        fail(where, f"{f}.u", f"a uniform draw must lie in [0, 1), got {u!r:.40}")
    if not 0.0 <= r <= 1.0 + ABS_TOL:
        fail(where, f"{f}.p_residual", f"a probability must lie in [0, 1], got {r!r:.40}")
    want = expected_residual(p, removed)
    if want is not None and not math.isclose(r, want[0], rel_tol=want[1], abs_tol=ABS_TOL):
        rule = ("the node's p: the first try reads the target's distribution unmodified" if removed == 0 else
                f"p / (1 - {removed:.6g}), the residual renormalised after the rejected siblings")
        fail(where, f"{f}.p_residual", f"must be {want[0]:.6g} = {rule}; got {r:.6g}")
    if entry["accepted"] != (u < r):
        fail(where, f"{f}.accepted", f"the draw says {'accept' if u < r else 'reject'} (u < p_residual: "
                                     f"{u:.6g} against {r:.6g}) but the record says {str(entry['accepted']).lower()}")


def try_children(tried: list[dict], pos: int, parent: int, shape: Shape, nodes: list[dict],
                 where: str) -> tuple[int, int | None]:
    """The walk at `parent`: its children tried in order until one is accepted. Returns the next
    position in `tried` and the accepted child (None: all were rejected)."""
    removed = 0.0
    for kid in shape.children(parent):
        if pos == len(tried):
            fail(where, "tree.tried", f"stops before the walk does: node {kid}, a child of {name_of(parent)}, "
                                      "was never tried")
        entry, f = tried[pos], f"tree.tried[{pos}]"
        if entry["node"] != kid:
            fail(where, f"{f}.node", f"must be node {kid}: the children of {name_of(parent)} are tried in order, "
                                     "each until one is accepted")
        check_draw(entry, nodes[kid]["p"], removed, where, f)
        pos += 1
        if entry["accepted"]:
            return pos, kid
        removed += nodes[kid]["p"]
    return pos, None


def replay_walk(tree: dict, shape: Shape, where: str) -> tuple[list[int], int, str]:
    """The walk the record's draws make: (path, the node it ends at, how the next token is drawn)."""
    tried, pos, node, path = tree["tried"], 0, ROOT, []
    kind = NEXT_BONUS  # reached a node without children: the target's full distribution there
    while shape.children(node):
        pos, chosen = try_children(tried, pos, node, shape, tree["nodes"], where)
        if chosen is None:
            kind = NEXT_RESIDUAL  # every child rejected: the residual at `node`
            break
        path.append(chosen)
        node = chosen
    if pos != len(tried):
        fail(where, f"tree.tried[{pos}]", f"tried after the walk ended at {name_of(node)} "
                                          f"({'no children' if kind == NEXT_BONUS else 'every child rejected'})")
    return path, node, kind


def check_path(recorded: list, walked: list[int], shape: Shape, where: str) -> None:
    """The recorded path runs from a child of the root down, and is the walk's accepted nodes."""
    above = ROOT
    for j, node in enumerate(recorded):
        if not is_int(node) or node not in shape.children(above):
            fail(where, f"tree.path[{j}]", f"{node!r:.20} is not a child of {name_of(above)}: the path runs from "
                                           "a child of the root down, each node a child of the one before")
        above = node
    if recorded != walked:
        fail(where, "tree.path", f"must be the accepted tried nodes, in order: {walked}")


def check_next(tree: dict, shape: Shape, end: int, kind: str, facts: RunFacts, where: str) -> None:
    """How the next token was drawn, and the residual it was drawn from."""
    recorded = tree["next_token_kind"]
    if recorded not in (NEXT_BONUS, NEXT_RESIDUAL):
        fail(where, "tree.next_token_kind", f"must be '{NEXT_BONUS}' or '{NEXT_RESIDUAL}', got {recorded!r:.40}")
    if recorded != kind:
        why = (f"{name_of(end)} has no children, so the next token is a bonus from the target's full distribution"
               if kind == NEXT_BONUS else f"every child of {name_of(end)} was rejected, so the next token is drawn "
               "from the residual (a bonus only where the walk reaches a node without children)")
        fail(where, "tree.next_token_kind", f"must be '{kind}': {why}")
    nxt = tree["next_token_id"]
    check_token(nxt, facts.vocab_size, where, "tree.next_token_id")
    if kind == NEXT_BONUS:
        if tree["residual_top"] is not None:
            fail(where, "tree.residual_top", "a bonus is drawn from the target's full distribution: residual_top is null")
        return
    rejected = {shape.tokens[kid]: tree["nodes"][kid]["p"] for kid in shape.children(end)}
    if nxt in rejected:
        fail(where, "tree.next_token_id", f"token {nxt} is a rejected child's: its residual probability is 0")
    check_tree_residual(tree["residual_top"], nxt, rejected, facts, where)


def check_tree_residual(res, nxt: int, rejected: dict[int, float], facts: RunFacts, where: str) -> None:
    """residual_top: the rejected children's tokens at residual 0, the drawn token above 0."""
    if res is None or not 1 <= len(res) <= facts.trace_top_k + 1:
        fail(where, "tree.residual_top", f"a residual draw records its residual: 1..{facts.trace_top_k + 1} entries")
    for e in res:
        if not isinstance(e, dict) or not is_int(e.get("token_id")) or not isinstance(e.get("text"), str) or \
                not all(is_num(e.get(f)) and 0 <= e[f] <= 1 + ABS_TOL for f in ("p_target", "residual")):
            fail(where, "tree.residual_top", "entries are {token_id, text, p_target, residual} with both in [0, 1]")
        check_token(e["token_id"], facts.vocab_size, where, "tree.residual_top")
        if e["token_id"] in rejected and (e["residual"] > ABS_TOL or not close(e["p_target"], rejected[e["token_id"]])):
            fail(where, "tree.residual_top", f"rejected token {e['token_id']} is listed at residual {e['residual']:.6g}, "
                 f"p_target {e['p_target']:.6g}: a rejected child leaves the residual (0) and keeps its node's p")
    if not any(e["token_id"] == nxt and e["residual"] > 0 for e in res):
        fail(where, "tree.residual_top", "the drawn token must be listed with a residual probability above 0")


def check_greedy_tree(tree: dict, shape: Shape, end: int, where: str) -> None:
    """Temperature 0: one-hot target rows, so an accepted node's p is 1, a rejected one's 0,
    and the next token is the target's argmax after the walk's last node."""
    nodes = tree["nodes"]
    for e in tree["tried"]:
        p, want = nodes[e["node"]]["p"], 1.0 if e["accepted"] else 0.0
        if p != want:
            fail(where, f"tree.nodes[{e['node']}].p", f"temperature 0: the target's distribution is one-hot, so an "
                 f"{'accepted' if e['accepted'] else 'rejected'} node's p is {want:g}, got {p:.6g}")
    for i, n in enumerate(nodes):
        if n["p"] not in (0.0, 1.0):
            fail(where, f"tree.nodes[{i}].p", "temperature 0: the target's distribution is one-hot, so p is 0 or 1")
    argmax = tree["target_top"][shape.row(end)]
    if len(argmax) != 1 or argmax[0]["token_id"] != tree["next_token_id"]:
        fail(where, "tree.next_token_id", f"temperature 0: the next token is the target's argmax after "
                                          f"{name_of(end)} (target_top row {shape.row(end)})")


# ---------------------------------------------------------------- commit and caches

def check_commit(c: dict, path_tokens: list[int], facts: RunFacts, run: Progress, where: str) -> tuple[list[int], bool]:
    """committed = final_tokens(path tokens + [next token]), the chain's commit rule."""
    tree = c["tree"]
    budget = facts.max_new_tokens - len(run.generated)
    want, finished = final_tokens(path_tokens + [tree["next_token_id"]], budget, facts.eos_ids)
    if c["committed_token_ids"] != want:
        fail(where, "committed_token_ids", f"must be the {len(path_tokens)} tokens of the accepted path plus the "
             f"{tree['next_token_kind']} token, cut at EOS and at the budget of {budget}: {want}")
    check_texts(c["committed_token_texts"], len(want), where, "committed_token_texts")
    if c["finished"] != finished:
        fail(where, "finished", f"must be {str(finished).lower()}: a run ends at EOS or at max_new_tokens")
    return want, finished


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


def draft_fed_range(shape: Shape, spec: "TreeSpec", forwards: int) -> tuple[int, int]:
    """Positions the draft's forwards append: the root, then the expanded nodes of each level but
    the deepest (static: all of them; dynamic: a frontier of at most top_k per level, holding
    every node that has children)."""
    if spec.kind == STATIC_TREE:
        fed = 1 + sum(d < spec.max_depth for d in shape.depths)
        return fed, fed
    parents = sum(1 for node in shape.kids if node != ROOT)
    return max(forwards, 1 + parents), 1 + (forwards - 1) * spec.top_k


def draft_kept_range(shape: Shape, spec: "TreeSpec", path: list[int], n_committed: int) -> tuple[int, int]:
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


def check_draft_kept(comp: dict, d: dict, shape: Shape, spec: "TreeSpec", path: list[int], n_committed: int,
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


def check_draft_cache(c: dict, shape: Shape, spec: "TreeSpec", path: list[int], n_committed: int,
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
    want, finished = check_commit(c, [shape.tokens[p] for p in path], facts, run, where)
    for name, ids, strings in tree_texts(c):
        check_text_map(texts, ids, strings, where, name)
    crop = facts.faults.get("crop_instead_of_compact", False)  # a declared teaching fault (header)
    target_after = check_target_cache(c, path, len(want), run.chain, where, crop)
    draft_after = check_draft_cache(c, shape, spec, path, len(want), run.chain, where, crop, facts.drafter_kind)
    check_times(c, tree["draft_forwards"], facts, where)
    run.chain = CacheChain(target_after, draft_after)
    run.generated += want
    run.finished = finished
