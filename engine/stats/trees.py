"""What a tree trace says, and a chain and a tree run of one pair side by side.

Plain functions of trace records (no torch, no Streamlit): `tree_stats` for one tree trace,
`compare_chain_tree` for a chain trace and a tree trace of the same target, draft and prompt.
The statistics page and `python -m engine stats` both show these numbers.

A tree cycle's record holds the drafted nodes, the acceptance walk (tried, path) and the next
token's kind (engine/tree/cycle.py, /work/tree-contract.md): everything here is counted from
those fields and the timings every cycle record carries. Times are medians over cycles with
their middle half (engine/stats/robust.py), as in engine/stats/analysis.py.
"""
from dataclasses import dataclass
from statistics import fmean

from engine.config import SettingsError, tree_from_header
from engine.stats.paths import target_weights
from engine.stats.robust import Spread, spread_of
from engine.trace import Trace, model_name
from engine.trace.metrics import decoding_tokens_per_s, drafted, trace_acceptance
from engine.trace.schema import DRAFT_MODEL, NEXT_BONUS

TREE_DEFINITIONS = {
    "tokens_per_cycle": "1 + accepted nodes per cycle: the path's tokens and the bonus or residual token "
                        "(before an EOS or the token budget cuts the last cycle).",
    "acceptance_by_depth": "cycles whose accepted path reached depth d / cycles; it never rises with d. "
                           "A chain's per-position acceptance is the same count for a tree of one child per node.",
    "acceptance_rate": "accepted nodes / drafted nodes: low for a tree by design, most branches are spares.",
    "next_token": "bonus: the path ended at a node without children, the next token is drawn from the target; "
                  "residual: every child tried at the path's end was rejected, the next token is drawn from "
                  "what the rejections left of the target's distribution.",
    "sibling_rank": "the place of each accepted node among its siblings in the order the walk tries them "
                    "(1 = the draft's most likely child). A rank of 2 or more is a token the draft did not rank "
                    "first: a cycle offering only the draft's first choice would have stopped there.",
    "saved_cycles": "cycles whose path holds at least one node that was not its parent's first child.",
    "draft_forwards": "batched draft forwards spent drafting in one cycle (one per depth); the catch-up after "
                      "the cycle is counted apart.",
    "verify_by_width": "median verify pass by its width N+1 (the root and N nodes).",
}


@dataclass(frozen=True)
class WidthCost:
    """The verify passes of one width (root + nodes) in a trace."""

    width: int
    cycles: int
    verify_s: Spread


@dataclass(frozen=True)
class TreeStats:
    shape: dict  # the header's settings["tree"] (engine/config.py TreeSpec.describe())
    max_depth: int  # settings["k"]: the tree's depth
    num_cycles: int
    nodes_mean: float  # drafted nodes per cycle
    nodes_min: int
    nodes_max: int
    tokens_per_cycle: float  # TREE_DEFINITIONS["tokens_per_cycle"], the mean
    tokens_per_cycle_counts: list[int]  # cycles that committed n = 1..max_depth+1 tokens
    acceptance_by_depth: list[float]  # d = 1..max_depth
    acceptance_rate: float  # accepted nodes / drafted nodes
    bonus_cycles: int
    residual_cycles: int
    rank_counts: list[int]  # accepted nodes that were their parent's r-th child, r = 1, 2, ...
    saved_cycles: int  # TREE_DEFINITIONS["saved_cycles"]
    draft_forwards: float  # per cycle, mean
    catch_up_share: float  # fraction of cycles that fed the draft afterwards
    verify_by_width: list[WidthCost]  # by width, narrowest first
    verify_s: Spread  # every verify pass
    cycle_s: Spread
    tokens_per_s: float  # engine.trace.metrics.decoding_tokens_per_s


def is_tree_trace(trace: Trace) -> bool:
    """A trace is a tree trace iff its header's settings has "tree" (then every cycle is a tree cycle)."""
    settings = trace.header.get("settings")
    return isinstance(settings, dict) and "tree" in settings


# ---------------------------------------------------------------- one cycle

def sibling_rank(nodes: list[dict], node: int) -> int:
    """1-based place of `node` among its parent's children; nodes are stored siblings in tried order."""
    parent = nodes[node]["parent"]
    return 1 + sum(1 for n in nodes[:node] if n["parent"] == parent)


def path_ranks(tree: dict) -> list[int]:
    """Sibling rank of each accepted node, root to leaf."""
    return [sibling_rank(tree["nodes"], p) for p in tree["path"]]


def draft_forwards(cycle: dict) -> int:
    """Draft forwards spent drafting: a tree's batched levels, a chain's steps (catch-up excluded)."""
    return cycle["tree"]["draft_forwards"] if "tree" in cycle else len(cycle["draft_step_times_s"])


def survival(path_lengths: list[int], depth: int) -> list[float]:
    """Fraction of cycles whose accepted run reached 1..depth (0 at every depth with no cycles)."""
    total = len(path_lengths)
    return [sum(n >= d for n in path_lengths) / total if total else 0.0 for d in range(1, depth + 1)]


def time_spread(values: list[float]) -> Spread:
    return spread_of(values) if values else Spread(0.0, 0.0, 0.0)


# ---------------------------------------------------------------- a tree trace

def verify_by_width(cycles: list[dict]) -> list[WidthCost]:
    widths: dict[int, list[float]] = {}
    for c in cycles:
        widths.setdefault(c["verify_positions"], []).append(c["verify_time_s"])
    return [WidthCost(w, len(ts), spread_of(ts)) for w, ts in sorted(widths.items())]


def rank_counts(cycles: list[dict]) -> list[int]:
    ranks = [r for c in cycles for r in path_ranks(c["tree"])]
    counts = [0] * max(ranks, default=0)
    for r in ranks:
        counts[r - 1] += 1
    return counts


def tokens_counts(accepted: list[int], depth: int) -> list[int]:
    """Cycles that committed n = 1..depth+1 tokens (accepted + 1; the cut of the last cycle ignored)."""
    counts = [0] * (depth + 1)
    for n in accepted:
        counts[min(n, depth)] += 1
    return counts


def committed_and_nodes_per_cycle(cycles: list[dict]) -> tuple[float, float]:
    """Tokens a tree cycle committed and nodes it verified (the root not counted), each averaged over
    the cycles (at least one): what a tree trace measured, as the teaching pages quote it."""
    per_cycle = sum(len(c["committed_token_ids"]) for c in cycles) / len(cycles)
    nodes = sum(len(c["tree"]["nodes"]) for c in cycles) / len(cycles)
    return per_cycle, nodes


def tree_stats(trace: Trace) -> TreeStats:
    """Every number the pages and the CLI show about one tree trace."""
    if not is_tree_trace(trace):
        raise ValueError("not a tree trace: its header's settings has no 'tree' (use engine/stats/analysis.py)")
    cycles, depth = trace.cycles, trace.k
    trees = [c["tree"] for c in cycles]
    nodes = [len(t["nodes"]) for t in trees] or [0]
    accepted = [len(t["path"]) for t in trees]
    bonus = sum(t["next_token_kind"] == NEXT_BONUS for t in trees)
    n = len(cycles)
    return TreeStats(
        shape=trace.header["settings"]["tree"], max_depth=depth, num_cycles=n,
        nodes_mean=fmean(nodes), nodes_min=min(nodes), nodes_max=max(nodes),
        tokens_per_cycle=1 + fmean(accepted) if n else 0.0, tokens_per_cycle_counts=tokens_counts(accepted, depth),
        acceptance_by_depth=survival(accepted, depth),
        acceptance_rate=sum(accepted) / sum(nodes) if sum(nodes) else 0.0,
        bonus_cycles=bonus, residual_cycles=n - bonus, rank_counts=rank_counts(cycles),
        saved_cycles=sum(any(r > 1 for r in path_ranks(t)) for t in trees),
        draft_forwards=fmean(draft_forwards(c) for c in cycles) if n else 0.0,
        catch_up_share=sum(c["draft_catch_up"] for c in cycles) / n if n else 0.0,
        verify_by_width=verify_by_width(cycles), verify_s=time_spread([c["verify_time_s"] for c in cycles]),
        cycle_s=time_spread([c["cycle_time_s"] for c in cycles]), tokens_per_s=decoding_tokens_per_s(cycles))


def tree_label(shape: dict) -> str:
    """settings["tree"] in the --tree form: 'tree static:3,2,1'; just 'tree' for an entry that is not a spec."""
    try:
        return "tree " + tree_from_header(shape).text()
    except SettingsError:
        return "tree"


# ---------------------------------------------------------------- a chain and a tree of one pair

@dataclass(frozen=True)
class RunSide:
    """One run of a comparison, chain or tree, in the numbers both kinds have."""

    label: str  # 'chain K=3' or the tree's shape in words
    cycles: int
    tokens_per_cycle: float  # the mean acceptance length: 1 + accepted per draft (every tree cycle drafts)
    tokens_per_cycle_counts: list[int]  # cycles that committed n = 1..K+1 tokens
    acceptance: list[float]  # by position (chain) or by depth (tree): the same survival count
    draft_forwards: float  # per cycle, drafting only
    catch_up_share: float
    verify_width: float  # positions per verify pass, mean
    verify_s: Spread
    cycle_s: Spread
    tokens_per_s: float


@dataclass(frozen=True)
class ChainTreeComparison:
    target: str
    draft: str
    chain: RunSide
    tree: RunSide
    tree_stats: TreeStats
    tokens_ratio: float  # tree tokens per cycle / chain's
    speedup: float | None  # tree tokens/s / chain's: the measured speedup of the tree (None: chain has no times)
    fair: bool  # the same draft forwards per cycle
    fairness: str  # a sentence saying whether and why the comparison is fair
    notes: list[str]  # settings that differ without making the pair another one


def run_side(trace: Trace, label: str) -> RunSide:
    cycles = trace.cycles
    m = trace_acceptance(cycles, trace.k)  # the one definition: a chain's cycle that drafted nothing is no draft
    drafting = [c["num_accepted"] for c in cycles if drafted(c)]
    return RunSide(label, len(cycles), m["mean_acceptance_length"], tokens_counts(drafting, trace.k),
                   m["per_position_acceptance"],
                   fmean(draft_forwards(c) for c in cycles) if cycles else 0.0,
                   sum(c["draft_catch_up"] for c in cycles) / len(cycles) if cycles else 0.0,
                   fmean(c["verify_positions"] for c in cycles) if cycles else 0.0,
                   time_spread([c["verify_time_s"] for c in cycles]),
                   time_spread([c["cycle_time_s"] for c in cycles]), decoding_tokens_per_s(cycles))


def cut(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def model_difference(role: str, chain: dict, tree: dict) -> str | None:
    """How the two headers' `role` model ("target" or "draft") differs, or None."""
    a, b = model_name(chain, role), model_name(tree, role)
    if a != b:
        return f"the {role} models differ ({cut(a)} in the chain, {cut(b)} in the tree)"
    da, db = chain.get(role), tree.get(role)
    da, db = (da if isinstance(da, dict) else {}), (db if isinstance(db, dict) else {})
    for field in sorted(set(da) & set(db) - {"name"}):
        if da[field] != db[field]:
            return f"the {role} models share the name {cut(a)} but differ in {field} ({da[field]!r:.40} vs {db[field]!r:.40})"
    return None


def prompt_difference(chain: dict, tree: dict) -> str | None:
    if chain.get("prompt") != tree.get("prompt"):
        return f"the prompts differ ({cut(str(chain.get('prompt')))} in the chain, {cut(str(tree.get('prompt')))} in the tree)"
    a, b = chain.get("prompt_token_ids"), tree.get("prompt_token_ids")
    if a != b:
        return (f"the prompts' tokens differ ({len(a or [])} vs {len(b or [])} tokens for the same text: one run "
                "used the chat template)")
    return None


def pair_differences(chain: dict, tree: dict) -> list[str]:
    """Why two headers are not runs of the same pair on the same prompt (empty: they are)."""
    found = [model_difference("target", chain, tree), model_difference("draft", chain, tree),
             prompt_difference(chain, tree)]
    kinds = [h.get("drafter", {}).get("kind", DRAFT_MODEL) for h in (chain, tree)]
    if kinds[0] != kinds[1]:
        found.append(f"the drafters differ ({kinds[0]} in the chain, {kinds[1]} in the tree)")
    weights = [target_weights(h) for h in (chain, tree)]
    if weights[0] != weights[1]:
        found.append(f"the target's weights differ ({weights[0]} in the chain, {weights[1]} in the tree): "
                     "another target distribution")
    return [f for f in found if f]


SETTING_NAMES = {"temperature": "temperature", "top_k": "top-k", "top_p": "top-p", "max_new_tokens": "max new tokens",
                 "cache_layout": "cache layout"}


def setting_notes(chain: dict, tree: dict) -> list[str]:
    """Settings that differ: still the same pair, but the numbers then answer a different question."""
    notes = []
    cs, ts = chain.get("settings", {}), tree.get("settings", {})
    for key, name in SETTING_NAMES.items():
        if cs.get(key) != ts.get(key):
            notes.append(f"{name} differs: {cs.get(key)!r:.20} in the chain, {ts.get(key)!r:.20} in the tree")
    for key in ("device", "dtype"):
        if chain.get(key) != tree.get(key):
            notes.append(f"{key} differs ({chain.get(key)!r:.20} vs {tree.get(key)!r:.20}): the times are not comparable")
    return notes


def fairness_words(chain: RunSide, tree: RunSide) -> tuple[bool, str]:
    if abs(chain.draft_forwards - tree.draft_forwards) < 1e-9:
        return True, (f"Fair: both spend {tree.draft_forwards:.3g} draft forwards per cycle, so the tree's only extra "
                      f"work is its wider verify pass ({tree.verify_width:.3g} positions against the chain's "
                      f"{chain.verify_width:.3g}).")
    return False, (f"Not like for like: the chain spends {chain.draft_forwards:.3g} draft forwards per cycle and the "
                   f"tree {tree.draft_forwards:.3g}. A fair pair is a chain of K = the tree's depth.")


def compare_chain_tree(chain: Trace, tree: Trace) -> ChainTreeComparison:
    """A chain trace and a tree trace of the same target, draft and prompt, side by side.

    Raises ValueError (one line, saying what differs) for traces of different pairs or prompts, for
    the kinds swapped, or for a trace without cycles."""
    if is_tree_trace(chain):
        raise ValueError("the first trace drafts a tree: compare_chain_tree needs a chain trace, then a tree trace")
    if not is_tree_trace(tree):
        raise ValueError("the second trace drafts a chain: compare_chain_tree needs a chain trace, then a tree trace")
    differences = pair_differences(chain.header, tree.header)
    if differences:
        raise ValueError("not the same pair and prompt: " + "; ".join(differences))
    for name, trace in (("chain", chain), ("tree", tree)):
        if not trace.cycles:
            raise ValueError(f"the {name} trace has no cycles to compare")
    stats = tree_stats(tree)
    c_side = run_side(chain, f"chain K={chain.k}")
    t_side = run_side(tree, tree_label(stats.shape))
    fair, words = fairness_words(c_side, t_side)
    return ChainTreeComparison(
        model_name(tree.header, "target"), model_name(tree.header, "draft"), c_side, t_side, stats,
        t_side.tokens_per_cycle / c_side.tokens_per_cycle,
        t_side.tokens_per_s / c_side.tokens_per_s if c_side.tokens_per_s > 0 else None,
        fair, words, setting_notes(chain.header, tree.header))
