"""A draft tree for a run about to start, sized from this machine's measured verify-cost curve.

The model, in four steps.

1. What one level of a tree accepts. A tree node's children are the draft's B most likely tokens,
   each a one-hot proposal, tried in order (docs/trees.md, the acceptance walk). The first is
   accepted with probability p_target(c1); if it is not, it leaves the residual and the second is
   accepted with p_target(c2) / (1 - p_target(c1)), so with probability p_target(c2) overall; and
   so on. The level therefore accepts one of its children with probability a(B) = sum over the
   draft's top B tokens of p_target. At T=0 p_target is one-hot and a(B) is 1 when the target's
   argmax is among the draft's top B, else 0.

2. Estimating a(B) from a chain pilot. Position i of a chain cycle (1-based) was tested in a context
   the run really committed when every draft token before it was accepted: positions 1 to
   num_accepted + 1 (the rejected one included; past it the draft ran on a token that was thrown
   away). At each such position the record keeps the draft's top tokens (`draft_top`) and the
   target's (`target_top`), both at most `trace_top_k` long (SpecSettings.trace_top_k: 10 by
   default, at most MAX_TRACE_TOP_K = 100; zero-probability entries are left out). So B can be at
   most trace_top_k, and a draft token missing from the target's list has a target probability
   below the smallest one listed: it counts 0 (or the record's `p_target` when it is the token the
   chain drafted there), so the estimate is a lower bound; `high` counts each such token at the
   most it could have. The pilot raises trace_top_k to PILOT_TOP_K to keep the two close. A full
   accept's last position (the bonus) has no draft row in the record and is not used.
   At T=0 (and with top-k or top-p) the chain's draft rows are its warped distribution, one-hot at
   T=0, while a tree ranks children by the plain softmax at the run's temperature (1 when greedy,
   engine/tree/draft.py). The pilot then ranks the draft's tokens at every tested position itself,
   with one draft forward over the committed sequence, and puts those rows in the records.

3. Tokens per cycle. A static tree with branching (B1..BD) reaches depth d with probability
   prod_{j<=d} a(Bj) if acceptance is independent across depths, so a cycle commits on average
   1 + sum_{d=1..D} prod_{j<=d} a(Bj) tokens (the 1 is the bonus or residual token). A chain of K is
   B = (1,)*K and this is then 1 + alpha + ... + alpha^K = (1 - alpha^(K+1)) / (1 - alpha), the
   chain's own expectation (engine.trace.metrics.expected_tokens_per_cycle).

4. Cost and speedup. A tree cycle runs D draft forwards, the one at depth d over the nodes of level
   d-1 (the root alone at depth 1), and one target verify over N+1 positions. Each draft forward
   costs the calibration's draft step at width 1 and the measured draft curve at wider widths
   (every draft forward costs one draft step when the calibration has no draft curve); the verify
   is read off the measured verify curve. Both curves are interpolated linearly between measured
   widths and never extrapolated: a tree wider than the widest measured width is not considered.
   Speedup over plain decoding = tokens per cycle / (cycle time / t_step).

Candidates: every non-increasing static branching (wider near the root, where acceptance is still
likely) up to MAX_DEPTH deep with each B at most MAX_BRANCHING and at most MAX_TREE_NODES nodes,
some B >= 2 (all-ones are the chains); the chains K = 1..8, rated with the pilot's alpha at the
committed positions (a chain samples its draft token, so its acceptance is the mean beta, which
equals a(1) at T=0); and plain decoding (K = 0). That is under a hundred shapes (85), so all are rated
and the best kept: no greedy growth whose order could miss a better shape.

Where it can be wrong: acceptance comes in streaks, so depths are not independent (the product
underrates deep trees and chains on easy text and overrates them on hard text); a pilot of a few
dozen positions gives a(B) to about +-0.1; the curves time causal forwards, while a tree's verify
and draft levels run under a tree mask; the acceptance walk, compaction and the per-level ranking
are not timed (as the chain's refined prediction leaves out the acceptance test and rollback).
"""
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import combinations_with_replacement
from statistics import fmean

import torch

from engine.config import SpecSettings, TreeSpec
from engine.cycle.pair import Pair
from engine.cycle.reference import speculative_generate
from engine.models.loading import LoadedModel
from engine.stats.analysis import calibration_of
from engine.trace.schema import DRAFT_MODEL, MAX_TREE_NODES, STATIC_TREE
from engine.tree.draft import confidence

MAX_BRANCHING = 4  # children per node the advisor considers (a(B) is estimated for B = 1..4)
MAX_DEPTH = 8  # as deep as the longest chain it compares with
CHAIN_KS = range(1, 9)
PILOT_TOP_K = 20  # top-list length the pilot records: a missing draft token then has p_target <= the 20th
TREE_PILOT_TOKENS = 32  # a(B) for four B from about 30 positions: each to about +-0.1
PLAIN, CHAIN, TREE = "plain", "chain", "tree"


# ---------------------------------------------------------------- a(B) from chain records

@dataclass(frozen=True)
class BranchAcceptance:
    """a(B): the chance one of the draft's top-B tokens is accepted at a committed position."""

    low: tuple[float, ...]  # index B-1; a draft token missing from the target's top list counts 0
    high: tuple[float, ...]  # the same, counting each missing token at the most it can be
    positions: int  # tested positions averaged over
    chain_alpha: float  # mean beta at the tested drafted positions: a sampled chain's acceptance there

    def describe(self) -> str:
        values = ", ".join(f"{a:.2f}" for a in self.low)
        return (f"a(B) for B = 1..{len(self.low)}: {values}, and a chain's alpha {self.chain_alpha:.2f}, "
                f"over {self.positions} pilot positions")


def tested_positions(cycle: dict) -> int:
    """Positions 1..num_accepted+1 of a chain cycle, as far as the record has both top lists."""
    return min(cycle["num_accepted"] + 1, len(cycle["draft_top"]), len(cycle["target_top"]))


def position_acceptance(cycle: dict, i: int, max_b: int, listed: int) -> tuple[list[float], list[float]]:
    """(low, high) a(B) for B = 1..max_b at 0-based position i of a chain record.

    `listed` is the trace_top_k the record was written with: a target row that long may leave out
    tokens of probability up to its smallest entry; a shorter one left out only zeros."""
    row = {e["token_id"]: e["p"] for e in cycle["target_top"][i]}
    if i < len(cycle["draft_token_ids"]):  # the drafted token's own p_target is always recorded
        row.setdefault(cycle["draft_token_ids"][i], cycle["p_target"][i])
    listed_row = cycle["target_top"][i]
    ceiling = min(e["p"] for e in listed_row) if len(listed_row) >= listed else 0.0
    room = max(0.0, 1.0 - sum(e["p"] for e in listed_row))  # mass outside the listed tokens
    children = [e["token_id"] for e in cycle["draft_top"][i]]
    low, high = [], []
    for b in range(1, max_b + 1):
        known = [row[t] for t in children[:b] if t in row]
        unknown = b - len(known)  # missing from the target's list, or from the draft's
        low.append(min(1.0, sum(known)))
        high.append(min(1.0, sum(known) + min(unknown * ceiling, room)))
    return low, high


def acceptance_by_branching(cycles: list[dict], listed: int, max_b: int = MAX_BRANCHING) -> BranchAcceptance:
    """a(B) for B = 1..max_b averaged over every tested position of chain records (see the docstring)."""
    if not 1 <= max_b <= listed:
        raise ValueError(f"a(B) up to B={max_b} needs top lists of at least {max_b} entries; the records keep {listed}")
    lows, highs, betas = [], [], []
    for c in cycles:
        for i in range(tested_positions(c)):
            low, high = position_acceptance(c, i, max_b, listed)
            lows.append(low)
            highs.append(high)
        betas += c["beta"][: min(c["num_accepted"] + 1, len(c["beta"]))]
    if not lows:
        raise ValueError("the pilot tested no position: a(B) cannot be estimated")
    low, high = column_means(lows), column_means(highs)
    return BranchAcceptance(low, high, len(lows), fmean(betas) if betas else low[0])


def column_means(rows: list[list[float]]) -> tuple[float, ...]:
    return tuple(fmean(column) for column in zip(*rows))


# ---------------------------------------------------------------- shapes and tokens per cycle

def level_widths(branching: Sequence[int]) -> list[int]:
    """Nodes at depth 1..D of a static tree."""
    widths, width = [], 1
    for b in branching:
        width *= b
        widths.append(width)
    return widths


def node_count(branching: Sequence[int]) -> int:
    return sum(level_widths(branching))


def fed_widths(branching: Sequence[int]) -> list[int]:
    """Width of each draft forward: the root alone, then every level but the deepest."""
    return [1, *level_widths(branching)[:-1]] if branching else []


def expected_tree_tokens(branching: Sequence[int], a_of_b: Sequence[float]) -> float:
    """1 + sum_d prod_{j<=d} a(B_j): tokens a cycle commits if depths accept independently.
    a_of_b[B-1] is a(B)."""
    total, reach = 1.0, 1.0
    for b in branching:
        reach *= a_of_b[b - 1]
        total += reach
    return total


def tree_family(max_b: int = MAX_BRANCHING, max_depth: int = MAX_DEPTH,
                max_nodes: int = MAX_TREE_NODES) -> list[tuple[int, ...]]:
    """Every non-increasing branching with some B >= 2, each B <= max_b, at most max_nodes nodes."""
    family = []
    for depth in range(1, max_depth + 1):
        for shape in combinations_with_replacement(range(max_b, 0, -1), depth):  # non-increasing tuples
            if shape[0] >= 2 and node_count(shape) <= max_nodes:
                family.append(shape)
    return family


# ---------------------------------------------------------------- measured costs

@dataclass(frozen=True)
class WidthCurve:
    """Seconds of one forward at measured widths; linear in between, unknown outside."""

    widths: tuple[int, ...]
    seconds: tuple[float, ...]

    def at(self, width: int) -> float | None:
        """The time at `width`, interpolated linearly between the nearest measured widths;
        None below the narrowest or beyond the widest (never extrapolated)."""
        if not self.widths or not self.widths[0] <= width <= self.widths[-1]:
            return None
        j = bisect_left(self.widths, width)
        if self.widths[j] == width:
            return self.seconds[j]
        (w0, w1), (t0, t1) = self.widths[j - 1:j + 1], self.seconds[j - 1:j + 1]
        return t0 + (t1 - t0) * (width - w0) / (w1 - w0)


@dataclass(frozen=True)
class TreeCosts:
    target_step_s: float  # one plain decoding step (with sampling)
    draft_step_s: float  # one draft forward over 1 token
    verify: WidthCurve  # the target over n positions
    draft: WidthCurve | None  # the draft over n positions; None: every forward costs draft_step_s

    def draft_forward(self, width: int) -> float | None:
        if width == 1 or self.draft is None:
            return self.draft_step_s
        return self.draft.at(width)

    def cycle_s(self, branching: Sequence[int]) -> float | None:
        """One cycle's seconds: a draft forward per depth and one verify; None if a width was not measured."""
        verify = self.verify.at(node_count(branching) + 1)
        drafts = [self.draft_forward(w) for w in fed_widths(branching)]
        if verify is None or None in drafts:
            return None
        return sum(drafts) + verify


def draft_curve_of(raw: dict) -> WidthCurve | None:
    """The calibration's optional draft curve (calibrate_widths' draft_positions and draft_s)."""
    if "draft_positions" not in raw and "draft_s" not in raw:
        return None
    try:
        widths, seconds = [int(w) for w in raw["draft_positions"]], [float(t) for t in raw["draft_s"]]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"the calibration's draft curve is malformed: {err!r}") from None
    if not widths or len(widths) != len(seconds) or widths != sorted(set(widths)) or widths[0] < 1:
        raise ValueError("the calibration's draft_positions must be distinct increasing widths, one per draft_s")
    if min(seconds) <= 0:
        raise ValueError("the calibration's draft curve has a time that is not positive")
    return WidthCurve(tuple(widths), tuple(seconds))


def costs_of(calibration: dict) -> TreeCosts:
    """A calibration as a header stores it (calibrate or calibrate_widths), as tree costs; ValueError if malformed."""
    cal = calibration_of({"calibration": calibration})
    if cal.verify_positions != sorted(set(cal.verify_positions)):
        raise ValueError("the calibration's verify_positions must be distinct and increasing")
    return TreeCosts(cal.target_step_s, cal.draft_step_s, WidthCurve(tuple(cal.verify_positions),
                                                                      tuple(cal.verify_s)), draft_curve_of(calibration))


# ---------------------------------------------------------------- the advisor

@dataclass(frozen=True)
class Candidate:
    kind: str  # PLAIN, CHAIN or TREE
    branching: tuple[int, ...]  # children per depth: () for plain decoding, (1,)*K for a chain
    tokens_per_cycle: float
    cycle_steps: float  # one cycle's time in target steps
    speedup: float  # predicted, over plain decoding

    @property
    def nodes(self) -> int:
        return node_count(self.branching)

    @property
    def depth(self) -> int:
        return len(self.branching)

    @property
    def text(self) -> str:
        """How a run is told to do it: K=0, K=3 or static:3,2,1."""
        if self.kind == TREE:
            return f"static:{','.join(map(str, self.branching))}"
        return f"K={self.depth}"


PLAIN_DECODING = Candidate(PLAIN, (), 1.0, 1.0, 1.0)  # one token per target step


def rate(kind: str, branching: tuple[int, ...], a_of_b: Sequence[float], costs: TreeCosts) -> Candidate | None:
    """A shape's predicted speedup; None when its widths lie outside the measured ones."""
    seconds = costs.cycle_s(branching)
    if seconds is None:
        return None
    tokens = expected_tree_tokens(branching, a_of_b)
    steps = seconds / costs.target_step_s
    return Candidate(kind, branching, tokens, steps, tokens / steps)


def best_of(candidates: list[Candidate]) -> Candidate | None:
    """The fastest; ties go to a chain, then to fewer nodes, then to a shallower shape."""
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c.speedup, c.kind == CHAIN, -c.nodes, -c.depth))


@dataclass(frozen=True)
class TreeAdvice:
    best: Candidate  # what to run: a tree, a chain or PLAIN_DECODING
    best_tree: Candidate | None  # None when no tree fits the measured widths
    best_chain: Candidate | None
    trees_rated: int
    sentence: str


def tree_candidates(a_of_b: Sequence[float], costs: TreeCosts, family: list[tuple[int, ...]]) -> list[Candidate]:
    usable = [b for b in family if max(b) <= len(a_of_b)]
    return [c for b in usable if (c := rate(TREE, b, a_of_b, costs)) is not None]


def chain_candidates(alpha: float, costs: TreeCosts) -> list[Candidate]:
    return [c for k in CHAIN_KS if (c := rate(CHAIN, (1,) * k, (alpha,), costs)) is not None]


def advise_tree(a_of_b: Sequence[float], calibration: dict, chain_alpha: float | None = None,
                family: list[tuple[int, ...]] | None = None) -> TreeAdvice:
    """The best of the tree family, the chains K=1..8 and plain decoding, for a(B) (a_of_b[B-1]),
    a calibration as a header stores it, and a chain's alpha (default a(1)). Plain decoding wins
    unless the best shape is predicted at least as fast."""
    costs = costs_of(calibration)
    trees = tree_candidates(a_of_b, costs, tree_family() if family is None else family)
    chains = chain_candidates(a_of_b[0] if chain_alpha is None else chain_alpha, costs)
    best_tree, best_chain = best_of(trees), best_of(chains)
    best = best_of([c for c in (best_tree, best_chain) if c is not None])
    if best is None or best.speedup < 1.0:
        best = PLAIN_DECODING
    return TreeAdvice(best, best_tree, best_chain, len(trees), tree_sentence(best, best_tree, best_chain))


def cost_words(c: Candidate) -> str:
    forwards = ("draft step" if c.kind == CHAIN else "draft forward") + ("s" if c.depth > 1 else "")
    return (f"a cycle costs {c.cycle_steps:.2f} target steps ({c.depth} {forwards} and one verify pass over "
            f"{c.nodes + 1} positions) and is expected to commit {c.tokens_per_cycle:.2f} tokens")


def shape_words(c: Candidate | None) -> str:
    if c is None:
        return "none fits the measured verify widths"
    if c.kind == TREE:
        return f"{c.text} ({c.nodes} nodes), is predicted at {c.speedup:.2f}x"
    return f"{c.text}, is predicted at {c.speedup:.2f}x"


def tree_sentence(best: Candidate, best_tree: Candidate | None, best_chain: Candidate | None) -> str:
    if best.kind == PLAIN:
        return ("Decode plainly (K=0): no tree or chain beats plain decoding on this machine. "
                f"The best tree, {shape_words(best_tree)}; the best chain, {shape_words(best_chain)}. "
                "Plain decoding commits one token per target step.")
    if best.kind == TREE:
        return (f"Draft a tree {best.text} ({best.nodes} nodes): predicted {best.speedup:.2f}x plain decoding; "
                f"{cost_words(best)}. The best chain, {shape_words(best_chain)}.")
    return (f"Draft a chain, {best.text}: predicted {best.speedup:.2f}x plain decoding; {cost_words(best)}. "
            f"The best tree, {shape_words(best_tree)}.")


# ---------------------------------------------------------------- the pilot (runs the models)

@dataclass(frozen=True)
class TreePlan:
    tree: TreeSpec | None  # the static tree to draft; None for a chain or plain decoding
    k: int  # the chain's K, 0 for plain decoding, the tree's depth for a tree
    advice: TreeAdvice
    acceptance: BranchAcceptance
    pilot_tokens: int
    sentence: str  # the advice, then what the pilot measured

    @property
    def plain(self) -> bool:
        return self.k == 0


def draft_rows_are_ranking(s: SpecSettings) -> bool:
    """Whether a chain record's draft rows rank tokens as tree drafting does: sampling, unfiltered."""
    return s.temperature > 0 and s.top_k == 0 and s.top_p == 1.0


def ranked_rows(draft: LoadedModel, ids: list[int], s: SpecSettings, n_top: int) -> list[list[dict]]:
    """Row j: the draft's top n_top tokens after ids[:j+1], ranked as engine/tree/draft.py's
    `confidence` ranks children: it is that function."""
    probs = confidence(draft.forward(ids, draft.new_cache()), s)  # (T, V)
    values, tokens = torch.topk(probs, min(n_top, probs.shape[-1]), dim=-1)
    return [[{"token_id": t, "p": v} for v, t in zip(vs, ts) if v > 0]
            for vs, ts in zip(values.tolist(), tokens.tolist())]


def with_draft_rows(cycles: list[dict], rows: list[list[dict]]) -> list[dict]:
    """The records with `draft_top` replaced at their tested positions by `rows` (row j: after
    committed token j). Position i of a cycle starting at committed length C follows token C+i-2;
    positions past the committed tokens (a cut at the budget) are left out."""
    out = []
    for c in cycles:
        last = c["committed_len_before"] - 2  # + i: the row after the last token position i sees
        upto = min(c["num_accepted"] + 1, len(c["committed_token_ids"]) + 1)
        out.append({**c, "draft_top": [rows[last + i] for i in range(1, upto + 1)]})
    return out


def pilot_cycles(pair: Pair, prompt_ids: list[int], s: SpecSettings, tokens: int) -> tuple[list[dict], int]:
    """A chain pilot at the settings' K over the first `tokens` tokens, with its draft rows ranked
    as a tree ranks children; returns the records and the top-list length they were written with."""
    if pair.draft is None or pair.drafter.kind != DRAFT_MODEL:
        raise ValueError("a draft tree is drafted by a draft model sharing the target's tokens; this pair has none")
    listed = max(s.trace_top_k, PILOT_TOP_K)
    pilot = replace(s, max_new_tokens=min(tokens, s.max_new_tokens), trace_top_k=listed)
    cycles = list(speculative_generate(pair, prompt_ids, pilot))
    if draft_rows_are_ranking(s):
        return cycles, listed
    committed = list(prompt_ids) + [t for c in cycles for t in c["committed_token_ids"]]
    return with_draft_rows(cycles, ranked_rows(pair.draft, committed, s, listed)), listed


def tree_plan_from(acceptance: BranchAcceptance, calibration: dict, pilot_tokens: int) -> TreePlan:
    """The advisor's choice for a measured a(B) and a calibration as a header stores it."""
    advice = advise_tree(acceptance.low, calibration, acceptance.chain_alpha)
    best = advice.best
    tree = TreeSpec(STATIC_TREE, branching=best.branching) if best.kind == TREE else None
    sentence = f"{advice.sentence} Measured: {acceptance.describe()}."
    return TreePlan(tree, best.depth, advice, acceptance, pilot_tokens, sentence)


def plan_tree(pair: Pair, prompt_ids: list[int], s: SpecSettings, calibration: dict,
              tokens: int = TREE_PILOT_TOKENS) -> TreePlan:
    """Pilot (a chain at the settings' K, output thrown away), a(B), and the advisor's pick."""
    cycles, listed = pilot_cycles(pair, prompt_ids, s, tokens)
    return tree_plan_from(acceptance_by_branching(cycles, listed), calibration, tokens)
