"""The replica run: a server workload's requests through the lab's engine, as an ordinary workload folder
(engine/workload/run.py: a trace per request and a manifest), then replica.json beside its manifest.

Each request runs from the server's own prompt ids (after the server's chat template, so no second
rendering of the template can differ) with the drafter and K that reproduce the server's
configuration (settings.py) and the server's max_tokens, on the chat preset's target: the model the
lab's vLLM serves (engine/servers/launch.py). replica.json is rewritten after every request, so an
interrupted replica keeps the comparison of the requests it finished.

Greedy requests run greedy and are compared step by step (align.py). Sampled ones run at the server's
temperature and top_p, the workload seeded with the server workload's seed: request i then runs with
seed * SEED_STRIDE + i (engine/workload/manifest.py), the number the client sent vLLM for request i
(engine/servers/client.py) when no request failed. The two engines' random generators differ, so the
same number gives other draws: it only makes the replica reproducible. They are compared in aggregate
(sampled.py).
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.config import SpecSettings
from engine.replica.align import RequestComparison, compare_request, drafting_cycles, server_steps
from engine.replica.comparison import write_comparison, write_sampled
from engine.replica.sampled import SampledComparison, SampledRequest, compare_sampled, sampled_request
from engine.replica.server_workload import ANSWERS, ServerAnswer, ServerWorkload, ServerWorkloadError
from engine.replica.settings import ReplicaPlan, replica_plan
from engine.run import load_preset
from engine.workload.manifest import SEED_LIMIT
from engine.workload.run import start_workload

REPLICA_PRESET = "chat"  # its target is the model the lab's vLLM serves (engine/models/presets.py smollm2_folder)


@dataclass(frozen=True)
class Replica:
    folder: Path
    comparisons: list[RequestComparison]  # greedy: each request step by step; sampled: empty
    sampled: SampledComparison | None = None  # sampled: the requests in aggregate


def one_budget(answers: list[ServerAnswer]) -> int:
    """The max_tokens every request was sent with: a workload runs one setting over all its requests."""
    budgets = sorted({a.max_tokens for a in answers})
    if len(budgets) > 1:
        raise ServerWorkloadError(f"{ANSWERS}: the requests were sent with max_tokens {budgets}; a replica runs "
                                  "one max_tokens for all (replicate each budget's requests from its own folder)")
    return budgets[0]


def check_vocabulary(answers: list[ServerAnswer], vocab_size: int) -> None:
    """Ids beyond the target's vocabulary mean the server served another model: nothing to compare."""
    for a in answers:
        highest = max(a.prompt_ids + a.token_ids)
        if highest >= vocab_size:
            raise ServerWorkloadError(f"{ANSWERS} request {a.request.id!r}: token id {highest} is beyond the "
                                      f"replica's target vocabulary of {vocab_size} (the server served another model)")


SERVER_KEYS = ("kind", "version", "model")
CONFIG_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


def head_of(server: ServerWorkload) -> dict:
    """What replica.json says of the server it replicates: the few fields it names, copied from the server
    workload's manifest only where they are short text (the rest of that manifest is the client's)."""
    named = {k: v for k in SERVER_KEYS if isinstance(v := server.manifest["server"].get(k), str) and len(v) <= 100}
    config = {k: server.speculative_config[k] for k in CONFIG_KEYS}  # settings.py checked each of them
    return {"server_workload": server.folder.resolve().name[:100], "server": named, "speculative_config": config}


def sampling_of(server: ServerWorkload) -> dict:
    """The server workload's temperature, top_p and seed, as the replica runs them."""
    settings = server.manifest["settings"]  # checked by the client's reader: in range, finite
    return {"temperature": float(settings["temperature"]), "top_p": float(settings["top_p"]),
            "seed": settings["seed"] % SEED_LIMIT}  # the client sends seed * SEED_STRIDE + i modulo SEED_LIMIT too


def replica_settings(server: ServerWorkload, k: int) -> SpecSettings:
    budget = one_budget(server.answers)
    if server.temperature == 0:
        return SpecSettings(k=k, temperature=0.0, max_new_tokens=budget)
    return SpecSettings(k=k, max_new_tokens=budget, **sampling_of(server))


def run_replica(server: ServerWorkload, out: str | Path,
                on_request: Callable[[RequestComparison | SampledRequest], None] | None = None,
                plan: ReplicaPlan | None = None) -> Replica:
    """Replicate every answer of `server` into the workload folder `out` (which must be new or empty);
    `plan` replaces the one that reproduces the server (a benchmark changes one setting to see what it does)."""
    out = Path(out)
    plan = plan or replica_plan(server.speculative_config, server.temperature)
    s = replica_settings(server, plan.k)
    pair = load_preset(REPLICA_PRESET, drafter=plan.drafter)
    check_vocabulary(server.answers, pair.target.full_vocab_size)
    cycles: list[dict] = []
    started = start_workload(pair, [a.request for a in server.answers], s, out, preset=REPLICA_PRESET,
                             prompts_name=ANSWERS, on_cycle=cycles.append,
                             given_ids=[a.prompt_ids for a in server.answers])
    if server.temperature > 0:
        return run_sampled(server, out, started, cycles, plan.k, on_request)
    comparisons = []
    for i, a in enumerate(server.answers):
        cycles.clear()
        started.run_request(i)
        steps = server_steps(a.drafted_per_step, a.accepted_per_step)
        comparisons.append(compare_request(a.request.id, steps, a.token_ids, list(cycles)))
        write_comparison(out, head_of(server), comparisons)
        if on_request:
            on_request(comparisons[-1])
    return Replica(out, comparisons)


def run_sampled(server: ServerWorkload, out: Path, started, cycles: list[dict], k: int,
                on_request: Callable[[SampledRequest], None] | None) -> Replica:
    """Each request's drafting steps counted on both sides, and all of them pooled per position."""
    head = head_of(server) | {"sampling": sampling_of(server)}
    requests, server_all, replica_all = [], [], []
    for i, a in enumerate(server.answers):
        cycles.clear()
        started.run_request(i)
        theirs, ours = server_steps(a.drafted_per_step, a.accepted_per_step), drafting_cycles(list(cycles))
        requests.append(sampled_request(a.request.id, theirs, ours))
        server_all += theirs
        replica_all += ours
        compared = compare_sampled(head["sampling"], requests, server_all, replica_all, k)
        write_sampled(out, head_of(server), compared)
        if on_request:
            on_request(requests[-1])
    return Replica(out, [], compared)
