"""The replica's comparison as text, for `python -m engine replica`. Greedy: a line per request (equal,
or the first step where the server and the replica part) and a summary line. Sampled: a line per
request (its drafting steps counted on each side), a line per draft position (each side's conditional
acceptance with its interval, and the test between them), the overall figures and a summary line."""
from engine.replica.align import Difference, RequestComparison
from engine.replica.sampled import LEVEL, SampledComparison, SampledRequest
from engine.workload.report import num, span


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


# ---------------------------------------------------------------- a sampled replica, in aggregate

def sampled_request_line(r: SampledRequest) -> str:
    return (f"{r.id}: server {counted(r.server_steps, 'drafting step')}, {r.server_accepted_tokens} of "
            f"{r.server_draft_tokens} drafted tokens accepted; replica {counted(r.replica_drafting_cycles, 'drafting cycle')}"
            f", {r.replica_accepted_tokens} of {r.replica_draft_tokens} accepted")


def side_words(cell: dict) -> str:
    """'0.412 [0.301, 0.532] (33/80)', or 'not reached (0/0)'."""
    if cell["rate"] is None:
        return f"not reached ({cell['accepted']}/{cell['reached']})"
    return f"{num(cell['rate'])} {span(cell['interval'])} ({cell['accepted']}/{cell['reached']})"


def test_words(row: dict) -> str:
    """How the two sides' rates at a position stand: overlap of the intervals and the test's p-value."""
    if row["p_value"] is None:
        return "nothing to compare (a side never reached the position)"
    overlap = "intervals overlap" if row["intervals_overlap"] else "intervals apart"
    verdict = f"differ at the {LEVEL:.0%} level" if row["differ"] else "no difference shown"
    return f"{overlap}; two-proportion p = {row['p_value']:.3g}: {verdict}"


def position_line(row: dict) -> str:
    return (f"  position {row['position']}: server {side_words(row['server'])}, "
            f"replica {side_words(row['replica'])}; {test_words(row)}")


def totals_words(side: dict, key: str, fmt: str) -> str:
    return f"{num(side[key], fmt)} {span(side[key + '_interval'], fmt)}"


def sampled_lines(c: SampledComparison) -> list[str]:
    """The per-position table, then the overall figures, then the summary line."""
    s, r = c.overall["server"], c.overall["replica"]
    lines = ["CONDITIONAL ACCEPTANCE BY POSITION (of the drafting steps that drafted position i and accepted all "
             "before it; 95% Wilson intervals, steps taken as independent: approximate)"]
    lines += [position_line(row) for row in c.positions]
    lines += [f"  acceptance rate: server {totals_words(s, 'acceptance_rate', '.3f')}, "
              f"replica {totals_words(r, 'acceptance_rate', '.3f')}",
              f"  mean acceptance length: server {totals_words(s, 'mean_acceptance_length', '.2f')}, "
              f"replica {totals_words(r, 'mean_acceptance_length', '.2f')} (95% intervals resample requests)",
              sampled_summary_line(c)]
    return lines


def sampled_summary_line(c: SampledComparison) -> str:
    t = c.sampling
    differ = [str(row["position"]) for row in c.positions if row["differ"]]
    named = f"positions {', '.join(differ)} differ" if len(differ) > 1 else f"position {''.join(differ)} differs"
    verdict = f"{named if differ else 'no position differs'} at the {LEVEL:.0%} level"
    return (f"{counted(len(c.requests), 'sampled request')} compared in aggregate (temperature {t['temperature']:g}, "
            f"top_p {t['top_p']:g}): {counted(c.overall['server']['drafts'], 'server drafting step')}, "
            f"{counted(c.overall['replica']['drafts'], 'replica drafting cycle')}; {verdict}")
