"""What a trace's numbers must mean: the invariants `load_trace` checks after the field types.

engine/trace/format.py checks that every field is there with the right JSON type; this module
checks that the numbers agree with each other and with the rules of a cycle (design notes,
"One cycle, exactly" and "Cache conventions"). A trace is untrusted input: one that breaks
an invariant is refused with a message naming the line, the cycle, the field and the rule.

Runs recorded with a deliberate bug (header "faults", see engine/teaching/faults.py `Faults`)
are checked against the bug they declare: a run that keeps its rejected K/V must show
exactly the cache lengths that bug produces, not the correct ones.

Fields this module does not know (a future cache layout's) are ignored. The header's
`drafter` entry says which drafter proposed: a draft model ("model", or no entry in
older traces) proposes exactly K tokens and keeps a cache over the target's positions.
An EAGLE head ("eagle") also proposes K and keeps a cache over the target's positions, but
keeps only entries built on the target's true features (see check_eagle_cache).
Prompt lookup and the other-tokenizer draft propose 0..K tokens deterministically (one-hot
rows, so p_draft is 1) and keep no such cache; their `drafter_state` is checked against
what each one does (the n-gram match; the draft's own tokens and cache).

A tree trace (the header's settings has "tree") has tree cycle records instead; their
rules are in tree_checks.py, which check_trace calls for each of its cycles.
"""
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.trace.commit import final_tokens
from engine.trace.metrics import trace_acceptance
from engine.trace.schema import (
    ACCEPTANCE_RULES,
    CACHE_CONVENTION,
    DRAFT_MODEL,
    DRAFTER_KINDS,
    EAGLE,
    GGUF_BLOCK_TYPES,
    LINEAR_PATHS,
    MAX_K,
    MAX_NGRAM,
    OTHER_TOKENIZER,
    PROMPT_LOOKUP,
    TARGET_WEIGHTS,
    WEIGHTS_INT4,
)

if TYPE_CHECKING:
    from engine.config import TreeSpec

# The deliberate bugs a teaching run may declare (mirror of teaching_faults.Faults; a test keeps them equal).
FAULT_FIELDS = {"keep_rejected_kv": bool, "skip_draft_catch_up": bool, "acceptance_rule": str, "greedy_draft": bool}
# ... and those of a tree run's rollback (mirror of teaching_faults.TreeFaults), declared by tree traces only.
TREE_FAULT_FIELDS = {"crop_instead_of_compact": bool}
MAX_VERIFY_WIDTH = 1024  # calibrated verify widths beyond this are not a real measurement
MAX_RANKS = 65536  # ranks of a tensor-parallel run: far beyond any real job
MAX_RANK_TEXT = 255  # a host name (at most 253 characters in DNS), a device or backend name
MAX_TOKEN_ID = 2**31 - 1  # the bound when a header gives no vocab_size: no tokenizer has more ids
REL_TOL, ABS_TOL = 1e-5, 1e-6  # float32 numbers written as float64: a few ulps of slack


class BrokenInvariant(ValueError):
    """One invariant a trace breaks; the message names where, the field and the rule."""


@dataclass(frozen=True)
class RunFacts:
    """What the header fixes for every cycle."""

    k: int
    temperature: float
    max_new_tokens: int
    trace_top_k: int
    prompt_ids: list[int]
    eos_ids: frozenset
    vocab_size: int | None
    faults: dict
    drafter: dict  # the header's drafter entry ({"kind": "model"} for traces without one)
    fast_path: bool = False  # engine/cycle/fast.py feeds d_K in every cycle, so catch-up time is spent in each
    tree: "TreeSpec | None" = None  # settings.tree of a tree trace: its cycles are tree cycle records

    @property
    def rule(self) -> str:
        return self.faults.get("acceptance_rule", "ratio")

    @property
    def drafter_kind(self) -> str:
        return self.drafter["kind"]

    @property
    def drafts_k_with_cache(self) -> bool:
        """A draft model or an EAGLE head: K proposals every cycle and a cache over the target's positions."""
        return self.drafter_kind in (DRAFT_MODEL, EAGLE)


def fail(where: str, field: str, rule: str) -> None:
    raise BrokenInvariant(f"{where}: field '{field}': {rule}")


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ---------------------------------------------------------------- header

def check_drafter(h: dict, temperature: float, where: str) -> dict:
    """The header's drafter entry and its settings; traces from before drafters had names used a draft model."""
    d = h.get("drafter", {"kind": DRAFT_MODEL})
    if not isinstance(d, dict) or d.get("kind") not in DRAFTER_KINDS:
        fail(where, "drafter", f"must be an object whose kind is one of {', '.join(DRAFTER_KINDS)}")
    if d["kind"] == PROMPT_LOOKUP:
        lo, hi = d.get("min_ngram"), d.get("max_ngram")
        if not (is_int(lo) and is_int(hi) and 1 <= lo <= hi <= MAX_NGRAM):
            fail(where, "drafter.min_ngram", f"prompt lookup needs 1 <= min_ngram <= max_ngram <= {MAX_NGRAM}")
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
    return d


def check_token_ids(ids: list, vocab: int | None, where: str, field: str) -> None:
    limit = vocab if vocab is not None else MAX_TOKEN_ID + 1
    for i, t in enumerate(ids):
        if not is_int(t) or not 0 <= t < limit:
            fail(where, f"{field}[{i}]", f"a token id must be an integer in 0..{limit - 1}, got {t!r:.40}")


def check_texts(texts: list, n: int, where: str, field: str) -> None:
    if len(texts) != n or not all(isinstance(t, str) for t in texts):
        fail(where, field, f"must be {n} strings, one per token id")


def check_settings(settings: dict, where: str) -> None:
    # Imported here: engine.config imports engine.trace.schema, which loads this package first.
    from engine.config import SettingsError, SpecSettings

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


def check_calibration(cal, where: str) -> None:
    """The optional step-time calibration (engine/stats/calibrate.py): positive finite times, distinct widths."""
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


def check_linear_path_curve(curve, where: str, name: str) -> None:
    """One model's measured linear paths (engine/models/linear_paths.py): a time per path and width,
    and a choice per width that is the faster path there (a tie: the model as loaded)."""
    if not isinstance(curve, dict):
        fail(where, name, "must be an object")
    widths, seconds, chosen = curve.get("widths"), curve.get("seconds"), curve.get("chosen")
    if (not isinstance(widths, list) or not widths or len(widths) > MAX_VERIFY_WIDTH
            or widths != list(range(1, len(widths) + 1)) or not all(is_int(w) for w in widths)):
        fail(where, f"{name}.widths", "must be the widths 1, 2, ..., n")
    if not isinstance(seconds, dict) or sorted(seconds) != sorted(LINEAR_PATHS) or not all(
            isinstance(v, list) and len(v) == len(widths) and all(is_num(t) and t > 0 for t in v)
            for v in seconds.values()):
        fail(where, f"{name}.seconds", f"must give {', '.join(LINEAR_PATHS)} a positive time at every width")
    if not isinstance(chosen, dict) or sorted(chosen) != sorted(str(w) for w in widths):
        fail(where, f"{name}.chosen", "must name one path for every width")
    for i, w in enumerate(widths):
        fastest = min(LINEAR_PATHS, key=lambda p: (seconds[p][i], p != LINEAR_PATHS[0]))
        if chosen[str(w)] != fastest:
            fail(where, f"{name}.chosen.{w}", f"must be the faster path at that width ({fastest})")
    if "spread" in curve and not (is_num(curve["spread"]) and curve["spread"] >= 0):
        fail(where, f"{name}.spread", "must be a non-negative number")
    if "kept" in curve and not isinstance(curve["kept"], bool):
        fail(where, f"{name}.kept", "must be true or false")
    machine = curve.get("machine")
    if not isinstance(machine, dict) or not all(isinstance(machine.get(k), str) and len(machine[k]) <= 200
                                                for k in ("cpu", "torch")):
        fail(where, f"{name}.machine", "must name the CPU and the torch version")


def check_linear_paths(paths, where: str) -> None:
    """The optional per-machine linear paths of a calibrated CPU run, for the target and a draft model."""
    if paths is None:
        return
    if not isinstance(paths, dict) or not set(paths) <= {"target", "draft"}:
        fail(where, "linear_paths", "must be an object with a curve for the target and/or the draft")
    for role, curve in paths.items():
        check_linear_path_curve(curve, where, f"linear_paths.{role}")


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
    if weights["path"] != WEIGHTS_INT4:
        return
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


def check_header(h: dict, where: str) -> RunFacts:
    check_settings(h["settings"], where)
    s = h["settings"]
    for role in ("target", "draft"):
        if "name" in h[role] and not isinstance(h[role]["name"], str):
            fail(where, f"{role}.name", "must be a string")
    vocab = h["target"].get("vocab_size")
    if vocab is not None and (not is_int(vocab) or vocab < 1):
        fail(where, "target.vocab_size", "must be a positive integer")
    if h["cache_convention"].get("name") != CACHE_CONVENTION:
        fail(where, "cache_convention.name", f"this engine reads the '{CACHE_CONVENTION}' convention only")
    prompt = h["prompt_token_ids"]
    if not prompt:
        fail(where, "prompt_token_ids", "a run starts from at least one prompt token")
    check_token_ids(prompt, vocab, where, "prompt_token_ids")
    check_texts(h["prompt_token_texts"], len(prompt), where, "prompt_token_texts")
    check_token_ids(h["eos_token_ids"], vocab, where, "eos_token_ids")
    faults = check_faults(h.get("faults"), where, "tree" in s)
    check_calibration(h.get("calibration"), where)
    check_linear_paths(h.get("linear_paths"), where)
    check_tensor_parallel(h.get("tensor_parallel"), where)
    check_target_weights(h.get("target_weights"), where)
    drafter = check_drafter(h, float(s["temperature"]), where)
    tree = None
    if "tree" in s:
        from engine.trace.tree_checks import check_tree_header  # tree_checks imports this module
        tree = check_tree_header(h, where)
    return RunFacts(s["k"], float(s["temperature"]), s["max_new_tokens"], s["trace_top_k"], list(prompt),
                    frozenset(h["eos_token_ids"]), vocab, faults, drafter, isinstance(h.get("fast_path"), dict), tree)


# ---------------------------------------------------------------- one cycle

def check_probabilities(c: dict, n_prop: int, where: str) -> None:
    for name in ("p_draft", "p_target", "accept_prob", "beta"):
        values = c[name]
        if len(values) != n_prop:
            fail(where, name, f"needs one entry per draft token ({n_prop}), has {len(values)}")
        for i, p in enumerate(values):
            if not is_num(p) or not 0.0 <= p <= 1.0 + ABS_TOL:
                fail(where, f"{name}[{i}]", f"a probability must lie in [0, 1], got {p!r:.40}")
    for i, (p_t, p_d, a, b) in enumerate(zip(c["p_target"], c["p_draft"], c["accept_prob"], c["beta"])):
        if p_d <= 0:
            fail(where, f"p_draft[{i}]", "the draft proposed a token it gives probability 0")
        if not close(a, min(1.0, p_t / p_d)):
            fail(where, f"accept_prob[{i}]", f"must equal min(1, p_target/p_draft) = {min(1.0, p_t / p_d):.6g}, got {a:.6g}")
        if b < min(p_t, p_d) - ABS_TOL:
            fail(where, f"beta[{i}]",
                 "beta = sum_x min(p_target, p_draft) cannot be below min(p_target, p_draft) of the draft token")


def passes(rule: str, u: float, accept_prob: float, p_target: float) -> bool | None:
    """What the declared acceptance rule decides for a draw; None when the draw does not decide."""
    if rule in ("ratio", "no_residual"):
        return u < accept_prob
    if rule == "p_target_only":
        return u < p_target
    return None  # token_match compares a fresh target sample, which the trace does not record


def check_decision(c: dict, n_prop: int, facts: RunFacts, where: str) -> None:
    n = c["num_accepted"]
    if not 0 <= n <= n_prop:
        fail(where, "num_accepted", f"must lie in 0..{n_prop} (the draft tokens of this cycle)")
    u = c["u"]
    if len(u) != min(n + 1, n_prop):
        fail(where, "u", f"one draw per tested position: {min(n + 1, n_prop)} for {n} accepted of {n_prop}, got {len(u)}")
    for i, x in enumerate(u):
        if not is_num(x) or not 0.0 <= x < 1.0:
            fail(where, f"u[{i}]", f"a uniform draw must lie in [0, 1), got {x!r:.40}")
        verdict = passes(facts.rule, x, c["accept_prob"][i], c["p_target"][i])
        if verdict is not None and verdict != (i < n):
            test = "u < p_target" if facts.rule == "p_target_only" else "u < accept_prob"
            fail(where, f"u[{i}]", f"the draw says {'accept' if verdict else 'reject'} ({test}) but the cycle "
                                   f"{'accepted' if i < n else 'rejected'} draft token {i + 1}")
    rejected = n < n_prop
    if c["rejected_position"] != (n + 1 if rejected else None):
        fail(where, "rejected_position", f"must be {n + 1 if rejected else 'null'} (first failing position, 1-based) "
                                         f"with {n} accepted of {n_prop}")
    if (c["resampled_token_id"] is None) == rejected or (c["bonus_token_id"] is None) != rejected:
        fail(where, "resampled_token_id", "a rejection has a resampled token and no bonus; a full accept the reverse")


def check_top(entries, n_rows: int, facts: RunFacts, where: str, field: str, chosen: list[int], p_chosen: list[float]) -> None:
    """Top-N lists: sorted, in range, and agreeing with the draft token's recorded probability."""
    if len(entries) != n_rows:
        fail(where, field, f"needs {n_rows} rows, has {len(entries)}")
    for r, row in enumerate(entries):
        if not isinstance(row, list) or len(row) > facts.trace_top_k:
            fail(where, f"{field}[{r}]", f"must be a list of at most trace_top_k = {facts.trace_top_k} entries")
        last = 1.0 + ABS_TOL
        for e in row:
            if not isinstance(e, dict) or not is_int(e.get("token_id")) or not isinstance(e.get("text"), str) \
                    or not is_num(e.get("p")) or not 0 < e["p"] <= last:
                fail(where, f"{field}[{r}]", "entries are {token_id, text, p} with 0 < p <= 1, most likely first")
            last = e["p"] + ABS_TOL
        check_token_ids([e["token_id"] for e in row], facts.vocab_size, where, f"{field}[{r}]")
        if sum(e["p"] for e in row) > 1.0 + 1e-3:
            fail(where, f"{field}[{r}]", "probabilities of one distribution sum to more than 1")
        if r < len(chosen):
            for e in row:
                if e["token_id"] == chosen[r] and not close(e["p"], p_chosen[r]):
                    fail(where, f"{field}[{r}]", f"lists draft token {chosen[r]} at p={e['p']:.6g}, the cycle "
                                                 f"records {p_chosen[r]:.6g}")


def check_residual(c: dict, facts: RunFacts, where: str) -> None:
    res = c["residual_top"]
    if c["resampled_token_id"] is None:
        if res is not None:
            fail(where, "residual_top", "only a rejected cycle has a residual distribution")
        return
    if res is None or len(res) > facts.trace_top_k + 1:
        fail(where, "residual_top", f"a rejection records its residual: 1..{facts.trace_top_k + 1} entries")
    for e in res:
        if not isinstance(e, dict) or not is_int(e.get("token_id")) or not isinstance(e.get("text"), str) or \
                not all(is_num(e.get(f)) and 0 <= e[f] <= 1 + ABS_TOL for f in ("p_target", "p_draft", "residual")):
            fail(where, "residual_top", "entries are {token_id, text, p_target, p_draft, residual} in [0, 1]")
    check_token_ids([e["token_id"] for e in res], facts.vocab_size, where, "residual_top")
    sampled = [e for e in res if e["token_id"] == c["resampled_token_id"]]
    if not sampled or sampled[0]["residual"] <= 0:
        fail(where, "residual_top", "the resampled token must be listed with a residual probability above 0")


def check_greedy(c: dict, n: int, next_token: int, where: str) -> None:
    """Temperature 0: one-hot distributions, so accept while the draft is the target's argmax."""
    if any(p != 1.0 for p in c["p_draft"]):
        fail(where, "p_draft", "greedy: the draft proposes its argmax, with probability 1")
    if any(p not in (0.0, 1.0) for p in c["p_target"]):
        fail(where, "p_target", "greedy: the target's distribution is one-hot, so p_target is 0 or 1")
    argmax = c["target_top"][n] if n < len(c["target_top"]) else []
    if len(argmax) != 1 or argmax[0]["token_id"] != next_token:
        fail(where, "resampled_token_id" if c["resampled_token_id"] is not None else "bonus_token_id",
             "greedy: the token after the accepted drafts is the target's argmax (target_top)")


def check_text_map(known: dict, ids: list[int], texts: list[str], where: str, field: str) -> None:
    """A token id decodes to one text everywhere in the trace."""
    for t, text in zip(ids, texts):
        if known.setdefault(t, text) != text:
            fail(where, field, f"token {t} is written {text!r:.30} here and {known[t]!r:.30} elsewhere")


def cycle_texts(c: dict) -> list[tuple[str, list[int], list[str]]]:
    pairs = [("draft_token_texts", c["draft_token_ids"], c["draft_token_texts"]),
             ("committed_token_texts", c["committed_token_ids"], c["committed_token_texts"])]
    nxt = c["resampled_token_id"] if c["resampled_token_id"] is not None else c["bonus_token_id"]
    pairs.append(("next_token_text", [nxt], [c["next_token_text"]]))
    for name in ("target_top", "draft_top"):
        for row in c[name]:
            pairs.append((name, [e["token_id"] for e in row], [e["text"] for e in row]))
    if c["residual_top"]:
        pairs.append(("residual_top", [e["token_id"] for e in c["residual_top"]], [e["text"] for e in c["residual_top"]]))
    return pairs


# ---------------------------------------------------------------- drafters other than a draft model

def check_one_hot(c: dict, n_prop: int, facts: RunFacts, where: str) -> None:
    """A deterministic drafter proposes with probability 1: p_draft 1, its top list the token itself, beta = p_target."""
    for i, (d, p_d, p_t, b, row) in enumerate(zip(c["draft_token_ids"], c["p_draft"], c["p_target"], c["beta"], c["draft_top"])):
        if p_d != 1.0:
            fail(where, f"p_draft[{i}]", f"{facts.drafter_kind} proposes deterministically: p_draft is 1")
        if len(row) != 1 or row[0]["token_id"] != d:
            fail(where, f"draft_top[{i}]", f"{facts.drafter_kind}'s distribution is one-hot on the proposed token {d}")
        if not close(b, p_t):
            fail(where, f"beta[{i}]", "with a one-hot draft, beta = sum_x min(p_target, p_draft) is p_target of the draft token")


def check_prompt_lookup(state: dict, drafts: list[int], sequence: list[int], facts: RunFacts, where: str) -> None:
    """The proposals are what followed an earlier occurrence of the sequence's last n tokens."""
    if not state.get("matched"):
        if drafts:
            fail(where, "draft_token_ids", "prompt lookup without a match proposes nothing")
        return
    n, start, cont = state.get("ngram_size"), state.get("match_start"), state.get("continuation_start")
    lo, hi = facts.drafter["min_ngram"], facts.drafter["max_ngram"]
    if not (is_int(n) and lo <= n <= hi and is_int(start) and 0 <= start and cont == start + n < len(sequence)):
        fail(where, "drafter_state", f"a match is n in {lo}..{hi} tokens at match_start, continuing at match_start + n "
                                     "inside the committed sequence")
    if sequence[start:start + n] != sequence[len(sequence) - n:]:
        fail(where, "drafter_state.match_start", f"the {n} tokens there are not the sequence's last {n}")
    if drafts != sequence[cont:cont + facts.k]:
        fail(where, "draft_token_ids", f"prompt lookup proposes the (up to K) tokens that followed the match, from "
                                       f"position {cont}: {sequence[cont:cont + facts.k]}")
    if state.get("proposed") != len(drafts):
        fail(where, "drafter_state.proposed", f"must be {len(drafts)}")


def check_other_tokenizer(state: dict, drafts: list[int], c: dict, facts: RunFacts, run: "Progress", where: str) -> None:
    """The draft's own tokens re-encode to the proposals; its own cache ends two short of the
    committed text in draft tokens (the last one is re-predicted: token healing)."""
    if state.get("target_token_ids") != drafts or state.get("target_token_texts") != c["draft_token_texts"]:
        fail(where, "drafter_state.target_token_ids", "the re-encoded draft text is the cycle's proposal (ids and texts)")
    own, own_texts = state.get("draft_token_ids"), state.get("draft_token_texts")
    if not isinstance(own, list) or not isinstance(own_texts, list):
        fail(where, "drafter_state.draft_token_ids", "the draft's own tokens: a list of ids and one of texts")
    check_token_ids(own, facts.drafter.get("draft_vocab_size"), where, "drafter_state.draft_token_ids")
    check_texts(own_texts, len(own), where, "drafter_state.draft_token_texts")
    check_text_map(run.draft_texts, own, own_texts, where, "drafter_state.draft_token_texts")
    lengths, committed = state.get("draft_cache_len"), state.get("draft_committed_len")
    if not isinstance(lengths, dict) or not all(is_int(lengths.get(f)) and lengths[f] >= 0
                                                for f in ("before", "after_append", "after_rollback")):
        fail(where, "drafter_state.draft_cache_len", "the draft's own cache lengths: before, after_append, after_rollback")
    if not is_int(committed) or lengths["after_rollback"] != max(committed - 2, 0):
        fail(where, "drafter_state.draft_cache_len.after_rollback",
             "the draft's cache keeps all of the committed text's draft tokens but the last two")
    if run.own_cache is not None and lengths["before"] != run.own_cache:
        fail(where, "drafter_state.draft_cache_len.before", f"must continue the previous cycle's length {run.own_cache}")
    if lengths["after_append"] < lengths["before"]:
        fail(where, "drafter_state.draft_cache_len.after_append", "drafting only appends to the draft's cache")
    run.own_cache = lengths["after_rollback"]


def check_eagle_state(c: dict, n_prop: int, where: str) -> None:
    """Optional (older eagle traces lack it): which feature each draft step read. Step 1 reads
    the target's true feature f_{n-2} (n = committed length before the cycle), later steps the
    head's own predicted feature."""
    state = c.get("drafter_state")
    if state is None:
        return
    if state.get("kind", EAGLE) != EAGLE:
        fail(where, "drafter_state.kind", "an eagle trace's drafter state has kind 'eagle'")
    sources = state.get("feature_sources")
    want = (["target"] + ["head"] * (n_prop - 1)) if n_prop else []
    if sources is not None and sources != want:
        fail(where, "drafter_state.feature_sources", f"must be {want}: draft step 1 reads the target's feature, "
                                                     "later steps the head's own predicted feature")
    first = state.get("first_feature_position")
    if first is not None and first != c["committed_len_before"] - 2:
        fail(where, "drafter_state.first_feature_position",
             f"must be {c['committed_len_before'] - 2}: the target's feature of the token before the last committed one")


def check_drafter_state(c: dict, facts: RunFacts, run: "Progress", where: str) -> None:
    if facts.drafter_kind == EAGLE:
        check_eagle_state(c, len(c["draft_token_ids"]), where)
    if facts.drafts_k_with_cache:
        return
    state = c.get("drafter_state")
    if not isinstance(state, dict) or state.get("kind") != facts.drafter_kind:
        fail(where, "drafter_state",
             f"every cycle of the {facts.drafter_kind} drafter records its state (kind {facts.drafter_kind!r})")
    if c["draft_cache_len"] is not None:
        fail(where, "draft_cache_len", f"{facts.drafter_kind} keeps no cache over the target's positions: null")
    check_one_hot(c, len(c["draft_token_ids"]), facts, where)
    if facts.drafter_kind == PROMPT_LOOKUP:
        check_prompt_lookup(state, c["draft_token_ids"], facts.prompt_ids + run.generated, facts, where)
    else:
        check_other_tokenizer(state, c["draft_token_ids"], c, facts, run, where)


# ---------------------------------------------------------------- caches

@dataclass
class CacheChain:
    """Cache lengths carried from one cycle to the next."""

    target: int
    draft: int | None


def check_lengths(lengths: dict, where: str, field: str) -> None:
    for name in ("before", "after_append", "after_rollback"):
        if lengths[name] < 0:
            fail(where, f"{field}.{name}", "a cache length cannot be negative")


def check_caches(c: dict, n_prop: int, committed_after: int, chain: CacheChain, facts: RunFacts, where: str) -> CacheChain:
    """Lengths by the convention: both caches end one short of the committed sequence (or as the fault says)."""
    keep = committed_after - 1
    t = c["target_cache_len"]
    check_lengths(t, where, "target_cache_len")
    if t["before"] != chain.target:
        fail(where, "target_cache_len.before", f"must continue the previous cycle's length {chain.target}")
    if t["after_append"] != t["before"] + n_prop + 1:
        fail(where, "target_cache_len.after_append", f"verify appends K+1 = {n_prop + 1} positions to {t['before']}")
    if c["verify_positions"] != n_prop + 1:
        fail(where, "verify_positions", f"verify runs over [last committed, d1..d{n_prop}] = {n_prop + 1} positions")
    keep_rejected = facts.faults.get("keep_rejected_kv", False)
    want = t["after_append"] if keep_rejected else keep
    if t["after_rollback"] != want:
        fail(where, "target_cache_len.after_rollback", f"must be {want}: " + (
            "the declared fault keeps the rejected K/V" if keep_rejected else "committed length - 1 by the convention"))
    d = c.get("draft_cache_len")
    if not isinstance(d, dict) or chain.draft is None:
        if c["draft_catch_up"] and c["catch_up_time_s"] < 0:
            fail(where, "catch_up_time_s", "cannot be negative")
        return CacheChain(t["after_rollback"], None)
    check_lengths(d, where, "draft_cache_len")
    if d["before"] != chain.draft:
        fail(where, "draft_cache_len.before", f"must continue the previous cycle's length {chain.draft}")
    if not facts.drafts_k_with_cache:
        return CacheChain(t["after_rollback"], d["after_rollback"])
    if d["after_append"] != d["before"] + n_prop:
        fail(where, "draft_cache_len.after_append", f"K = {n_prop} draft steps append {n_prop} positions to {d['before']}")
    if facts.drafter_kind == EAGLE:
        return check_eagle_cache(c, d, keep, where, t["after_rollback"])
    cropped = d["after_append"] if keep_rejected else min(d["after_append"], keep)
    catch_up = cropped < keep and not facts.faults.get("skip_draft_catch_up", False)
    if c["draft_catch_up"] != catch_up:
        fail(where, "draft_catch_up", f"must be {str(catch_up).lower()}: the draft is fed the committed tokens "
                                      "it never saw (d_K after a full accept)")
    if d["after_rollback"] != (keep if catch_up else cropped):
        fail(where, "draft_cache_len.after_rollback", f"must be {keep if catch_up else cropped} by the convention"
             + (" and the declared fault" if facts.faults else ""))
    if not catch_up and c["catch_up_time_s"] != 0 and not facts.fast_path:
        fail(where, "catch_up_time_s", "no catch-up ran, so its time is 0")
    return CacheChain(t["after_rollback"], d["after_rollback"])


def check_eagle_cache(c: dict, d: dict, keep: int, where: str, target_after: int) -> CacheChain:
    """The head keeps only entries built on the target's true features: its first draft step
    (fed f_{n-2}) survives, later steps (fed its own predictions) are dropped, and the accepted
    tokens are fed again with true features. The teaching faults leave the head alone."""
    catch_up = d["before"] + 1 < keep
    if c["draft_catch_up"] != catch_up:
        fail(where, "draft_catch_up", f"must be {str(catch_up).lower()}: the head is fed again every committed "
                                      "token past its first draft step, with the target's true features")
    if d["after_rollback"] != keep:
        fail(where, "draft_cache_len.after_rollback", f"must be {keep}: committed length - 1 by the convention")
    if not catch_up and c["catch_up_time_s"] != 0:
        fail(where, "catch_up_time_s", "no catch-up ran, so its time is 0")
    return CacheChain(target_after, d["after_rollback"])


def check_times(c: dict, n_prop: int, facts: RunFacts, where: str) -> None:
    for name in ("draft_time_s", "catch_up_time_s"):
        if c[name] < 0:
            fail(where, name, "a time cannot be negative")
    for name in ("verify_time_s", "cycle_time_s"):  # a forward pass always takes some time
        if c[name] <= 0:
            fail(where, name, "a measured time must be positive")
    steps = c["draft_step_times_s"]
    if facts.drafts_k_with_cache and len(steps) != n_prop:
        fail(where, "draft_step_times_s", f"one time per draft step: {n_prop}, got {len(steps)}")
    if not all(is_num(x) and x >= 0 for x in steps):
        fail(where, "draft_step_times_s", "times must be non-negative numbers")


# ---------------------------------------------------------------- the whole trace

@dataclass
class Progress:
    """The run as replayed so far."""

    generated: list[int]
    chain: CacheChain
    finished: bool = False
    draft_texts: dict = field(default_factory=dict)  # other tokenizer: the draft's own id -> text
    own_cache: int | None = None  # other tokenizer: its own cache length after the last rollback


def check_cycle(c: dict, facts: RunFacts, run: Progress, texts: dict, where: str) -> None:
    drafts = c["draft_token_ids"]
    n_prop = len(drafts)
    if run.finished:
        fail(where, "cycle", "a cycle after the one that finished the run")
    if n_prop > facts.k:
        fail(where, "draft_token_ids", f"{n_prop} draft tokens, more than K={facts.k}")
    if facts.drafts_k_with_cache and n_prop != facts.k:
        fail(where, "draft_token_ids",
             f"has {n_prop} entries, expected {facts.k}: the {facts.drafter_kind} drafter proposes exactly K")
    check_token_ids(drafts, facts.vocab_size, where, "draft_token_ids")
    check_texts(c["draft_token_texts"], n_prop, where, "draft_token_texts")
    prompt_len = len(facts.prompt_ids)
    if c["committed_len_before"] != prompt_len + len(run.generated):
        fail(where, "committed_len_before", f"must be prompt + tokens so far = {prompt_len + len(run.generated)}")
    check_probabilities(c, n_prop, where)
    check_decision(c, n_prop, facts, where)
    n = c["num_accepted"]
    nxt = c["resampled_token_id"] if c["resampled_token_id"] is not None else c["bonus_token_id"]
    next_field = "resampled_token_id" if c["resampled_token_id"] is not None else "bonus_token_id"
    check_token_ids([nxt], facts.vocab_size, where, next_field)
    budget = facts.max_new_tokens - len(run.generated)
    want, finished = final_tokens(drafts[:n] + [nxt], budget, facts.eos_ids)
    if c["committed_token_ids"] != want:
        fail(where, "committed_token_ids", f"must be the {n} accepted drafts plus the "
             f"{'resampled' if n < n_prop else 'bonus'} token, cut at EOS and at the budget of {budget}: {want}")
    check_texts(c["committed_token_texts"], len(want), where, "committed_token_texts")
    if c["finished"] != finished:
        fail(where, "finished", f"must be {str(finished).lower()}: a run ends at EOS or at max_new_tokens")
    check_top(c["target_top"], n_prop + 1, facts, where, "target_top", drafts, c["p_target"])
    check_top(c["draft_top"], n_prop, facts, where, "draft_top", drafts, c["p_draft"])
    check_residual(c, facts, where)
    if facts.temperature == 0:
        check_greedy(c, n, nxt, where)
    for name, ids, strings in cycle_texts(c):
        check_text_map(texts, ids, strings, where, name)
    check_drafter_state(c, facts, run, where)
    run.chain = check_caches(c, n_prop, prompt_len + len(run.generated) + len(want), run.chain, facts, where)
    check_times(c, n_prop, facts, where)
    run.generated += want
    run.finished = finished


def check_summary(s: dict, cycles: list[dict], facts: RunFacts, run: Progress, where: str) -> None:
    """The summary agrees with its cycles; for a tree trace, k is the max depth and the
    acceptance numbers mean what metrics.trace_acceptance says."""
    if not run.finished:
        fail(where, "stop_reason", "a summary follows the cycle that finished the run (EOS or max_new_tokens)")
    if s["generated_token_ids"] != run.generated:
        fail(where, "generated_token_ids", "must be the committed tokens of all cycles, in order")
    if s["num_generated"] != len(run.generated):
        fail(where, "num_generated", f"must be {len(run.generated)}")
    if s["num_cycles"] != len(cycles):
        fail(where, "num_cycles", f"must be {len(cycles)}")
    stop = "eos" if run.generated and run.generated[-1] in facts.eos_ids else "max_new_tokens"
    if s["stop_reason"] != stop:
        fail(where, "stop_reason", f"must be '{stop}'")
    per_pos = s["per_position_acceptance"]
    if len(per_pos) != facts.k or not all(is_num(p) and 0 <= p <= 1 for p in per_pos):
        fail(where, "per_position_acceptance", f"K = {facts.k} rates in [0, 1]")
    m = trace_acceptance(cycles, facts.k)
    for name in ("acceptance_rate", "mean_acceptance_length"):
        if not close(s[name], m[name]):
            fail(where, name, f"disagrees with the cycles: {m[name]:.6g}")
    if not all(close(a, b) for a, b in zip(per_pos, m["per_position_acceptance"])):
        fail(where, "per_position_acceptance", "disagrees with the cycles")
    if s["wall_time_s"] < 0:
        fail(where, "wall_time_s", "a time cannot be negative")
    rate = len(run.generated) / s["wall_time_s"] if s["wall_time_s"] > 0 else 0.0
    if not math.isclose(s["tokens_per_s"], rate, rel_tol=1e-6, abs_tol=1e-9):
        fail(where, "tokens_per_s", f"must be num_generated / wall_time_s = {rate:.6g}")


def check_trace(header: dict, cycles: list[dict], summary: dict | None, header_line: int,
                cycle_lines: list[int], summary_line: int | None) -> None:
    """Raise BrokenInvariant on the first invariant the trace breaks (fields already type-checked)."""
    facts = check_header(header, f"line {header_line} (header)")
    start = len(facts.prompt_ids) - 1  # prefill caches every prompt token but the last
    run = Progress([], CacheChain(start, start))
    texts: dict[int, str] = {}
    check_text_map(texts, facts.prompt_ids, header["prompt_token_texts"], f"line {header_line} (header)", "prompt_token_texts")
    check_one = check_cycle
    if facts.tree is not None:
        from engine.trace.tree_checks import check_tree_cycle
        check_one = check_tree_cycle
    for c, line in zip(cycles, cycle_lines):
        check_one(c, facts, run, texts, f"line {line} (cycle {c['cycle']})")
    if summary is not None:
        check_summary(summary, cycles, facts, run, f"line {summary_line} (summary)")


def check_records(header: dict, cycles: list[dict], summary: dict | None) -> None:
    """check_trace for records already in memory, numbered as a file would number them."""
    check_trace(header, cycles, summary, 1, list(range(2, 2 + len(cycles))), len(cycles) + 2)
