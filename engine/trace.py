"""The trace format: one JSON object per line.

Line 1 is the header, then one record per cycle, appended as each cycle ends (a killed
run keeps the cycles it finished), then a summary. A file without its summary is
incomplete and is never reported as a finished run.
"""
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import IO, NotRequired, TypedDict, Union, get_args, get_origin, get_type_hints, is_typeddict

from .layout_stats import LayoutFieldError, check_layout_cycle, check_layout_header
from .metrics import acceptance_metrics

DRAFTER_KINDS = ("model", "prompt-lookup", "other-tokenizer")  # engine.drafters names the same three

FORMAT = "speclab-trace"
VERSION = 1


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
        """"model", "prompt-lookup" or "other-tokenizer"; traces written before drafters had a
        name (no header "drafter" entry) all came from a draft model."""
        return drafter_kind(self.header)


def drafter_kind(header: dict) -> str:
    return header.get("drafter", {}).get("kind", "model")


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

    Written by engine.speculative.run_cycle (the fields from draft_token_texts on are the
    `record=True` part, describe_cycle). n below is the number of proposals: K for a draft
    model, 0..K for prompt lookup and the other-tokenizer draft.
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

SUMMARY_FIELDS = {
    "type": (str,), "generated_token_ids": (list,), "generated_text": (str,),
    "acceptance_rate": NUM, "mean_acceptance_length": NUM, "per_position_acceptance": (list,),
    "num_cycles": (int,), "num_generated": (int,), "stop_reason": (str,),
    "wall_time_s": NUM, "tokens_per_s": NUM,
}


def _type_ok(value, allowed: tuple) -> bool:
    if value is None:
        return None in allowed
    if isinstance(value, bool):  # JSON true/false must not pass as a number
        return bool in allowed
    return isinstance(value, tuple(t for t in allowed if t is not None))


def _check_fields(record: dict, fields: dict, where: str) -> None:
    for name, allowed in fields.items():
        if name not in record:
            raise TraceError(f"{where}: missing field '{name}'")
        if not _type_ok(record[name], allowed):
            names = "/".join("null" if t is None else t.__name__ for t in allowed)
            raise TraceError(f"{where}: field '{name}' should be {names}, got {record[name]!r:.60}")


def _check_header(h: dict, where: str) -> None:
    if h.get("format") != FORMAT:
        raise TraceError(f"{where}: not a {FORMAT} file (format is {h.get('format')!r})")
    if h.get("version") != VERSION:
        raise TraceError(f"{where}: trace version {h.get('version')!r} is not supported (this engine reads version {VERSION})")
    _check_fields(h, HEADER_FIELDS, where)
    _check_fields(h["settings"], SETTINGS_FIELDS, f"{where} settings")
    if h["settings"]["k"] < 1:
        raise TraceError(f"{where}: settings.k must be at least 1")
    if "drafter" in h:  # optional: absent in traces written before there were several drafters
        if not isinstance(h["drafter"], dict) or h["drafter"].get("kind") not in DRAFTER_KINDS:
            raise TraceError(f"{where}: header 'drafter' must be an object whose 'kind' is one of {', '.join(DRAFTER_KINDS)}")
    try:
        check_layout_header(h)
    except LayoutFieldError as err:
        raise TraceError(f"{where}: {err}") from None


def _check_cycle(c: dict, k: int, index: int, where: str, kind: str = "model") -> None:
    """`kind` is the header's drafter: a draft model proposes exactly K tokens every cycle;
    prompt lookup and the other-tokenizer draft may propose fewer, or none."""
    _check_fields(c, CYCLE_FIELDS, where)
    _check_fields(c["target_cache_len"], CACHE_LEN_FIELDS, f"{where} target_cache_len")
    if c["draft_cache_len"] is not None:
        _check_fields(c["draft_cache_len"], CACHE_LEN_FIELDS, f"{where} draft_cache_len")
    elif kind == "model":
        raise TraceError(f"{where}: field 'draft_cache_len' is null, but a draft model keeps a cache")
    if "drafter_state" in c and not isinstance(c["drafter_state"], dict):
        raise TraceError(f"{where}: field 'drafter_state' should be an object")
    if c["cycle"] != index:
        raise TraceError(f"{where}: cycle number {c['cycle']} where {index} was expected")
    proposed = len(c["draft_token_ids"])
    if kind == "model" and proposed != k:
        raise TraceError(f"{where}: field 'draft_token_ids' has {proposed} entries, expected {k} (K={k})")
    if proposed > k:
        raise TraceError(f"{where}: {proposed} draft tokens, more than K={k}")
    lengths = {"draft_token_texts": proposed, "p_draft": proposed, "p_target": proposed,
               "accept_prob": proposed, "beta": proposed, "draft_top": proposed, "target_top": proposed + 1}
    for name, n in lengths.items():
        if len(c[name]) != n:
            raise TraceError(f"{where}: field '{name}' has {len(c[name])} entries, expected {n} (K={k})")
    n_acc = c["num_accepted"]
    if not 0 <= n_acc <= proposed:
        raise TraceError(f"{where}: num_accepted {n_acc} outside 0..{proposed}")
    if len(c["u"]) != min(n_acc + 1, proposed):
        raise TraceError(f"{where}: {len(c['u'])} draws u for {n_acc} accepted of {proposed} proposed (K={k})")
    if (c["rejected_position"] is None) != (n_acc == proposed) or (c["bonus_token_id"] is None) == (c["resampled_token_id"] is None):
        raise TraceError(f"{where}: rejected_position, resampled_token_id and bonus_token_id disagree with num_accepted")
    if len(c["committed_token_texts"]) != len(c["committed_token_ids"]):
        raise TraceError(f"{where}: committed_token_texts and committed_token_ids differ in length")


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed in a trace")


def parse_trace(lines: list[str], source: str = "trace", allow_incomplete: bool = False) -> Trace:
    """Validate and parse trace lines; raise TraceError naming the line and field at fault."""
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line, parse_constant=_reject_constant)
        except ValueError as err:
            last = number == len(lines) or not any(l.strip() for l in lines[number:])
            if last and allow_incomplete:
                break  # a run killed mid-write: keep the cycles before it
            raise TraceError(f"{source} line {number}: not valid JSON ({err})" + (" - the file looks truncated" if last else "")) from None
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
    cycles, summary = [], None
    for number, rec in rest:
        where = f"{source} line {number}"
        if summary is not None:
            raise TraceError(f"{where}: a record after the summary")
        if rec.get("type") == "cycle":
            _check_cycle(rec, k, len(cycles), where, kind)
            try:
                check_layout_cycle(header, rec)
            except LayoutFieldError as err:
                raise TraceError(f"{where}: {err}") from None
            cycles.append(rec)
        elif rec.get("type") == "summary":
            _check_fields(rec, SUMMARY_FIELDS, where)
            summary = rec
        else:
            raise TraceError(f"{where}: unknown record type {rec.get('type')!r}")
    if summary is None and not allow_incomplete:
        raise TraceError(f"{source}: no summary after {len(cycles)} cycles - the run did not finish (the file is incomplete)")
    return Trace(header, cycles, summary)


def load_trace(path: str | Path, allow_incomplete: bool = False) -> Trace:
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not UTF-8 text ({err})") from None
    return parse_trace(text.splitlines(), str(path), allow_incomplete)


def loads_trace(data: bytes | str, source: str = "upload", allow_incomplete: bool = False) -> Trace:
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise TraceError(f"{source}: not UTF-8 text ({err})") from None
    return parse_trace(data.splitlines(), source, allow_incomplete)


class TraceWriter:
    """Appends records to a trace file, flushing each so a killed run keeps its cycles."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file: IO[str] = self.path.open("w", encoding="utf-8")

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_summary(cycles: list[dict], k: int, generated_text: str, stop_reason: str,
                 wall_time_s: float) -> dict:
    generated = [t for c in cycles for t in c["committed_token_ids"]]
    return {
        "type": "summary", "generated_token_ids": generated, "generated_text": generated_text,
        **acceptance_metrics([c["num_accepted"] for c in cycles], k, [len(c["draft_token_ids"]) for c in cycles]),
        "num_generated": len(generated), "stop_reason": stop_reason, "wall_time_s": wall_time_s,
        "tokens_per_s": len(generated) / wall_time_s if wall_time_s > 0 else 0.0,
    }


def library_versions() -> dict:
    import torch
    import transformers
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}
