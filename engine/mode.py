"""The run mode: one validated value for how a run's cycles are made, built once from the CLI, the app or the API.

It says what the cycles are (a chain or a tree, on the reference path or the device-resident
fast path, or B chains in one batched cycle), which teaching faults break them, and over how
many tensor-parallel ranks the target runs. Impossible combinations are refused here and nowhere else, each with one
wording, as soon as the mode is built (the CLI builds it before any model loads); what
depends on the loaded pair (the drafter kind) is refused by `prepare` before anything is
written. The mode also writes its own trace header fields.

Importing this module loads no torch: the CLI builds a mode before it loads anything. The
cycle kinds it picks are imported when a run starts.
"""
from dataclasses import asdict, dataclass, replace
from typing import Any

from engine.config import SettingsError, SpecSettings, TreeSpec, check_capture
from engine.drafters.refusals import MIS_SET_CHAIN_ONLY
from engine.drafters.registry import DRAFTERS
from engine.models.errors import OWN_DECODER_TP
from engine.trace.batch_reader import MAX_BATCH
from engine.trace.schema import DECODER_HF, DECODER_OWN, DRAFT_MODEL, FEATURE_HEADS, WEIGHTS_FLOAT32


def refuse(asked: bool, message: str) -> None:
    if asked:
        raise SettingsError(message)


def refuse_with_batch(asked: bool, what: str) -> None:
    """The one wording of every combination --batch does not run."""
    refuse(asked, f"--batch does not run with {what}: drop one of the two")


@dataclass(frozen=True)
class RunMode:
    """How a run's cycles are made; the default is the chain on the reference path, correct, one process."""

    tree: TreeSpec | None = None  # draft token trees of this shape (engine/tree/) instead of chains
    fast: str | None = None  # a capture mode (engine.config.CAPTURE_MODES): the device-resident path; None: the reference path
    # --capture auto on the CPU: the measurement that chose `fast` (engine/cycle/capture_choice.py CaptureTimes.describe)
    fast_measured: dict | None = None
    # the fast path's caches and forwards built before the run (engine/cycle/fast.py FastModels: an advised run's
    # calibrated forwards, engine/stats/fast_calibrate.py), reused so that no width is compiled twice
    fast_models: Any = None
    faults: Any = None  # a teaching CycleRule (engine/teaching/faults.py); None: the ratio test
    tp_size: int = 1  # tensor-parallel ranks the target is sharded over (engine/parallel/rank.py)
    tensor_parallel: dict | None = None  # rank 0's record of the group, for the header
    calibrate: bool = False  # also time both models' steps (engine/stats/calibrate.py)
    calibration: dict | None = None  # a calibration already measured for this pair and prompt, recorded as it is
    # reuse the K/V of the start a request shares with the previous one (engine/kv/prefix.py), one store per
    # model kept across the requests that share this mode; a chain of the draft model on a dynamic cache only
    prefix_reuse: Any = None
    batch: int | None = None  # rows of one batched cycle (engine/batch/cycle.py), a workload's requests B at a time

    def __post_init__(self) -> None:
        tree, faults = self.tree is not None, self.faults is not None
        check_capture(self.fast)
        if self.batch is not None:
            self.refuse_with_batch()
        for asked, what in ((self.fast is not None, "--fast"), (faults and not self.faults.for_trees, "a teaching fault"),
                            (self.calibrate or self.calibration is not None, "calibration"), (self.tp_size > 1, "--tp")):
            refuse(tree and asked, f"--tree does not run with {what} yet; drop one of the two")
        refuse(faults and not tree and not self.faults.for_chains,
               "tree faults break a tree's rollback: they need a tree spec")
        refuse(self.fast is not None and faults,
               "the fast path runs the correct algorithm only: teaching faults need the reference path")
        refuse(self.fast is not None and self.tp_size > 1,
               "--fast keeps the cycle on one device (CUDA graphs over static caches); under --tp use the normal "
               "path (drop --fast)")

    def refuse_with_batch(self) -> None:
        """What a batched cycle cannot run, one line each, as soon as the mode is built."""
        b = self.batch
        refuse(isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BATCH,
               f"--batch must be an integer from 1 to {MAX_BATCH}, got {b!r}")
        for asked, what in ((self.tree is not None, "--tree (trees in a batch are not built)"),
                            (self.fast is not None, "--fast (the batch has its own static rows)"),
                            (self.calibrate or self.calibration is not None, "--calibrate"),
                            (self.faults is not None, "a teaching fault (the batch runs the ratio test only)"),
                            (self.tp_size > 1, "--tp (the ranks' mirror does not see the batch's forwards)"),
                            (self.prefix_reuse is not None, "prefix reuse (each row's prompt is read alone)")):
            refuse_with_batch(asked, what)

    def check_batch_settings(self, s: SpecSettings, resume: bool = False) -> None:
        """The settings and workload options a batched cycle cannot run (nothing when the mode is not a batch)."""
        if self.batch is None:
            return
        refuse_with_batch(resume, "--resume (a batched workload runs in one go)")
        refuse_with_batch(s.cache_layout != "dynamic", f"--cache {s.cache_layout} (a batch keeps every row in its "
                          "own ragged buffer, engine/kv/rows.py; a batched paged layout is not built)")

    def check_drafter(self, kind: str, target_weights: str = WEIGHTS_FLOAT32, mis_set: bool = False,
                      decoder: str = DECODER_HF) -> None:
        """What this mode cannot run with a drafter kind, a deliberately mis-set draft model (`mis_set`,
        engine/drafters/model.py), the target's weights or the decoder (--decoder), refused before anything loads."""
        # The tree and the fast path draft with the draft model directly, not through the drafter's variants.
        refuse(mis_set and (self.tree is not None or self.fast is not None), MIS_SET_CHAIN_ONLY)
        refuse(self.tp_size > 1 and kind in FEATURE_HEADS,
               "the EAGLE head drafts through the target's output layer, which --tp shards over the ranks: use a "
               "draft model, prompt lookup or the other-tokenizer draft")
        refuse(self.tp_size > 1 and target_weights != WEIGHTS_FLOAT32,
               f"--target-weights {target_weights} runs on one CPU process: drop --tp")
        refuse(decoder == DECODER_OWN and self.tp_size > 1, OWN_DECODER_TP)
        if self.batch is not None:
            refuse_with_batch(decoder != DECODER_HF, f"--decoder {decoder}")
            refuse_with_batch(mis_set, "--draft-prompt or --draft-filters (a mis-set draft runs on the reference "
                                       "chain only)")
            refuse(kind in DRAFTERS and not DRAFTERS[kind].batches,
                   f"--batch drafts every row in one forward, through a drafter that proposes for several rows at "
                   f"once; the {kind} drafter proposes for one: batched speculation runs the draft-model drafter only")

    def with_ranks(self, tensor_parallel: dict) -> "RunMode":
        """The same mode with rank 0's record of the group (engine/parallel/rank.py), once the ranks have joined."""
        return replace(self, tp_size=tensor_parallel["tp_size"], tensor_parallel=tensor_parallel)

    def settings_for(self, s: SpecSettings) -> SpecSettings:
        """The settings the cycles run and the header records: K is a tree's depth; the fast path's caches and a
        batch's rows are static."""
        if self.tree is not None:
            s = replace(s, k=self.tree.max_depth)
        if (self.fast is not None or self.batch is not None) and s.cache_layout != "static":
            s = replace(s, cache_layout="static")
        return s

    def cycle_kind(self, pair, s: SpecSettings):
        """The cycle kind that runs these cycles (engine/cycle/driver.py CycleKind or RowsKind), for a loaded pair."""
        from engine.cycle.ratio_test import RATIO_TEST
        from engine.cycle.reference import ChainCycle
        if self.batch is not None:
            from engine.batch.cycle import BatchedChainCycle
            return BatchedChainCycle(pair, s)
        if self.tree is not None:
            from engine.tree.cycle import TreeCycle
            return TreeCycle(pair, s, self.tree, self.faults or RATIO_TEST)
        if self.fast is not None:
            from engine.cycle.fast import FastChainCycle
            return FastChainCycle(pair, s, self.fast, self.fast_models)
        return ChainCycle(pair, s, self.faults or RATIO_TEST)

    def prepare(self, pair, s: SpecSettings):
        """Refuse what the loaded pair cannot run in this mode (before anything is written); the cycle kind
        that runs, whose `settings` are the ones to record."""
        self.check_drafter(pair.drafter.kind, pair.target.weights, getattr(pair.drafter, "mis_set", False),
                           pair.target.decoder_asked)
        self.check_batch_settings(s)
        pair.drafter.check_settings(s)
        kind = self.cycle_kind(pair, self.settings_for(s))
        kind.check()
        return kind

    def cache_layout(self, s: SpecSettings, prompt_len: int) -> dict:
        """The header's "cache_layout": what the cycle kind allocates for this prompt."""
        if self.tree is not None:
            from engine.tree.cycle import tree_layout
            return tree_layout(s, self.tree, prompt_len).describe()
        from engine.kv.layouts import layout_for_run
        layout = layout_for_run(s, prompt_len, getattr(self.faults, "keep_rejected_kv", False))
        if self.fast_models is not None:  # caches built before the run, sized for its widest use: the buffers it has
            layout = replace(layout, capacity=self.fast_models.capacity)
        return layout.describe()

    def header_fields(self, measured: dict) -> dict:
        """The header's optional fields this mode adds, in the header's order; `measured` (the linear
        paths and the calibration, when asked for) goes between the ranks and the fast path."""
        fields: dict = {}
        if self.faults is not None:  # marks a deliberately broken teaching run
            fields["faults"] = asdict(self.faults)
        if self.tensor_parallel is not None:  # the ranks the target was sharded over
            fields["tensor_parallel"] = self.tensor_parallel
        fields |= measured
        if self.fast is not None:  # which path made the cycles
            fields["fast_path"] = {"capture": self.fast} | (
                {} if self.fast_measured is None else {"measured": self.fast_measured})
        return fields


def refuse_tree_auto(drafter_kind: str, fast: bool, calibrate: bool, mis_set: bool = False) -> None:
    """`--tree auto` (the tree advisor chooses the run, engine/run.py run_tree_advised): what it cannot do."""
    refuse(mis_set, MIS_SET_CHAIN_ONLY)
    refuse(drafter_kind != DRAFT_MODEL,
           f"--tree auto sizes trees from the draft model's costs and ranks; with --drafter {drafter_kind} name the "
           "tree (static:3,2,1 or dynamic:top_k=3,depth=4,nodes=12)")
    refuse(fast or calibrate, "--tree auto measures on its own and runs the reference cycle: drop --fast and --calibrate")


DEFAULT_MODE = RunMode()  # the chain on the reference path, correct, one process
