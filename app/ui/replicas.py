"""The replica comparison a live workload may hold: replica.json beside its manifest (`python -m engine
replica --out` under the live runs' folder), read checked through engine/replica/comparison.py, and its
rows for the Workload page: greedy, each request with a link into the stepper at the replica's cycle
where the replica parts from its server; sampled, a row per draft position and per overall figure
(the words engine/replica/report.py prints) and each request's counts with a link to its trace. Rows
are plain data, so tests read them without drawing the page."""
from app.ui import state, workloads
from engine.replica.align import Difference, RequestComparison
from engine.replica.comparison import read_comparison
from engine.replica.report import parting, side_words, test_words, totals_words
from engine.replica.sampled import SampledComparison


def comparison_of(choice: tuple[str, str]) -> list[RequestComparison] | SampledComparison | None:
    """The replica's comparison with its server, or None for a workload that is no replica. Only live
    workload folders hold one (bundled and uploaded workloads are zips of `run --prompts` folders)."""
    if choice[0] != "run":
        return None
    workload = workloads.load(choice)
    settings = workload.manifest["settings"]
    return read_comparison(state.workload_path(*choice), settings["k"], workload.entries, settings)


def opened_cycle(d: Difference | None, last_cycle: int) -> int:
    """Where the stepper opens a request: the replica's cycle where it parts from the server; its last
    cycle when the server went on drafting after the replica's last drafting cycle; else its first."""
    if d is None:
        return 0
    return last_cycle if d.replica_cycle is None else d.replica_cycle


def outcome_words(c: RequestComparison) -> str:
    if c.equal:
        return "equal, step by step and token by token"
    if c.first_difference is None:
        return "every drafting step equal, different tokens"
    return parting(c.first_difference) + ("" if c.tokens_equal else "; different tokens")


def replica_rows(choice: tuple[str, str], comparisons: list[RequestComparison]) -> list[dict]:
    """A row per compared request: its link (to the cycle where it parts), the outcome in words, both step counts."""
    entries = {e.id: e for e in workloads.load(choice).entries}
    rows = []
    for c in comparisons:
        e = entries[c.id]
        last = max(0, (e.summary or {}).get("num_cycles", 1) - 1)
        cycle = opened_cycle(c.first_difference, last)
        text = c.id if c.equal else f"{c.id} · cycle {cycle}"
        rows.append({"request": workloads.link(text, choice, e.file, cycle), "against the server": outcome_words(c),
                     "server drafting steps": c.server_steps, "replica drafting cycles": c.replica_drafting_cycles})
    return rows


def position_rows(c: SampledComparison) -> list[dict]:
    """A row per draft position: each side's conditional acceptance, interval and counts, and the test."""
    return [{"position": row["position"], "server": side_words(row["server"]), "replica": side_words(row["replica"]),
             "against each other": test_words(row)} for row in c.positions]


def overall_rows(c: SampledComparison) -> list[dict]:
    s, r = c.overall["server"], c.overall["replica"]
    return [{"figure": "acceptance rate", "server": totals_words(s, "acceptance_rate", ".3f"),
             "replica": totals_words(r, "acceptance_rate", ".3f")},
            {"figure": "mean acceptance length", "server": totals_words(s, "mean_acceptance_length", ".2f"),
             "replica": totals_words(r, "mean_acceptance_length", ".2f")}]


def sampled_request_rows(choice: tuple[str, str], c: SampledComparison) -> list[dict]:
    """A row per request: its link (to its first cycle) and both sides' counts."""
    entries = {e.id: e for e in workloads.load(choice).entries}
    return [{"request": workloads.link(r.id, choice, entries[r.id].file, 0),
             "server drafting steps": r.server_steps,
             "server accepted / drafted": f"{r.server_accepted_tokens} / {r.server_draft_tokens}",
             "replica drafting cycles": r.replica_drafting_cycles,
             "replica accepted / drafted": f"{r.replica_accepted_tokens} / {r.replica_draft_tokens}"}
            for r in c.requests]
