"""The server's per-step lists beside the replica's cycles: where the two first part.

vLLM's per-request metrics have one entry per verify step that drafted at least one token: a step
where the n-gram lookup found nothing runs the target alone and is not counted. The replica's trace
records every cycle, those that proposed nothing too, so the cycles that drafted nothing are skipped
before the two lists are laid side by side; each step then keeps the index of its cycle in the trace
(counting every cycle), which is where the stepper opens it.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One verify step that drafted: its proposed and accepted draft tokens, and (the replica's) its cycle."""

    drafted: int
    accepted: int
    cycle: int | None = None


@dataclass(frozen=True)
class Difference:
    """The first drafting step where the server and the replica part; None on the side that ran out of steps."""

    step: int
    server_drafted: int | None
    server_accepted: int | None
    replica_drafted: int | None
    replica_accepted: int | None
    replica_cycle: int | None


@dataclass(frozen=True)
class RequestComparison:
    id: str
    equal: bool  # every drafting step the same, and the same generated tokens
    server_steps: int
    replica_drafting_cycles: int
    tokens_equal: bool
    first_difference: Difference | None


def server_steps(drafted: list[int], accepted: list[int]) -> list[Step]:
    return [Step(d, a) for d, a in zip(drafted, accepted, strict=True)]


def drafting_cycles(cycles: list[dict]) -> list[Step]:
    """The replica's chain cycles that proposed at least one token, with their index in the trace."""
    return [Step(len(c["draft_token_ids"]), c["num_accepted"], c["cycle"])
            for c in cycles if c.get("draft_token_ids")]


def first_difference(server: list[Step], replica: list[Step]) -> Difference | None:
    """The first step whose drafted or accepted counts differ, or where one side has no more steps."""
    for j in range(max(len(server), len(replica))):
        s = server[j] if j < len(server) else None
        r = replica[j] if j < len(replica) else None
        if s is None or r is None or (s.drafted, s.accepted) != (r.drafted, r.accepted):
            return Difference(j, s and s.drafted, s and s.accepted, r and r.drafted, r and r.accepted, r and r.cycle)
    return None


def compare_request(rid: str, server: list[Step], server_tokens: list[int], replica_cycles: list[dict]) -> RequestComparison:
    replica = drafting_cycles(replica_cycles)
    generated = [t for c in replica_cycles for t in c["committed_token_ids"]]
    parted = first_difference(server, replica)
    same_tokens = generated == server_tokens
    return RequestComparison(rid, parted is None and same_tokens, len(server), len(replica), same_tokens, parted)
