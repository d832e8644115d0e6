"""`python -m engine diagnose`: why is acceptance low on this pair, these settings and these requests?

The same pair and sampling options as `engine run`. The target loads once; each drafter an
experiment needs is built around it. The runs go to --out as workload folders (one per arm) with
the findings in diagnosis.json; the report names the folder behind every figure.
"""
import json
import sys
from pathlib import Path

from engine import cli_run
from engine.config import SettingsError
from engine.diagnose.experiments import CONTEXT_TOKENS, Arm, plan
from engine.drafters.registry import DrafterOptions, check_before_loading, options_from_args
from engine.models.presets import PRESETS
from engine.trace.schema import DECODER_HF, EAGLE
from engine.workload.prompts import BUNDLED_PROMPT_SET, Request, read_prompts

ROOT = Path(__file__).resolve().parents[1]
PROMPT_SET = BUNDLED_PROMPT_SET
LONG_TEXT = ROOT / "assets" / "prompts" / "long-context.jsonl"


def per_category(requests: list[Request], n: int | None) -> list[Request]:
    if n is None:
        return requests
    if n < 1:
        raise SettingsError("--per-category must be at least 1")
    seen: dict[str, int] = {}
    kept = []
    for r in requests:
        seen[r.category] = seen.get(r.category, 0) + 1
        if seen[r.category] <= n:
            kept.append(r)
    return kept


def context_prefix(tokenizer, tokens: int = CONTEXT_TOKENS) -> str:
    """About `tokens` tokens of a public-domain passage the requests do not ask about."""
    text = json.loads(LONG_TEXT.read_text(encoding="utf-8").splitlines()[0])["prompt"]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
    return f"(Unrelated text first.)\n\n{tokenizer.decode(ids)}\n\n(Now the request.)\n\n"


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


def cmd_diagnose(args) -> int:
    from tqdm import tqdm

    from engine.diagnose.diagnosis import diagnose, format_diagnosis

    if args.tree is not None:
        raise SettingsError("diagnose compares chains: drop --tree")
    args.drafter = cli_run.chosen_drafter(args)
    settings = cli_run.settings_from_args(args)
    options = options_from_args(args)
    target, draft, preset = cli_run.resolve_models(args)
    requests = per_category(read_prompts(args.prompts or PROMPT_SET), args.per_category)
    check_before_loading(options, settings, PRESETS[preset] if preset else None, draft)
    cli_run.check_device(args.device, args.dtype)
    load = PairLoader(args, preset, target)
    pair = load(options)
    chat = not args.no_chat_template
    has_template = chat and bool(getattr(pair.target.tokenizer, "chat_template", None))
    has_eagle = bool(preset and PRESETS[preset].own_draft(EAGLE))
    base = Arm("baseline", options, settings)
    arms = 2 + sum(e.arm is not None for e in plan(base, has_template=has_template, has_eagle=has_eagle,
                                                   prefix="", best_k=None))
    bar = tqdm(total=arms * len(requests), unit="req", desc="diagnosis", file=sys.stderr)
    with cli_run.ctrl_c_at_cycle_ends() as stop_if_asked:
        try:
            result = diagnose(load, base, requests, args.out, has_template=has_template, has_eagle=has_eagle,
                              context_prefix=context_prefix(pair.target.tokenizer), chat_template=chat,
                              preset=preset, resume=args.resume, only=set(args.only.split(",")) if args.only else None,
                              on_request=lambda arm: bar.update(1) or bar.set_postfix(arm=arm),
                              on_cycle=lambda rec: stop_if_asked())
        finally:
            bar.close()
    found = result.as_dict()
    Path(args.out, "diagnosis.json").write_text(json.dumps(found, indent=1, ensure_ascii=False), encoding="utf-8")
    print(json.dumps(found, ensure_ascii=False) if args.json else format_diagnosis(result))
    return 0

