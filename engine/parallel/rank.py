"""One rank of a run under torchrun: every rank loads its shard of the target, rank 0 runs the cycle.

    torchrun --nproc-per-node N -m engine run --tp N ...

Every rank joins the group and loads the target with transformers' tensor-parallel plan
(engine/models/loading.py, `tp_size`). Rank 0 also loads the drafter, then runs the same
cycle as a single process (engine/cycle/reference.py) with its target wrapped so that each
target operation is announced to the other ranks first (engine/parallel/mirror.py); they
replay them on their own shard until rank 0 says stop. Rank 0 alone writes the trace, the
progress bar and errors (engine/parallel/failure.py says who speaks when something fails).
`python -m engine run --tp N` (engine/cli/run.py cmd_run_parallel) calls it on every rank.

May import the engine's library: it is engine/run.py under torchrun, so engine.run and engine.mode
on top of the rest of engine.parallel; never engine.cli. No other module of engine.parallel imports it.
"""
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.drafters.registry import DrafterOptions
from engine.mode import DEFAULT_MODE, RunMode
from engine.models.device import pick_dtype
from engine.models.loading import LoadedModel, load_model
from engine.parallel.failure import GroupError, broken_group, is_group_failure
from engine.parallel.mirror import Lead, LeadTarget, Observer, follow
from engine.parallel.world import World, rank_layout
from engine.run import name_preset_models, pair_for_target, preset_drafter, run_to_trace
from engine.trace.format import Trace


@dataclass
class RankModels:
    """What this rank holds: its shard of the target; on rank 0 also the pair the cycle runs."""

    world: World
    target: LoadedModel
    layout: list[dict]  # every rank's host and device
    pair: Pair | None = None  # rank 0 only: a LeadTarget and the drafter
    lead: Lead | None = None

    def header_entry(self) -> dict:
        """The trace header's "tensor_parallel" field."""
        w = self.world
        return {"world_size": w.world_size, "tp_size": w.world_size, "backend": w.backend, "drafter_rank": 0,
                "ranks": [{key: r[key] for key in ("rank", "local_rank", "host", "device")} for r in self.layout]}


def quiet_follower() -> None:
    """The other ranks write nothing: no loading bars, no library warnings (rank 0 shows its own)."""
    import transformers
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.simplefilter("ignore")
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)


def check_all_loaded(world: World, layout: list[dict]) -> None:
    """After every rank tried to load: stop everywhere if one failed, rank 0 naming it."""
    failed = [r for r in layout if r.get("error")]
    if not failed:
        return
    if not world.is_lead:
        raise GroupError("another rank failed to load")  # rank 0 reports it
    first = failed[0]
    more = f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""
    raise GroupError(f"rank {first['rank']} on {first['host']} could not load its shard of the target{more}: "
                     f"{first['error']}")


def load_ranks(world: World, target: str, options: DrafterOptions, dtype_name: str | None = None,
               trust_remote_code: bool = False, preset: str | None = None) -> RankModels:
    """Every rank loads its shard; rank 0 then loads the drafter. A collective: every rank calls it."""
    if not world.is_lead:
        quiet_follower()
    dtype = pick_dtype(world.device, dtype_name)
    shard, error = None, None
    try:
        shard = load_model(target, world.device, dtype, trust_remote_code, tp_size=world.world_size)
    except Exception as err:  # noqa: BLE001 - every rank must reach the gather below, failed or not
        error = " ".join(str(err).split()) or type(err).__name__
        error = error if target in error else f"{target}: {error}"  # a library's own error names no folder
    try:
        layout = rank_layout(world, error)
    except Exception as err:
        raise broken_group(err, world.timeout_s, "while the ranks were loading") from err
    check_all_loaded(world, layout)
    models = RankModels(world, shard, layout)
    if world.is_lead:
        models.lead = Lead(world)
        try:
            models.pair = lead_pair(shard, models.lead, options, trust_remote_code, preset)
        except Exception:
            models.lead.stop(aborted=True)  # the others wait for rank 0's first operation
            raise
    return models


def lead_pair(shard: LoadedModel, lead: Lead, options: DrafterOptions, trust_remote_code: bool,
              preset: str | None) -> Pair:
    """Rank 0's pair: the drafter on rank 0's device, the target wrapped to announce its operations."""
    entry = shipped = None
    if preset is not None:
        entry, options, shipped = preset_drafter(preset, options)
    pair = pair_for_target(shard, options, trust_remote_code)
    pair.target = LeadTarget.of(pair.target, lead)
    return pair if entry is None else name_preset_models(pair, entry, options, shipped)


def run_lead(models: RankModels, prompt: str, s: SpecSettings, out: str | Path, mode: RunMode = DEFAULT_MODE, *,
             preset: str | None = None, chat_template: bool = True, on_cycle: Callable[[dict], None] | None = None,
             observe: Observer | None = None) -> Trace:
    """Rank 0: the run, written to `out` as a single process writes it (the mode records the group), then
    tell the others to stop."""
    models.lead.observe = observe
    try:
        trace = run_to_trace(models.pair, prompt, s, out, mode.with_ranks(models.header_entry()), preset=preset,
                             chat_template=chat_template, on_cycle=on_cycle)
    except GroupError:
        raise
    except Exception as err:
        if is_group_failure(err):
            raise broken_group(err, models.world.timeout_s, "during the run") from err
        try:  # rank 0's own error (a prompt too long, a full cache): the others are waiting for an operation
            models.lead.stop(aborted=True)
        except Exception:  # noqa: BLE001 - the group is gone as well; the first error is the one to report
            pass
        raise
    models.lead.stop()
    return trace


def run_follower(models: RankModels, observe: Observer | None = None) -> int:
    """Another rank: replay rank 0's operations; the exit code 0, or 2 when rank 0 stopped on an error."""
    return 0 if follow(models.world, models.target, observe) else 2
