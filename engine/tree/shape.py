"""The token tree one cycle drafts, and the two rules for growing it.

Node i holds a token, its parent (ROOT for a child of the last committed token) and the
draft's probability of the token at the parent. Nodes are numbered parents before children
(parent < i), level by level, and siblings in the order the acceptance walk tries them: the
draft's most likely first.
"""
import math
from dataclasses import dataclass, field

import torch

from engine.config import TreeSpec
from engine.trace.schema import ROOT, STATIC_TREE


@dataclass
class DraftTree:
    token_ids: list[int] = field(default_factory=list)  # (N,)
    parents: list[int] = field(default_factory=list)  # (N,) ROOT or an earlier node's index
    q: list[float] = field(default_factory=list)  # (N,) the draft's probability of the token at its parent
    score: list[float] = field(default_factory=list)  # (N,) sum of log q along the path from the root

    def __len__(self) -> int:
        return len(self.token_ids)

    def add(self, token_id: int, parent: int, q: float) -> int:
        base = 0.0 if parent == ROOT else self.score[parent]
        self.token_ids.append(token_id)
        self.parents.append(parent)
        self.q.append(q)
        self.score.append(base + math.log(q) if q > 0 else -math.inf)
        return len(self.token_ids) - 1

    @property
    def depths(self) -> list[int]:
        """(N,) 1 for a child of the root."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p == ROOT else out[p] + 1)
        return out

    def children(self, parent: int) -> list[int]:
        """The children of `parent` (ROOT or a node), in the order they are tried."""
        return [i for i, p in enumerate(self.parents) if p == parent]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node`."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def top_children(probs: torch.Tensor, n: int) -> list[tuple[int, float]]:
    """The n most likely tokens of a (V,) distribution with their probabilities, best first;
    zero-probability tokens are never proposed (greedy drafts have one child per node)."""
    values, ids = torch.topk(probs, min(n, probs.shape[-1]))
    return [(int(i), float(v)) for v, i in zip(values.tolist(), ids.tolist()) if v > 0]


def expand_static(tree: DraftTree, frontier: list[int], probs: torch.Tensor, branching: int) -> list[int]:
    """Give each frontier node (ROOT for the first level) its `branching` best children.
    probs (len(frontier), V): the draft's distribution after each frontier node. Returns the new level."""
    level = []
    for parent, row in zip(frontier, probs):
        level += [tree.add(t, parent, q) for t, q in top_children(row, branching)]
    return level


def expand_dynamic(tree: DraftTree, frontier: list[int], probs: torch.Tensor, top_k: int) -> list[int]:
    """EAGLE-2's step: every frontier node gets its top_k children as candidates; the top_k
    candidates by cumulative score become the next frontier. Returns (next frontier)."""
    level = expand_static(tree, frontier, probs, top_k)
    return sorted(level, key=lambda i: -tree.score[i])[:top_k]


def keep_best(tree: DraftTree, nodes: int) -> tuple[DraftTree, list[int]]:
    """EAGLE-2's rerank: the `nodes` best candidates by score, renumbered parents first.
    Returns the new tree and, for each of its nodes, the index it had in `tree`.

    A child's score is its parent's plus a log-probability (<= 0), so it never beats its
    parent; ties are broken towards shallower nodes, and ancestors are added if a tie ever
    left one out, so the kept set is always a tree."""
    depths = tree.depths
    best = sorted(range(len(tree)), key=lambda i: (-tree.score[i], depths[i], i))[:nodes]
    kept = {a for i in best for a in tree.path_to(i)}
    order = sorted(kept, key=lambda i: (depths[i], i))  # level by level, siblings as tried
    new_index = {old: new for new, old in enumerate(order)}
    out = DraftTree()
    for old in order:
        parent = tree.parents[old]
        out.token_ids.append(tree.token_ids[old])
        out.parents.append(ROOT if parent == ROOT else new_index[parent])
        out.q.append(tree.q[old])
        out.score.append(tree.score[old])
    return out, order


def level_width(spec: TreeSpec, depth: int) -> int:
    """Children per node at `depth` (1-based) for a static tree, top_k for a dynamic one."""
    return spec.branching[depth - 1] if spec.kind == STATIC_TREE else spec.top_k
