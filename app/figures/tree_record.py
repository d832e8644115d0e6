"""What a tree trace and a tree cycle record say, read off them for the figures.

A trace is a tree trace when its header's settings has "tree"; each of its cycle records then
has a `tree` entry (nodes, tried, path, next token, compaction) and none of a chain cycle's
per-position fields. Here: whether a header is a tree trace's, its tree settings in words, and
the walk read off a cycle (each node's parent, the order tried, each node's outcome, the next
token's numbers). No Streamlit, no figures.
"""
from typing import Sequence

from app.figures.derive import ACCEPTED, REJECTED
from app.figures.style import UNTRIED
from engine.config import SettingsError, tree_from_header
from engine.trace.schema import NEXT_BONUS, ROOT, STATIC_TREE


def is_tree_header(header: dict) -> bool:
    """A tree trace's header: settings["tree"] is present (then every cycle is a tree cycle)."""
    return isinstance(header.get("settings"), dict) and "tree" in header["settings"]


def tree_words(spec: dict) -> str:
    """The header's settings["tree"] in words, its depth and size always said: 'static tree 3,2,1
    (depth 3, 15 nodes)' or 'dynamic tree (top-4, depth 4, 16 nodes)'."""
    if spec.get("kind") == STATIC_TREE:
        shape = "static tree " + ",".join(str(b) for b in spec.get("branching", []))
        try:
            tree = tree_from_header(spec)
        except SettingsError:  # a header the loader has not checked: its branching alone
            return shape
        return f"{shape} (depth {tree.max_depth}, {tree.max_nodes} nodes)"
    return f"dynamic tree (top-{spec.get('top_k')}, depth {spec.get('depth')}, {spec.get('nodes')} nodes)"


# ---------------------------------------------------------------- the walk, read off the record

def parents_of(tree: dict) -> list[int]:
    """Each node's parent; one that breaks the contract (not an earlier node) is drawn under the root."""
    out = []
    for i, node in enumerate(tree["nodes"]):
        p = node.get("parent", ROOT)
        out.append(p if isinstance(p, int) and 0 <= p < i else ROOT)
    return out


def tried_by_node(tree: dict) -> dict[int, tuple[int, dict]]:
    """node -> (its place in the walk's order, its tried entry)."""
    return {t["node"]: (k, t) for k, t in enumerate(tree["tried"])}


def node_outcomes(tree: dict) -> list[str]:
    """ACCEPTED for the path, REJECTED for a tried node off it, UNTRIED for the rest."""
    on_path, tried = set(tree["path"]), tried_by_node(tree)
    return [ACCEPTED if i in on_path else REJECTED if i in tried else UNTRIED for i in range(len(tree["nodes"]))]


def why_untried(tree: dict, parents: Sequence[int], i: int) -> str:
    parent = parents[i]
    if parent != ROOT and parent not in tree["path"]:
        return "its parent was never accepted, so nothing under it is tested"
    if tree["path"] and any(parents[p] == parent for p in tree["path"]):
        return "an earlier sibling was accepted, so the walk went down that branch"
    return "the walk stopped before it"


def ancestors_or_self(parents: Sequence[int], i: int) -> list[int]:
    """Node i's ancestors (root excluded) and i itself, from the top of the tree down."""
    chain = []
    while i != ROOT:
        chain.append(i)
        i = parents[i]
    return chain[::-1]


def last_on_path(tree: dict) -> int:
    return tree["path"][-1] if tree["path"] else ROOT


def next_token_numbers(tree: dict) -> tuple[float | None, float | None]:
    """(p_target, residual) of the next token, as far as the record's top lists keep them."""
    tid, last = tree["next_token_id"], last_on_path(tree)
    if tree["next_token_kind"] == NEXT_BONUS:
        row = tree["target_top"][last + 1] if last + 1 < len(tree["target_top"]) else []
        return next((e["p"] for e in row if e["token_id"] == tid), None), None
    found = next((e for e in tree.get("residual_top") or [] if e["token_id"] == tid), None)
    return (found["p_target"], found["residual"]) if found else (None, None)
