"""What a trace's header must mean: the settings, the drafter, the declared faults, and the
optional calibration, linear paths, tensor-parallel layout, target weights and decoders. `check_header`
returns the RunFacts every cycle is then checked against (a tree run's through
tree_checks.check_tree_header).
"""
import math

from engine.config import SettingsError, SpecSettings
from engine.trace.batch_reader import MAX_BATCH
from engine.trace.check_basics import RunFacts, fail, is_int, is_num
from engine.trace.schema import (
    ACCEPTANCE_RULES,
    ACTIVATIONS,
    AS_LOADED,
    CACHE_CONVENTIONS,
    CAPTURE_MODES,
    DECODER_HF,
    DECODER_OWN,
    DECODERS,
    DRAFT_FILTERS,
    DRAFT_FILTERS_REQUEST,
    DRAFT_MODEL,
    DRAFT_PROMPT_AS_TARGET,
    DRAFT_PROMPTS,
    DRAFTER_KINDS,
    EAGLE3,
    EAGLE3_AUX,
    EAGLE3_FEATURES,
    GGUF_BLOCK_TYPES,
    GGUF_WEIGHTS,
    LINEAR_PATHS,
    MAX_DECODER_FALLBACK_TEXT,
    MAX_K,
    MAX_NGRAM,
    NGRAM_EARLIEST,
    NGRAM_LATEST,
    OTHER_TOKENIZER,
    PROMPT_LOOKUP,
    REQUIRED_LINEAR_PATHS,
    ROWS,
    ROWS_VARIANTS,
    SUFFIX,
    TARGET_WEIGHTS,
    VLLM_CONVENTION,
    VLLM_CONVENTION_TEXT,
    VLLM_DRAFT_SAMPLING,
    WEIGHTS_INT4,
)
from engine.trace.shared_checks import check_texts, check_token_ids
from engine.trace.suffix_checks import check_suffix_header
from engine.trace.tree_checks import check_tree_header

# The deliberate bugs a teaching run may declare (mirror of teaching_faults.Faults; a test keeps them equal).
FAULT_FIELDS = {"keep_rejected_kv": bool, "skip_draft_catch_up": bool, "acceptance_rule": str, "greedy_draft": bool}
# ... and those of a tree run's rollback (mirror of teaching_faults.TreeFaults), declared by tree traces only.
TREE_FAULT_FIELDS = {"crop_instead_of_compact": bool}
MAX_VERIFY_WIDTH = 1024  # calibrated verify widths beyond this are not a real measurement
MAX_RANKS = 65536  # ranks of a tensor-parallel run: far beyond any real job
MAX_RANK_TEXT = 255  # a host name (at most 253 characters in DNS), a device or backend name
# The drafter kinds that draft with a model of their own, whose code --decoder picks (mirror of the registry's
# Needs.model, engine/drafters/registry.py; tests/test_own_decoder_run.py keeps them equal). Prompt lookup has
# no model and an EAGLE head is its own module: their headers' "decoder" names the target only.
DRAFTERS_WITH_MODEL = (DRAFT_MODEL, OTHER_TOKENIZER)


def check_drafter(h: dict, temperature: float, where: str) -> dict:
    """The header's drafter entry and its settings; traces from before drafters had names used a draft model."""
    d = h.get("drafter", {"kind": DRAFT_MODEL})
    if not isinstance(d, dict) or d.get("kind") not in DRAFTER_KINDS:
        fail(where, "drafter", f"must be an object whose kind is one of {', '.join(DRAFTER_KINDS)}")
    if d["kind"] == PROMPT_LOOKUP:
        lo, hi = d.get("min_ngram"), d.get("max_ngram")
        if not (is_int(lo) and is_int(hi) and 1 <= lo <= hi <= MAX_NGRAM):
            fail(where, "drafter.min_ngram", f"prompt lookup needs 1 <= min_ngram <= max_ngram <= {MAX_NGRAM}")
        if d.get("ngram_match", NGRAM_EARLIEST) != NGRAM_EARLIEST:
            fail(where, "drafter.ngram_match", f"is {NGRAM_EARLIEST!r} or left out ({NGRAM_LATEST!r})")
        if d.get("after_first_token", True) is not True:
            fail(where, "drafter.after_first_token", "is true or left out (the first cycle looks up in the prompt)")
    if d["kind"] == SUFFIX:
        check_suffix_header(d, where)
    if d["kind"] == OTHER_TOKENIZER:
        if temperature != 0:
            fail(where, "settings.temperature", "the other-tokenizer drafter runs greedy only (temperature 0): "
                                                "a ratio test needs the draft's probability of each target token")
        steps = d.get("max_draft_steps", 0)
        if not is_int(steps) or not 0 <= steps <= MAX_K:
            fail(where, "drafter.max_draft_steps", f"must be an integer in 0 (K)..{MAX_K}")
        vocab = d.get("draft_vocab_size")
        if vocab is not None and (not is_int(vocab) or vocab < 1):
            fail(where, "drafter.draft_vocab_size", "must be a positive integer")
    check_mis_set_draft(d, h, where)
    check_mis_set_head(d, h, where)
    return d


def chain_only(h: dict) -> bool:
    """The run drafted on the reference chain: no tree, no fast path, no batch (where the mis-set drafters run)."""
    return "tree" not in h["settings"] and h.get("fast_path") is None and h.get("batch") is None


def check_mis_set_head(d: dict, h: dict, where: str) -> None:
    """An EAGLE-3 head mis-set on purpose (engine/drafters/eagle3.py): which target hidden states it read.
    Absent means the correct run, fc over the auxiliary layers."""
    features = d.get("eagle3_features", EAGLE3_AUX)
    if not isinstance(features, str) or features not in EAGLE3_FEATURES:
        fail(where, "drafter.eagle3_features", f"must be one of {', '.join(map(repr, EAGLE3_FEATURES))}")
    if features != EAGLE3_AUX and d["kind"] != EAGLE3:
        fail(where, "drafter.eagle3_features", "only an EAGLE-3 head reads the target's hidden states this way")
    if features != EAGLE3_AUX and not chain_only(h):
        fail(where, "drafter.eagle3_features", "a mis-set head runs on the reference chain only "
                                               "(no tree, no fast path, no batch)")


def check_mis_set_draft(d: dict, h: dict, where: str) -> None:
    """A draft model mis-set on purpose (engine/drafters/model.py): what it read as the prompt and how it
    filtered its distribution. Absent fields mean the correct run: the target's prompt, the request's filters."""
    prompt, filters = d.get("draft_prompt", DRAFT_PROMPT_AS_TARGET), d.get("draft_filters", DRAFT_FILTERS_REQUEST)
    for name, value, allowed in (("draft_prompt", prompt, DRAFT_PROMPTS), ("draft_filters", filters, DRAFT_FILTERS)):
        if not isinstance(value, str) or value not in allowed:
            fail(where, f"drafter.{name}", f"must be one of {', '.join(map(repr, allowed))}")
        if value != allowed[0] and d["kind"] != DRAFT_MODEL:
            fail(where, f"drafter.{name}", "only a draft model runs mis-set this way")
        if value != allowed[0] and not chain_only(h):
            fail(where, f"drafter.{name}", "a mis-set draft model runs on the reference chain only "
                                           "(no tree, no fast path, no batch)")
    own = d.get("draft_prompt_token_ids")
    if prompt == DRAFT_PROMPT_AS_TARGET:
        if own is not None:
            fail(where, "drafter.draft_prompt_token_ids", "only a draft that reads its own rendering of the prompt "
                                                          "(draft_prompt 'raw') records one")
        return
    if not isinstance(own, list) or not own:
        fail(where, "drafter.draft_prompt_token_ids", "the prompt the draft read: a non-empty list of token ids")
    check_token_ids(own, h["target"].get("vocab_size"), where, "drafter.draft_prompt_token_ids")
    if not h.get("chat_template") and own != h["prompt_token_ids"]:
        fail(where, "drafter.draft_prompt_token_ids", "without a chat template the target read the raw prompt too, "
                                                      "so the draft's ids are the target's prompt_token_ids")
    if h.get("cache_layout", {}).get("name", "dynamic") != "dynamic" and len(own) > len(h["prompt_token_ids"]):
        fail(where, "drafter.draft_prompt_token_ids", "a draft prompt longer than the target's runs with a dynamic "
                                                      "cache only (the layout is sized for the target's prompt)")


def check_settings(settings: dict, where: str) -> None:
    known = {name: settings[name] for name in SpecSettings.__dataclass_fields__ if name in settings}
    for name, v in known.items():
        if isinstance(v, float) and not math.isfinite(v):
            fail(where, f"settings.{name}", "must be a finite number")
    try:
        SpecSettings(**known)
    except SettingsError as err:
        fail(where, "settings", f"out of range: {err}")


def check_faults(faults, where: str, tree: bool = False) -> dict:
    """The declared faults: a chain run's (FAULT_FIELDS) in a chain trace, a tree rollback's in a tree trace."""
    if faults is None:
        return {}
    if not isinstance(faults, dict):
        fail(where, "faults", "must be an object naming the deliberate bugs of a teaching run")
    known = TREE_FAULT_FIELDS if tree else FAULT_FIELDS
    for name, value in faults.items():
        if name not in known:
            other = " (a tree run's fault, and this is a chain trace)" if name in TREE_FAULT_FIELDS else ""
            fail(where, f"faults.{name}", f"unknown fault{other}; known: {', '.join(known)}")
        if type(value) is not known[name]:
            fail(where, f"faults.{name}", f"must be {known[name].__name__}")
    if faults.get("acceptance_rule", "ratio") not in ACCEPTANCE_RULES:
        fail(where, "faults.acceptance_rule", f"unknown rule; known: {', '.join(ACCEPTANCE_RULES)}")
    return faults


def check_calibration(cal, where: str, fast=None) -> None:
    """The optional step-time calibration (engine/stats/calibrate.py): positive finite times, distinct widths;
    one that timed the fast path's forwards (engine/stats/fast_calibrate.py) names the capture the run's
    fast_path ran, or its times would not be the run's."""
    if cal is None:
        return
    if not isinstance(cal, dict):
        fail(where, "calibration", "must be an object")
    for name in ("target_step_s", "draft_step_s"):
        if not is_num(cal.get(name)) or cal[name] <= 0:
            fail(where, f"calibration.{name}", "must be a positive finite number of seconds")
    if not is_int(cal.get("cache_len")) or cal["cache_len"] < 0:
        fail(where, "calibration.cache_len", "must be a non-negative integer")
    widths, times = cal.get("verify_positions"), cal.get("verify_s")
    if not isinstance(widths, list) or not isinstance(times, list) or not widths or len(widths) != len(times):
        fail(where, "calibration.verify_positions", "must be a non-empty list as long as verify_s")
    if not all(is_int(n) and 1 <= n <= MAX_VERIFY_WIDTH for n in widths) or widths != sorted(set(widths)):
        fail(where, "calibration.verify_positions", f"must be distinct increasing integers in 1..{MAX_VERIFY_WIDTH}")
    if not all(is_num(t) and t > 0 for t in times):
        fail(where, "calibration.verify_s", "must be positive finite numbers of seconds")
    if "capture" in cal and (not isinstance(fast, dict) or cal["capture"] != fast.get("capture")):
        fail(where, "calibration.capture", "names the fast path's capture whose forwards it timed: it must be the "
                                           "run's fast_path.capture")


def check_linear_path_curve(curve, where: str, name: str) -> None:
    """One model's measured linear paths (engine/models/linear_paths.py): a time per path and width,
    and a choice per width that is the faster path there (a tie: the model as loaded)."""
    if not isinstance(curve, dict):
        fail(where, name, "must be an object")
    widths, seconds, chosen = curve.get("widths"), curve.get("seconds"), curve.get("chosen")
    if (not isinstance(widths, list) or not widths or len(widths) > MAX_VERIFY_WIDTH
            or widths != list(range(1, len(widths) + 1)) or not all(is_int(w) for w in widths)):
        fail(where, f"{name}.widths", "must be the widths 1, 2, ..., n")
    if not isinstance(seconds, dict):
        fail(where, f"{name}.seconds", "must be an object")
    absent = curve.get("absent", {})
    if not isinstance(absent, dict) or not all(p in LINEAR_PATHS and p not in seconds and isinstance(why, str)
                                               and len(why) <= 500 for p, why in absent.items()):
        fail(where, f"{name}.absent", "must map an untimed path to why it was not timed")
    # a bfloat16 model has no packed path: absent says so instead of a time
    if (not set(REQUIRED_LINEAR_PATHS) <= set(seconds) | set(absent)
            or AS_LOADED not in seconds or len(seconds) < 2 or not set(seconds) <= set(LINEAR_PATHS) or not all(
            isinstance(v, list) and len(v) == len(widths) and all(is_num(t) and t > 0 for t in v)
            for v in seconds.values())):
        fail(where, f"{name}.seconds", f"must give {AS_LOADED} and at least one other path a positive time at every "
             f"width, and {', '.join(REQUIRED_LINEAR_PATHS)} a time or (in absent) why not (and {ROWS} where it was "
             "timed)")
    if not isinstance(chosen, dict) or sorted(chosen) != sorted(str(w) for w in widths):
        fail(where, f"{name}.chosen", "must name one path for every width")
    for i, w in enumerate(widths):
        fastest = min(seconds, key=lambda p: (seconds[p][i], LINEAR_PATHS.index(p)))  # a tie: the earlier path
        if chosen[str(w)] != fastest:
            fail(where, f"{name}.chosen.{w}", f"must be the faster path at that width ({fastest})")
    check_rows_variants(curve, widths, seconds, where, name)
    if "spread" in curve and not (is_num(curve["spread"]) and curve["spread"] >= 0):
        fail(where, f"{name}.spread", "must be a non-negative number")
    if "kept" in curve and not isinstance(curve["kept"], bool):
        fail(where, f"{name}.kept", "must be true or false")
    machine = curve.get("machine")
    if not isinstance(machine, dict) or not all(isinstance(machine.get(k), str) and len(machine[k]) <= 200
                                                for k in ("cpu", "torch")):
        fail(where, f"{name}.machine", "must name the CPU and the torch version")


def check_rows_variants(curve: dict, widths: list, seconds: dict, where: str, name: str) -> None:
    """The rows kernel's variants, where the curve timed them: a time per variant and width, and per width
    the fastest one (a tie: the earlier timed), as engine/models/linear_paths.py chose it."""
    timed, chosen = curve.get("rows_seconds"), curve.get("rows_variants")
    if not timed and chosen is None:
        return  # a curve from before the variants (no field), or without the rows path (none timed)
    if (not isinstance(timed, dict) or not timed or ROWS not in seconds or not set(timed) <= set(ROWS_VARIANTS)
            or not all(isinstance(v, list) and len(v) == len(widths) and all(is_num(t) and t > 0 for t in v)
                       for v in timed.values())):
        fail(where, f"{name}.rows_seconds", f"must give each timed variant of {', '.join(ROWS_VARIANTS)} a "
             "positive time at every width, where the rows path was timed")
    if not isinstance(chosen, dict) or sorted(chosen) != sorted(str(w) for w in widths):
        fail(where, f"{name}.rows_variants", "must name one variant for every width")
    names = list(timed)
    for i, w in enumerate(widths):
        fastest = min(names, key=lambda v: (timed[v][i], names.index(v)))
        if chosen[str(w)] != fastest:
            fail(where, f"{name}.rows_variants.{w}", f"must be the fastest variant at that width ({fastest})")


def check_linear_paths(paths, where: str) -> None:
    """The optional per-machine linear paths of a calibrated CPU run, for the target and a draft model."""
    if paths is None:
        return
    if not isinstance(paths, dict) or not set(paths) <= {"target", "draft"}:
        fail(where, "linear_paths", "must be an object with a curve for the target and/or the draft")
    for role, curve in paths.items():
        check_linear_path_curve(curve, where, f"linear_paths.{role}")


def check_fast_path(fast, where: str) -> None:
    """The optional fast path (engine/cycle/fast.py): its capture mode, and under --capture auto the
    measurement that chose it (engine/cycle/capture_choice.py): one cycle's forward seconds per mode."""
    if fast is None:
        return
    if not isinstance(fast, dict) or not set(fast) <= {"capture", "measured"}:
        fail(where, "fast_path", "must be an object with a capture and, optionally, what measured it")
    if fast.get("capture") not in CAPTURE_MODES:
        fail(where, "fast_path.capture", f"must be one of {', '.join(CAPTURE_MODES)}")
    measured = fast.get("measured")
    if measured is None:
        return
    if not isinstance(measured, dict) or not isinstance(measured.get("cycle_s"), dict):
        fail(where, "fast_path.measured", "must be an object with cycle_s, compile_s and kept")
    cycle_s = measured["cycle_s"]
    if set(cycle_s) != {"none", "compile"} or not all(is_num(v) and 0 < v < 60 for v in cycle_s.values()):
        fail(where, "fast_path.measured.cycle_s", "must give seconds in (0, 60) for none and compile")
    if not (is_num(measured.get("compile_s")) and measured["compile_s"] >= 0):
        fail(where, "fast_path.measured.compile_s", "must be seconds, at least 0")
    if not isinstance(measured.get("kept"), bool):
        fail(where, "fast_path.measured.kept", "must be true or false")
    if fast["capture"] == "graph":
        fail(where, "fast_path.capture", "a measured choice is none or compile (CUDA graphs are not measured)")


def check_tensor_parallel(tp, where: str) -> None:
    """The optional rank layout of a tensor-parallel run (engine/parallel_run.py): sizes that fit
    together and one entry per rank, in order. Host and device names are shown, so they are short text."""
    if tp is None:
        return
    if not isinstance(tp, dict):
        fail(where, "tensor_parallel", "must be an object")
    world, size, lead = tp.get("world_size"), tp.get("tp_size"), tp.get("drafter_rank", 0)
    if not (is_int(world) and 1 <= world <= MAX_RANKS):
        fail(where, "tensor_parallel.world_size", f"must be an integer in 1..{MAX_RANKS}")
    if not (is_int(size) and 1 <= size <= world and world % size == 0):
        fail(where, "tensor_parallel.tp_size", f"must be a positive integer dividing world_size ({world})")
    if not (isinstance(tp.get("backend"), str) and 0 < len(tp["backend"]) <= MAX_RANK_TEXT):
        fail(where, "tensor_parallel.backend", f"must be a name of 1..{MAX_RANK_TEXT} characters")
    if not (is_int(lead) and 0 <= lead < world):
        fail(where, "tensor_parallel.drafter_rank", f"must be a rank in 0..{world - 1}")
    ranks = tp.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != world:
        fail(where, "tensor_parallel.ranks", f"must list all {world} ranks")
    for i, r in enumerate(ranks):
        if not isinstance(r, dict) or not is_int(r.get("rank")) or r["rank"] != i:
            fail(where, f"tensor_parallel.ranks[{i}].rank", f"must be {i}: every rank once, in order")
        if not is_int(r.get("local_rank")) or not 0 <= r["local_rank"] < world:
            fail(where, f"tensor_parallel.ranks[{i}].local_rank", f"must be an integer in 0..{world - 1}")
        for name in ("host", "device"):
            if not isinstance(r.get(name), str) or not 0 < len(r[name]) <= MAX_RANK_TEXT:
                fail(where, f"tensor_parallel.ranks[{i}].{name}", f"must be a name of 1..{MAX_RANK_TEXT} characters")


def check_target_weights(weights, where: str) -> None:
    """The optional weights path of the target (engine/models/gguf_linear.py); absent in older traces,
    which ran the model as loaded."""
    if weights is None:
        return
    if not isinstance(weights, dict) or weights.get("path") not in TARGET_WEIGHTS:
        fail(where, "target_weights.path", f"must be one of {', '.join(TARGET_WEIGHTS)}")
    if weights["path"] not in GGUF_WEIGHTS:
        return
    activations = weights.get("activations", ACTIVATIONS[WEIGHTS_INT4])  # older int4 traces did not say
    if activations != ACTIVATIONS[weights["path"]]:
        fail(where, "target_weights.activations", f"must be {ACTIVATIONS[weights['path']]!r} on the "
                                                  f"{weights['path']} path")
    name = weights.get("file")
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        fail(where, "target_weights.file", "must name the GGUF file in at most 200 characters")
    types = weights.get("tensor_types")
    if not isinstance(types, dict) or not types or not all(
            t in GGUF_BLOCK_TYPES and is_int(n) and 0 < n <= 10**6 for t, n in types.items()):
        fail(where, "target_weights.tensor_types", f"must count layers per block type ({', '.join(GGUF_BLOCK_TYPES)})")
    for key in ("float_layers", "weight_bytes"):
        if not is_int(weights.get(key)) or weights[key] < 0:
            fail(where, f"target_weights.{key}", "must be a non-negative integer")


def check_decoder(h: dict, drafter_kind: str, where: str) -> None:
    """The optional "decoder" (engine/run.py describe_decoders): which code made each model's distributions,
    {"target": {"ran": "own"}, "draft": {"ran": "hf", "fallback": "<why the own decoder did not apply>"}}.
    Absent in traces of runs that did not ask for the own decoder: every model ran on Hugging Face's modules."""
    decoder = h.get("decoder")
    if decoder is None:
        return
    roles = ("target", "draft") if drafter_kind in DRAFTERS_WITH_MODEL else ("target",)
    if not isinstance(decoder, dict) or sorted(decoder) != sorted(roles):
        has = "a draft model" if len(roles) == 2 else f"no draft model (drafter {drafter_kind})"
        fail(where, "decoder", f"must be an object with one entry for each of {', '.join(roles)} (this run has {has})")
    for role in roles:
        entry, name = decoder[role], f"decoder.{role}"
        if not isinstance(entry, dict) or entry.get("ran") not in DECODERS:
            fail(where, f"{name}.ran", f"must be one of {', '.join(DECODERS)}")
        extra = sorted(set(entry) - {"ran", "fallback"})
        if extra:
            fail(where, name, f"unknown field {extra[0]!r}; an entry has 'ran' and, for a model the own decoder "
                              "refused, 'fallback'")
        if "fallback" not in entry:
            continue
        if entry["ran"] != DECODER_HF:
            fail(where, f"{name}.fallback", "only a model that fell back to Hugging Face's modules ('ran': 'hf') "
                                            "says why")
        reason = entry["fallback"]
        if (not isinstance(reason, str) or not 0 < len(reason) <= MAX_DECODER_FALLBACK_TEXT
                or reason != " ".join(reason.split())):
            fail(where, f"{name}.fallback", f"must say why in one line of 1..{MAX_DECODER_FALLBACK_TEXT} characters")
    if decoder["target"]["ran"] == DECODER_OWN:
        if h.get("tensor_parallel") is not None:
            fail(where, "decoder.target.ran", "a target sharded over ranks (tensor_parallel) runs Hugging Face's "
                                              "modules, not the own decoder")


def check_request(h: dict, where: str) -> None:
    """A workload's request (engine/workload/): its conversation and its id and category, shown as text."""
    messages = h.get("messages")
    if messages is not None and not (isinstance(messages, list) and messages and all(
            isinstance(m, dict) and set(m) == {"role", "content"} and all(isinstance(v, str) for v in m.values())
            for m in messages)):
        fail(where, "messages", "must be a list of {role, content} turns of text")
    request = h.get("request")
    if request is not None and not (isinstance(request, dict) and set(request) == {"id", "category"}
                                    and all(isinstance(v, str) and 0 < len(v) <= 100 for v in request.values())):
        fail(where, "request", "must be {id, category}, each text of 1 to 100 characters")


def check_batch(h: dict, where: str) -> bool:
    """A request run in a batch (engine/workload/batched.py): the batch's rows and the row it ran in. Its
    cycles feed the draft d_K every time, as gpt-fast does; a chain of the draft model only."""
    batch = h.get("batch")
    if batch is None:
        return False
    if not (isinstance(batch, dict) and set(batch) == {"rows", "row"} and is_int(batch["rows"])
            and 1 <= batch["rows"] <= MAX_BATCH and is_int(batch["row"]) and 0 <= batch["row"] < batch["rows"]):
        fail(where, "batch", f"must be {{rows, row}}: 1..{MAX_BATCH} rows and a row among them")
    if "tree" in h["settings"] or h.get("fast_path") is not None or h.get("drafter", {}).get("kind") != DRAFT_MODEL:
        fail(where, "batch", "a batch runs chains of the draft model, on the batched cycle (no tree, no fast path)")
    if h.get("cache_layout", {}).get("name") != "static":
        fail(where, "batch", "each row of a batch is a static buffer (cache_layout static)")
    return True


def check_prefix_reuse(h: dict, where: str) -> None:
    """How many prompt tokens each model took from the previous request's K/V (engine/kv/prefix.py):
    fewer than it prefilled, so every run still reads at least its last prompt token itself."""
    reuse = h.get("prefix_reuse")
    if reuse is None:
        return
    prefilled = len(h["prompt_token_ids"]) - 1  # the target's; a draft reading its own rendering may differ
    if not (isinstance(reuse, dict) and reuse and set(reuse) <= {"target", "draft"}
            and all(is_int(n) and 0 <= n < 10**7 for n in reuse.values())
            and (reuse.get("target", 0) == 0 or reuse["target"] < prefilled)):
        fail(where, "prefix_reuse", "must give target and draft a number of reused prompt tokens, "
                                    "fewer than the prompt's prefilled ones")
    if h.get("cache_layout", {}).get("name", "dynamic") != "dynamic" or "tree" in h["settings"]:
        fail(where, "prefix_reuse", "a reused prompt start is copied into dynamic caches of a chain only")


def check_convention(h: dict, where: str) -> str:
    """The cache convention: the lab's own, or a live vLLM's as its capture plugin records it, which comes only
    from vLLM's n-gram proposer on a plain chain (no tree, fast path, batch, layout or teaching fault)."""
    name = h["cache_convention"].get("name")
    if name not in CACHE_CONVENTIONS:
        fail(where, "cache_convention.name", f"must be one of {', '.join(map(repr, CACHE_CONVENTIONS))}")
    if name != VLLM_CONVENTION:
        return name
    if h["cache_convention"].get("text") != VLLM_CONVENTION_TEXT:
        fail(where, "cache_convention.text", f"the '{VLLM_CONVENTION}' convention states its rules in the text "
                                             "engine/trace/schema.py gives (VLLM_CONVENTION_TEXT)")
    others = [f for f in ("fast_path", "batch", "cache_layout", "faults", "tensor_parallel",
                          "prefix_reuse", "calibration") if h.get(f) is not None]
    drafter = h.get("drafter", {})
    if drafter.get("kind") not in (PROMPT_LOOKUP, DRAFT_MODEL) or "tree" in h["settings"] or others:
        fail(where, "cache_convention.name", f"'{VLLM_CONVENTION}' is a capture of vLLM's n-gram proposer or draft "
                                             "model on a chain: a prompt-lookup or model drafter, no tree"
                                             + (f", no {others[0]}" if others else ""))
    if drafter["kind"] == DRAFT_MODEL and drafter.get("vllm_draft_sample_method") not in VLLM_DRAFT_SAMPLING:
        fail(where, "drafter.vllm_draft_sample_method", f"a captured vLLM draft model says how it drafted: one of "
                                                        f"{', '.join(map(repr, VLLM_DRAFT_SAMPLING))}")
    return name


def check_header(h: dict, where: str) -> RunFacts:
    check_settings(h["settings"], where)
    check_request(h, where)
    s = h["settings"]
    for role in ("target", "draft"):
        if "name" in h[role] and not isinstance(h[role]["name"], str):
            fail(where, f"{role}.name", "must be a string")
    vocab = h["target"].get("vocab_size")
    if vocab is not None and (not is_int(vocab) or vocab < 1):
        fail(where, "target.vocab_size", "must be a positive integer")
    convention = check_convention(h, where)
    prompt = h["prompt_token_ids"]
    if not prompt:
        fail(where, "prompt_token_ids", "a run starts from at least one prompt token")
    check_token_ids(prompt, vocab, where, "prompt_token_ids")
    check_texts(h["prompt_token_texts"], len(prompt), where, "prompt_token_texts")
    check_token_ids(h["eos_token_ids"], vocab, where, "eos_token_ids")
    faults = check_faults(h.get("faults"), where, "tree" in s)
    check_fast_path(h.get("fast_path"), where)
    check_calibration(h.get("calibration"), where, h.get("fast_path"))
    check_linear_paths(h.get("linear_paths"), where)
    check_tensor_parallel(h.get("tensor_parallel"), where)
    check_target_weights(h.get("target_weights"), where)
    drafter = check_drafter(h, float(s["temperature"]), where)
    check_decoder(h, drafter["kind"], where)
    batched = check_batch(h, where)
    check_prefix_reuse(h, where)
    tree = None
    if "tree" in s:
        tree = check_tree_header(h, where)
    return RunFacts(s["k"], float(s["temperature"]), s["max_new_tokens"], s["trace_top_k"], list(prompt),
                    frozenset(h["eos_token_ids"]), vocab, faults, drafter,
                    isinstance(h.get("fast_path"), dict) or batched, tree, convention)
