"""After a tree, crop is not enough: the correct tree engine beside one that rolls back like a chain.

A chain's rollback cuts the cache to the committed length: the accepted draft tokens already
sit, in order, right after the root. A tree's verify writes every node side by side (node i
at slot L+1+i, level by level), so the accepted path sits in order only when it ran through
nodes 0, 1, 2, ... For any other path a crop keeps the K/V of nodes that were not accepted
(a rejected sibling, a cousin on another branch) in the slots of committed tokens, and every
later query attends to a text that was never written. The broken run here
(`TreeFaults(crop_instead_of_compact=True)`, engine/teaching/faults.py) does that to both
caches; the correct one compacts (engine/tree/compact.py).

After every cycle each run's caches are compared, slot by slot, with a fresh prefill of the
committed sequence (engine.kv.layouts.attended_kv on both, the check the tests make), and the
cycle notes whether its path left the first branch, the only case where the two rollbacks
differ. This module never writes a trace file.
"""
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from engine.config import SpecSettings, TreeSpec
from engine.cycle.driver import run_cycles, start
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.plain import target_generate
from engine.kv.layouts import attended_kv
from engine.kv.ops import cache_len, prefill
from engine.models.loading import LoadedModel
from engine.teaching.faults import NO_TREE_FAULTS, TreeFaults
from engine.teaching.runs import first_divergence
from engine.tree.cycle import TreeCycle

CORRECT, CROP = "correct", "crop_instead_of_compact"
TREE_MODES: dict[str, TreeFaults] = {CORRECT: NO_TREE_FAULTS, CROP: TreeFaults(crop_instead_of_compact=True)}
TREE_MODE_LABELS = {CORRECT: "correct engine (compacts)", CROP: "broken: crops like a chain"}
DEFAULT_TREE = "static:3,2,1"  # the rollback page's tree, stored for its defaults by scripts/make_teaching_results.py
# A slot matches when its K and V agree elementwise with the fresh prefill's within these: the tests'
# tolerance (tests/test_kv_layouts.py). The tree's batched forward and a one-pass prefill add in a
# different order, so float32 K/V differ around 1e-6; another token's K/V differs by far more than 1e-4.
KV_RTOL, KV_ATOL = 1e-4, 1e-5


@dataclass
class CacheCheck:
    """One cache after a cycle against a fresh prefill of the committed sequence but its last token."""

    slots: int  # attended slots the cache holds
    slots_differ: int  # slots whose K or V differs in any layer (a missing or extra slot counts too)
    first_differing: int | None

    @property
    def matches(self) -> bool:
        return self.slots_differ == 0


@dataclass
class TreeCycleCheck:
    cycle: int
    path: list[int]  # the accepted nodes
    committed_token_ids: list[int]
    committed_len: int  # after the cycle
    left_first_branch: bool  # a committed path node is not node j at depth j+1: a crop keeps the wrong K/V
    target: CacheCheck
    draft: CacheCheck


@dataclass
class TreeRunLog:
    mode: str
    generated: list[int]
    cycles: list[TreeCycleCheck]

    @property
    def bites(self) -> int:
        """Cycles whose path left the first branch: where crop and compaction keep different slots."""
        return sum(c.left_first_branch for c in self.cycles)

    @property
    def first_bite(self) -> int | None:
        return next((c.cycle for c in self.cycles if c.left_first_branch), None)

    @property
    def first_target_mismatch(self) -> int | None:
        return next((c.cycle for c in self.cycles if not c.target.matches), None)

    @property
    def tokens_per_cycle(self) -> float:
        return len(self.generated) / max(len(self.cycles), 1)


@dataclass
class TreeComparison:
    """The correct tree engine and the cropping one on one pair, prompt, settings and tree."""

    prompt_ids: list[int]
    settings: dict  # SpecSettings.to_dict(), K = the tree's depth
    tree: dict  # TreeSpec.describe()
    reference: list[int] | None  # plain greedy target decoding (temperature 0 only)
    runs: dict[str, TreeRunLog]
    texts: dict[int, str] = field(default_factory=dict)  # decoded text of every id shown

    @property
    def first_divergence(self) -> int | None:
        """The first generated token where the broken run differs from the correct one."""
        return first_divergence(self.runs[CROP].generated, self.runs[CORRECT].generated)


def left_first_branch(path: list[int], committed_count: int) -> bool:
    """Does compaction move anything? Path node j lands in slot L+1+j; it was written at L+1+path[j].
    Only the first committed_count - 1 path nodes are kept (EOS or the budget may cut the rest)."""
    return any(node != j for j, node in enumerate(path[: committed_count - 1]))


@torch.inference_mode()
def check_against_fresh_prefill(model: LoadedModel, cache, committed: list[int]) -> CacheCheck:
    """Compare every attended slot of `cache` with a fresh prefill of committed[:-1], layer by layer."""
    fresh = prefill(model, committed)
    held, want = cache_len(cache), len(committed) - 1
    n = min(held, want)
    differ = torch.zeros(max(held, want), dtype=torch.bool)
    differ[n:] = True  # a slot only one of the two has
    for (k, v), (fk, fv) in zip(attended_kv(cache), attended_kv(fresh), strict=True):
        for ours, theirs in ((k, fk), (v, fv)):  # (1, H, T, D) each
            close = torch.isclose(ours[:, :, :n].float().cpu(), theirs[:, :, :n].float().cpu(),
                                  rtol=KV_RTOL, atol=KV_ATOL)
            differ[:n] |= ~close.all(dim=-1).all(dim=1)[0]  # (n,): any head, any channel
    where = differ.nonzero().flatten().tolist()
    return CacheCheck(held, len(where), where[0] if where else None)


def tree_run(pair: Pair, prompt_ids: list[int], s: SpecSettings, spec: TreeSpec, mode: str,
             on_progress: Callable[[float], None] | None = None) -> TreeRunLog:
    """The tree engine in `mode` (TREE_MODES), both caches checked after every cycle; `on_progress`
    hears the share of the new tokens generated so far."""
    kind = TreeCycle(pair, replace(s, k=spec.max_depth), spec, TREE_MODES[mode])
    kind.check()
    state = start(kind, prompt_ids)
    cycles: list[TreeCycleCheck] = []
    for rec in run_cycles(kind, state):
        path, committed = list(rec["tree"]["path"]), list(rec["committed_token_ids"])
        cycles.append(TreeCycleCheck(
            len(cycles), path, committed, len(state.committed), left_first_branch(path, len(committed)),
            check_against_fresh_prefill(pair.target, state.target_cache, state.committed),
            check_against_fresh_prefill(pair.draft, state.draft_cache, state.committed)))
        if on_progress:
            on_progress(min(1.0, len(state.generated) / max(kind.settings.max_new_tokens, 1)))
    return TreeRunLog(mode, list(state.generated), cycles)


def compare_tree_runs(pair: Pair, prompt_ids: list[int], s: SpecSettings, spec: TreeSpec,
                      on_progress: Callable[[float], None] | None = None) -> TreeComparison:
    """Both rollbacks on one prompt, settings, seed and tree; at temperature 0 also plain greedy decoding.
    `on_progress` hears the share of the work done (each run a half; the plain reference is quick)."""
    report = on_progress or (lambda fraction: None)
    s = replace(s, k=spec.max_depth)
    runs = {mode: tree_run(pair, prompt_ids, s, spec, mode, lambda f, i=i: report((i + f) / len(TREE_MODES)))
            for i, mode in enumerate(TREE_MODES)}
    reference = target_generate(pair.target, prompt_ids, s, pair.eos_ids) if s.temperature == 0 else None
    texts = TokenTexts(pair.target.tokenizer)
    ids = set(prompt_ids) | set(reference or []) | {t for run in runs.values() for t in run.generated}
    return TreeComparison(list(prompt_ids), s.to_dict(), spec.describe(), reference, runs,
                          {i: texts(i) for i in sorted(ids)})
