"""The drafter registry: the one place a drafter kind maps to its class, its options, its
command-line flags and how it is built.

A kind's name is in engine/trace/schema.py (the trace checks and the app's torch-free pages
read it there); everything else about it is its `DrafterKind` entry in DRAFTERS: what it is,
what it needs besides the target, whether it can sample, its own flags, the draft a preset
ships for it, and its builder. `python -m engine run` adds every kind's flags from here,
engine/run.py builds drafters with `build_drafter`, and the app's live run names them by
their labels.

No torch at import time: each drafter's module is imported when its class is first asked
for, so the command-line parser (and `python -m engine stats`) never load model code.
"""
import importlib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from engine.config import SettingsError, SpecSettings
from engine.drafters.refusals import MIS_SET_HEAD_ONLY, MIS_SET_MODEL_ONLY, OTHER_TOKENIZER_GREEDY_ONLY
from engine.drafters.suffix_tree import check_options as check_suffix_options  # no torch there
from engine.trace.schema import (
    DRAFT_FILTERS,
    DRAFT_FILTERS_REQUEST,
    DRAFT_MODEL,
    DRAFT_PROMPT_AS_TARGET,
    DRAFT_PROMPTS,
    EAGLE,
    EAGLE3,
    EAGLE3_AUX,
    EAGLE3_FEATURES,
    MAX_CACHED_REQUESTS,
    MAX_K,
    MAX_NGRAM,
    MAX_SUFFIX_DEPTH,
    NGRAM_LATEST,
    NGRAM_MATCHES,
    OTHER_TOKENIZER,
    PROMPT_LOOKUP,
    SUFFIX,
)

if TYPE_CHECKING:
    from engine.drafters.base import Drafter
    from engine.models.loading import LoadedModel
    from engine.models.presets import Preset


@dataclass(frozen=True)
class DrafterOptions:
    """Which drafter, and its own options (the CLI's --drafter and the flags after it)."""

    kind: str = DRAFT_MODEL  # one of DRAFTERS
    max_ngram: int = 3  # prompt lookup: longest n-gram tried first
    min_ngram: int = 1  # prompt lookup: shortest n-gram tried
    ngram_match: str = NGRAM_LATEST  # prompt lookup: which earlier occurrence it copies from
    after_first_token: bool = False  # prompt lookup: no lookup before the first output token (vLLM's order)
    draft_model: str | None = None  # the folder of its draft: a draft model, one with its own tokenizer, an EAGLE head
    max_draft_steps: int = 0  # other tokenizer: draft tokens per cycle at most (0: K)
    # A draft model mis-set on purpose (engine/drafters/model.py; engine/diagnose/ plants them):
    draft_prompt: str = DRAFT_PROMPT_AS_TARGET  # "raw": the draft reads the prompt without the chat template
    draft_filters: str = DRAFT_FILTERS_REQUEST  # "temperature only": the draft ignores the request's top-k/top-p
    eagle3_features: str = EAGLE3_AUX  # an EAGLE-3 head mis-set on purpose: "top layer" reads no aux layers
    # Suffix decoding (engine/drafters/suffix.py), vLLM's defaults:
    suffix_depth: int = 24  # longest substring its trees keep
    suffix_factor: float = 1.0  # draft tokens per matched token, at most
    suffix_min_prob: float = 0.1  # tokens whose frequency probability falls below this are pruned
    suffix_cached_requests: int = 10_000  # earlier requests' outputs the global tree keeps

    @property
    def mis_set_model(self) -> bool:
        """The draft model runs one of the deliberately mis-set ways (still exact, lower acceptance)."""
        return (self.draft_prompt, self.draft_filters) != (DRAFT_PROMPT_AS_TARGET, DRAFT_FILTERS_REQUEST)

    @property
    def mis_set(self) -> bool:
        """A draft model or an EAGLE-3 head runs one of the deliberately mis-set ways (reference chain only)."""
        return self.mis_set_model or self.eagle3_features != EAGLE3_AUX

    def __post_init__(self) -> None:
        if self.kind not in DRAFTERS:
            raise SettingsError(f"unknown drafter {self.kind!r}; choose one of {', '.join(DRAFTERS)}")
        for name in ("max_ngram", "min_ngram", "max_draft_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SettingsError(f"{name} must be an integer, got {value!r}")
        if not 1 <= self.min_ngram <= self.max_ngram <= MAX_NGRAM:
            raise SettingsError(f"n-gram sizes need 1 <= --min-ngram ({self.min_ngram}) <= --max-ngram "
                                f"({self.max_ngram}) <= {MAX_NGRAM}")
        if not 0 <= self.max_draft_steps <= MAX_K:
            raise SettingsError(f"--draft-steps must be between 0 (K) and {MAX_K}, got {self.max_draft_steps}")
        for name, allowed in (("draft_prompt", DRAFT_PROMPTS), ("draft_filters", DRAFT_FILTERS),
                              ("ngram_match", NGRAM_MATCHES), ("eagle3_features", EAGLE3_FEATURES)):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in allowed:
                raise SettingsError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        if not isinstance(self.after_first_token, bool) or (self.after_first_token and self.kind != PROMPT_LOOKUP):
            raise SettingsError("after_first_token is prompt lookup's, and true or false")
        if self.mis_set_model and self.kind != DRAFT_MODEL:
            raise SettingsError(f"{MIS_SET_MODEL_ONLY}, not to --drafter {self.kind}")
        if self.eagle3_features != EAGLE3_AUX and self.kind != EAGLE3:
            raise SettingsError(f"{MIS_SET_HEAD_ONLY}, not to --drafter {self.kind}")
        check_suffix_options(self.suffix_depth, self.suffix_factor, self.suffix_min_prob, self.suffix_cached_requests)


OPTION_DEFAULTS = {f.name: f.default for f in fields(DrafterOptions)}


@dataclass(frozen=True)
class Flag:
    """One option of a drafter kind: a `python -m engine run` flag that sets the DrafterOptions
    field `field` (a trace header's drafter entry records it under the same name)."""

    name: str  # "--max-ngram"
    field: str  # "max_ngram"
    help: str
    low: int = 0  # an integer flag: the range DrafterOptions accepts, offered by the app's input
    high: int = 0
    label: str | None = None  # the app's live-run input; None: the app leaves it at its default
    choices: tuple[str, ...] = ()  # a flag naming one of these words instead of an integer

    @property
    def dest(self) -> str:
        """The attribute argparse stores it under."""
        return self.name.removeprefix("--").replace("-", "_")

    @property
    def default(self) -> int | str:
        return OPTION_DEFAULTS[self.field]

    @property
    def type(self) -> type:
        """What its value is (argparse's `type`, and how a header's value is read back): a word, or a
        number of its default's type (an integer, or a float for suffix decoding's factor and probability)."""
        return str if self.choices else type(self.default)


@dataclass(frozen=True)
class Needs:
    """What a drafter kind needs besides the target."""

    draft: str | None = None  # what --draft names for it, in words; None: it drafts without one
    model: bool = False  # that draft is a model folder (load_model opens it), not an EAGLE head's files
    same_tokens: bool = False  # the draft model shares the target's tokens: the pair's draft (Pair.draft)
    target_features: bool = False  # it drafts from the target's hidden features (the verify pass hands them over)

    @property
    def own_draft(self) -> bool:
        """Its draft is the drafter's own (a draft with another tokenizer, an EAGLE head), not the
        pair's draft model: where a pair's two folders are given (the app), it goes in the options."""
        return self.draft is not None and not self.same_tokens


@dataclass(frozen=True)
class Shipped:
    """A draft a preset ships: its folder on this machine and the portable name traces give it."""

    folder: Path
    name: str


Load = Callable[[str], "LoadedModel"]  # opens a model folder on the target's device, in its dtype
Builder = Callable[["LoadedModel", DrafterOptions, Load], "Drafter"]


def ships_none(preset: "Preset") -> None:
    return None


def name_model(drafter: "Drafter", name: str) -> None:
    drafter.model.name = name  # a draft model's name is its model's


def name_head(drafter: "Drafter", name: str) -> None:
    drafter.name = name  # an EAGLE head names itself


@dataclass(frozen=True)
class DrafterKind:
    """Everything about one drafter kind but its name's definition (engine.trace.schema)."""

    kind: str
    home: str  # "module:Class": its class, imported on first use (see the module docstring)
    title: str  # its name in messages
    description: str  # how the CLI's --drafter help names it
    label: str  # how the app's live run names it
    needs: Needs
    build: Builder  # a drafter for the target from its options (its draft already named in them)
    shipped: Callable[["Preset"], Shipped | None] = ships_none  # the draft a preset ships for it, if any
    name_draft: Callable[["Drafter", str], None] = name_model  # name a shipped draft as traces record it
    flags: tuple[Flag, ...] = ()
    samples: bool = True  # exact at temperature > 0 as well as greedy
    refusal: str = ""  # why it refuses temperature > 0 (when it does not sample)
    not_shipped: str = ""  # what is said of a preset that ships no draft for it
    checked_early: bool = False  # the CLI looks for its draft before any model loads (a head: when the pair loads)
    batches: bool = False  # its class proposes for several rows at once (`propose_rows`): it can run in --batch

    @property
    def cls(self) -> type:
        module, name = self.home.split(":")
        return getattr(importlib.import_module(module), name)

    def missing_draft(self) -> str:
        return f"the {self.kind} drafter needs {self.needs.draft} (--draft)"


# ---------------------------------------------------------------- builders (each imports its drafter when called)

def build_model(target: "LoadedModel", options: DrafterOptions, load: Load) -> "Drafter":
    from engine.drafters.model import ModelDrafter
    from engine.models.loading import check_same_token_space

    draft = load(options.draft_model)
    check_same_token_space(target, draft)
    return ModelDrafter(draft, draft_prompt=options.draft_prompt, draft_filters=options.draft_filters)


def build_prompt_lookup(target: "LoadedModel", options: DrafterOptions, load: Load) -> "Drafter":
    from engine.drafters.prompt_lookup import PromptLookupDrafter

    return PromptLookupDrafter(target.full_vocab_size, options.max_ngram, options.min_ngram, options.ngram_match,
                               options.after_first_token)


def build_suffix(target: "LoadedModel", options: DrafterOptions, load: Load) -> "Drafter":
    from engine.drafters.suffix import SuffixDrafter

    return SuffixDrafter(target.full_vocab_size, options.suffix_depth, options.suffix_factor, options.suffix_min_prob,
                         options.suffix_cached_requests)


def build_other_tokenizer(target: "LoadedModel", options: DrafterOptions, load: Load) -> "Drafter":
    from engine.drafters.other_tokenizer import OtherTokenizerDrafter

    draft = load(options.draft_model)
    return OtherTokenizerDrafter(draft, target.tokenizer, target.full_vocab_size, options.max_draft_steps)


def build_eagle(target: "LoadedModel", options: DrafterOptions, load: Load) -> "Drafter":
    from engine.drafters.eagle import load_head

    return load_head(options.draft_model, target)


def build_eagle3(target: "LoadedModel", options: DrafterOptions, load: Load) -> "Drafter":
    from engine.drafters.eagle3 import load_eagle3

    return load_eagle3(options.draft_model, target, options.eagle3_features)


# ---------------------------------------------------------------- what a preset ships for each kind

def pair_draft(preset: "Preset") -> Shipped:
    return Shipped(preset.draft_folder(), preset.draft_name)


def shipped_own_draft(preset: "Preset", kind: str) -> Shipped | None:
    name = preset.own_draft(kind)
    return None if name is None else Shipped(preset.own_draft_folder(kind), f"assets/models/{name}")


def other_tokenizer_draft(preset: "Preset") -> Shipped | None:
    return shipped_own_draft(preset, OTHER_TOKENIZER)


def eagle_head(preset: "Preset") -> Shipped | None:
    shipped = shipped_own_draft(preset, EAGLE)
    return shipped if shipped is not None and shipped.folder.is_dir() else None  # a named but absent head ships none


def eagle3_head(preset: "Preset") -> Shipped | None:
    shipped = shipped_own_draft(preset, EAGLE3)
    return shipped if shipped is not None and shipped.folder.is_dir() else None


DRAFTERS = {spec.kind: spec for spec in (
    DrafterKind(
        DRAFT_MODEL, "engine.drafters.model:ModelDrafter", title="a draft model",
        description="a draft model sharing the target's tokenizer",
        label="draft model (shares the target's tokenizer)",
        needs=Needs("a draft model", model=True, same_tokens=True),
        build=build_model, shipped=pair_draft, batches=True,
        flags=(Flag("--draft-prompt", "draft_prompt", "draft model, mis-set on purpose: 'raw' reads the prompt "
                    "without the chat template the target reads (exact, lower acceptance)", choices=DRAFT_PROMPTS),
               Flag("--draft-filters", "draft_filters", "draft model, mis-set on purpose: 'temperature only' "
                    "ignores the request's top-k/top-p (exact, lower acceptance)", choices=DRAFT_FILTERS))),
    DrafterKind(
        PROMPT_LOOKUP, "engine.drafters.prompt_lookup:PromptLookupDrafter", title="prompt lookup",
        description="prompt lookup (copies the tokens that followed the last n-gram earlier in the text)",
        label="prompt lookup (n-gram copy from earlier text, no model)",
        needs=Needs(), build=build_prompt_lookup,
        flags=(Flag("--max-ngram", "max_ngram", "prompt lookup: longest n-gram matched first", 1, MAX_NGRAM,
                    label="Longest n-gram matched first"),
               Flag("--min-ngram", "min_ngram", "prompt lookup: shortest n-gram tried", 1, MAX_NGRAM,
                    label="Shortest n-gram tried"),
               Flag("--ngram-match", "ngram_match", "prompt lookup: copy after the latest earlier occurrence of the "
                    "n-gram (the default) or the earliest (as vLLM's ngram method and Hugging Face do)",
                    choices=NGRAM_MATCHES))),
    DrafterKind(
        OTHER_TOKENIZER, "engine.drafters.other_tokenizer:OtherTokenizerDrafter",
        title="the other-tokenizer drafter",
        description="a draft model with another tokenizer (greedy only)",
        label="draft model with its own tokenizer (greedy only)",
        needs=Needs("a draft model with its own tokenizer", model=True),
        build=build_other_tokenizer, shipped=other_tokenizer_draft,
        flags=(Flag("--draft-steps", "max_draft_steps", "other tokenizer: draft tokens per cycle at most (default 0: K)",
                    0, MAX_K),),
        samples=False,
        refusal=OTHER_TOKENIZER_GREEDY_ONLY,
        not_shipped="ships no draft with another tokenizer: name one with --draft, or use --preset tiny-shakespeare",
        checked_early=True),
    DrafterKind(
        EAGLE, "engine.drafters.eagle:EagleDrafter", title="an EAGLE head",
        description="an EAGLE-style head that drafts from the target's features (--draft: its folder)",
        label="EAGLE-style head (drafts from the target's own features)",
        needs=Needs("a head folder", target_features=True),
        build=build_eagle, shipped=eagle_head, name_draft=name_head,
        not_shipped="ships no EAGLE head: name one with --draft"),
    DrafterKind(
        EAGLE3, "engine.drafters.eagle3:Eagle3Drafter", title="an EAGLE-3 head",
        description="an EAGLE-3 head in the speculators format, fusing three target layers (--draft: its folder)",
        label="EAGLE-3 head (speculators format; fuses three target layers)",
        needs=Needs("a speculators eagle3 folder", target_features=True),
        build=build_eagle3, shipped=eagle3_head, name_draft=name_head,
        flags=(Flag("--eagle3-features", "eagle3_features", "EAGLE-3 head, mis-set on purpose: 'top layer' hands it "
                    "the target's last layer's output instead of its auxiliary layers fused by fc, as vLLM does for "
                    "a head whose config sets eagle_config.use_aux_hidden_state false (exact, acceptance near zero)",
                    choices=EAGLE3_FEATURES),),
        not_shipped="ships no EAGLE-3 head: name one with --draft"),
    DrafterKind(
        SUFFIX, "engine.drafters.suffix:SuffixDrafter", title="suffix decoding",
        description="suffix decoding (continues the last tokens as this request's text and earlier requests' "
                    "outputs most often did; no model)",
        label="suffix decoding (suffix trees over this request and earlier outputs, no model)",
        needs=Needs(), build=build_suffix,
        flags=(Flag("--suffix-depth", "suffix_depth", "suffix decoding: longest substring its trees keep "
                    f"(a match is at most one shorter; 2..{MAX_SUFFIX_DEPTH})", 2, MAX_SUFFIX_DEPTH,
                    label="Suffix tree depth"),
               Flag("--suffix-factor", "suffix_factor", "suffix decoding: draft tokens per matched token, at most "
                    "(the draft is also at most K)"),
               Flag("--suffix-min-prob", "suffix_min_prob", "suffix decoding: prune draft tokens whose frequency "
                    "probability falls below this"),
               Flag("--suffix-cached-requests", "suffix_cached_requests", "suffix decoding: earlier requests' outputs "
                    "the global tree keeps, oldest evicted first (0: none)", 0, MAX_CACHED_REQUESTS))),
)}


def all_flags() -> list[Flag]:
    """Every kind's own flags, in the registry's order (the order `--help` lists them)."""
    return [flag for spec in DRAFTERS.values() for flag in spec.flags]


# ---------------------------------------------------------------- options from the CLI, a trace, a preset

def options_from_args(args) -> DrafterOptions:
    """The options of `python -m engine run`: every kind's flags are range-checked, whichever kind
    runs; --draft goes to a kind that takes a draft."""
    takes_draft = args.drafter in DRAFTERS and DRAFTERS[args.drafter].needs.draft is not None
    return DrafterOptions(kind=args.drafter, draft_model=args.draft if takes_draft else None,
                          **{flag.field: getattr(args, flag.dest) for flag in all_flags()})


def options_from_header(header: dict) -> DrafterOptions:
    """The drafter a trace was written with, from its header (a draft model for older traces)."""
    d = header.get("drafter") or {}
    spec = DRAFTERS.get(d.get("kind", DRAFT_MODEL), DRAFTERS[DRAFT_MODEL])
    return DrafterOptions(spec.kind, **{flag.field: flag.type(d.get(flag.field, flag.default)) for flag in spec.flags})


def with_shipped_draft(preset: "Preset", options: DrafterOptions) -> tuple[DrafterOptions, Shipped | None]:
    """The options with the draft the preset ships for their kind, unless they name one."""
    spec = DRAFTERS[options.kind]
    if spec.needs.draft is None or options.draft_model is not None:
        return options, None
    shipped = spec.shipped(preset)
    if shipped is None:
        raise SettingsError(f"preset {preset.name!r} {spec.not_shipped}")
    return replace(options, draft_model=str(shipped.folder)), shipped


def check_before_loading(options: DrafterOptions, settings: SpecSettings, preset: "Preset | None",
                         draft: str | None) -> None:
    """What the drafter needs that the CLI can check before any model loads (its n-gram and step
    ranges: DrafterOptions): sampling, and for some kinds that a draft is named or shipped."""
    spec = DRAFTERS[options.kind]
    if not spec.samples and settings.temperature != 0:
        raise SettingsError(spec.refusal)
    if not spec.checked_early or draft:
        return
    if preset is None:
        raise SettingsError(spec.missing_draft())
    if spec.shipped(preset) is None:
        raise SettingsError(f"preset {preset.name!r} {spec.not_shipped}")


def build_drafter(target: "LoadedModel", options: DrafterOptions, load: Load) -> "Drafter":
    """The drafter `options` name, for `target`; `load` opens its draft model, if it has one."""
    spec = DRAFTERS[options.kind]
    if spec.needs.draft is not None and not options.draft_model:
        raise SettingsError(spec.missing_draft())
    return spec.build(target, options, load)
