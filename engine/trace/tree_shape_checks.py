"""What a tree cycle's drafted tree must be: nodes numbered parents first, level by level, each
one deeper than its parent with its score the sum of log q on its path; siblings ordered and
distinct within the spec's branching; a dynamic tree's frontier; and the top lists after each
node. `check_nodes` returns the Shape the walk and the cache checks then read.
"""
import math
from collections import Counter
from dataclasses import dataclass

from engine.config import TreeSpec
from engine.trace.check_basics import ABS_TOL, RunFacts, close, fail, is_int
from engine.trace.schema import ROOT, STATIC_TREE
from engine.trace.shared_checks import check_top

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


def check_token(t, vocab: int | None, where: str, field: str) -> None:
    limit = vocab if vocab is not None else 2**31
    if not is_int(t) or not 0 <= t < limit:
        fail(where, field, f"a token id must be an integer in 0..{limit - 1}, got {t!r:.40}")


def check_node(n: dict, i: int, depths: list[int], nodes: list[dict], spec: TreeSpec, facts: RunFacts,
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


def check_nodes(nodes: list[dict], spec: TreeSpec, facts: RunFacts, where: str) -> Shape:
    if len(nodes) > spec.max_nodes:
        fail(where, "tree.nodes", f"{len(nodes)} nodes; the {spec.text()} tree holds at most {spec.max_nodes}")
    depths: list[int] = []
    kids: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        depths.append(check_node(n, i, depths, nodes, spec, facts, where))
        kids.setdefault(n["parent"], []).append(i)
    return Shape([n["token_id"] for n in nodes], [n["parent"] for n in nodes], depths, kids)


def check_siblings(shape: Shape, nodes: list[dict], spec: TreeSpec, where: str) -> None:
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


def check_frontier(shape: Shape, spec: TreeSpec, where: str) -> None:
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
