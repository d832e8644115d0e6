"""One tree cycle: draft a tree, verify every node in one target pass, walk it, commit, compact.

The chain's cycle (engine/cycle/reference.py) is untouched; a run with a tree spec runs
these cycles instead and writes tree cycle records (the `tree` entry below). The cache
convention is the chain's: after each cycle both caches hold the committed sequence but
its last token, which is the next cycle's root. What drafts the trees is the pair's
drafter kind's TreeProposer (engine/tree/draft.py): the draft model, or the EAGLE head
(engine/tree/eagle.py), whose verify pass also yields the target's features. Records are
the same for both.
"""
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from engine.config import SettingsError, SpecSettings, TreeSpec
from engine.cycle.reference import Pair, RunState, TokenTexts, cycle_layout_fields, layout_states
from engine.kv.layouts import CacheLayout, new_cache
from engine.kv.ops import cache_len, prefill
from engine.models.device import timed
from engine.models.sampling import warp_probs
from engine.trace.commit import final_tokens
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


def start_tree_run(pair: Pair, prompt_ids: list[int], s: SpecSettings, spec: TreeSpec) -> RunState:
    if not prompt_ids:
        raise ValueError("the prompt is empty: at least one token is needed to start decoding")
    proposer = tree_proposer(pair)
    layout = tree_layout(s, spec, len(prompt_ids))
    target_cache = new_cache(layout, pair.target.model.config)
    features = None  # the prefill's top features (len(prompt) - 1, H), for a proposer that reads them
    if proposer.reads_target_features and len(prompt_ids) > 1:
        features = pair.target.fill_with_features(prompt_ids[:-1], target_cache)
    else:
        prefill(pair.target, prompt_ids, target_cache)
    return RunState(list(prompt_ids), target_cache, proposer.start(prompt_ids, layout, features))


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
    """What one cycle did, before it is written down."""

    draft: TreeDraft
    p_target: torch.Tensor  # (N+1, V) warped: row 0 after the root, row 1+i after node i
    decision: TreeDecision
    committed: list[int]
    lengths: dict  # target and draft cache lengths before / after append / after compaction
    compaction: dict
    times: dict
    layout_fields: dict  # the static and paged layouts' states (none for a dynamic cache)


def run_tree_step(pair: Pair, state: RunState, s: SpecSettings, spec: TreeSpec, gen: torch.Generator,
                  rollback: Rollback = compact) -> TreeStep:
    start_time = time.perf_counter()
    proposer = tree_proposer(pair)
    draft_cache = proposer.cache(state.draft_state)
    root, before = state.committed[-1], len(state.committed) - 1
    draft_before = cache_len(draft_cache)
    layout_before = layout_states(state.target_cache, draft_cache)
    draft = proposer.draft(state.draft_state, root, spec, s)
    draft_appended, draft_layout_appended = cache_len(draft_cache), layout_states(None, draft_cache)[1]
    (logits, features), verify_s = timed(lambda: verify_pass(pair, proposer, root, draft.tree, state.target_cache),
                                         pair.target.device)
    p_target = warp_probs(logits, s).cpu()
    target_appended, target_layout_appended = cache_len(state.target_cache), layout_states(state.target_cache, None)[0]
    decision = accept_tree(draft.tree, p_target, gen)
    path_tokens = [draft.tree.token_ids[i] for i in decision.path]
    committed, state.finished = final_tokens(path_tokens + [decision.next_token_id],
                                             s.max_new_tokens - len(state.generated), pair.eos_ids)
    state.committed += committed
    state.generated += committed
    kept = path_slots(before, decision.path, len(committed))
    moves = rollback(state.target_cache, before, kept)
    draft_compaction, catch_up_s = proposer.roll_back(state.draft_state, draft, decision.path, state.committed,
                                                      features, rollback)
    lengths = {"target": {"before": before, "after_append": target_appended, "after_rollback": cache_len(state.target_cache)},
               "draft": {"before": draft_before, "after_append": draft_appended,
                         "after_rollback": cache_len(draft_cache)}}
    compaction = {"target": {"kept_slots": slots_held(before, len(kept), moves), "moves": [list(m) for m in moves]},
                  "draft": draft_compaction}
    times = {"verify_s": verify_s, "catch_up_s": catch_up_s, "cycle_s": time.perf_counter() - start_time}
    layout_fields = cycle_layout_fields(state.target_cache, draft_cache, layout_before,
                                        (target_layout_appended, draft_layout_appended))
    return TreeStep(draft, p_target, decision, committed, lengths, compaction, times, layout_fields)


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


def tree_record(cycle: int, step: TreeStep, state: RunState, s: SpecSettings, texts: TokenTexts) -> dict:
    """A tree cycle's trace record: the chain's shared fields, and `tree`."""
    n = len(step.draft.tree)
    return {
        "type": "cycle", "cycle": cycle, "committed_len_before": len(state.committed) - len(step.committed),
        "num_accepted": len(step.decision.path), "committed_token_ids": step.committed,
        "committed_token_texts": texts.many(step.committed), "finished": state.finished,
        "next_token_text": texts(step.decision.next_token_id),
        "target_cache_len": step.lengths["target"], "draft_cache_len": step.lengths["draft"], **step.layout_fields,
        "draft_catch_up": step.times["catch_up_s"] > 0, "verify_positions": n + 1,
        "draft_time_s": sum(step.draft.step_times_s), "draft_step_times_s": step.draft.step_times_s,
        "verify_time_s": step.times["verify_s"], "catch_up_time_s": step.times["catch_up_s"],
        "cycle_time_s": step.times["cycle_s"], "tree": tree_entry(step, s, texts),
    }


def run_tree_cycle(pair: Pair, state: RunState, s: SpecSettings, spec: TreeSpec, gen: torch.Generator,
                   cycle: int, texts: TokenTexts, rollback: Rollback = compact) -> dict:
    """Run one tree cycle; return its trace record."""
    return tree_record(cycle, run_tree_step(pair, state, s, spec, gen, rollback), state, s, texts)


def tree_generate(pair: Pair, prompt_ids: list[int], s: SpecSettings, spec: TreeSpec,
                  rollback: Rollback = compact) -> Iterator[dict]:
    """Yield one tree cycle record per cycle until EOS or max_new_tokens. `rollback` is the
    compaction; the teaching code alone passes a broken one (engine/teaching/faults.py)."""
    check_tree_run(pair, spec)
    gen = torch.Generator().manual_seed(s.seed)
    texts = TokenTexts(pair.target.tokenizer)
    state = start_tree_run(pair, prompt_ids, s, spec)
    cycle = 0
    while not state.finished:
        yield run_tree_cycle(pair, state, s, spec, gen, cycle, texts, rollback)
        cycle += 1
