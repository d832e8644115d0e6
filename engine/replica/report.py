"""The replica's comparison as text: a line per request (equal, or the first step where the server and
the replica part) and a summary line, for `python -m engine replica`."""
from engine.replica.align import Difference, RequestComparison


def side(drafted: int | None, accepted: int | None) -> str:
    return "no step" if drafted is None else f"drafted {drafted}, accepted {accepted}"


def parting(d: Difference) -> str:
    where = "" if d.replica_cycle is None else f" (replica cycle {d.replica_cycle})"
    return (f"parts at drafting step {d.step}{where}: server {side(d.server_drafted, d.server_accepted)}, "
            f"replica {side(d.replica_drafted, d.replica_accepted)}")


def counted(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def request_line(c: RequestComparison) -> str:
    steps = f"{counted(c.server_steps, 'server step')}, {counted(c.replica_drafting_cycles, 'replica drafting cycle')}"
    if c.equal:
        return f"{c.id}: equal ({steps}, the same tokens)"
    tokens = "the same tokens" if c.tokens_equal else "different tokens"
    what = parting(c.first_difference) if c.first_difference else "every drafting step equal"
    return f"{c.id}: {what}; {tokens} ({steps})"


def summary_line(comparisons: list[RequestComparison]) -> str:
    equal = sum(c.equal for c in comparisons)
    steps = sum(c.server_steps for c in comparisons)
    return (f"{equal} of {len(comparisons)} requests equal step by step and token by token "
            f"({steps} server drafting steps in all)")
