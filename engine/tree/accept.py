"""The acceptance walk over a draft tree: which drafted nodes the target keeps, and the next token.

Each node is a deterministic (top-k) proposal, so as a draft distribution it is one-hot on its
token t. For a one-hot proposal the ratio test accepts with probability r(t), and after a
rejection the target still owes norm(max(0, r - onehot(t))): r with t zeroed, renormalised.
Why siblings tried one after another keep this exact, by induction on the siblings left at a
node: with none left, the token is drawn from r itself. Otherwise the first sibling's token t
comes out with probability r(t); with probability 1 - r(t) it is rejected and the rest of the
walk, by induction, picks a token distributed as r without t, renormalised, so any other token
x comes out with probability (1 - r(t)) * r(x) / (1 - r(t)) = r(x). So the token taken at a node
follows the target's row there; when it is an accepted child, the walk goes on with the target's
row after that child, and the same holds one level down. The tree is a fixed function of the
context, so it cannot bias anything: the committed tokens follow the target. This is SpecInfer's
multi-step speculative sampling over a token tree (Miao et al., 2023) with one-hot proposals,
and the way EAGLE-2 (Li et al., 2024) verifies its dynamic trees when sampling.

Leaving a rejected token in the residual breaks it: later siblings are accepted too rarely
(against r(x) instead of r(x) / (1 - r(t))) and the final draw can give the rejected token a
second chance, so the output leans towards the first sibling tried. `remove_rejected=False`
does exactly that, for the teaching pages and for the test that shows the exactness test can fail.
"""
from dataclasses import dataclass

import torch

from engine.models.sampling import sample, uniform
from engine.trace.schema import NEXT_BONUS, NEXT_RESIDUAL, ROOT
from engine.tree.shape import DraftTree


@dataclass
class TriedChild:
    node: int
    p_residual: float  # r[token] when it was tried: what the acceptance test compared u with
    u: float  # the uniform draw spent on this child
    accepted: bool  # u < p_residual


@dataclass
class TreeDecision:
    path: list[int]  # accepted nodes, the root's child first, each the child of the one before
    tried: list[TriedChild]  # in the order tried
    next_token_id: int
    next_token_kind: str  # NEXT_BONUS or NEXT_RESIDUAL
    residual_probs: torch.Tensor | None  # (V,) what the next token was drawn from after a rejection; None for a bonus


def check_rows(tree: DraftTree, p_target: torch.Tensor) -> None:
    """One row per position of the verify pass, [root, node 0..N-1], and every token in the vocabulary."""
    n = len(tree)
    if p_target.dim() != 2 or p_target.shape[0] != n + 1:
        raise ValueError(f"p_target must be (N+1, V) = ({n + 1}, V) for a tree of {n} nodes, got {tuple(p_target.shape)}")
    vocab = p_target.shape[1]
    if any(not 0 <= t < vocab for t in tree.token_ids):
        raise ValueError(f"a tree token lies outside the target's vocabulary of {vocab}")


def without_token(r: torch.Tensor, token: int) -> torch.Tensor:
    """r (V,) with `token` zeroed and the rest renormalised: norm(max(0, r - onehot(token))),
    in r's own dtype, as engine.models.sampling.residual computes a residual."""
    out = r.clone()  # never write into the caller's p_target
    out[token] = 0.0
    total = out.sum()
    # Never 0 for a real distribution: `token` was rejected, so r[token] <= u < 1. A row whose only
    # mass sits on one token holds exactly 1 there (softmax gives exp(0)/exp(0), a renormalised row
    # x/x, a one-hot 1), which u < 1 always accepts; so some other token still carries mass.
    if not total > 0:
        raise ValueError(f"the target's row has no mass left once token {token} is removed: not a distribution")
    return out / total


def try_siblings(tree: DraftTree, children: list[int], r: torch.Tensor, gen: torch.Generator,
                 tried: list[TriedChild], remove_rejected: bool) -> tuple[int | None, torch.Tensor]:
    """Try `children` in order against the residual r (V,), one uniform draw each, appending to `tried`.
    Returns the accepted child (None when all fail) and the residual after the rejected ones."""
    for child in children:
        token = tree.token_ids[child]
        p = float(r[token])
        u = uniform(gen)
        tried.append(TriedChild(child, p, u, u < p))  # strict '<': a token of mass 0 is never accepted
        if u < p:
            return child, r
        if remove_rejected:
            r = without_token(r, token)
    return None, r


def accept_tree(tree: DraftTree, p_target: torch.Tensor, gen: torch.Generator,
                remove_rejected: bool = True) -> TreeDecision:
    """Walk the tree from the root: accept a child with probability r[token], else remove its token
    from r and try the next sibling; end with a bonus at a childless node or a residual draw.

    p_target (N+1, V): row 0 after the root, row 1+i after node i (already warped). A tree of 0
    nodes is a plain target step (only the bonus, like a chain with n=0).
    remove_rejected=False is a deliberately broken rule for teaching and for the test that proves
    the exactness test can fail: a rejected sibling's token stays in the residual, so the next
    sibling is tried against the unmodified row and the final residual is that row. Normal runs
    never pass it.
    """
    check_rows(tree, p_target)
    path: list[int] = []
    tried: list[TriedChild] = []
    node, r = ROOT, p_target[0]  # r (V,): the distribution the walk owes at the current node
    while True:
        children = tree.children(node)
        if not children:
            return TreeDecision(path, tried, sample(r, gen), NEXT_BONUS, None)
        accepted, r = try_siblings(tree, children, r, gen, tried, remove_rejected)
        if accepted is None:
            r = r.clone()  # the unmodified row under the broken rule: a copy, not a view of p_target
            return TreeDecision(path, tried, sample(r, gen), NEXT_RESIDUAL, r)
        path.append(accepted)
        node, r = accepted, p_target[1 + accepted]
