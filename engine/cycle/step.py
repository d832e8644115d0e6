"""What a cycle kind hands the driver (engine/cycle/driver.py): its decision, then its caches' state."""
from dataclasses import dataclass
from typing import Any

from engine.trace.format import CacheLengths


@dataclass
class CycleStep:
    """What one cycle decided, before the commit."""

    accepted_token_ids: list[int]  # the accepted draft tokens (a tree: the accepted path's)
    next_token_id: int  # the resampled or bonus token
    draft_token_ids: list[int] | None  # the chain's proposals; None for a tree (its nodes are in `tree`)
    verify_positions: int  # rows of the verify pass: n + 1
    draft_step_times_s: list[float]
    verify_time_s: float
    drafter_state: dict | None = None  # the drafter's own record part ("drafter_state" in the trace)
    detail: Any = None  # what the kind's settle and describe need (distributions, the decision, lengths)

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_token_ids)


@dataclass
class Settled:
    """Both caches after the rollback, as the record states them."""

    target_cache_len: CacheLengths
    draft_cache_len: CacheLengths | None  # None when the drafter keeps no cache over the target's positions
    layout_fields: dict  # static and paged layouts' states (none for a dynamic cache)
    draft_catch_up: bool
    catch_up_time_s: float
