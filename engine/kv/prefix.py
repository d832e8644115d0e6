"""Reusing the K/V of a prompt's start that the previous prompt shared (prefix caching for one remembered prompt).

Attention is causal, so position i's K/V depend on tokens 0..i only: two prompts that begin with the
same P tokens begin with the same K/V. A `PrefixStore` remembers the last prompt its model read (ids
and K/V); the next prefill copies the K/V of the longest start the two share (at least MIN_REUSE
tokens) and reads only the rest. Serving engines do this across requests (vLLM's automatic prefix
caching, SGLang's radix cache), holding many prompts; one is enough here.

The copied K/V equal a fresh prefill's up to float32 rounding (the forward that made them
multiplied another number of rows), so a run that reused a start says how many tokens in its
header ("prefix_reuse"). Nothing is reused unless a run asks (RunMode.prefix_reuse): the
diagnosis's context experiment does, whose requests all begin with the same long passage.
Only the dynamic layout is served; any other layout reads the whole prompt.
"""
from dataclasses import dataclass, field

import torch

MIN_REUSE = 32  # tokens: a shorter shared start (a chat template's system turn) is not worth the copy


def shared_start(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class PrefixStore:
    """The last prompt one model read: its ids (the prefilled ones) and their K/V, per layer (1, H, T, D)."""

    ids: list[int] = field(default_factory=list)
    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def reusable(self, ids: list[int]) -> int:
        """Tokens of `ids` whose K/V the store holds (0 below MIN_REUSE). All of `ids` never: the last
        prefilled token is read again, so the forward that fills the cache has at least one token."""
        n = min(shared_start(self.ids, ids), len(ids) - 1)
        return n if n >= MIN_REUSE else 0

    def remember(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.ids, self.kv = list(ids), [(k.clone(), v.clone()) for k, v in kv]


@dataclass
class PrefixReuse:
    """A run's stores, one per model it prefills (the target, the draft), kept across its requests."""

    stores: dict[str, PrefixStore] = field(default_factory=dict)

    def store(self, role: str) -> PrefixStore:
        return self.stores.setdefault(role, PrefixStore())
