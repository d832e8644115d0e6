"""What a trace holds: the Trace a loaded file becomes, the record types each line is written
as (CycleRecord, TreeCycleRecord and their parts, as TypedDicts), and the loader's tables of
field name -> allowed JSON types, derived from those types so a field is named in one place.

Standard library only: the reader (format.py), its field checks (field_checks.py), the cycle
that builds the records and the app all import from here.
"""
from dataclasses import dataclass
from types import UnionType
from typing import NotRequired, TypedDict, Union, get_args, get_origin, get_type_hints, is_typeddict

from engine.trace.schema import DRAFT_MODEL, VLLM_CONVENTION


@dataclass
class Trace:
    header: dict
    cycles: list[dict]
    summary: dict | None

    @property
    def complete(self) -> bool:
        return self.summary is not None

    @property
    def k(self) -> int:
        return self.header["settings"]["k"]

    @property
    def drafter_kind(self) -> str:
        """One of schema.DRAFTER_KINDS; traces written before drafters had a name (no header
        "drafter" entry) all came from a draft model."""
        return drafter_kind(self.header)

    @property
    def is_tree(self) -> bool:
        """Whether the run drafted trees: its cycles are TreeCycleRecords, not CycleRecords."""
        return is_tree_trace(self.header)

    @property
    def is_vllm_capture(self) -> bool:
        """Whether a live vLLM's cycles were captured here (its cache bookkeeping, schema.VLLM_CONVENTION)."""
        return is_vllm_capture(self.header)


def is_vllm_capture(header: dict) -> bool:
    convention = header.get("cache_convention")
    return isinstance(convention, dict) and convention.get("name") == VLLM_CONVENTION


def drafter_kind(header: dict) -> str:
    return header.get("drafter", {}).get("kind", DRAFT_MODEL)


def is_tree_trace(header: dict) -> bool:
    """A trace is a tree trace iff its header's settings has "tree" (TreeSpec.describe())."""
    return "tree" in header.get("settings", {})


# Field name -> allowed JSON types. `None` in the tuple marks a nullable field.
NUM = (int, float)
HEADER_FIELDS = {
    "type": (str,), "format": (str,), "version": (int,), "target": (dict,), "draft": (dict,),
    "settings": (dict,), "prompt": (str,), "prompt_token_ids": (list,), "prompt_token_texts": (list,),
    "cache_convention": (dict,), "device": (str,), "dtype": (str,), "versions": (dict,),
    "eos_token_ids": (list,),
}
SETTINGS_FIELDS = {"k": (int,), "temperature": NUM, "top_k": (int,), "top_p": NUM,
                   "seed": (int,), "max_new_tokens": (int,), "trace_top_k": (int,)}


class CacheLengths(TypedDict):
    before: int  # positions cached when the cycle starts (committed length - 1)
    after_append: int  # after drafting (draft) or verifying (target): provisional entries included
    after_rollback: int  # after the rollback (and a draft's catch-up)


class CycleRecord(TypedDict):
    """One cycle of a trace: the names are written here once; the loader's table is derived from them.

    Built by engine.cycle.trace_record.cycle_record for both the reference and the fast path (the
    fields from draft_token_texts on are the `record=True` part, describe_cycle). n below is
    the number of proposals: K for a draft model, 0..K for prompt lookup and the other-tokenizer draft.
    """

    type: str  # "cycle"
    cycle: int
    committed_len_before: int
    draft_token_ids: list  # (n,) in the target's vocabulary
    draft_token_texts: list  # (n,)
    p_draft: list  # (n,) the drafter's probability of each proposed token (1.0 for a deterministic drafter)
    p_target: list  # (n,)
    accept_prob: list  # (n,) min(1, p_target / p_draft)
    u: list  # the uniform draws, up to the first rejection
    beta: list  # (n,) sum_x min(p_target, p_draft) at each position
    num_accepted: int
    rejected_position: int | None  # 1-based; None when all n passed
    resampled_token_id: int | None
    bonus_token_id: int | None
    next_token_text: str
    residual_top: list | None
    target_top: list  # (n+1,) top entries of the target's distributions
    draft_top: list  # (n,)
    committed_token_ids: list
    committed_token_texts: list
    finished: bool
    target_cache_len: CacheLengths
    draft_cache_len: CacheLengths | None  # None when the drafter keeps no cache over the target's positions
    draft_catch_up: bool
    verify_positions: int  # n + 1
    draft_time_s: float
    draft_step_times_s: list
    verify_time_s: float
    catch_up_time_s: float
    cycle_time_s: float
    drafter_state: NotRequired[dict]  # prompt lookup / other tokenizer: the match or the token mapping


# ---------------------------------------------------------------- tree cycles (draft trees, engine/tree/)

class TreeNode(TypedDict):
    """One drafted node. Nodes are numbered parents first, level by level, siblings in the order
    the walk tries them (the draft's most likely first)."""

    token_id: int
    text: str
    parent: int  # schema.ROOT (-1) for a child of the root (the last committed token), else an earlier node
    depth: int  # 1 for a child of the root
    q: float  # the draft's probability of the token at its parent
    score: float  # sum of log q from the root down to this node
    p: float  # the target's warped probability of the token at its parent, unmodified


class TreeTry(TypedDict):
    """One child the acceptance walk tried, in the order tried."""

    node: int
    p_residual: float  # the residual's probability of the node's token when it was tried
    u: float  # the uniform draw; accepted iff u < p_residual
    accepted: bool


class SlotCompaction(TypedDict):
    """One cache's rollback after a tree: the slots kept from `before` (= L) on, and the moves."""

    kept_slots: list  # [L] + [L+1+p for p in path], cut to len(committed) entries
    moves: list  # [[from, to]] for the kept slots that change place


class TreeCompaction(TypedDict):
    target: SlotCompaction
    draft: SlotCompaction | None  # None when the drafter keeps no cache over the target's positions


class DraftTreeRecord(TypedDict):
    """A tree cycle's `tree`: what was drafted, how the walk went, and how the caches were compacted."""

    nodes: list  # (N,) TreeNode
    tried: list  # TreeTry, in the order tried
    path: list  # the accepted nodes, from a child of the root down
    next_token_id: int
    next_token_kind: str  # schema.NEXT_BONUS or NEXT_RESIDUAL
    residual_top: list | None  # top entries of the residual the next token came from; None for a bonus
    target_top: list  # (N+1,) top entries of the target's distributions: after the root, then after each node
    draft_forwards: int  # batched draft forwards this cycle
    compaction: TreeCompaction


class TreeCycleRecord(TypedDict):
    """One cycle of a tree trace: the fields a chain record shares (same meaning), and `tree`.

    The chain's per-position fields (CHAIN_ONLY_FIELDS) are absent: the walk over the tree
    replaces them. Written by engine/tree/cycle.py; docs/trace-format.md ("Tree cycle record")
    says what each field means and what the loader checks.
    """

    type: str  # "cycle"
    cycle: int
    committed_len_before: int
    num_accepted: int  # len(tree.path)
    next_token_text: str
    committed_token_ids: list
    committed_token_texts: list
    finished: bool
    target_cache_len: CacheLengths  # after_append = before + N + 1
    draft_cache_len: CacheLengths | None
    draft_catch_up: bool
    verify_positions: int  # N + 1: the root and every node, in one target forward
    draft_time_s: float
    draft_step_times_s: list  # one per batched draft forward
    verify_time_s: float
    catch_up_time_s: float
    cycle_time_s: float
    tree: DraftTreeRecord


def _allowed(annotation) -> tuple:
    """A field's annotation as the loader's tuple of JSON types (None marks nullable)."""
    if annotation is type(None):
        return (None,)
    if get_origin(annotation) in (Union, UnionType):
        return tuple(t for arg in get_args(annotation) for t in _allowed(arg))
    if annotation is float:
        return NUM  # JSON has one number type: an integer-valued time is still a number
    if is_typeddict(annotation):
        return (dict,)
    return (annotation,)


def fields_of(record_type) -> dict:
    """Field name -> allowed JSON types, for the required fields of a TypedDict."""
    hints = get_type_hints(record_type)  # in declaration order
    return {name: _allowed(hint) for name, hint in hints.items() if name in record_type.__required_keys__}


CYCLE_FIELDS = fields_of(CycleRecord)
CACHE_LEN_FIELDS = fields_of(CacheLengths)
TREE_CYCLE_FIELDS = fields_of(TreeCycleRecord)
TREE_FIELDS = fields_of(DraftTreeRecord)
TREE_NODE_FIELDS = fields_of(TreeNode)
TREE_TRY_FIELDS = fields_of(TreeTry)
TREE_COMPACTION_FIELDS = fields_of(TreeCompaction)
SLOT_COMPACTION_FIELDS = fields_of(SlotCompaction)
# A chain record's per-position fields; a tree record must not carry them.
CHAIN_ONLY_FIELDS = tuple(name for name in CYCLE_FIELDS if name not in TREE_CYCLE_FIELDS)

SUMMARY_FIELDS = {
    "type": (str,), "generated_token_ids": (list,), "generated_text": (str,),
    "acceptance_rate": NUM, "mean_acceptance_length": NUM, "per_position_acceptance": (list,),
    "num_cycles": (int,), "num_generated": (int,), "stop_reason": (str,),
    "wall_time_s": NUM, "tokens_per_s": NUM,
}


def model_name(header: dict, role: str) -> str:
    """The name a trace gives its "target" or "draft" model; a placeholder when it gives none."""
    entry = header.get(role)
    name = entry.get("name") if isinstance(entry, dict) else None
    return name if isinstance(name, str) and name else f"unnamed {role} model"
