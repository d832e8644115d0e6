"""From settings to a finished trace file: load a pair, encode the prompt, run, record."""
import platform
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from engine.config import SpecSettings, refuse_empty_prompt
from engine.cycle.driver import run_cycles, start
from engine.cycle.pair import Pair, eos_ids_of
from engine.cycle.plain import target_generate
from engine.drafters.registry import DRAFTERS, DrafterOptions, build_drafter, with_shipped_draft
from engine.mode import DEFAULT_MODE, RunMode
from engine.models import linear_paths
from engine.models.device import pick_device, pick_dtype, timed
from engine.models.loading import LoadedModel, load_model
from engine.models.presets import PRESETS
from engine.stats.calibrate import TREE_WIDTHS, calibrate_widths
from engine.stats.calibrate import calibrate as measure_step_times
from engine.stats.plan import KPlan, plan_k, plan_k_fast
from engine.stats.tree_plan import TreePlan, plan_tree
from engine.trace.format import Trace, TraceWriter, make_summary
from engine.trace.schema import (
    CACHE_CONVENTION,
    CACHE_CONVENTION_TEXT,
    DECODER_HF,
    DRAFT_MODEL,
    DRAFT_PROMPT_AS_TARGET,
    DRAFT_PROMPT_RAW,
    FORMAT,
    VERSION,
    WEIGHTS_FLOAT32,
)

Messages = tuple[tuple[str, str], ...]  # a conversation's (role, content) turns


def library_versions() -> dict:
    """The versions a trace's header records; torch is imported here, never by engine/trace."""
    import torch
    import transformers
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def load_pair(target: str, draft: str, device: str | None = None,
              trust_remote_code: bool = False, dtype_name: str | None = None,
              target_weights: str = WEIGHTS_FLOAT32, decoder: str = DECODER_HF) -> Pair:
    """A target and a draft model sharing its tokenizer."""
    return load_with_drafter(target, DrafterOptions(draft_model=draft), device, trust_remote_code, dtype_name,
                             target_weights, decoder)


def load_preset(name: str, device: str | None = None, dtype_name: str | None = None,
                drafter: DrafterOptions | None = None, target_weights: str = WEIGHTS_FLOAT32,
                decoder: str = DECODER_HF) -> Pair:
    """The preset's target with `drafter` (its own draft model by default), using the draft the
    preset ships for that kind unless the options name one. `target_weights` (engine/trace/schema.py
    TARGET_WEIGHTS) picks what the target's linear layers run on; int4 needs the preset's GGUF file.
    `decoder` (schema.DECODERS) picks the code the target and a draft model run on (LoadedModel.use_decoder)."""
    preset, options, shipped = preset_drafter(name, drafter)
    pair = load_with_drafter(str(preset.target_folder()), options, device, dtype_name=dtype_name, decoder=decoder)
    pair.target.gguf_file = preset.target_gguf()  # the file its float32 copy was made from
    pair.target.use_weights(target_weights)
    return name_preset_models(pair, preset, options, shipped)


def preset_drafter(name: str, drafter: DrafterOptions | None = None) -> tuple:
    """(preset, drafter options with the preset's shipped draft filled in, that shipped draft or None)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    preset = PRESETS[name]
    options, shipped = with_shipped_draft(preset, drafter or DrafterOptions())
    return preset, options, shipped


def name_preset_models(pair: Pair, preset, options: DrafterOptions, shipped) -> Pair:
    """Traces name a preset's shipped models portably, never by this machine's path."""
    pair.target.name = preset.target_name
    if shipped is not None:
        DRAFTERS[options.kind].name_draft(pair.drafter, shipped.name)
    return pair


def load_with_drafter(target: str, options: DrafterOptions, device: str | None = None,
                      trust_remote_code: bool = False, dtype_name: str | None = None,
                      target_weights: str = WEIGHTS_FLOAT32, decoder: str = DECODER_HF) -> Pair:
    """A target and the drafter `options` name (engine/drafters/registry.py builds it), the target and a
    draft model running on `decoder` (LoadedModel.use_decoder: a model the own decoder refuses falls back)."""
    dev = pick_device(device)
    dtype = pick_dtype(dev, dtype_name)
    target_model = load_model(target, dev, dtype, trust_remote_code)
    target_model.use_weights(target_weights)
    target_model.use_decoder(decoder)
    return pair_for_target(target_model, options, trust_remote_code)


def pair_for_target(target_model: LoadedModel, options: DrafterOptions, trust_remote_code: bool = False) -> Pair:
    """The drafter `options` name for a loaded target; a draft model loads on the target's device and dtype
    (under tensor parallelism: rank 0's device, unsharded) and runs on the decoder asked of the target
    (an EAGLE head is its own module: it keeps it)."""
    dev, dtype, decoder = target_model.device, target_model.dtype, target_model.decoder_asked

    def load(folder: str) -> LoadedModel:
        draft = load_model(folder, dev, dtype, trust_remote_code)
        draft.use_decoder(decoder)
        return draft

    drafter = build_drafter(target_model, options, load)
    # Pair.draft is a draft model over the target's tokens only (calibration times its steps).
    draft = drafter.model if DRAFTERS[options.kind].needs.same_tokens else None
    return Pair(target_model, draft, eos_ids_of(target_model), drafter)


def settle_linear_paths(pair: Pair) -> dict:
    """Run each model's forward widths on the linear path this machine measured faster
    (engine/models/linear_paths.py); what the header records, per model where there was a choice."""
    models = {"target": pair.target, "draft": pair.draft}
    curves = {role: linear_paths.settle(m) for role, m in models.items() if m is not None}
    return {role: curve for role, curve in curves.items() if curve is not None}


def encode_prompt(tokenizer, prompt: str, chat: bool, messages: Messages | None = None) -> list[int]:
    """Token ids of the prompt, or of a conversation (`messages`, whose last turn is the user's);
    wrapped in the chat template when asked and available. Without the template a conversation
    is read as `prompt`, the text its caller made of it (engine/workload/prompts.py Request.text)."""
    if chat and getattr(tokenizer, "chat_template", None):
        turns = [{"role": r, "content": c} for r, c in messages] if messages else [{"role": "user", "content": prompt}]
        prompt = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    refuse_empty_prompt(ids)
    return list(ids)


def pair_for_prompt(pair: Pair, prompt: str, prompt_ids: list[int], messages: Messages | None = None) -> Pair:
    """The pair as it runs this prompt. A draft model set to read the prompt without the chat template
    (draft_prompt "raw", a mis-setting planted on purpose: engine/drafters/model.py) is handed that
    rendering, encoded with the draft's own tokenizer; `prompt_ids` are the target's."""
    drafter = pair.drafter
    if getattr(drafter, "draft_prompt", DRAFT_PROMPT_AS_TARGET) != DRAFT_PROMPT_RAW:
        return pair
    own = encode_prompt(drafter.model.tokenizer, prompt, False, messages)  # a conversation without a template: its text
    return replace(pair, drafter=drafter.reading(prompt_ids, own))


def context_length(pair: Pair) -> int | None:
    """Positions the target and a same-tokenizer draft can attend to (max_position_embeddings), if known.

    Prompt lookup has no model; an other-tokenizer draft counts its own tokens, not the target's.
    """
    models = [m for m in (pair.target, pair.draft) if m is not None]
    sizes = [getattr(m.model.config, "max_position_embeddings", None) for m in models]
    sizes = [n for n in sizes if isinstance(n, int) and n > 0]
    return min(sizes) if sizes else None


def check_prompt_fits(pair: Pair, prompt_len: int, s: SpecSettings) -> None:
    """The last verify pass reaches position prompt + max_new_tokens + K - 1: it must fit the context."""
    context = context_length(pair)
    if context is not None and prompt_len + s.max_new_tokens + s.k > context:
        room = context - s.max_new_tokens - s.k
        raise ValueError(f"the prompt is {prompt_len} tokens; with max_new_tokens {s.max_new_tokens} and K {s.k} "
                         f"the models' context of {context} leaves room for {max(room, 0)} prompt tokens")


def describe_model(m: LoadedModel) -> dict:
    params = sum(p.numel() for p in m.model.parameters())
    return {"name": m.name, "architecture": type(m.model).__name__, "parameters": params,
            "vocab_size": m.full_vocab_size,
            "kept_vocab": None if m.kept_token_ids is None else int(m.kept_token_ids.numel())}


def decoder_models(pair: Pair) -> dict[str, LoadedModel]:
    """The models whose code --decoder picks: the target, and the drafter's model when it drafts with one
    (a draft model, or one with its own tokenizer; not prompt lookup, not an EAGLE head)."""
    draft = getattr(pair.drafter, "model", None) if DRAFTERS[pair.drafter.kind].needs.model else None
    return {"target": pair.target} | ({} if draft is None else {"draft": draft})


def describe_decoders(pair: Pair) -> dict:
    """The header's optional "decoder" field: which decoder made each model's distributions, and why a
    model asked to run on the own decoder did not. Only a run that asked for the own decoder writes it:
    without it a trace's models ran on Hugging Face's modules, as every trace before the field did."""
    models = decoder_models(pair)
    if all(m.decoder_asked == DECODER_HF for m in models.values()):
        return {}
    return {"decoder": {role: m.describe_decoder() for role, m in models.items()}}


def make_header(pair: Pair, s: SpecSettings, prompt: str, prompt_ids: list[int],
                preset: str | None, chat_template: bool, mode: RunMode) -> dict:
    tok = pair.target.tokenizer
    settings = s.to_dict() | ({} if mode.tree is None else {"tree": mode.tree.describe()})
    return {
        "type": "header", "format": FORMAT, "version": VERSION,
        "target": describe_model(pair.target), "draft": pair.drafter.describe(),
        "drafter": pair.drafter.settings(),
        "tokenizer": type(tok).__name__, "preset": preset, "chat_template": chat_template,
        "target_weights": pair.target.describe_weights(), **describe_decoders(pair),
        "settings": settings, "prompt": prompt, "prompt_token_ids": prompt_ids,
        "prompt_token_texts": [tok.decode([t]) for t in prompt_ids],
        "cache_convention": {"name": CACHE_CONVENTION, "text": CACHE_CONVENTION_TEXT},
        "cache_layout": mode.cache_layout(s, len(prompt_ids)),
        "device": str(pair.target.device), "dtype": str(pair.target.dtype).removeprefix("torch."),
        "versions": library_versions(), "eos_token_ids": sorted(pair.eos_ids),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def measured_fields(pair: Pair, prompt_ids: list[int], s: SpecSettings, mode: RunMode) -> dict:
    """The header's linear paths and calibration, when the mode asks for them (traces without them stay valid).
    A compiled fast path settles the paths whether or not it calibrates (engine/cycle/fast_forward.py
    FixedForward), so its header records them either way."""
    if not (mode.calibrate or mode.calibration or mode.fast == "compile"):
        return {}
    paths = settle_linear_paths(pair)
    if not (mode.calibrate or mode.calibration):
        return {"linear_paths": paths} if paths else {}
    return ({"linear_paths": paths} if paths else {}) | {
        "calibration": mode.calibration or measure_step_times(pair, prompt_ids, s)}


def prefix_models(pair: Pair, mode: RunMode, s: SpecSettings) -> dict[str, LoadedModel]:
    """The models whose prefill reuses a shared prompt start in this run (engine/kv/prefix.py): with
    mode.prefix_reuse, a chain of the draft model on the reference path over dynamic caches; else none."""
    if (mode.prefix_reuse is None or pair.drafter.kind != DRAFT_MODEL or mode.tree is not None or mode.fast is not None
            or mode.tp_size > 1 or s.cache_layout != "dynamic"):
        return {}
    return {"target": pair.target, "draft": pair.drafter.model}


@contextmanager
def reusing_prefixes(pair: Pair, mode: RunMode, s: SpecSettings, prompt_ids: list[int]):
    """Hand each model its store for the run, and yield the header's "prefix_reuse": how many prompt
    tokens each model takes from its store (the rule engine.kv.ops.prefill then follows)."""
    models = prefix_models(pair, mode, s)
    reads = {"target": prompt_ids, "draft": getattr(pair.drafter, "own_prompt_ids", lambda p: p)(prompt_ids)}
    for role, model in models.items():
        model.prefix_store = mode.prefix_reuse.store(role)
    try:
        yield {role: model.prefix_store.reusable(reads[role][:-1]) if len(reads[role]) > 1 else 0
               for role, model in models.items()}
    finally:
        for model in models.values():
            model.prefix_store = None


def answer_text(tokenizer, token_ids: list[int]) -> str:
    """Generated tokens as a server answers them: special tokens (an end of turn such as <|im_end|>)
    skipped, as vLLM and the OpenAI-compatible servers do by default, so that the lab's text and a
    server's can be compared as they are. The tokens themselves, specials included, stay in the ids."""
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def run_summary(pair: Pair, cycles: list[dict], k: int, wall_s: float) -> dict:
    """A finished run's summary line: its tokens, their text, why it stopped and its wall time."""
    generated = [t for c in cycles for t in c["committed_token_ids"]]
    stop = "eos" if generated and generated[-1] in pair.eos_ids else "max_new_tokens"
    return make_summary(cycles, k, answer_text(pair.target.tokenizer, generated), stop, wall_s)


def run_to_trace(pair: Pair, prompt: str, s: SpecSettings, out: str | Path, mode: RunMode = DEFAULT_MODE, *,
                 preset: str | None = None, chat_template: bool = True,
                 on_cycle: Callable[[dict], None] | None = None, messages: Messages | None = None,
                 request: dict | None = None, prompt_ids: list[int] | None = None) -> Trace:
    """Run speculative decoding on `prompt` in `mode` (engine/mode.py: chain or tree, reference or fast,
    faults, ranks, calibration), writing the trace to `out` as it goes. Everything the mode or the
    pair cannot run is refused before anything is written. A workload's request passes its
    conversation (`messages`, with `prompt` its text without a template) and its id and category
    (`request`), which the header keeps. `prompt_ids`, when given, are the target's prompt as it runs
    (a server's ids after its own chat template, which the replica feeds): used as they are, never
    encoded again, so no second rendering of the template can differ from them.
    """
    refuse_empty_prompt(prompt)
    use_chat = chat_template and bool(getattr(pair.target.tokenizer, "chat_template", None))
    if prompt_ids is None:
        prompt_ids = encode_prompt(pair.target.tokenizer, prompt, use_chat, messages)
    else:
        refuse_empty_prompt(prompt_ids)
        prompt_ids = list(prompt_ids)
    pair = pair_for_prompt(pair, prompt, prompt_ids, messages)
    kind = mode.prepare(pair, s)
    s = kind.settings
    check_prompt_fits(pair, len(prompt_ids), s)
    if mode.fast is not None and mode.calibrate and mode.calibration is None:
        mode = fast_calibrated(pair, prompt_ids, s, mode)
        kind = mode.prepare(pair, s)  # the cycle kind on the calibrated forwards
    header = make_header(pair, s, prompt, prompt_ids, preset, use_chat, mode)
    if messages:
        header["messages"] = [{"role": r, "content": c} for r, c in messages]
    if request:
        header["request"] = request
    header |= mode.header_fields(measured_fields(pair, prompt_ids, s, mode))
    cycles: list[dict] = []
    with reusing_prefixes(pair, mode, s, prompt_ids) as reused, TraceWriter(out) as writer:
        if reused:
            header["prefix_reuse"] = reused
        writer.write(header)
        started = time.perf_counter()  # the wall time includes the prefill, as it always has
        for rec in run_cycles(kind, start(kind, prompt_ids)):  # prepare has checked the kind
            writer.write(rec)
            cycles.append(rec)
            if on_cycle:
                on_cycle(rec)
        summary = run_summary(pair, cycles, s.k, time.perf_counter() - started)
        writer.write(summary)
    return Trace(header, cycles, summary)


def fast_calibrated(pair: Pair, prompt_ids: list[int], s: SpecSettings, mode: RunMode) -> RunMode:
    """`--fast --calibrate`: the step times of the forwards the fast run calls (engine/stats/fast_calibrate.py),
    not the reference path's, and those forwards kept for the run, so none is built (or compiled) twice."""
    from engine.stats.fast_calibrate import calibrate_fast

    calibration, forwards = calibrate_fast(pair, prompt_ids, s, mode.fast)
    return replace(mode, calibration=calibration, fast_models=forwards.models_for(s.k))


def prepare_advised_run(pair: Pair, prompt: str, s: SpecSettings, chat_template: bool) -> list[int]:
    """What both advisors do before measuring: refuse what cannot run, encode the prompt, and settle
    this machine's linear path per width (the calibration then times the paths the run will use)."""
    refuse_empty_prompt(prompt)
    pair.drafter.check_settings(s)
    use_chat = chat_template and bool(getattr(pair.target.tokenizer, "chat_template", None))
    prompt_ids = encode_prompt(pair.target.tokenizer, prompt, use_chat)
    check_prompt_fits(pair, len(prompt_ids), s)
    settle_linear_paths(pair)
    return prompt_ids


@dataclass(frozen=True)
class AdvisedRun:
    """What run_advised did: a trace at the advised K, or (plan.k == 0) plain decoding's text."""

    plan: KPlan
    trace: Trace | None  # None when the advisor said to decode plainly
    text: str
    tokens: int
    decode_s: float  # plain decoding's loop, prefill aside; for a trace, its cycles' time


def run_advised(pair: Pair, prompt: str, s: SpecSettings, out: str | Path, preset: str | None = None,
                chat_template: bool = True, on_cycle: Callable[[dict], None] | None = None) -> AdvisedRun:
    """Calibrate on this machine, measure alpha with a short pilot at s.k, and run what the K advisor
    says (engine/stats/plan.py): speculation at its K, traced to `out`, or plain decoding when no K
    beats it here, in which case nothing is written."""
    prompt_ids = prepare_advised_run(pair, prompt, s, chat_template)
    pair = pair_for_prompt(pair, prompt, prompt_ids)  # the K advisor's pilot drafts as the run will
    calibration = measure_step_times(pair, prompt_ids, s)
    plan = plan_k(pair, prompt_ids, s, calibration)
    if plan.plain:
        tokens, seconds = timed(lambda: target_generate(pair.target, prompt_ids, s, pair.eos_ids))
        return AdvisedRun(plan, None, answer_text(pair.target.tokenizer, tokens), len(tokens), seconds)
    advised = replace(s, k=plan.k)
    widest = max(calibration["verify_positions"])
    mode = RunMode(calibrate=True, calibration=calibration if plan.k + 1 <= widest else None)
    trace = run_to_trace(pair, prompt, advised, out, mode, preset=preset, chat_template=chat_template, on_cycle=on_cycle)
    return AdvisedRun(plan, trace, trace.summary["generated_text"], trace.summary["num_generated"],
                      sum(c["cycle_time_s"] for c in trace.cycles))


def run_fast_advised(pair: Pair, prompt: str, s: SpecSettings, out: str | Path, mode: RunMode,
                     preset: str | None = None, chat_template: bool = True,
                     on_cycle: Callable[[dict], None] | None = None) -> AdvisedRun:
    """run_advised on the fast path (`mode.fast`, its capture settled): the K advisor weighs K on the fast
    path's own forwards (engine/stats/fast_calibrate.py), its pilot runs them, and so does what it says:
    speculation at its K, traced with that calibration, or plain decoding on the same path. The forwards
    are built once for all three (under --capture compile each width compiles once)."""
    from engine.cycle.fast import fast_plain_decode
    from engine.stats.fast_calibrate import calibrate_fast

    prompt_ids = prepare_advised_run(pair, prompt, s, chat_template)
    pair = pair_for_prompt(pair, prompt, prompt_ids)
    s = mode.prepare(pair, s).settings  # refuses what the fast path cannot run before anything is timed
    calibration, forwards = calibrate_fast(pair, prompt_ids, s, mode.fast)
    plan = plan_k_fast(pair, prompt_ids, s, calibration, forwards)
    if plan.plain:
        tokens, seconds = timed(lambda: fast_plain_decode(pair.target, prompt_ids, s, pair.eos_ids, mode.fast,
                                                          forwards.plain_model()))
        return AdvisedRun(plan, None, answer_text(pair.target.tokenizer, tokens), len(tokens), seconds)
    advised = replace(mode, calibration=calibration, fast_models=forwards.models_for(plan.k))
    trace = run_to_trace(pair, prompt, replace(s, k=plan.k), out, advised, preset=preset, chat_template=chat_template,
                         on_cycle=on_cycle)
    return AdvisedRun(plan, trace, trace.summary["generated_text"], trace.summary["num_generated"],
                      sum(c["cycle_time_s"] for c in trace.cycles))


TREE_DRAFT_WIDTHS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]  # a tree's level batches, timed for the draft


@dataclass(frozen=True)
class TreeAdvisedRun:
    """What run_tree_advised did: a trace of the advised tree or chain, or plain decoding's text."""

    plan: TreePlan
    trace: Trace | None  # None when the advisor said to decode plainly
    text: str
    tokens: int


def run_tree_advised(pair: Pair, prompt: str, s: SpecSettings, out: str | Path, preset: str | None = None,
                     chat_template: bool = True, on_cycle: Callable[[dict], None] | None = None) -> TreeAdvisedRun:
    """`--tree auto`: measure both models' cost by width on this machine, estimate from a short chain
    pilot how often the draft's top-B tokens hold the target's choice, and run what the tree advisor
    (engine/stats/tree_plan.py) predicts fastest: a static tree, a chain, or plain decoding."""
    prompt_ids = prepare_advised_run(pair, prompt, s, chat_template)
    pair = pair_for_prompt(pair, prompt, prompt_ids)  # the tree advisor's pilot drafts as the run would
    calibration = calibrate_widths(pair, prompt_ids, s, TREE_WIDTHS, draft_widths=TREE_DRAFT_WIDTHS)
    plan = plan_tree(pair, prompt_ids, s, calibration)
    if plan.plain:
        tokens = target_generate(pair.target, prompt_ids, s, pair.eos_ids)
        return TreeAdvisedRun(plan, None, answer_text(pair.target.tokenizer, tokens), len(tokens))
    trace = run_to_trace(pair, prompt, replace(s, k=plan.k), out, RunMode(tree=plan.tree), preset=preset,
                         chat_template=chat_template, on_cycle=on_cycle)
    return TreeAdvisedRun(plan, trace, trace.summary["generated_text"], trace.summary["num_generated"])
