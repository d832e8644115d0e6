"""Settings of one speculative run, range-checked in one place."""
from dataclasses import asdict, dataclass

from engine.trace.schema import (
    CAPTURE_MODES,
    DYNAMIC_TREE,
    LAYOUTS,
    MAX_BLOCK_SIZE,
    MAX_K,
    MAX_NEW_TOKENS,
    MAX_TRACE_TOP_K,
    MAX_TREE_BRANCHING,
    MAX_TREE_DEPTH,
    MAX_TREE_NODES,
    STATIC_TREE,
    TREE_KINDS,
)


class SettingsError(ValueError):
    """A setting outside its allowed range; the message names the setting."""


CAPTURE_AUTO = "auto"  # --capture auto: CUDA graphs on CUDA; on the CPU, what engine/cycle/capture_choice.py measured faster


def check_capture(capture: str | None) -> None:
    if capture is not None and capture not in CAPTURE_MODES:
        raise SettingsError(f"unknown capture mode {capture!r}; choose one of {', '.join(CAPTURE_MODES)}")


EMPTY_PROMPT = "the prompt is empty or only whitespace: give the model some text to continue"


def refuse_empty_prompt(prompt: str | list[int]) -> None:
    """The one check for an empty prompt: text that is nothing but whitespace, or no token ids."""
    if (not prompt.strip()) if isinstance(prompt, str) else len(prompt) == 0:
        raise SettingsError(EMPTY_PROMPT)


@dataclass(frozen=True)
class SpecSettings:
    k: int = 4  # draft tokens proposed per cycle
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0  # 1 disables nucleus filtering
    seed: int = 0
    max_new_tokens: int = 64
    trace_top_k: int = 10  # entries of each distribution kept in the trace for charts
    cache_layout: str = "dynamic"  # KV-cache layout of both models: dynamic, static or paged
    block_size: int = 16  # slots per block of the paged layout

    def __post_init__(self) -> None:
        validate_settings(self)

    def to_dict(self) -> dict:
        return asdict(self)


def _check_int(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise SettingsError(f"{name} must be between {low} and {high}, got {value}")


def validate_settings(s: SpecSettings) -> None:
    _check_int("k", s.k, 1, MAX_K)
    _check_int("top_k", s.top_k, 0, 1_000_000)
    _check_int("seed", s.seed, 0, 2**63 - 1)
    _check_int("max_new_tokens", s.max_new_tokens, 1, MAX_NEW_TOKENS)
    _check_int("trace_top_k", s.trace_top_k, 1, MAX_TRACE_TOP_K)
    _check_int("block_size", s.block_size, 1, MAX_BLOCK_SIZE)
    if s.cache_layout not in LAYOUTS:
        raise SettingsError(f"cache_layout must be one of {', '.join(LAYOUTS)}, got {s.cache_layout!r}")
    if isinstance(s.temperature, bool) or not isinstance(s.temperature, (int, float)):
        raise SettingsError(f"temperature must be a number, got {s.temperature!r}")
    if not 0.0 <= s.temperature <= 100.0 or s.temperature != s.temperature:
        raise SettingsError(f"temperature must be between 0 (greedy) and 100, got {s.temperature}")
    if isinstance(s.top_p, bool) or not isinstance(s.top_p, (int, float)):
        raise SettingsError(f"top_p must be a number, got {s.top_p!r}")
    if not 0.0 < s.top_p <= 1.0:
        raise SettingsError(f"top_p must be in (0, 1], got {s.top_p}")


# ---------------------------------------------------------------- draft trees (engine/tree/)

@dataclass(frozen=True)
class TreeSpec:
    """The shape of the token tree drafted each cycle (the CLI's --tree).

    static: every node at depth d gets `branching[d-1]` children, the draft's top ones (Medusa's
    fixed trees). dynamic: EAGLE-2's rule: at each of `depth` levels the `top_k` best nodes of the
    level (by cumulative draft log-probability) each get their `top_k` best children; at the end
    the `nodes` best of all candidates are kept (a node never scores above its parent, so the kept
    set contains every kept node's ancestors).
    """

    kind: str
    branching: tuple[int, ...] = ()  # static only
    top_k: int = 0  # dynamic only
    depth: int = 0  # dynamic only
    nodes: int = 0  # dynamic only

    def __post_init__(self) -> None:
        validate_tree(self)

    @property
    def max_depth(self) -> int:
        return len(self.branching) if self.kind == STATIC_TREE else self.depth

    @property
    def max_nodes(self) -> int:
        """Draft nodes a cycle can hold (the root not counted)."""
        if self.kind == DYNAMIC_TREE:
            return self.nodes
        total, width = 0, 1
        for b in self.branching:
            width *= b
            total += width
        return total

    def candidates(self) -> int:
        """dynamic: every node the expansion scores before the best `nodes` are kept."""
        return self.top_k + (self.depth - 1) * self.top_k * self.top_k

    def describe(self) -> dict:
        """The header's settings["tree"]."""
        if self.kind == STATIC_TREE:
            return {"kind": self.kind, "branching": list(self.branching)}
        return {"kind": self.kind, "top_k": self.top_k, "depth": self.depth, "nodes": self.nodes}

    def text(self) -> str:
        """The --tree form: static:2,2,1 or dynamic:top_k=4,depth=4,nodes=16."""
        if self.kind == STATIC_TREE:
            return f"static:{','.join(map(str, self.branching))}"
        return f"dynamic:top_k={self.top_k},depth={self.depth},nodes={self.nodes}"


def validate_tree(t: TreeSpec) -> None:
    if t.kind not in TREE_KINDS:
        raise SettingsError(f"tree kind must be one of {', '.join(TREE_KINDS)}, got {t.kind!r}")
    if t.kind == STATIC_TREE:
        if not t.branching or not isinstance(t.branching, tuple):
            raise SettingsError("a static tree needs its branching per depth, e.g. static:3,2,1")
        if len(t.branching) > MAX_TREE_DEPTH:
            raise SettingsError(f"a tree is at most {MAX_TREE_DEPTH} deep, got {len(t.branching)} depths")
        for b in t.branching:
            _check_int("branching", b, 1, MAX_TREE_BRANCHING)
    else:
        _check_int("top_k", t.top_k, 1, MAX_TREE_BRANCHING)
        _check_int("depth", t.depth, 1, MAX_TREE_DEPTH)
        _check_int("nodes", t.nodes, 1, MAX_TREE_NODES)
        if t.nodes > t.candidates():
            raise SettingsError(f"nodes={t.nodes} is more than the {t.candidates()} candidates "
                                f"top_k={t.top_k} over depth={t.depth} produces")
    if t.max_nodes > MAX_TREE_NODES:
        raise SettingsError(f"the tree has {t.max_nodes} nodes; at most {MAX_TREE_NODES} are allowed")


def parse_tree(text: str) -> TreeSpec:
    """--tree static:B1,B2,... or dynamic:top_k=K,depth=D,nodes=N, with a clear error otherwise."""
    kind, sep, rest = text.strip().partition(":")
    if not sep or kind not in TREE_KINDS:
        raise SettingsError(f"--tree must look like static:3,2,1 or dynamic:top_k=4,depth=4,nodes=16; got {text!r}")
    if kind == STATIC_TREE:
        try:
            branching = tuple(int(b) for b in rest.split(","))
        except ValueError:
            raise SettingsError(f"a static tree's branching is comma-separated integers, got {rest!r}") from None
        return TreeSpec(kind, branching=branching)
    fields = {}
    for part in rest.split(","):
        name, eq, value = part.partition("=")
        if not eq or name.strip() not in ("top_k", "depth", "nodes") or not value.strip().lstrip("-").isdigit():
            raise SettingsError(f"a dynamic tree takes top_k=, depth= and nodes= integers; got {part!r}")
        fields[name.strip()] = int(value)
    missing = {"top_k", "depth", "nodes"} - set(fields)
    if missing:
        raise SettingsError(f"a dynamic tree needs {', '.join(sorted(missing))} as well")
    return TreeSpec(kind, **fields)


def tree_from_header(entry: dict) -> TreeSpec:
    """A header's settings["tree"] back as a TreeSpec; SettingsError when it is not one."""
    if not isinstance(entry, dict) or entry.get("kind") not in TREE_KINDS:
        raise SettingsError(f"settings.tree must name a kind of {', '.join(TREE_KINDS)}")
    if entry["kind"] == STATIC_TREE:
        if set(entry) != {"kind", "branching"} or not isinstance(entry["branching"], list):
            raise SettingsError("a static settings.tree has exactly kind and a branching list")
        return TreeSpec(STATIC_TREE, branching=tuple(entry["branching"]))
    if set(entry) != {"kind", "top_k", "depth", "nodes"}:
        raise SettingsError("a dynamic settings.tree has exactly kind, top_k, depth and nodes")
    return TreeSpec(DYNAMIC_TREE, top_k=entry["top_k"], depth=entry["depth"], nodes=entry["nodes"])
