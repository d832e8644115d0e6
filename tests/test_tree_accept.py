"""The tree acceptance walk on hand-built distributions (as vLLM's rejection-sampler tests do).

No model runs here. The unit cases write p_target out by hand, so each outcome can be worked
out on paper. The exactness tests use a hand-built "language" over 6 tokens: the target's
p(next | previous token) and a different draft's, whose top-k proposals form the trees; the
tokens the walk commits must follow the target's chain p(x1) p(x2 | x1).
"""
from typing import Callable

import pytest
import torch

from engine.models.sampling import sample, uniform
from engine.teaching.exactness import chi_square
from engine.trace.schema import NEXT_BONUS, NEXT_RESIDUAL, ROOT
from engine.tree.accept import TreeDecision, accept_tree
from engine.tree.shape import DraftTree, expand_dynamic, expand_static, keep_best

V = 6


def dist(*probs: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(probs, dtype=dtype)


def one_hot(i: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(i), V).float()


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tree_of(nodes: list[tuple[int, int]]) -> DraftTree:
    """A tree from (token, parent) pairs in node order; q is irrelevant to the walk."""
    tree = DraftTree()
    for token, parent in nodes:
        tree.add(token, parent, 0.5)
    return tree


def committed(tree: DraftTree, d: TreeDecision) -> list[int]:
    return [tree.token_ids[i] for i in d.path] + [d.next_token_id]


# ---------------------------------------------------------------- unit cases, worked out by hand

# Node 0 (token 1) and node 1 (token 2) hang off the root; node 2 (token 3) and node 3 (token 4) off node 0.
SMALL = tree_of([(1, ROOT), (2, ROOT), (3, 0), (4, 0)])
SEED0_U = [0.49625658988952637, 0.7682217955589294, 0.08847743272781372, 0.13203048706054688]


def test_seed_0_draws_are_the_ones_the_hand_computations_use():
    g = gen(0)
    assert [uniform(g) for _ in range(4)] == pytest.approx(SEED0_U, abs=1e-12)


def test_hand_computed_walk_accepts_down_to_a_leaf_and_draws_a_bonus():
    p_target = torch.stack([
        dist(0.1, 0.6, 0.2, 0.1, 0.0, 0.0),  # after the root
        dist(0.05, 0.05, 0.1, 0.2, 0.5, 0.1),  # after node 0 (token 1)
        one_hot(0),  # after node 1, never reached
        one_hot(0),  # after node 2, never reached
        dist(0.1, 0.2, 0.3, 0.4, 0.0, 0.0),  # after node 3 (token 4)
    ])
    d = accept_tree(SMALL, p_target, gen(0))
    # u0 = 0.496 < 0.6: node 0 accepted. u1 = 0.768 >= 0.2: node 2 rejected, token 3 removed: the residual
    # after node 0 becomes (0.05, 0.05, 0.1, 0, 0.5, 0.1) / 0.8, so node 3 is tried with 0.5 / 0.8 = 0.625;
    # u2 = 0.088 < 0.625: accepted. Node 3 is a leaf: the bonus is drawn from its row with u3 = 0.132,
    # which falls in token 1's interval [0.1, 0.3) of the cdf.
    assert d.path == [0, 3]
    assert [(t.node, t.accepted) for t in d.tried] == [(0, True), (2, False), (3, True)]
    assert [t.p_residual for t in d.tried] == pytest.approx([0.6, 0.2, 0.625], abs=1e-6)  # float32 rows
    assert [t.u for t in d.tried] == SEED0_U[:3]
    assert (d.next_token_id, d.next_token_kind, d.residual_probs) == (1, NEXT_BONUS, None)
    assert committed(SMALL, d) == [1, 4, 1]


ROOT_ROW = dist(0.1, 0.4, 0.3, 0.2, 0.0, 0.0)  # both of the root's children are rejected with seed 0


def rejecting_rows(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.stack([ROOT_ROW.to(dtype)] + [one_hot(0).to(dtype)] * 4)


def test_hand_computed_walk_rejects_every_child_of_the_root_and_samples_the_residual():
    d = accept_tree(SMALL, rejecting_rows(), gen(0))
    # u0 = 0.496 >= 0.4: node 0 (token 1) rejected; residual (0.1, 0, 0.3, 0.2, 0, 0) / 0.6. Node 1 (token 2)
    # is tried with 0.3 / (1 - 0.4) = 0.5; u1 = 0.768 >= 0.5: rejected. Residual (0.1, 0, 0, 0.2, 0, 0) / 0.3;
    # u2 = 0.088 < 1/3 picks token 0.
    assert d.path == [] and [(t.node, t.accepted) for t in d.tried] == [(0, False), (1, False)]
    assert [t.p_residual for t in d.tried] == pytest.approx([0.4, 0.5], abs=1e-6)
    assert (d.next_token_id, d.next_token_kind) == (0, NEXT_RESIDUAL)
    torch.testing.assert_close(d.residual_probs, dist(1 / 3, 0, 0, 2 / 3, 0, 0))
    assert committed(SMALL, d) == [0]


def test_float64_rows_give_the_same_walk_with_a_float64_residual():
    d32, d64 = accept_tree(SMALL, rejecting_rows(), gen(0)), accept_tree(SMALL, rejecting_rows(torch.float64), gen(0))
    assert (d32.path, d32.next_token_id) == (d64.path, d64.next_token_id)
    assert d32.residual_probs.dtype == torch.float32 and d64.residual_probs.dtype == torch.float64
    # the same arithmetic in both dtypes: equal to float32's precision
    torch.testing.assert_close(d64.residual_probs, d32.residual_probs.double(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(d64.residual_probs, dist(1 / 3, 0, 0, 2 / 3, 0, 0, dtype=torch.float64))


def test_the_walk_leaves_p_target_as_it_was():
    p_target = rejecting_rows()
    before = p_target.clone()
    accept_tree(SMALL, p_target, gen(0))
    assert torch.equal(p_target, before)


def test_broken_rule_tries_siblings_against_the_unmodified_row():
    d = accept_tree(SMALL, rejecting_rows(), gen(0), remove_rejected=False)
    # node 1 is tried with 0.3 itself (u1 = 0.768: rejected), and the next token comes from the untouched row:
    # u2 = 0.088 < 0.1 gives token 0 again, but from (0.1, 0.4, 0.3, 0.2, 0, 0).
    assert [t.p_residual for t in d.tried] == pytest.approx([0.4, 0.3], abs=1e-6)
    assert d.next_token_kind == NEXT_RESIDUAL
    torch.testing.assert_close(d.residual_probs, ROOT_ROW)


def test_greedy_rows_accept_the_argmax_child_and_reject_its_siblings():
    # T = 0: the root's row is certain of token 2 (node 1, the second sibling), node 1 is a leaf.
    p_target = torch.stack([one_hot(2), one_hot(0), one_hot(5), one_hot(0), one_hot(0)])
    for seed in range(10):
        d = accept_tree(SMALL, p_target, gen(seed))
        assert d.path == [1] and [(t.node, t.accepted) for t in d.tried] == [(0, False), (1, True)]
        assert [t.p_residual for t in d.tried] == [0.0, 1.0]  # exactly: a one-hot row renormalised stays 0/1
        assert (d.next_token_id, d.next_token_kind, d.residual_probs) == (5, NEXT_BONUS, None)


def test_greedy_rows_walk_two_levels_and_take_the_bonus_at_the_leaf():
    p_target = torch.stack([one_hot(1), one_hot(3), one_hot(0), one_hot(5), one_hot(0)])
    for seed in range(10):
        d = accept_tree(SMALL, p_target, gen(seed))
        assert d.path == [0, 2] and d.next_token_kind == NEXT_BONUS
        assert committed(SMALL, d) == [1, 3, 5]


def test_greedy_rows_whose_argmax_is_no_child_give_a_residual_equal_to_the_argmax():
    p_target = torch.stack([one_hot(5)] + [one_hot(0)] * 4)
    for seed in range(10):
        d = accept_tree(SMALL, p_target, gen(seed))
        assert d.path == [] and [t.accepted for t in d.tried] == [False, False]
        assert (d.next_token_id, d.next_token_kind) == (5, NEXT_RESIDUAL)
        torch.testing.assert_close(d.residual_probs, one_hot(5))


def test_an_empty_tree_is_a_plain_target_step():
    row = dist(0.1, 0.2, 0.3, 0.1, 0.2, 0.1)
    for seed in range(10):
        d = accept_tree(DraftTree(), row[None], gen(seed))
        assert d.path == [] and d.tried == [] and d.next_token_kind == NEXT_BONUS and d.residual_probs is None
        assert d.next_token_id == sample(row, gen(seed))  # the one draw is the bonus's: none spent on tests


def test_one_uniform_draw_per_tried_child_then_one_for_the_next_token():
    p_target = torch.stack([ROOT_ROW, dist(0.05, 0.05, 0.1, 0.2, 0.5, 0.1)] + [dist(*[1 / 6] * 6)] * 3)
    for seed in range(30):
        g = gen(seed)
        d = accept_tree(SMALL, p_target, g)
        twin = gen(seed)
        assert [t.u for t in d.tried] == [uniform(twin) for _ in d.tried]
        uniform(twin)  # the next token's draw
        assert torch.equal(g.get_state(), twin.get_state())


def test_a_residual_left_with_one_token_holds_exactly_1_there():
    """Why the residual's mass never runs out (accept.without_token): after the other siblings are
    removed, the last token's share is x / x = 1 exactly, which every u < 1 accepts."""
    tree = tree_of([(0, ROOT), (1, ROOT), (2, ROOT)])
    logits = torch.tensor([0.3, -1.7, 2.9, -float("inf"), -float("inf"), -float("inf")])
    p_target = torch.softmax(logits, -1).expand(4, V)  # float32 mass on tokens 0, 1, 2 only
    last_tried = 0
    for seed in range(200):
        d = accept_tree(tree, p_target, gen(seed))
        if len(d.tried) == 3:
            last_tried += 1
            assert d.tried[-1].p_residual == 1.0 and d.tried[-1].accepted and d.path == [2]
    assert last_tried > 0  # the case happened


def test_bad_rows_get_a_clear_error():
    with pytest.raises(ValueError, match=r"\(N\+1, V\) = \(5, V\)"):
        accept_tree(SMALL, torch.stack([ROOT_ROW] * 4), gen())
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        accept_tree(tree_of([(V, ROOT)]), torch.stack([ROOT_ROW] * 2), gen())
    # not a distribution: all the row's mass on a token it gives only 0.3; u0 = 0.496 rejects it
    with pytest.raises(ValueError, match="no mass left"):
        accept_tree(tree_of([(1, ROOT)]), torch.stack([dist(0, 0.3, 0, 0, 0, 0)] * 2), gen(0))


# ---------------------------------------------------------------- a hand-built language and its trees

TARGET = torch.tensor([  # p_target(next | previous token): row = previous token
    [0.05, 0.30, 0.25, 0.20, 0.15, 0.05],
    [0.30, 0.05, 0.10, 0.35, 0.10, 0.10],
    [0.10, 0.20, 0.05, 0.15, 0.40, 0.10],
    [0.25, 0.25, 0.20, 0.05, 0.10, 0.15],
    [0.15, 0.10, 0.30, 0.20, 0.05, 0.20],
    [0.20, 0.15, 0.15, 0.15, 0.25, 0.10],
])
DRAFT = torch.tensor([  # a different draft: its top-3 list differs from the target's in every row
    [0.10, 0.15, 0.35, 0.05, 0.30, 0.05],
    [0.40, 0.05, 0.25, 0.10, 0.05, 0.15],
    [0.05, 0.30, 0.10, 0.35, 0.12, 0.08],
    [0.08, 0.40, 0.12, 0.10, 0.25, 0.05],
    [0.35, 0.05, 0.10, 0.30, 0.02, 0.18],
    [0.12, 0.33, 0.05, 0.22, 0.10, 0.18],
])
FIRST_ROOT = 3  # the last committed token before the first cycle


def grow(root: int, widths: list[int], expand, draft: torch.Tensor) -> DraftTree:
    """Draft a tree after `root`: one level per width, children by the draft's top-k (`expand`)."""
    tree, frontier = DraftTree(), [ROOT]
    for width in widths:
        previous = [root if f == ROOT else tree.token_ids[f] for f in frontier]
        frontier = expand(tree, frontier, draft[previous], width)  # draft rows (len(frontier), V)
    return tree


def static_tree(root: int, draft: torch.Tensor = DRAFT) -> DraftTree:
    return grow(root, [3, 2], expand_static, draft)


def dynamic_tree(root: int, draft: torch.Tensor = DRAFT) -> DraftTree:
    return keep_best(grow(root, [3, 3, 3], expand_dynamic, draft), 7)[0]  # EAGLE-2: top_k 3, depth 3, 7 nodes


def lopsided_tree(root: int, draft: torch.Tensor = DRAFT) -> DraftTree:
    """Three children of the root; a chain of two below the first one only."""
    return grow(root, [3, 1, 1], lambda t, f, p, w: expand_static(t, f[:1], p[:1], w), draft)


SHAPES = {"static-3x2": static_tree, "dynamic": dynamic_tree, "lopsided": lopsided_tree}


def target_rows(tree: DraftTree, root: int, table: torch.Tensor = TARGET) -> torch.Tensor:
    """p_target (N+1, V): after the root, then after each node (the language looks one token back)."""
    return table[[root] + tree.token_ids]


class Language:
    """One shape's trees and target rows for every possible root, built once."""

    def __init__(self, shape, table: torch.Tensor = TARGET, draft: torch.Tensor = DRAFT) -> None:
        self.trees = [shape(root, draft) for root in range(V)]
        self.rows = [target_rows(tree, root, table) for root, tree in enumerate(self.trees)]

    def cycle(self, root: int, g: torch.Generator, remove_rejected: bool = True) -> tuple[DraftTree, TreeDecision]:
        return self.trees[root], accept_tree(self.trees[root], self.rows[root], g, remove_rejected)

    def generate(self, n: int, g: torch.Generator, remove_rejected: bool = True) -> list[int]:
        """The first n committed tokens after FIRST_ROOT: as many cycles as it takes, each one's root
        the last token committed (a cycle commits its path tokens, then the next token)."""
        out = [FIRST_ROOT]
        while len(out) <= n:
            tree, d = self.cycle(out[-1], g, remove_rejected)
            out += committed(tree, d)
        return out[1: n + 1]


def test_the_trees_have_the_intended_shapes():
    assert [len(static_tree(r)) for r in range(V)] == [9] * V
    assert all(static_tree(r).depths == [1, 1, 1, 2, 2, 2, 2, 2, 2] for r in range(V))
    assert [len(dynamic_tree(r)) for r in range(V)] == [7] * V
    assert dynamic_tree(FIRST_ROOT).parents == [ROOT, ROOT, ROOT, 0, 0, 1, 1]  # node 2: a leaf at depth 1
    assert lopsided_tree(FIRST_ROOT).parents == [ROOT, ROOT, ROOT, 0, 3]
    # after FIRST_ROOT the draft proposes 1, 4, 2; the target's token 0 (0.25) is none of them: residual draws
    assert static_tree(FIRST_ROOT).token_ids[:3] == [1, 4, 2]
    torch.testing.assert_close(TARGET.sum(1), torch.ones(V))  # hand-written rows: distributions to rounding
    torch.testing.assert_close(DRAFT.sum(1), torch.ones(V))


@pytest.mark.parametrize("shape", SHAPES)
def test_every_walk_tries_and_accepts_as_the_contract_says(shape):
    """Over many seeded walks: the tried record and the path obey the contract's checks."""
    lang = Language(SHAPES[shape])
    g = gen(11)
    for i in range(600):
        root = i % V
        tree, d = lang.cycle(root, g)
        row = TARGET[root]  # the unmodified target row of the node whose children are tried
        rejected_mass = 0.0
        expected_order = tree.children(ROOT)
        for t in d.tried:
            assert t.node == expected_order[0] and 0 <= t.u < 1 and t.accepted == (t.u < t.p_residual)
            p = float(row[tree.token_ids[t.node]])
            # the contract: a later sibling is tried with p / (1 - mass of the siblings rejected before it)
            # rel 1e-5: float32 renormalisations (about 1e-7 relative each) against this float64 formula
            assert t.p_residual == pytest.approx(p / (1 - rejected_mass), rel=1e-5)
            if t.accepted:
                rejected_mass, row = 0.0, TARGET[tree.token_ids[t.node]]
                expected_order = tree.children(t.node)
            else:
                rejected_mass += p
                expected_order = expected_order[1:]
        assert d.path == [t.node for t in d.tried if t.accepted]
        assert [tree.parents[n] for n in d.path] == ([ROOT] + d.path)[: len(d.path)]
        last = d.path[-1] if d.path else ROOT
        assert d.next_token_kind == (NEXT_BONUS if not tree.children(last) else NEXT_RESIDUAL)
        assert (d.residual_probs is None) == (d.next_token_kind == NEXT_BONUS)
        assert not expected_order  # a residual only after every sibling failed; a bonus at a leaf


# ---------------------------------------------------------------- exactness by chi-square

# 5000 runs per shape: the pair test (36 cells, 35 degrees of freedom, alpha 1e-3) then has power 0.9 against
# any deviation with w^2 = sum (p1 - p0)^2 / p0 >= 0.011 (noncentrality 5000 w^2 >= 55, engine.teaching.power).
# The broken rule's first-token law has w^2 = 0.19 here: 2000 runs give a noncentrality of about 370 against a
# critical value of 36 (5 dof, alpha 1e-6), caught with certainty. A run costs about 0.35 ms on 1 thread.
TRIALS, BROKEN_TRIALS = 5000, 2000
EXACT_SHAPES = ["static-3x2", "dynamic"]  # the dynamic tree has a leaf at depth 1: a bonus as the second token


def exact_chain(n: int) -> torch.Tensor:
    """p(x1) p(x2 | x1) ... p(xn | x(n-1)) after FIRST_ROOT, as a (V,) * n table."""
    law = TARGET[FIRST_ROOT].double()
    for _ in range(n - 1):
        law = law[..., None] * TARGET.double()  # broadcasts (V,)*k x (V, V) to (V,)*(k+1)
    return law


def sample_counts(shape: str, remove_rejected: bool, trials: int, seed: int = 2024) -> torch.Tensor:
    """Counts (V, V) of the first two committed tokens over `trials` independent runs."""
    lang, g = Language(SHAPES[shape]), gen(seed)
    counts = torch.zeros(V, V)
    for _ in range(trials):
        x1, x2 = lang.generate(2, g, remove_rejected)
        counts[x1, x2] += 1
    return counts


@pytest.fixture(scope="module")
def counts() -> Callable[..., torch.Tensor]:
    """Sampled once per (shape, rule), shared by the first-token and the pair tests."""
    cache: dict = {}

    def get(shape: str, remove_rejected: bool = True) -> torch.Tensor:
        if (shape, remove_rejected) not in cache:
            trials = TRIALS if remove_rejected else BROKEN_TRIALS
            cache[shape, remove_rejected] = sample_counts(shape, remove_rejected, trials)
        return cache[shape, remove_rejected]
    return get


def first_n(pair_counts: torch.Tensor, n: int) -> torch.Tensor:
    """(V,) counts of the first token for n = 1, the (V, V) pair counts for n = 2."""
    return pair_counts.sum(1) if n == 1 else pair_counts


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("shape", EXACT_SHAPES)
def test_committed_tokens_follow_the_target(counts, shape, n):
    """The first committed token, and the first two: the second comes from the path (an accepted node
    at depth 2), from the next-token draw at depth 1 (a bonus at a leaf or a residual), or from the
    next cycle when the first committed only one token. Together they must follow p(x1) p(x2 | x1)."""
    result = chi_square(first_n(counts(shape), n), exact_chain(n))
    assert result.p_value > 1e-3, f"{shape}: the first {n} tokens fail chi-square, p={result.p_value:.2g}"


@pytest.mark.parametrize("n", [1, 2])
def test_chi_square_catches_a_residual_that_keeps_rejected_siblings(counts, n):
    result = chi_square(first_n(counts("static-3x2", remove_rejected=False), n), exact_chain(n))
    assert result.p_value < 1e-6, f"the broken rule passed chi-square, p={result.p_value:.2g}"


# ---------------------------------------------------------------- T = 0: the greedy chain

def greedy_table(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random one-hot target (its argmax per previous token) and a noisy draft, right only part of the time."""
    scores = torch.rand(V, V, generator=gen(seed))
    target = torch.nn.functional.one_hot(scores.argmax(-1), V).float()  # (V, V) one-hot rows
    draft = torch.softmax(2 * scores + 3 * torch.rand(V, V, generator=gen(seed + 100)), -1)
    return target, draft


@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_rows_commit_the_longest_argmax_path_plus_the_argmax_after_it(shape):
    accepted_lengths = set()
    for seed in range(8):
        target, draft = greedy_table(seed)
        lang = Language(SHAPES[shape], target, draft)
        for root in range(V):
            greedy = [root]
            for _ in range(5):
                greedy.append(int(target[greedy[-1]].argmax()))
            tree, d = lang.cycle(root, gen(seed))
            # the longest path of the tree spelling greedy[1:], found independently of the walk
            node, depth = ROOT, 0
            while match := [c for c in tree.children(node) if tree.token_ids[c] == greedy[depth + 1]]:
                node, depth = match[0], depth + 1
            assert len(d.path) == depth and committed(tree, d) == greedy[1: depth + 2]
            assert all(t.p_residual == float(t.accepted) for t in d.tried)  # at T=0: 1 when accepted, else 0
            accepted_lengths.add(depth)
    assert {0, 1, 2} <= accepted_lengths  # no accept, a partial path and a path to depth 2 all happened
