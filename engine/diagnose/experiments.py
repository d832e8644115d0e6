"""The experiments of a diagnosis: each one arm that differs from the user's run in exactly one thing.

The baseline arm is the user's own settings and drafter. Each experiment names the one change and says
in words what the user's run does and what the change does. Its kind says how the report reads it:
a CAUSE is a setting of this drafter that can be wrong (the chat template, the sampling filters),
ranked by the acceptance it gains; TUNING is K, judged by tokens/s on the calibrated step times and
ranked after the causes (a shorter K raises accepted/drafted by arithmetic alone, since its later,
weaker positions drop out of the count, and the best K depends on the acceptance the causes change,
so K is tuned once they are fixed); an ALTERNATIVE is another drafter, ranked by tokens/s (acceptance
rates of different drafters do not compare: prompt lookup drafts fewer tokens); a PROPERTY describes
the pair (temperature, context length), shown, not ranked. An experiment that cannot run on this pair
says why and is skipped.
"""
from dataclasses import dataclass, replace

from engine.config import SpecSettings
from engine.drafters.registry import DrafterOptions
from engine.trace.schema import DRAFT_FILTERS_REQUEST as FOLLOWS
from engine.trace.schema import DRAFT_FILTERS_TEMPERATURE as IGNORES
from engine.trace.schema import DRAFT_MODEL, DRAFT_PROMPT_RAW, EAGLE, EAGLE3, EAGLE3_AUX, EAGLE3_TOP, PROMPT_LOOKUP, SUFFIX
from engine.trace.schema import DRAFT_PROMPT_AS_TARGET as AS_TARGET

# Text put before every request by the context-length experiment: a neutral passage the request
# does not ask about (public domain, Lewis Carroll's Alice, as in assets/prompts/long-context.jsonl).
CONTEXT_TOKENS = 600  # about; fits the shipped pairs' 2,048 positions with the prompt set's requests
TEMPERATURES = (0.0, 0.7, 1.0)
CAUSE, TUNING, ALTERNATIVE, PROPERTY = "cause", "tuning", "alternative", "property"
DEPTH = "draft depth"
CONTEXT = "context length"
CONTEXT_ARM = "longer-context"  # its arm's folder
GLOBAL_TREE = "global tree"
AUX_STATES = "auxiliary states"
# The measure each kind is ranked and worded by, as a finding's dict names it (report.py Finding.judged_by)
JUDGED_BY = {CAUSE: "acceptance_rate", TUNING: "step_tokens_per_s", ALTERNATIVE: "tokens_per_s",
             PROPERTY: "acceptance_rate"}


@dataclass(frozen=True)
class Arm:
    """One run of every request: a drafter, settings, and text before each request."""

    name: str  # also its folder's name
    drafter: DrafterOptions
    settings: SpecSettings
    prefix: str = ""


@dataclass(frozen=True)
class Experiment:
    """The baseline against one arm that changes one thing."""

    name: str  # short, a key of the report
    kind: str  # CAUSE, ALTERNATIVE or PROPERTY
    now: str  # what the user's run does, e.g. "the draft ignores the request's top-k/top-p"
    change: str  # what the arm does, e.g. "when it follows them"
    arm: Arm | None  # None: not run here (`skipped` says why), or measured without an arm (`probe`)
    skipped: str = ""


def arm_name(*parts: str) -> str:
    return "-".join(p.replace(" ", "-").replace(".", "_") for p in parts)


def template_experiment(base: Arm, has_template: bool) -> Experiment:
    if base.drafter.kind != DRAFT_MODEL:
        return Experiment("chat template", CAUSE, "", "", None, "the drafter reads no prompt of its own")
    if not has_template:
        return Experiment("chat template", CAUSE, "", "", None, "the target's tokenizer has no chat template")
    raw = base.drafter.draft_prompt == DRAFT_PROMPT_RAW
    other = replace(base.drafter, draft_prompt=AS_TARGET if raw else DRAFT_PROMPT_RAW)
    return Experiment(
        "chat template", CAUSE,
        "the draft reads the prompt without the chat template" if raw else "the draft reads the prompt as the target does",
        "when it reads it as the target does" if raw else "when it reads it without the chat template",
        Arm(arm_name("draft-prompt", other.draft_prompt), other, base.settings, base.prefix))


def filters_experiment(base: Arm) -> Experiment:
    s = base.settings
    if base.drafter.kind != DRAFT_MODEL:
        return Experiment("sampling filters", CAUSE, "", "", None, "only a draft model samples from its own distribution")
    if s.temperature == 0 or (not s.top_k and s.top_p >= 1.0):
        return Experiment("sampling filters", CAUSE, "", "", None, "the request sets no top-k or top-p at temperature > 0")
    ignores = base.drafter.draft_filters == IGNORES
    other = replace(base.drafter, draft_filters=FOLLOWS if ignores else IGNORES)
    return Experiment(
        "sampling filters", CAUSE,
        "the draft ignores the request's top-k/top-p" if ignores else "the draft follows the request's top-k/top-p",
        "when it follows them" if ignores else "when it ignores them",
        Arm(arm_name("draft-filters", other.draft_filters), other, s, base.prefix))


def aux_states_experiment(base: Arm) -> Experiment:
    """An EAGLE-3 head with and without its auxiliary layers: the misconfiguration that leaves acceptance near
    zero (an engine that hands the head only the target's top state). Whichever way the user's run reads them,
    the arm reads them the other way, so the finding says what the right way gains or the wrong one costs."""
    if base.drafter.kind != EAGLE3:
        return Experiment(AUX_STATES, CAUSE, "", "", None, "only an EAGLE-3 head reads the target's auxiliary layers")
    top = base.drafter.eagle3_features == EAGLE3_TOP
    other = replace(base.drafter, eagle3_features=EAGLE3_AUX if top else EAGLE3_TOP)
    aux_words = "the target's auxiliary layers fused by fc"
    top_words = "the target's last layer's output in their place (no fc)"
    return Experiment(
        AUX_STATES, CAUSE,
        f"the head reads {top_words}" if top else f"the head reads {aux_words}",
        f"when it reads {aux_words}" if top else f"when it reads {top_words}",
        Arm(arm_name("eagle3-features", other.eagle3_features), other, base.settings, base.prefix))


def temperature_experiments(base: Arm) -> list[Experiment]:
    return [Experiment(f"temperature {t}", PROPERTY, f"at temperature {base.settings.temperature}", f"at temperature {t}",
                       Arm(arm_name("temperature", str(t)), base.drafter, replace(base.settings, temperature=t), base.prefix))
            for t in TEMPERATURES if t != base.settings.temperature]


def context_experiment(base: Arm, prefix: str) -> Experiment:
    return Experiment(CONTEXT, PROPERTY, "with the requests as they are",
                      f"with about {CONTEXT_TOKENS} tokens of unrelated text before each",
                      Arm(CONTEXT_ARM, base.drafter, base.settings, prefix + base.prefix))


def depth_experiment(base: Arm, best_k: int | None, plain_better: bool = False) -> Experiment:
    """K against the K the advisor picks from the baseline's own calibration and acceptance (its best
    K of 1 and more, even where it says plain decoding would beat them all: the report says so)."""
    k = base.settings.k
    if best_k is None:
        return Experiment(DEPTH, TUNING, "", "", None, "no calibration to advise a K from (a tree, or no step times)")
    if best_k == k:
        return Experiment(DEPTH, TUNING, f"K={k}", "", None, f"K={k} is already the advisor's pick on this machine")
    plain = " (the advisor says plain decoding beats every K on this machine)" if plain_better else ""
    return Experiment(DEPTH, TUNING, f"K={k}", f"at the advisor's K={best_k}{plain}",
                      Arm(arm_name("k", str(best_k)), base.drafter, replace(base.settings, k=best_k), base.prefix))


def drafter_experiments(base: Arm, has_eagle: bool) -> list[Experiment]:
    """The other drafters this pair supports, with the same settings."""
    words = {DRAFT_MODEL: "the draft model", PROMPT_LOOKUP: "prompt lookup (n-grams of the prompt and output)",
             EAGLE: "the EAGLE head"}
    kinds = [PROMPT_LOOKUP] + ([EAGLE] if has_eagle else [])
    now = f"with {words.get(base.drafter.kind, base.drafter.kind)}"
    return [Experiment(f"drafter {kind}", ALTERNATIVE, now, f"with {words[kind]}",
                       Arm(arm_name("drafter", kind), DrafterOptions(kind=kind), base.settings, base.prefix))
            for kind in kinds if kind != base.drafter.kind]


def global_tree_experiments(base: Arm) -> list[Experiment]:
    """Suffix decoding only: the same run with the request's own tree alone, so the difference is what the
    global tree (earlier outputs, and the request's own as vLLM adds it) brought to acceptance."""
    if base.drafter.kind != SUFFIX:
        return []
    kept = base.drafter.suffix_cached_requests
    other = replace(base.drafter, suffix_cached_requests=0 if kept else DrafterOptions().suffix_cached_requests)
    return [Experiment(GLOBAL_TREE, PROPERTY,
                       f"with the global tree (up to {kept} finished outputs)" if kept else "with the request's own tree only",
                       "with the request's own tree only" if kept else
                       f"with the global tree (up to {other.suffix_cached_requests} finished outputs)",
                       Arm(arm_name("suffix-cached-requests", str(other.suffix_cached_requests)), other, base.settings,
                           base.prefix))]


def plan(base: Arm, *, has_template: bool, has_eagle: bool, prefix: str, best_k: int | None,
         plain_better: bool = False) -> list[Experiment]:
    """Every experiment for this pair and these settings, in the order they run."""
    return [template_experiment(base, has_template), filters_experiment(base), aux_states_experiment(base),
            depth_experiment(base, best_k, plain_better),
            *drafter_experiments(base, has_eagle), *global_tree_experiments(base), *temperature_experiments(base),
            context_experiment(base, prefix)]
