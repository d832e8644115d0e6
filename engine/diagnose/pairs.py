"""The pairs a diagnosis runs: the target loads once, and each drafter an experiment needs is built
around it, once (`PairLoader`, the `LoadPair` that engine/diagnose/run.py calls per arm).

Used by `python -m engine diagnose` (engine/cli/diagnose.py) and, started from the target that live
runs share, by the app's live diagnosis (app/runs/diagnose.py).

May import: engine.run (loading a preset or a folder, building a drafter around a loaded target),
engine.drafters, engine.trace.schema. engine.run loads torch, so it is imported when a pair is built.
"""
from engine.drafters.registry import DrafterOptions
from engine.trace.schema import DECODER_HF


class PairLoader:
    """The target loads once; each drafter options' pair is built around it, once."""

    def __init__(self, args, preset: str | None, target: str) -> None:
        self.args, self.preset, self.target = args, preset, target
        self.pairs: dict[DrafterOptions, object] = {}

    def __call__(self, options: DrafterOptions):
        if options not in self.pairs:
            self.pairs[options] = self.first(options) if not self.pairs else self.around(options)
        return self.pairs[options]

    def first(self, options: DrafterOptions):
        from engine.run import load_preset, load_with_drafter
        a = self.args
        decoder = getattr(a, "decoder", DECODER_HF)  # the app's live diagnosis names no decoder
        if self.preset:
            return load_preset(self.preset, a.device, a.dtype, options, a.target_weights, decoder)
        return load_with_drafter(self.target, options, a.device, a.trust_remote_code, a.dtype, a.target_weights,
                                 decoder)

    def around(self, options: DrafterOptions):
        from engine.run import name_preset_models, pair_for_target, preset_drafter
        target = next(iter(self.pairs.values())).target
        if not self.preset:
            return pair_for_target(target, options, self.args.trust_remote_code)
        preset, filled, shipped = preset_drafter(self.preset, options)
        return name_preset_models(pair_for_target(target, filled), preset, filled, shipped)
