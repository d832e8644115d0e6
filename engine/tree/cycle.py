"""The tree's cycle kind: draft a tree, verify every node in one target pass, walk it, compact.

`TreeCycle` plugs into the one driver (engine/cycle/driver.py), which commits and builds the
record (engine/cycle/trace_record.py) as for a chain; its description adds the `tree` entry built
here. Teaching faults reach it as they reach the chain: a CycleRule, whose `tree_rollback`
replaces the compaction (engine/teaching/faults.py TreeFaults). The cache
convention is the chain's: after each cycle both caches hold the committed sequence but
its last token, which is the next cycle's root. What drafts the trees is the pair's
drafter kind's TreeProposer (engine/tree/draft.py): the draft model, or the EAGLE head
(engine/tree/eagle.py), whose verify pass also yields the target's features. Records are
the same for both.
"""
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import torch

from engine.config import SettingsError, SpecSettings, TreeSpec
from engine.cycle import driver
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.ratio_test import RATIO_TEST, CycleRule
from engine.cycle.reference import RunState
from engine.cycle.step import CycleStep, Settled
from engine.drafters.refusals import MIS_SET_CHAIN_ONLY
from engine.kv.layouts import CacheLayout, cycle_layout_fields, layout_states, new_cache
from engine.kv.ops import cache_len, prefill
from engine.models.device import timed
from engine.models.sampling import warp_probs
from engine.trace.schema import DRAFT_MODEL, EAGLE, ROOT
from engine.tree.accept import TreeDecision, accept_tree
from engine.tree.attention import verify_tree, verify_tree_with_features
from engine.tree.compact import Rollback, compact, slots_held
from engine.tree.draft import ModelTreeProposer, TreeDraft, TreeProposer
from engine.tree.eagle import EagleTreeProposer
from engine.tree.shape import DraftTree


def tree_proposer(pair: Pair) -> TreeProposer:
    """What drafts this pair's trees: a drafter with a distribution over the target's tokens to rank
    children by, and a cache over the target's positions to put a tree mask on."""
    kind = pair.drafter.kind
    if getattr(pair.drafter, "mis_set", False):  # the tree drafts with the draft model, not through its variants
        raise SettingsError(MIS_SET_CHAIN_ONLY)
    if kind == DRAFT_MODEL and pair.draft is not None:
        return ModelTreeProposer(pair.draft)
    if kind == EAGLE:
        return EagleTreeProposer(pair.drafter)
    raise SettingsError(f"--tree drafts with the draft model or the EAGLE head, which rank each node's children by "
                        f"their distribution over the target's tokens; the {kind} drafter proposes chains only")


def check_tree_run(pair: Pair, spec: TreeSpec) -> None:
    """Refuse a drafter that cannot draft trees (prompt lookup, a draft with its own tokenizer), saying why."""
    tree_proposer(pair)


def tree_layout(s: SpecSettings, spec: TreeSpec, prompt_len: int) -> CacheLayout:
    """The run's cache layout, sized for a verify that appends every node and the root."""
    return CacheLayout(s.cache_layout, prompt_len + s.max_new_tokens + spec.max_nodes + 1, s.block_size)


def verify_pass(pair: Pair, proposer: TreeProposer, root: int, tree: DraftTree,
                cache) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target's one tree pass: (N+1, V) logits, and its top features (N+1, H) when the proposer reads them."""
    if proposer.reads_target_features:
        return verify_tree_with_features(pair.target, root, tree, cache)
    return verify_tree(pair.target, root, tree, cache), None


def path_slots(start: int, path: list[int], keep: int) -> list[int]:
    """The target cache's slots to keep from `start` (the root's slot) on: root, then the path's nodes."""
    return [start, *(start + 1 + node for node in path)][:keep]


@dataclass
class TreeStep:
    """What one tree cycle drafted and decided, for its settle and its record."""

    draft: TreeDraft
    p_target: torch.Tensor  # (N+1, V) warped: row 0 after the root, row 1+i after node i
    decision: TreeDecision
    features: torch.Tensor | None  # (N+1, H) the verify's top features, for a proposer that reads them
    before: int  # the target cache's length before the cycle (the root's slot)
    draft_before: int
    draft_appended: int
    target_appended: int
    layout_before: tuple
    layout_appended: tuple
    compaction: dict | None = None  # filled by settle: both caches' kept slots and moves


@dataclass
class TreeCycle:
    """The tree's cycle: draft a tree, verify every node in one target pass, walk it, compact both caches.
    `rule` is the ratio test; a teaching fault's `tree_rollback` replaces the compaction."""

    pair: Pair
    settings: SpecSettings
    spec: TreeSpec
    rule: CycleRule = RATIO_TEST

    @cached_property
    def proposer(self) -> TreeProposer:
        return tree_proposer(self.pair)  # once per kind: a run's cycles share it

    @property
    def rollback(self) -> Rollback:
        return self.rule.tree_rollback or compact

    def check(self) -> None:
        check_tree_run(self.pair, self.spec)

    def start(self, prompt_ids: list[int]) -> RunState:
        pair, proposer = self.pair, self.proposer
        layout = tree_layout(self.settings, self.spec, len(prompt_ids))
        target_cache = new_cache(layout, pair.target.model.config)
        features = None  # the prefill's top features (len(prompt) - 1, H), for a proposer that reads them
        if proposer.reads_target_features and len(prompt_ids) > 1:
            features = pair.target.fill_with_features(prompt_ids[:-1], target_cache)
        else:
            prefill(pair.target, prompt_ids, target_cache)
        return RunState(list(prompt_ids), target_cache, proposer.start(prompt_ids, layout, features))

    def step(self, state: RunState, gen: torch.Generator, record: bool) -> CycleStep:
        proposer, s = self.proposer, self.settings
        draft_cache = proposer.cache(state.draft_state)
        root, before = state.committed[-1], len(state.committed) - 1
        draft_before = cache_len(draft_cache)
        layout_before = layout_states(state.target_cache, draft_cache)
        draft = proposer.draft(state.draft_state, root, self.spec, s)
        draft_appended, draft_layout_appended = cache_len(draft_cache), layout_states(None, draft_cache)[1]
        (logits, features), verify_s = timed(
            lambda: verify_pass(self.pair, proposer, root, draft.tree, state.target_cache), self.pair.target.device)
        p_target = warp_probs(logits, s).cpu()
        target_appended = cache_len(state.target_cache)
        target_layout_appended = layout_states(state.target_cache, None)[0]
        decision = accept_tree(draft.tree, p_target, gen)
        detail = TreeStep(draft, p_target, decision, features, before, draft_before, draft_appended, target_appended,
                          layout_before, (target_layout_appended, draft_layout_appended))
        path_tokens = [draft.tree.token_ids[i] for i in decision.path]
        return CycleStep(path_tokens, decision.next_token_id, None, len(draft.tree) + 1, draft.step_times_s,
                         verify_s, None, detail)

    def settle(self, state: RunState, step: CycleStep) -> Settled:
        t: TreeStep = step.detail
        proposer, before = self.proposer, t.before
        draft_cache = proposer.cache(state.draft_state)
        kept = path_slots(before, t.decision.path, len(state.committed) - 1 - before)
        moves = self.rollback(state.target_cache, before, kept)
        draft_compaction, catch_up_s = proposer.roll_back(state.draft_state, t.draft, t.decision.path,
                                                          state.committed, t.features, self.rollback)
        t.compaction = {"target": {"kept_slots": slots_held(before, len(kept), moves), "moves": [list(m) for m in moves]},
                        "draft": draft_compaction}
        return Settled(
            {"before": before, "after_append": t.target_appended, "after_rollback": cache_len(state.target_cache)},
            {"before": t.draft_before, "after_append": t.draft_appended, "after_rollback": cache_len(draft_cache)},
            cycle_layout_fields(state.target_cache, draft_cache, t.layout_before, t.layout_appended),
            catch_up_s > 0, catch_up_s)

    def describe(self, state: RunState, step: CycleStep, committed: list[int], texts: TokenTexts) -> dict:
        return {"committed_token_texts": texts.many(committed), "next_token_text": texts(step.next_token_id),
                "tree": tree_entry(step.detail, self.settings, texts)}


def top_entries(row: torch.Tensor, n: int, texts: TokenTexts) -> list[dict]:
    values, ids = torch.topk(row, min(n, row.shape[-1]))
    return [{"token_id": int(i), "text": texts(int(i)), "p": float(v)} for v, i in zip(values, ids) if v > 0]


def residual_entries(step: TreeStep, n: int, texts: TokenTexts) -> list[dict] | None:
    """The residual's top tokens (the sampled one always listed) beside the target's own probability."""
    d = step.decision
    if d.residual_probs is None:
        return None
    row = step.p_target[0 if not d.path else 1 + d.path[-1]]
    ids = [int(i) for i in torch.topk(d.residual_probs, min(n, row.shape[-1])).indices]
    ids = [i for i in ids if d.residual_probs[i] > 0 and i != d.next_token_id] + [d.next_token_id]
    return [{"token_id": i, "text": texts(i), "p_target": float(row[i]), "residual": float(d.residual_probs[i])}
            for i in ids]


def node_entries(tree: DraftTree, p_target: torch.Tensor, texts: TokenTexts) -> list[dict]:
    depths = tree.depths
    return [{"token_id": t, "text": texts(t), "parent": parent, "depth": depths[i], "q": tree.q[i],
             "score": tree.score[i], "p": float(p_target[0 if parent == ROOT else 1 + parent, t])}
            for i, (t, parent) in enumerate(zip(tree.token_ids, tree.parents))]


def tree_entry(step: TreeStep, s: SpecSettings, texts: TokenTexts) -> dict:
    d = step.decision
    return {
        "nodes": node_entries(step.draft.tree, step.p_target, texts),
        "tried": [{"node": t.node, "p_residual": t.p_residual, "u": t.u, "accepted": t.accepted} for t in d.tried],
        "path": list(d.path), "next_token_id": d.next_token_id, "next_token_kind": d.next_token_kind,
        "residual_top": residual_entries(step, s.trace_top_k, texts),
        "target_top": [top_entries(row, s.trace_top_k, texts) for row in step.p_target],
        "draft_forwards": len(step.draft.step_times_s), "compaction": step.compaction,
    }


def start_tree_run(pair: Pair, prompt_ids: list[int], s: SpecSettings, spec: TreeSpec,
                   rule: CycleRule = RATIO_TEST) -> RunState:
    """A tree run's state, prefilled, for callers that run cycles one by one."""
    return driver.start(TreeCycle(pair, s, spec, rule), prompt_ids)


def run_tree_cycle(pair: Pair, state: RunState, s: SpecSettings, spec: TreeSpec, gen: torch.Generator,
                   cycle: int, texts: TokenTexts, rule: CycleRule = RATIO_TEST, record: bool = True) -> dict:
    """One tree cycle through the driver; returns its trace record."""
    return driver.run_one_cycle(TreeCycle(pair, s, spec, rule), state, gen, cycle, texts, record)


def tree_generate(pair: Pair, prompt_ids: list[int], s: SpecSettings, spec: TreeSpec,
                  rule: CycleRule = RATIO_TEST, record: bool = True) -> Iterator[dict]:
    """Yield one tree cycle record per cycle until EOS or max_new_tokens."""
    return driver.generate(TreeCycle(pair, s, spec, rule), prompt_ids, record)
