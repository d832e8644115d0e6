"""What every invariant check is built from: how a rule is refused (`fail`, BrokenInvariant),
the float tolerances and type tests, the facts a header fixes for every cycle (RunFacts) and the
run as the checks replay it (Progress, CacheChain).

A leaf of the check modules: header_checks.py, chain_checks.py, drafter_checks.py and the tree
checks all import from here, and this module imports none of them.
"""
import math
from dataclasses import dataclass, field

from engine.config import TreeSpec
from engine.trace.errors import BrokenInvariant
from engine.trace.json_lines import finite
from engine.trace.schema import CACHE_CONVENTION, DRAFT_MODEL, FEATURE_HEADS, VLLM_CONVENTION

MAX_TOKEN_ID = 2**31 - 1  # the bound when a header gives no vocab_size: no tokenizer has more ids
REL_TOL, ABS_TOL = 1e-5, 1e-6  # float32 numbers written as float64: a few ulps of slack


@dataclass(frozen=True)
class RunFacts:
    """What the header fixes for every cycle."""

    k: int
    temperature: float
    max_new_tokens: int
    trace_top_k: int
    prompt_ids: list[int]
    eos_ids: frozenset
    vocab_size: int | None
    faults: dict
    drafter: dict  # the header's drafter entry ({"kind": "model"} for traces without one)
    fast_path: bool = False  # the fast path and a batch feed d_K in every cycle, so catch-up time is spent in each
    tree: TreeSpec | None = None  # settings.tree of a tree trace: its cycles are tree cycle records
    convention: str = CACHE_CONVENTION  # the header's cache_convention.name (schema.CACHE_CONVENTIONS)

    @property
    def vllm(self) -> bool:
        """A capture of a live vLLM's cycles: its own cache bookkeeping and acceptance test (schema.VLLM_CONVENTION)."""
        return self.convention == VLLM_CONVENTION

    @property
    def rule(self) -> str:
        return self.faults.get("acceptance_rule", "ratio")

    @property
    def drafter_kind(self) -> str:
        return self.drafter["kind"]

    @property
    def draft_offset(self) -> int:
        """Positions the draft's cache holds beyond the target's (negative: fewer): a draft model that read its
        own rendering of the prompt (the header's drafter.draft_prompt_token_ids) has its own prompt length."""
        own = self.drafter.get("draft_prompt_token_ids")
        return 0 if own is None else len(own) - len(self.prompt_ids)

    @property
    def drafts_k_with_cache(self) -> bool:
        """A draft model or an EAGLE(-3) head run by the lab: K proposals every cycle and a cache over the target's
        positions (a live vLLM's draft model drafts nothing in its prefill and keeps its own paged cache)."""
        return (self.drafter_kind == DRAFT_MODEL or self.drafter_kind in FEATURE_HEADS) and not self.vllm


@dataclass
class CacheChain:
    """Cache lengths carried from one cycle to the next."""

    target: int | None  # None before a vLLM capture's first cycle, the prefill, which starts where vLLM's cache did
    draft: int | None


@dataclass
class Progress:
    """The run as replayed so far."""

    generated: list[int]
    chain: CacheChain
    finished: bool = False
    draft_texts: dict = field(default_factory=dict)  # other tokenizer: the draft's own id -> text
    own_cache: int | None = None  # other tokenizer: its own cache length after the last rollback


def fail(where: str, field: str, rule: str) -> None:
    raise BrokenInvariant(f"{where}: field '{field}': {rule}")


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x) -> bool:
    return finite(x)
