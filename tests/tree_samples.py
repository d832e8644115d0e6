"""Hand-built tree traces, correct by construction, for tests that need one before the engine writes them.

A sample is a few HandCycles: the drafted nodes (token, parent, q), the target's distribution
after the root and after each node (a few listed tokens; the rest of the mass is left
unlisted), the uniform draws in the order the walk uses them, and the token drawn at the end.
Everything else in the record (the tries, the path, the commit, the cache lengths and the
compaction) is computed here by a plain-Python walk that follows the tree record's rules
(docs/trace-format.md, "Tree cycle record"), never by asking the checker. The header is a
bundled chain trace's (the tiny Shakespeare byte-level model: token id = byte + 3, EOS = 1)
with settings["tree"].

    from tests.tree_samples import sample_tree_trace, dumps
    loads_trace(dumps(sample_tree_trace()))
"""
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import TreeSpec
from engine.trace.commit import final_tokens
from engine.trace.format import make_summary
from engine.trace.schema import NEXT_BONUS, NEXT_RESIDUAL, ROOT, STATIC_TREE

BASE_TRACE = Path(__file__).resolve().parent.parent / "assets" / "traces" / "shakespeare-cache-dynamic.jsonl"
EOS = 1
BLOCK_SIZE, POOL_BLOCKS, CAPACITY = 4, 16, 64  # the paged and static layouts of the samples


def tok(ch: str) -> int:
    """The byte-level model's id of a one-character token."""
    return ord(ch) + 3


def text_of(token: int) -> str:
    return "</s>" if token == EOS else chr(token - 3)


@dataclass
class HandCycle:
    nodes: list[tuple[int, int, float]]  # (token, parent, q), parents first, level by level, siblings as tried
    rows: list[dict[int, float]]  # N+1: the target's listed probabilities after the root, then after each node
    draws: list[float]  # the walk's uniform draws, in order
    next_token: int  # drawn from the bonus or residual distribution (it must have mass there)


@dataclass
class Walk:
    tried: list[dict] = field(default_factory=list)
    path: list[int] = field(default_factory=list)
    end: int = ROOT
    kind: str = NEXT_BONUS


def children(nodes: list[tuple[int, int, float]], parent: int) -> list[int]:
    return [i for i, (_, p, _) in enumerate(nodes) if p == parent]


def target_p(hand: HandCycle, i: int) -> float:
    token, parent, _ = hand.nodes[i]
    return hand.rows[0 if parent == ROOT else 1 + parent].get(token, 0.0)


def walk(hand: HandCycle) -> Walk:
    """The contract's acceptance walk: children tried in order, u < r[t] accepts, a rejected
    token leaves the residual, which is renormalised."""
    w, draws = Walk(), iter(hand.draws)
    while kids := children(hand.nodes, w.end):
        removed, chosen = 0.0, None
        for kid in kids:
            p = target_p(hand, kid)
            r = p / (1.0 - removed) if p > 0 else 0.0
            u = next(draws)
            w.tried.append({"node": kid, "p_residual": r, "u": u, "accepted": u < r})
            if u < r:
                chosen = kid
                break
            removed += p
        if chosen is None:
            w.kind = NEXT_RESIDUAL
            break
        w.path.append(chosen)
        w.end = chosen
    assert next(draws, None) is None, "a hand cycle has draws the walk does not use"
    return w


def top_list(row: dict[int, float], n: int) -> list[dict]:
    listed = sorted(((p, t) for t, p in row.items() if p > 0), key=lambda e: (-e[0], e[1]))[:n]
    return [{"token_id": t, "text": text_of(t), "p": p} for p, t in listed]


def residual_top(hand: HandCycle, w: Walk, n: int) -> list[dict] | None:
    """The residual at the walk's end: its rejected children's tokens at 0, the rest renormalised."""
    if w.kind == NEXT_BONUS:
        return None
    row = hand.rows[0 if w.end == ROOT else 1 + w.end]
    rejected = {hand.nodes[k][0] for k in children(hand.nodes, w.end)}
    remaining = 1.0 - sum(row.get(t, 0.0) for t in rejected)
    entries = [{"token_id": t, "text": text_of(t), "p_target": p, "residual": 0.0 if t in rejected else p / remaining}
               for t, p in row.items()]
    entries.sort(key=lambda e: (-e["residual"], e["token_id"]))
    assert any(e["token_id"] == hand.next_token and e["residual"] > 0 for e in entries[:n]), "next has no residual"
    return entries[:n]


def depths_of(nodes: list[tuple[int, int, float]]) -> list[int]:
    out: list[int] = []
    for _, parent, _ in nodes:
        out.append(1 if parent == ROOT else out[parent] + 1)
    return out


def scores_of(nodes: list[tuple[int, int, float]]) -> list[float]:
    out: list[float] = []
    for _, parent, q in nodes:
        out.append((0.0 if parent == ROOT else out[parent]) + math.log(q))
    return out


def draft_slots(nodes: list[tuple[int, int, float]], spec: TreeSpec, base: int) -> dict[int, int]:
    """Node -> its slot in the draft cache: the root at `base`, then each level but the deepest
    fed in one forward (static: the whole level; dynamic: its top_k best by score)."""
    depths, scores, slots, slot = depths_of(nodes), scores_of(nodes), {}, base + 1
    for depth in range(1, spec.max_depth):
        level = [i for i, d in enumerate(depths) if d == depth]
        if spec.kind != STATIC_TREE:
            level = sorted(level, key=lambda i: -scores[i])[:spec.top_k]
        for i in level:
            slots[i] = slot
            slot += 1
    for i in range(len(nodes)):
        assert not children(nodes, i) or i in slots, "a node with children must have been fed"
    return slots


def compaction(kept: list[int], base: int) -> dict:
    return {"kept_slots": kept, "moves": [[src, base + j] for j, src in enumerate(kept) if src != base + j]}


def layout_states(layout: str, lengths: dict, high_water: int) -> dict | None:
    """A static or paged cache's state at each moment (engine/trace/layout_checks.py's fields)."""
    if layout == "static":
        top = max(high_water, lengths["after_append"])
        return {m: {"write_position": n, "stale_slots": max(high_water if m == "before" else top, n) - n,
                    "capacity": CAPACITY} for m, n in lengths.items()}
    if layout == "paged":
        def state(n: int) -> dict:
            used = math.ceil(n / BLOCK_SIZE)
            return {"block_table": list(range(used)), "num_tokens": n, "blocks_used": used,
                    "blocks_free": POOL_BLOCKS - used, "pool_blocks": POOL_BLOCKS}
        states = {m: state(n) for m, n in lengths.items()}
        before, after, rolled = (len(states[m]["block_table"]) for m in lengths)
        return {**states, "blocks_allocated": list(range(before, after)), "blocks_freed": list(range(rolled, after))}
    return None


@dataclass
class RunState:
    committed: int  # committed length (prompt + generated)
    generated: list[int] = field(default_factory=list)
    high_water: dict = field(default_factory=lambda: {"target": 0, "draft": 0})


def cycle_record(index: int, hand: HandCycle, spec: TreeSpec, header: dict, run: RunState) -> dict:
    """One tree cycle record, every field computed from the hand-built numbers."""
    s, n = header["settings"], len(hand.nodes)
    w = walk(hand)
    committed, finished = final_tokens([hand.nodes[p][0] for p in w.path] + [hand.next_token],
                                       s["max_new_tokens"] - len(run.generated), set(header["eos_token_ids"]))
    base, keep = run.committed - 1, run.committed - 1 + len(committed)
    slots = draft_slots(hand.nodes, spec, base)
    draft_kept = [base]
    for p in w.path:
        if p not in slots:
            break
        draft_kept.append(slots[p])
    draft_kept = draft_kept[:len(committed)]
    catch_up = base + len(draft_kept) < keep
    depths, scores = depths_of(hand.nodes), scores_of(hand.nodes)
    steps = [0.001 * (d + 1) for d in range(spec.max_depth)]
    lengths = {"target": {"before": base, "after_append": base + n + 1, "after_rollback": keep},
               "draft": {"before": base, "after_append": base + 1 + len(slots), "after_rollback": keep}}
    rec = {
        "type": "cycle", "cycle": index, "committed_len_before": run.committed, "num_accepted": len(w.path),
        "next_token_text": text_of(hand.next_token), "committed_token_ids": committed,
        "committed_token_texts": [text_of(t) for t in committed], "finished": finished,
        "target_cache_len": lengths["target"], "draft_cache_len": lengths["draft"], "draft_catch_up": catch_up,
        "verify_positions": n + 1, "draft_time_s": sum(steps), "draft_step_times_s": steps, "verify_time_s": 0.02,
        "catch_up_time_s": 0.003 if catch_up else 0.0, "cycle_time_s": sum(steps) + 0.03,
        "tree": {
            "nodes": [{"token_id": t, "text": text_of(t), "parent": parent, "depth": depths[i], "q": q,
                       "score": scores[i], "p": target_p(hand, i)} for i, (t, parent, q) in enumerate(hand.nodes)],
            "tried": w.tried, "path": w.path, "next_token_id": hand.next_token, "next_token_kind": w.kind,
            "residual_top": residual_top(hand, w, s["trace_top_k"] + 1),
            "target_top": [top_list(row, s["trace_top_k"]) for row in hand.rows],
            "draft_forwards": spec.max_depth,
            "compaction": {"target": compaction(([base] + [base + 1 + p for p in w.path])[:len(committed)], base),
                           "draft": compaction(draft_kept, base)},
        },
    }
    layout = s.get("cache_layout", "dynamic")
    for model in ("target", "draft"):
        states = layout_states(layout, lengths[model], run.high_water[model])
        if states is not None:
            rec[f"{model}_cache_layout_state"] = states
        run.high_water[model] = max(run.high_water[model], lengths[model]["after_append"])
    run.committed += len(committed)
    run.generated += committed
    return rec


def tree_header(spec: TreeSpec, temperature: float, max_new_tokens: int, layout: str = "dynamic") -> dict:
    """A bundled chain trace's header, turned into a tree run's."""
    with BASE_TRACE.open(encoding="utf-8") as f:
        h = json.loads(f.readline())
    h.pop("calibration", None)  # measured on chain cycles; a tree run here is not calibrated
    h["settings"].update(k=spec.max_depth, tree=spec.describe(), temperature=temperature,
                         max_new_tokens=max_new_tokens, cache_layout=layout, block_size=BLOCK_SIZE)
    h["cache_layout"] = {"name": layout, "text": f"the {layout} layout"}
    if layout == "static":
        h["cache_layout"]["capacity"] = CAPACITY
    if layout == "paged":
        h["cache_layout"].update(block_size=BLOCK_SIZE, pool_blocks=POOL_BLOCKS)
    return h


def tree_trace(spec: TreeSpec, hands: list[HandCycle], temperature: float, max_new_tokens: int,
               layout: str = "dynamic") -> list[dict]:
    """Header, cycle records and summary of a run made of `hands` (the last one must finish it)."""
    header = tree_header(spec, temperature, max_new_tokens, layout)
    run = RunState(len(header["prompt_token_ids"]))
    cycles = [cycle_record(i, hand, spec, header, run) for i, hand in enumerate(hands)]
    assert cycles[-1]["finished"], "the hand cycles must end the run"
    stop = "eos" if run.generated[-1] == EOS else "max_new_tokens"
    text = "".join(text_of(t) for t in run.generated)
    return [header, *cycles, make_summary(cycles, spec.max_depth, text, stop, 0.5)]


# ---------------------------------------------------------------- the samples

def sample_hands() -> list[HandCycle]:
    """Four sampled cycles of a static 2,2,1 tree (at most 10 nodes, max depth 3): a full tree
    whose walk ends in a residual at depth 2; a narrower one accepted to a leaf (a bonus, and a
    draft catch-up: the deepest node is never fed to the draft); both root children rejected;
    and a cycle cut by the token budget (10)."""
    a, b, c, d, e, f, g, h, i, j = (tok(ch) for ch in "abcdefghij")
    full = HandCycle(
        nodes=[(a, ROOT, 0.6), (b, ROOT, 0.3), (c, 0, 0.5), (d, 0, 0.2), (e, 1, 0.7), (f, 1, 0.1),
               (g, 2, 0.9), (h, 3, 0.8), (i, 4, 0.6), (j, 5, 0.5)],
        rows=[{a: 0.5, b: 0.3, tok("x"): 0.1}, {c: 0.4, d: 0.2}, {e: 0.2, f: 0.6, tok("y"): 0.1}, {g: 0.7},
              {h: 0.3}, {i: 0.5}, {j: 0.9, tok("z"): 0.05}, {tok("k"): 0.5}, {tok("k"): 0.5}, {tok("k"): 0.5},
              {tok("k"): 0.5}],
        draws=[0.7, 0.4, 0.5, 0.1, 0.95], next_token=tok("z"))
    to_leaf = HandCycle(
        nodes=[(tok("k"), ROOT, 0.9), (tok("l"), 0, 0.8), (tok("m"), 1, 0.95)],
        rows=[{tok("k"): 0.6}, {tok("l"): 0.7}, {tok("m"): 0.8}, {tok("n"): 0.4, tok(" "): 0.3}],
        draws=[0.3, 0.5, 0.2], next_token=tok("n"))
    root_rejected = HandCycle(
        nodes=[(tok("o"), ROOT, 0.5), (tok("p"), ROOT, 0.4), (tok("q"), 0, 0.9), (tok("r"), 1, 0.9),
               (tok("s"), 2, 1.0), (tok("t"), 3, 1.0)],
        rows=[{tok("o"): 0.2, tok("p"): 0.1, tok("u"): 0.6}, {tok("q"): 0.5}, {tok("r"): 0.5}, {tok("s"): 0.5},
              {tok("t"): 0.5}, {tok("u"): 0.5}, {tok("u"): 0.5}],
        draws=[0.5, 0.9], next_token=tok("u"))
    budget_cut = HandCycle(
        nodes=[(tok("v"), ROOT, 0.7), (tok("w"), 0, 0.6), (tok("x"), 1, 0.5)],
        rows=[{tok("v"): 0.8}, {tok("w"): 0.9}, {tok("x"): 0.1, tok("y"): 0.5}, {tok("z"): 0.2}],
        draws=[0.1, 0.2, 0.6], next_token=tok("y"))
    return [full, to_leaf, root_rejected, budget_cut]


SAMPLE_SPEC = TreeSpec(STATIC_TREE, branching=(2, 2, 1))


def sample_tree_trace(layout: str = "dynamic") -> list[dict]:
    """The static 2,2,1 sample at temperature 0.8, 10 new tokens, in the given cache layout."""
    return tree_trace(SAMPLE_SPEC, sample_hands(), 0.8, 10, layout)


DYNAMIC_SPEC = TreeSpec("dynamic", top_k=2, depth=3, nodes=5)


def dynamic_tree_trace() -> list[dict]:
    """Two cycles of an EAGLE-2 tree (top_k=2, depth=3, nodes=5): a bonus after a rejected and an
    accepted sibling (the draft's kept slots move), then an EOS drawn from a residual."""
    first = HandCycle(
        nodes=[(tok("f"), ROOT, 0.5), (tok("g"), 0, 0.6), (tok("h"), 0, 0.3), (tok("i"), 1, 0.7)],
        rows=[{tok("f"): 0.9}, {tok("g"): 0.1, tok("h"): 0.5}, {tok("i"): 0.4}, {tok("j"): 0.5}, {tok("j"): 0.2}],
        draws=[0.4, 0.5, 0.3], next_token=tok("j"))
    eos = HandCycle(
        nodes=[(tok("a"), ROOT, 0.6), (tok("b"), ROOT, 0.3), (tok("c"), 0, 0.7), (tok("d"), 1, 0.9), (tok("e"), 2, 0.8)],
        rows=[{tok("a"): 0.5, tok("b"): 0.4}, {tok("c"): 0.9}, {tok("d"): 0.5}, {tok("e"): 0.6, EOS: 0.3},
              {tok("a"): 0.2}, {tok("b"): 0.3}],
        draws=[0.2, 0.3, 0.7], next_token=EOS)
    return tree_trace(DYNAMIC_SPEC, [first, eos], 1.0, 40)


WIDE_SPEC = TreeSpec("dynamic", top_k=2, depth=3, nodes=8)


def wide_dynamic_tree_trace() -> list[dict]:
    """One cycle of a wider EAGLE-2 tree (top_k=2, depth=3, nodes=8) whose level 2 has three nodes,
    two of them (the frontier) expanded; the budget of 3 cuts the commit."""
    a, b, c, d, e, f, g = (tok(ch) for ch in "abcdefg")
    hand = HandCycle(
        nodes=[(a, ROOT, 0.6), (b, ROOT, 0.3), (c, 0, 0.6), (d, 0, 0.3), (e, 1, 0.5), (f, 2, 0.8), (g, 3, 0.9)],
        rows=[{a: 0.7}, {c: 0.2, d: 0.6}, {e: 0.5}, {f: 0.3}, {g: 0.5}, {a: 0.5}, {b: 0.5}, {c: 0.5}],
        draws=[0.1, 0.5, 0.2, 0.4], next_token=c)
    return tree_trace(WIDE_SPEC, [hand], 1.0, 3)


GREEDY_SPEC = TreeSpec(STATIC_TREE, branching=(2, 1))


def greedy_tree_trace() -> list[dict]:
    """Three cycles at temperature 0 of a static 2,1 tree: one-hot target rows, so the walk
    takes a child exactly when it is the target's argmax (p 1) and rejects it otherwise (p 0)."""
    a, b, c, d, e, f, g, h = (tok(ch) for ch in "abcdefgh")
    hands = [
        HandCycle(nodes=[(a, ROOT, 0.9), (tok("q"), ROOT, 0.1), (b, 0, 1.0)],
                  rows=[{a: 1.0}, {c: 1.0}, {c: 1.0}, {a: 1.0}], draws=[0.3, 0.6], next_token=c),
        HandCycle(nodes=[(d, ROOT, 1.0), (e, 0, 1.0)], rows=[{d: 1.0}, {e: 1.0}, {f: 1.0}],
                  draws=[0.8, 0.1], next_token=f),
        HandCycle(nodes=[(g, ROOT, 1.0), (a, 0, 1.0)], rows=[{h: 1.0}, {a: 1.0}, {b: 1.0}],
                  draws=[0.2], next_token=h),
    ]
    return tree_trace(GREEDY_SPEC, hands, 0.0, 6)


def dumps(records: list[dict], ensure_ascii: bool = False) -> str:
    return "".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in records)
