"""Rank 0 runs the cycle; every other rank replays its target operations on its own shard.

Why the drafter runs on rank 0 only, its proposals broadcast (not replicated on every rank):
the ranks must feed the target the same tokens, and a broadcast makes that true by
construction. A replicated drafter would agree only while every rank's draft arithmetic is
bit-identical and every generator is consumed alike, and one rank drifting by one token
would make the sharded target's all-reduces add up different sequences without any error.
It also keeps the draft's weights and cache off the other ranks, and it serves every
drafter kind as it is (prompt lookup has no model to replicate). The price is nothing in
wall time: the other ranks would otherwise spend the same drafting time drafting.

The draws and the decision are made once, on rank 0. What the other ranks must agree on
follows from them, and rank 0 sends exactly that, as int64 tensors (never pickles):

    NEW_CACHE  cache id, layout, capacity, block size     a run (or calibration) starts a target cache
    FILL       cache id, its length, token ids            a prefill, no logits used
    FORWARD    cache id, its length, token ids            a verify pass (or a timed step)
    ROLL_BACK  cache id, keep                             after the decision: the committed length - 1
    STOP       aborted                                    the run is over

Each rank checks that its cache has the length rank 0's had before every append, and the
committed length after every rollback, and keeps the token ids its cache holds, so every rank
can be checked against rank 0's committed sequence (tests/test_tensor_parallel.py does).
"""
from dataclasses import dataclass, field, fields
from typing import Callable

import torch
import torch.distributed as dist
from transformers.cache_utils import Cache

from engine.kv.layouts import (
    ROLL_BACK_LISTENER,
    CacheLayout,
    PagedKVCache,
    StaticKVCache,
    layout_name,
    new_cache,
)
from engine.kv.ops import cache_len, crop
from engine.models.loading import LoadedModel
from engine.parallel.world import World
from engine.trace.schema import LAYOUTS

NEW_CACHE, FILL, FORWARD, ROLL_BACK, STOP = 1, 2, 3, 4, 5
HEADER_LEN = 6  # op, cache id, three numbers, how many token ids follow
MAX_IDS = 1 << 24  # a prompt longer than this is no prompt: a corrupt header, not a message


class MirrorError(RuntimeError):
    """A rank's cache disagrees with rank 0's: the ranks would compute on different sequences."""


@dataclass(frozen=True)
class Op:
    kind: int
    cache_id: int = 0
    a: int = 0
    b: int = 0
    c: int = 0
    ids: list[int] = field(default_factory=list)


class OpLink:
    """Rank 0's operations to every other rank: a fixed header broadcast, then the ids if any."""

    def __init__(self, world: World) -> None:
        self.device = world.device  # NCCL sends device tensors; gloo CPU ones

    def send(self, op: Op) -> None:
        header = torch.tensor([op.kind, op.cache_id, op.a, op.b, op.c, len(op.ids)], dtype=torch.long)
        dist.broadcast(header.to(self.device), src=0)
        if op.ids:
            dist.broadcast(torch.tensor(op.ids, dtype=torch.long, device=self.device), src=0)

    def receive(self) -> Op:
        header = torch.zeros(HEADER_LEN, dtype=torch.long, device=self.device)
        dist.broadcast(header, src=0)
        kind, cache_id, a, b, c, n = header.tolist()
        if kind not in (NEW_CACHE, FILL, FORWARD, ROLL_BACK, STOP) or not 0 <= n <= MAX_IDS:
            raise MirrorError(f"a message from rank 0 makes no sense (op {kind}, {n} ids): the ranks are out of step")
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        if n:
            dist.broadcast(ids, src=0)
        return Op(kind, cache_id, a, b, c, ids.tolist())


@dataclass
class MirroredCache:
    """One target cache as both sides track it: its id and the token ids whose K/V it holds."""

    cache_id: int
    cache: Cache
    tokens: list[int] = field(default_factory=list)  # (cache length,) in position order


Observer = Callable[[int, MirroredCache], None]  # (rank, cache) after every rollback


def describe_cache(cache: Cache) -> tuple[int, int, int]:
    """(layout index, capacity, block size): what another rank needs to build the same layout."""
    name = layout_name(cache)
    if isinstance(cache, StaticKVCache):
        return LAYOUTS.index(name), cache.capacity, 0
    if isinstance(cache, PagedKVCache):
        return LAYOUTS.index(name), cache.pool.num_blocks * cache.block_size, cache.block_size
    return LAYOUTS.index(name), 0, 0


class Lead:
    """Rank 0's side: announces every target operation before it runs it."""

    def __init__(self, world: World, observe: Observer | None = None) -> None:
        self.link = OpLink(world)
        self.observe = observe
        self.last_id = 0

    def mirrored(self, cache: Cache) -> MirroredCache:
        """The cache's mirror record; the first time it is seen, the other ranks build their own."""
        mirror = getattr(cache, "tp_mirror", None)
        if mirror is None:
            if cache_len(cache):
                raise MirrorError("a target cache reached the tensor-parallel target already filled")
            self.last_id += 1
            mirror = MirroredCache(self.last_id, cache)
            self.link.send(Op(NEW_CACHE, mirror.cache_id, *describe_cache(cache)))
            cache.tp_mirror = mirror
            setattr(cache, ROLL_BACK_LISTENER, lambda keep: self.rolled_back(mirror, keep))
        return mirror

    def appending(self, kind: int, cache: Cache, token_ids: list[int]) -> None:
        mirror = self.mirrored(cache)
        self.link.send(Op(kind, mirror.cache_id, cache_len(cache), ids=list(token_ids)))
        mirror.tokens += token_ids

    def rolled_back(self, mirror: MirroredCache, keep: int) -> None:
        self.link.send(Op(ROLL_BACK, mirror.cache_id, keep))
        del mirror.tokens[keep:]
        if self.observe is not None:
            self.observe(0, mirror)

    def stop(self, aborted: bool = False) -> None:
        self.link.send(Op(STOP, a=int(aborted)))


@dataclass
class LeadTarget(LoadedModel):
    """Rank 0's shard of the target: each forward is first announced to the other ranks."""

    lead: Lead | None = None

    @classmethod
    def of(cls, model: LoadedModel, lead: Lead) -> "LeadTarget":
        return cls(**{f.name: getattr(model, f.name) for f in fields(LoadedModel)}, lead=lead)

    def forward(self, token_ids: list[int], cache: Cache) -> torch.Tensor:
        self.lead.appending(FORWARD, cache, token_ids)
        return super().forward(token_ids, cache)

    def fill(self, token_ids: list[int], cache: Cache) -> None:
        self.lead.appending(FILL, cache, token_ids)
        super().fill(token_ids, cache)


class Follower:
    """Another rank's side: one target cache at a time, built and moved as rank 0 says."""

    def __init__(self, world: World, target: LoadedModel, observe: Observer | None = None) -> None:
        self.rank, self.target, self.observe = world.rank, target, observe
        self.link = OpLink(world)
        self.mirror: MirroredCache | None = None

    def current(self, op: Op) -> MirroredCache:
        if self.mirror is None or self.mirror.cache_id != op.cache_id:
            held = self.mirror.cache_id if self.mirror else "none"
            raise MirrorError(f"rank {self.rank} was sent an operation on target cache {op.cache_id} but holds {held}")
        return self.mirror

    def check_length(self, mirror: MirroredCache, expected: int, when: str) -> None:
        have = cache_len(mirror.cache)
        if have != expected or len(mirror.tokens) != have:
            raise MirrorError(f"rank {self.rank}'s target cache holds {have} positions {when}, rank 0's {expected}")

    def apply(self, op: Op) -> bool:
        """Carry out one operation; False once rank 0 says stop."""
        if op.kind == STOP:
            return False
        if op.kind == NEW_CACHE:
            layout = CacheLayout(LAYOUTS[op.a], op.b, op.c or 1)
            self.mirror = MirroredCache(op.cache_id, new_cache(layout, self.target.model.config))
            return True
        mirror = self.current(op)
        if op.kind in (FILL, FORWARD):
            self.check_length(mirror, op.a, "before an append")
            (self.target.fill if op.kind == FILL else self.target.forward)(op.ids, mirror.cache)  # logits unused
            mirror.tokens += op.ids
        else:
            crop(mirror.cache, op.a)
            del mirror.tokens[op.a:]
            self.check_length(mirror, op.a, "after a rollback")
            if self.observe is not None:
                self.observe(self.rank, mirror)
        return True


def follow(world: World, target: LoadedModel, observe: Observer | None = None) -> bool:
    """Replay rank 0's target operations until it says stop; True unless it stopped on an error."""
    follower = Follower(world, target, observe)
    while True:
        op = follower.link.receive()
        if not follower.apply(op):
            return op.a == 0
