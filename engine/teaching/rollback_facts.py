"""What the rollback page reads off its runs: the numbers it states beside its charts.

The runs come from engine/teaching/runs.py (the correct and the broken chain engines),
stale_slots.py (the correct engine on a static cache) and tree_rollback.py (compaction against
a crop after a tree); these are plain readings of their records, kept out of the page.
"""
from engine.teaching.runs import RunLog
from engine.teaching.stale_slots import StaticRun
from engine.teaching.tree_rollback import TreeRunLog


def largest_target_drift(run: RunLog) -> float:
    """The largest total variation, over the run's cycles, between the target's next-token distribution
    from its own cache and from a fresh prefill: how far a broken cache moved the target."""
    return max(c.target_tv for c in run.cycles)


def stale_cycle_to_show(bug_run: RunLog, static: StaticRun) -> int:
    """The first cycle where both kinds of leftovers exist (the broken run's rejected K/V in the attended
    range, at least two stale slots past the static cache's write position), else cycle 2 or the last one."""
    last = min(len(bug_run.cycles), len(static.cycles)) - 1
    telling = [i for i in range(last + 1)
               if static.cycles[i].stale_slots >= 2 and bug_run.cycles[i].target_cache.num_stale > 0]
    return telling[0] if telling else min(2, last)


def wrong_cache_cycles(run: TreeRunLog) -> int:
    """Cycles after which either cache of a tree run differs from a fresh prefill of the committed text."""
    return sum(not c.target.matches or not c.draft.matches for c in run.cycles)
