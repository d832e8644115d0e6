"""What the cycle needs from a drafter, whatever kind it is.

A drafter proposes up to K tokens in the target's vocabulary, each with the distribution
it was drawn from over that whole vocabulary (a deterministic drafter gives a one-hot
row), and is told after each cycle what was committed so it can roll its own state back.
The cycle (verify, ratio test, residual or bonus, target rollback) never looks further.

One optional extension: a drafter that drafts from the target's own features (the EAGLE
head, eagle.py) sets `reads_target_features = True`. Then `start(prompt_ids, features)` gets
the prefill's top features, and after each verify the cycle calls
`take_target_features(state, features)` with that pass's (n+1, H) features before
`roll_back`: the same target passes, no second one.

Another: a drafter that proposes for several rows at once (a batch, engine/batch/cycle.py) implements
`start_rows`, `admit_row`, `propose_rows` and `roll_back_row` (the draft model's, engine/drafters/model.py)
and its registry entry says `batches=True`; the run mode refuses --batch with any other.
"""
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engine.config import SpecSettings


@dataclass
class Proposal:
    token_ids: list[int]  # (n,) n <= K, ids in the target's vocabulary
    p_draft: torch.Tensor  # (n, V_target) distribution each token was drawn from, on the CPU
    step_times_s: list[float]  # time of each drafting step (one entry for a lookup)
    state: dict | None = None  # drafter-specific record part ("drafter_state" in the trace)


@dataclass
class CatchUp:
    """What a drafter did after the cycle committed: did it feed tokens it never saw, and how long."""

    happened: bool = False
    time_s: float = 0.0


class Drafter(Protocol):
    kind: str  # one of engine.trace.schema.DRAFTER_KINDS: the CLI's --drafter names

    def describe(self) -> dict:
        """The trace header's "draft" entry (name, architecture, parameters, vocab_size, kept_vocab)."""

    def settings(self) -> dict:
        """The drafter's own options, for the trace header's "drafter" entry."""

    def check_settings(self, s: SpecSettings) -> None:
        """Raise SettingsError when this drafter cannot run exactly with these settings."""

    def start(self, prompt_ids: list[int], layout: Any = None) -> Any:
        """Per-run state (a cache in `layout`, a kv_layouts.CacheLayout; a token mapping), ready for the first cycle."""

    def propose(self, state: Any, committed: list[int], k: int, s: SpecSettings,
                gen: torch.Generator) -> Proposal:
        """Up to k tokens that follow `committed`."""

    def cache_len(self, state: Any) -> int | None:
        """Length of a draft cache over the target's positions; None if the drafter keeps none."""

    def roll_back(self, state: Any, committed: list[int]) -> CatchUp:
        """Bring the state in line with the committed sequence (committed length - 1 cached)."""


def one_hot_rows(token_ids: list[int], vocab_size: int) -> torch.Tensor:
    """(n, V) one-hot distributions: the proposal distribution of a deterministic drafter.

    With q one-hot on d, the ratio test accepts d with probability p_target(d) and the
    residual norm(max(0, p_target - q)) is p_target with d zeroed: still exact.
    """
    rows = torch.zeros(len(token_ids), vocab_size)
    if token_ids:
        rows[torch.arange(len(token_ids)), torch.tensor(token_ids)] = 1.0
    return rows
