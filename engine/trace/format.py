"""The trace format: one JSON object per line.

Line 1 is the header, then one record per cycle, appended as each cycle ends (a killed
run keeps the cycles it finished), then a summary. A file without its summary is
incomplete and is never reported as a finished run.
"""
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import IO, NotRequired, TypedDict, Union, get_args, get_origin, get_type_hints, is_typeddict

from engine.trace.checks import BrokenInvariant, check_trace
from engine.trace.layout_checks import LayoutFieldError, check_layout_cycle, check_layout_header
from engine.trace.metrics import drafted, trace_acceptance  # noqa: F401 - drafted is read from here too
from engine.trace.schema import DRAFT_MODEL, DRAFTER_KINDS, EAGLE, FORMAT, MAX_TREE_NODES, VERSION

MAX_TRACE_BYTES = 256 * 2**20  # 4096 tokens at K=32 with top-100 lists stay well below this
# A chain record nests 4 deep; a tree record 6 (cycle > tree > compaction > target > moves > one move).
# The rest is room for layout and drafter fields.
MAX_DEPTH = 16
PARTIAL_SUFFIX = ".partial"  # the file a run streams into until it finishes


class TraceError(ValueError):
    """A trace file that cannot be read; the message says where and what is wrong."""


@dataclass
class Trace:
    header: dict
    cycles: list[dict]
    summary: dict | None

    @property
    def complete(self) -> bool:
        return self.summary is not None

    @property
    def k(self) -> int:
        return self.header["settings"]["k"]

    @property
    def drafter_kind(self) -> str:
        """One of schema.DRAFTER_KINDS; traces written before drafters had a name (no header
        "drafter" entry) all came from a draft model."""
        return drafter_kind(self.header)

    @property
    def is_tree(self) -> bool:
        """Whether the run drafted trees: its cycles are TreeCycleRecords, not CycleRecords."""
        return is_tree_trace(self.header)


def drafter_kind(header: dict) -> str:
    return header.get("drafter", {}).get("kind", DRAFT_MODEL)


def is_tree_trace(header: dict) -> bool:
    """A trace is a tree trace iff its header's settings has "tree" (TreeSpec.describe())."""
    return "tree" in header.get("settings", {})


# Field name -> allowed JSON types. `None` in the tuple marks a nullable field.
NUM = (int, float)
HEADER_FIELDS = {
    "type": (str,), "format": (str,), "version": (int,), "target": (dict,), "draft": (dict,),
    "settings": (dict,), "prompt": (str,), "prompt_token_ids": (list,), "prompt_token_texts": (list,),
    "cache_convention": (dict,), "device": (str,), "dtype": (str,), "versions": (dict,),
    "eos_token_ids": (list,),
}
SETTINGS_FIELDS = {"k": (int,), "temperature": NUM, "top_k": (int,), "top_p": NUM,
                   "seed": (int,), "max_new_tokens": (int,), "trace_top_k": (int,)}
class CacheLengths(TypedDict):
    before: int  # positions cached when the cycle starts (committed length - 1)
    after_append: int  # after drafting (draft) or verifying (target): provisional entries included
    after_rollback: int  # after the rollback (and a draft's catch-up)


class CycleRecord(TypedDict):
    """One cycle of a trace: the names are written here once; the loader's table is derived from them.

    Built by engine.cycle.record.cycle_record for both the reference and the fast path (the
    fields from draft_token_texts on are the `record=True` part, describe_cycle). n below is
    the number of proposals: K for a draft model, 0..K for prompt lookup and the other-tokenizer draft.
    """

    type: str  # "cycle"
    cycle: int
    committed_len_before: int
    draft_token_ids: list  # (n,) in the target's vocabulary
    draft_token_texts: list  # (n,)
    p_draft: list  # (n,) the drafter's probability of each proposed token (1.0 for a deterministic drafter)
    p_target: list  # (n,)
    accept_prob: list  # (n,) min(1, p_target / p_draft)
    u: list  # the uniform draws, up to the first rejection
    beta: list  # (n,) sum_x min(p_target, p_draft) at each position
    num_accepted: int
    rejected_position: int | None  # 1-based; None when all n passed
    resampled_token_id: int | None
    bonus_token_id: int | None
    next_token_text: str
    residual_top: list | None
    target_top: list  # (n+1,) top entries of the target's distributions
    draft_top: list  # (n,)
    committed_token_ids: list
    committed_token_texts: list
    finished: bool
    target_cache_len: CacheLengths
    draft_cache_len: CacheLengths | None  # None when the drafter keeps no cache over the target's positions
    draft_catch_up: bool
    verify_positions: int  # n + 1
    draft_time_s: float
    draft_step_times_s: list
    verify_time_s: float
    catch_up_time_s: float
    cycle_time_s: float
    drafter_state: NotRequired[dict]  # prompt lookup / other tokenizer: the match or the token mapping


# ---------------------------------------------------------------- tree cycles (draft trees, engine/tree/)

class TreeNode(TypedDict):
    """One drafted node. Nodes are numbered parents first, level by level, siblings in the order
    the walk tries them (the draft's most likely first)."""

    token_id: int
    text: str
    parent: int  # schema.ROOT (-1) for a child of the root (the last committed token), else an earlier node
    depth: int  # 1 for a child of the root
    q: float  # the draft's probability of the token at its parent
    score: float  # sum of log q from the root down to this node
    p: float  # the target's warped probability of the token at its parent, unmodified


class TreeTry(TypedDict):
    """One child the acceptance walk tried, in the order tried."""

    node: int
    p_residual: float  # the residual's probability of the node's token when it was tried
    u: float  # the uniform draw; accepted iff u < p_residual
    accepted: bool


class SlotCompaction(TypedDict):
    """One cache's rollback after a tree: the slots kept from `before` (= L) on, and the moves."""

    kept_slots: list  # [L] + [L+1+p for p in path], cut to len(committed) entries
    moves: list  # [[from, to]] for the kept slots that change place


class TreeCompaction(TypedDict):
    target: SlotCompaction
    draft: SlotCompaction | None  # None when the drafter keeps no cache over the target's positions


class DraftTreeRecord(TypedDict):
    """A tree cycle's `tree`: what was drafted, how the walk went, and how the caches were compacted."""

    nodes: list  # (N,) TreeNode
    tried: list  # TreeTry, in the order tried
    path: list  # the accepted nodes, from a child of the root down
    next_token_id: int
    next_token_kind: str  # schema.NEXT_BONUS or NEXT_RESIDUAL
    residual_top: list | None  # top entries of the residual the next token came from; None for a bonus
    target_top: list  # (N+1,) top entries of the target's distributions: after the root, then after each node
    draft_forwards: int  # batched draft forwards this cycle
    compaction: TreeCompaction


class TreeCycleRecord(TypedDict):
    """One cycle of a tree trace: the fields a chain record shares (same meaning), and `tree`.

    The chain's per-position fields (CHAIN_ONLY_FIELDS) are absent: the walk over the tree
    replaces them. Written by engine/tree/cycle.py; docs/trace-format.md ("Tree cycle record")
    says what each field means and what the loader checks.
    """

    type: str  # "cycle"
    cycle: int
    committed_len_before: int
    num_accepted: int  # len(tree.path)
    next_token_text: str
    committed_token_ids: list
    committed_token_texts: list
    finished: bool
    target_cache_len: CacheLengths  # after_append = before + N + 1
    draft_cache_len: CacheLengths | None
    draft_catch_up: bool
    verify_positions: int  # N + 1: the root and every node, in one target forward
    draft_time_s: float
    draft_step_times_s: list  # one per batched draft forward
    verify_time_s: float
    catch_up_time_s: float
    cycle_time_s: float
    tree: DraftTreeRecord


def _allowed(annotation) -> tuple:
    """A field's annotation as the loader's tuple of JSON types (None marks nullable)."""
    if annotation is type(None):
        return (None,)
    if get_origin(annotation) in (Union, UnionType):
        return tuple(t for arg in get_args(annotation) for t in _allowed(arg))
    if annotation is float:
        return NUM  # JSON has one number type: an integer-valued time is still a number
    if is_typeddict(annotation):
        return (dict,)
    return (annotation,)


def fields_of(record_type) -> dict:
    """Field name -> allowed JSON types, for the required fields of a TypedDict."""
    hints = get_type_hints(record_type)  # in declaration order
    return {name: _allowed(hint) for name, hint in hints.items() if name in record_type.__required_keys__}


CYCLE_FIELDS = fields_of(CycleRecord)
CACHE_LEN_FIELDS = fields_of(CacheLengths)
TREE_CYCLE_FIELDS = fields_of(TreeCycleRecord)
TREE_FIELDS = fields_of(DraftTreeRecord)
TREE_NODE_FIELDS = fields_of(TreeNode)
TREE_TRY_FIELDS = fields_of(TreeTry)
TREE_COMPACTION_FIELDS = fields_of(TreeCompaction)
SLOT_COMPACTION_FIELDS = fields_of(SlotCompaction)
# A chain record's per-position fields; a tree record must not carry them.
CHAIN_ONLY_FIELDS = tuple(name for name in CYCLE_FIELDS if name not in TREE_CYCLE_FIELDS)

SUMMARY_FIELDS = {
    "type": (str,), "generated_token_ids": (list,), "generated_text": (str,),
    "acceptance_rate": NUM, "mean_acceptance_length": NUM, "per_position_acceptance": (list,),
    "num_cycles": (int,), "num_generated": (int,), "stop_reason": (str,),
    "wall_time_s": NUM, "tokens_per_s": NUM,
}


def model_name(header: dict, role: str) -> str:
    """The name a trace gives its "target" or "draft" model; a placeholder when it gives none."""
    entry = header.get(role)
    name = entry.get("name") if isinstance(entry, dict) else None
    return name if isinstance(name, str) and name else f"unnamed {role} model"


def _type_ok(value, allowed: tuple) -> bool:
    if value is None:
        return None in allowed
    if isinstance(value, bool):  # JSON true/false must not pass as a number
        return bool in allowed
    return isinstance(value, tuple(t for t in allowed if t is not None))


def _check_fields(record: dict, fields: dict, where: str, prefix: str = "") -> None:
    """`prefix` names a nested object's place ("tree.nodes[3].") in the messages."""
    for name, allowed in fields.items():
        if name not in record:
            raise TraceError(f"{where}: missing field '{prefix}{name}'")
        if not _type_ok(record[name], allowed):
            names = "/".join("null" if t is None else t.__name__ for t in allowed)
            raise TraceError(f"{where}: field '{prefix}{name}' should be {names}, got {record[name]!r:.60}")


def _check_header(h: dict, where: str) -> None:
    if h.get("format") != FORMAT:
        raise TraceError(f"{where}: not a {FORMAT} file (format is {h.get('format')!r})")
    if h.get("version") != VERSION:
        raise TraceError(f"{where}: trace version {h.get('version')!r} is not supported (this engine reads version {VERSION})")
    _check_fields(h, HEADER_FIELDS, where)
    _check_fields(h["settings"], SETTINGS_FIELDS, f"{where} settings")
    if "drafter" in h:  # optional: absent in traces written before there were several drafters
        if not isinstance(h["drafter"], dict) or h["drafter"].get("kind") not in DRAFTER_KINDS:
            raise TraceError(f"{where}: field 'drafter' must be an object whose 'kind' is one of {', '.join(DRAFTER_KINDS)}")
    try:
        check_layout_header(h)
    except LayoutFieldError as err:
        raise TraceError(layout_message(err, where)) from None
    if is_tree_trace(h):
        _check_tree_settings(h["settings"]["tree"], where)


def _check_tree_settings(entry, where: str) -> None:
    """settings.tree must read back as a TreeSpec (engine/config.py's own range checks)."""
    # Imported here: engine.config imports engine.trace.schema, which loads this package first.
    from engine.config import SettingsError, tree_from_header
    try:
        tree_from_header(entry)
    except SettingsError as err:
        raise TraceError(f"{where}: field 'settings.tree': {err}") from None


def layout_message(err: LayoutFieldError, where: str) -> str:
    """A layout refusal in the loader's form: where, then the field, then the rule."""
    text = str(err)
    name = text.split(":", 1)[0].split(" ", 1)[0]
    rule = text[len(name):].removeprefix(":").strip()
    return f"{where}: field '{name}': {rule}"


def _check_cycle(c: dict, k: int, index: int, where: str, kind: str = DRAFT_MODEL) -> None:
    """`kind` is the header's drafter: a draft model proposes exactly K tokens every cycle;
    prompt lookup and the other-tokenizer draft may propose fewer, or none."""
    _check_fields(c, CYCLE_FIELDS, where)
    if "tree" in c:
        raise TraceError(f"{where}: field 'tree': a chain trace's cycle holds no tree "
                         "(its header's settings has no 'tree')")
    _check_shared_fields(c, index, where, kind)
    # Lengths, ranges and how the fields agree: engine/trace/checks.py, after every record is read.


def _check_shared_fields(c: dict, index: int, where: str, kind: str) -> None:
    """What chain and tree records share: the cache lengths, the drafter's state, the cycle number."""
    _check_fields(c["target_cache_len"], CACHE_LEN_FIELDS, f"{where} target_cache_len")
    if c["draft_cache_len"] is not None:
        _check_fields(c["draft_cache_len"], CACHE_LEN_FIELDS, f"{where} draft_cache_len")
    elif kind in (DRAFT_MODEL, EAGLE):
        raise TraceError(f"{where}: field 'draft_cache_len' is null, "
                         f"but the {kind} drafter keeps a cache over the target's positions")
    if "drafter_state" in c and not isinstance(c["drafter_state"], dict):
        raise TraceError(f"{where}: field 'drafter_state' should be an object")
    if c["cycle"] != index:
        raise TraceError(f"{where}: field 'cycle': cycle number {c['cycle']} where {index} was expected "
                         "(cycles are numbered from 0, in order, none missing)")


def _check_tree_cycle(c: dict, index: int, where: str, kind: str) -> None:
    """A tree trace's cycle: the shared fields, no chain field, and the types inside `tree`,
    each list held to its size limit before its entries are read."""
    _check_fields(c, TREE_CYCLE_FIELDS, where)
    for name in CHAIN_ONLY_FIELDS:
        if name in c:
            raise TraceError(f"{where}: field '{name}': a tree cycle has no chain field "
                             "(the walk over the tree is recorded in 'tree')")
    _check_shared_fields(c, index, where, kind)
    tree = c["tree"]
    _check_fields(tree, TREE_FIELDS, where, "tree.")
    n = len(tree["nodes"])
    if not 1 <= n <= MAX_TREE_NODES:
        raise TraceError(f"{where}: field 'tree.nodes': a tree holds 1..{MAX_TREE_NODES} nodes, got {n}")
    _check_entries(tree["nodes"], TREE_NODE_FIELDS, n, where, "tree.nodes")
    _check_entries(tree["tried"], TREE_TRY_FIELDS, n, where, "tree.tried")
    for name, limit in (("path", n), ("target_top", n + 1)):
        if len(tree[name]) > limit:
            raise TraceError(f"{where}: field 'tree.{name}': at most {limit} entries for {n} nodes, "
                             f"got {len(tree[name])}")
    compaction = tree["compaction"]
    _check_fields(compaction, TREE_COMPACTION_FIELDS, where, "tree.compaction.")
    for model in ("target", "draft"):
        if compaction[model] is not None:
            _check_fields(compaction[model], SLOT_COMPACTION_FIELDS, where, f"tree.compaction.{model}.")
            for name in SLOT_COMPACTION_FIELDS:
                if len(compaction[model][name]) > n + 1:
                    raise TraceError(f"{where}: field 'tree.compaction.{model}.{name}': at most {n + 1} "
                                     f"entries (the root and {n} nodes)")


def _check_entries(entries: list, fields: dict, limit: int, where: str, name: str) -> None:
    """A list of objects of one TypedDict, at most `limit` of them."""
    if len(entries) > limit:
        raise TraceError(f"{where}: field '{name}': at most {limit} entries, got {len(entries)}")
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise TraceError(f"{where}: field '{name}[{i}]' should be an object, got {e!r:.60}")
        _check_fields(e, fields, where, f"{name}[{i}].")


class _Refused(ValueError):
    """Valid JSON that a trace may still not hold (the message says what)."""


def _reject_constant(name: str):
    raise _Refused(f"{name} is not a number a trace may hold")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:40]} is too large to be a finite number")
    return value


def _too_deep(value) -> bool:
    """Whether containers nest deeper than MAX_DEPTH (the record itself is level 1).

    json.loads itself stops at the interpreter's recursion limit (a RecursionError, caught
    below); this walk, without recursion, holds records to a much smaller limit.
    """
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        children = v.values() if isinstance(v, dict) else v
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def split_records(text: str) -> list[str]:
    """Lines as the writer ends them: on '\\n' only. U+2028, U+2029, U+0085 and the like are
    legal inside a JSON string and stay in their token text; a UTF-8 BOM is skipped."""
    return text.removeprefix("\ufeff").split("\n")


def _parse_line(line: str) -> object:
    try:
        value = json.loads(line, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise _Refused(f"the record nests more than {MAX_DEPTH} levels deep") from None
    if isinstance(value, (dict, list)) and _too_deep(value):
        raise _Refused(f"the record nests more than {MAX_DEPTH} levels deep")
    return value


def parse_trace(lines: list[str], source: str = "trace", allow_incomplete: bool = False) -> Trace:
    """Validate and parse trace lines; raise TraceError naming the line and field at fault."""
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = _parse_line(line)
        except ValueError as err:
            last = number == len(lines) or not any(rest.strip() for rest in lines[number:])
            finished = any(r.get("type") == "summary" for _, r in records)
            if last and allow_incomplete and not finished:
                break  # a run killed mid-write: keep the cycles before it
            if isinstance(err, _Refused):
                raise TraceError(f"{source} line {number}: {err}") from None
            truncated = " - the file looks truncated" if last else ""
            raise TraceError(f"{source} line {number}: not valid JSON ({err}){truncated}") from None
        if not isinstance(rec, dict):
            raise TraceError(f"{source} line {number}: expected a JSON object")
        records.append((number, rec))
    if not records:
        raise TraceError(f"{source}: the file is empty")
    (n0, header), rest = records[0], records[1:]
    if header.get("type") != "header":
        raise TraceError(f"{source} line {n0}: the first record must be the header")
    _check_header(header, f"{source} line {n0}")
    k = header["settings"]["k"]
    kind = drafter_kind(header)
    tree = is_tree_trace(header)
    cycles, summary = [], None
    cycle_lines, summary_line = [], None
    for number, rec in rest:
        where = f"{source} line {number}"
        if summary is not None:
            raise TraceError(f"{where}: a record after the summary")
        if rec.get("type") == "cycle":
            if tree:
                _check_tree_cycle(rec, len(cycles), where, kind)
            else:
                _check_cycle(rec, k, len(cycles), where, kind)
            try:
                check_layout_cycle(header, rec)
            except LayoutFieldError as err:
                raise TraceError(layout_message(err, where)) from None
            cycles.append(rec)
            cycle_lines.append(number)
        elif rec.get("type") == "summary":
            _check_fields(rec, SUMMARY_FIELDS, where)
            summary, summary_line = rec, number
        else:
            raise TraceError(f"{where}: unknown record type {rec.get('type')!r}")
    if summary is None and not allow_incomplete:
        raise TraceError(f"{source}: no summary after {len(cycles)} cycles - the run did not finish (the file is incomplete)")
    try:
        check_trace(header, cycles, summary, n0, cycle_lines, summary_line)
    except BrokenInvariant as err:
        raise TraceError(f"{source} {err}") from None
    return Trace(header, cycles, summary)


def _too_big(size: int, source: str, max_bytes: int) -> None:
    if size > max_bytes:
        raise TraceError(f"{source}: {size / 2**20:.1f} MiB is larger than the {max_bytes / 2**20:.0f} MiB "
                         "a trace may have")


def load_trace(path: str | Path, allow_incomplete: bool = False, source: str | None = None,
               max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """Read and check a trace file. `source` names it in messages (default: the path as given)."""
    path = Path(path)
    source = source or str(path)
    if not path.is_file():
        raise TraceError(f"trace file not found: {source}")
    _too_big(path.stat().st_size, source, max_bytes)
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)
    return loads_trace(data, source, allow_incomplete, max_bytes)


def loads_trace(data: bytes | str, source: str = "upload", allow_incomplete: bool = False,
                max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    _too_big(len(data), source, max_bytes)
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise TraceError(f"{source}: not UTF-8 text ({err})") from None
    return parse_trace(split_records(data), source, allow_incomplete)


def partial_path(path: str | Path) -> Path:
    """Where a run streams its trace until it finishes: `out.jsonl.partial` beside `out.jsonl`."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


class TraceWriter:
    """Streams records into `<path>.partial`, flushing each so a killed run keeps its cycles, and
    renames it to `path` only when the run ends without an error: a failed run never
    destroys an earlier trace at `path`.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file: IO[str] = self.partial.open("w", encoding="utf-8", newline="\n")

    def write(self, record: dict) -> None:
        # ensure_ascii=False keeps token texts readable; the reader splits on '\n' only, so
        # U+2028 and friends inside a string round-trip.
        self.file.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()

    def finish(self) -> None:
        self.file.close()
        os.replace(self.partial, self.path)

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.close()  # the partial file keeps the finished cycles under its own name


def make_summary(cycles: list[dict], k: int, generated_text: str, stop_reason: str,
                 wall_time_s: float) -> dict:
    """The closing record, for chain and tree cycles alike (a tree's k is its max depth;
    metrics.trace_acceptance says what the numbers mean for a tree)."""
    generated = [t for c in cycles for t in c["committed_token_ids"]]
    return {
        "type": "summary", "generated_token_ids": generated, "generated_text": generated_text,
        **trace_acceptance(cycles, k),
        "num_generated": len(generated), "stop_reason": stop_reason, "wall_time_s": wall_time_s,
        "tokens_per_s": len(generated) / wall_time_s if wall_time_s > 0 else 0.0,
    }
