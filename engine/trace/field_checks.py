"""The loader's first pass over each record: every field is there with the right JSON type,
lists inside a tree record are held to their size limits before their entries are read, and
the header's format, version, drafter, layout and tree settings are ones this engine reads.
Each refusal is a TraceError naming the line and the field. What the numbers must mean comes
after, in checks.py.
"""
from engine.config import SettingsError, tree_from_header
from engine.trace.errors import TraceError
from engine.trace.layout_checks import LayoutFieldError, check_layout_header
from engine.trace.record_types import (
    CACHE_LEN_FIELDS,
    CHAIN_ONLY_FIELDS,
    CYCLE_FIELDS,
    HEADER_FIELDS,
    SETTINGS_FIELDS,
    SLOT_COMPACTION_FIELDS,
    TREE_COMPACTION_FIELDS,
    TREE_CYCLE_FIELDS,
    TREE_FIELDS,
    TREE_NODE_FIELDS,
    TREE_TRY_FIELDS,
    is_tree_trace,
)
from engine.trace.schema import DRAFT_MODEL, DRAFTER_KINDS, FEATURE_HEADS, FORMAT, MAX_TREE_NODES, VERSION


def _type_ok(value, allowed: tuple) -> bool:
    if value is None:
        return None in allowed
    if isinstance(value, bool):  # JSON true/false must not pass as a number
        return bool in allowed
    return isinstance(value, tuple(t for t in allowed if t is not None))


def check_fields(record: dict, fields: dict, where: str, prefix: str = "") -> None:
    """`prefix` names a nested object's place ("tree.nodes[3].") in the messages."""
    for name, allowed in fields.items():
        if name not in record:
            raise TraceError(f"{where}: missing field '{prefix}{name}'")
        if not _type_ok(record[name], allowed):
            names = "/".join("null" if t is None else t.__name__ for t in allowed)
            raise TraceError(f"{where}: field '{prefix}{name}' should be {names}, got {record[name]!r:.60}")


def check_header_fields(h: dict, where: str) -> None:
    if h.get("format") != FORMAT:
        raise TraceError(f"{where}: not a {FORMAT} file (format is {h.get('format')!r})")
    if h.get("version") != VERSION:
        raise TraceError(f"{where}: trace version {h.get('version')!r} is not supported (this engine reads version {VERSION})")
    check_fields(h, HEADER_FIELDS, where)
    check_fields(h["settings"], SETTINGS_FIELDS, f"{where} settings")
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


def check_cycle_fields(c: dict, k: int, index: int, where: str, kind: str = DRAFT_MODEL,
                       captured: bool = False) -> None:
    """`kind` is the header's drafter: a draft model proposes exactly K tokens every cycle;
    prompt lookup and the other-tokenizer draft may propose fewer, or none. `captured`: a live vLLM's
    cycles (schema.VLLM_CONVENTION), whose draft model's own paged cache the capture does not read."""
    check_fields(c, CYCLE_FIELDS, where)
    if "tree" in c:
        raise TraceError(f"{where}: field 'tree': a chain trace's cycle holds no tree "
                         "(its header's settings has no 'tree')")
    _check_shared_fields(c, index, where, kind, captured)


def _check_shared_fields(c: dict, index: int, where: str, kind: str, captured: bool = False) -> None:
    """What chain and tree records share: the cache lengths, the drafter's state, the cycle number."""
    check_fields(c["target_cache_len"], CACHE_LEN_FIELDS, f"{where} target_cache_len")
    if c["draft_cache_len"] is not None:
        check_fields(c["draft_cache_len"], CACHE_LEN_FIELDS, f"{where} draft_cache_len")
    elif (kind == DRAFT_MODEL or kind in FEATURE_HEADS) and not captured:
        raise TraceError(f"{where}: field 'draft_cache_len' is null, "
                         f"but the {kind} drafter keeps a cache over the target's positions")
    if "drafter_state" in c and not isinstance(c["drafter_state"], dict):
        raise TraceError(f"{where}: field 'drafter_state' should be an object")
    if c["cycle"] != index:
        raise TraceError(f"{where}: field 'cycle': cycle number {c['cycle']} where {index} was expected "
                         "(cycles are numbered from 0, in order, none missing)")


def check_tree_cycle_fields(c: dict, index: int, where: str, kind: str) -> None:
    """A tree trace's cycle: the shared fields, no chain field, and the types inside `tree`,
    each list held to its size limit before its entries are read."""
    check_fields(c, TREE_CYCLE_FIELDS, where)
    for name in CHAIN_ONLY_FIELDS:
        if name in c:
            raise TraceError(f"{where}: field '{name}': a tree cycle has no chain field "
                             "(the walk over the tree is recorded in 'tree')")
    _check_shared_fields(c, index, where, kind)
    tree = c["tree"]
    check_fields(tree, TREE_FIELDS, where, "tree.")
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
    check_fields(compaction, TREE_COMPACTION_FIELDS, where, "tree.compaction.")
    for model in ("target", "draft"):
        if compaction[model] is not None:
            check_fields(compaction[model], SLOT_COMPACTION_FIELDS, where, f"tree.compaction.{model}.")
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
        check_fields(e, fields, where, f"{name}[{i}].")
