"""Tree cycle records built by hand, in the tree trace format (docs/trace-format.md).

The app's tree figures are tested on these before the tree engine exists: each record is
self-consistent (the acceptance walk is run here on the given p and u, the committed tokens,
cache lengths and compaction follow from it), so what a figure shows can be checked against
the record's own fields. No model runs: the numbers are chosen, not sampled.
"""
import math
import random
from dataclasses import dataclass

from engine.trace import Trace
from engine.trace.commit import final_tokens
from engine.trace.schema import NEXT_BONUS, NEXT_RESIDUAL, ROOT

VOCAB = ["<eos>", "the", "cat", "dog", "sat", "ran", "on", "a", "mat", "log", "and", "then", "it", "slept",
         "far", "away", " ", "\n", "<script>alert(1)</script>", "<img src=x onerror=alert(1)>"]
VOCAB += [f"w{i}" for i in range(100)]  # filler words for big trees
ID = {w: i for i, w in enumerate(VOCAB)}
PROMPT = ["the", "cat"]


@dataclass(frozen=True)
class Node:
    text: str  # a word of VOCAB
    parent: int  # ROOT or an earlier node
    q: float  # the draft's probability of the token at its parent
    p: float  # the target's probability of the token at its parent


def depths(nodes: list[Node]) -> list[int]:
    out: list[int] = []
    for n in nodes:
        out.append(1 if n.parent == ROOT else out[n.parent] + 1)
    return out


def children(nodes: list[Node], parent: int) -> list[int]:
    return [i for i, n in enumerate(nodes) if n.parent == parent]


def walk(nodes: list[Node], us: list[float]) -> tuple[list[dict], list[int]]:
    """The contract's acceptance walk: (tried, path). A child is tried with its p renormalised by the
    mass of the siblings rejected before it; `us` are the uniform draws, in the order used."""
    draws = iter(us)
    tried, path, at = [], [], ROOT
    while children(nodes, at):
        rejected_mass, accepted = 0.0, None
        for child in children(nodes, at):
            rest = 1.0 - rejected_mass
            r = nodes[child].p / rest if rest > 1e-12 else 0.0
            u = next(draws)
            tried.append({"node": child, "p_residual": r, "u": u, "accepted": u < r})
            if u < r:
                accepted = child
                break
            rejected_mass += nodes[child].p
        if accepted is None:
            break
        path.append(accepted)
        at = accepted
    return tried, path


def entry(word: str, p: float) -> dict:
    return {"token_id": ID[word], "text": word, "p": p}


def target_rows(nodes: list[Node], next_word: str, next_p: float, next_row: int) -> list[list[dict]]:
    """N+1 rows of the target's top tokens: each parent's children with their p (and the next token
    in the row it was drawn from), largest first."""
    rows = []
    for parent in [ROOT] + list(range(len(nodes))):
        row = {nodes[c].text: nodes[c].p for c in children(nodes, parent)}
        if parent == next_row:
            row[next_word] = max(row.get(next_word, 0.0), next_p)
        rows.append(sorted((entry(w, p) for w, p in row.items()), key=lambda e: -e["p"]))
    return rows


def compaction(before: int, kept_sources: list[int], keep: int) -> dict:
    kept = kept_sources[:keep]
    return {"kept_slots": kept, "moves": [[src, before + j] for j, src in enumerate(kept) if src != before + j]}


def tree_cycle(cycle: int, committed_len_before: int, nodes: list[Node], us: list[float], next_word: str,
               next_p: float = 0.5, max_depth: int | None = None, budget: int = 1000) -> dict:
    """One tree cycle record: the walk on `us`, then `next_word` as the bonus or residual token."""
    tried, path = walk(nodes, us)
    last = path[-1] if path else ROOT
    kind = NEXT_RESIDUAL if children(nodes, last) else NEXT_BONUS
    rejected_mass = sum(nodes[t["node"]].p for t in tried if not t["accepted"] and nodes[t["node"]].parent == last)
    ids, finished = final_tokens([ID[nodes[i].text] for i in path] + [ID[next_word]], budget, {ID["<eos>"]})
    L, n, d = committed_len_before - 1, len(nodes), depths(nodes)
    scores: list[float] = []
    for node in nodes:
        score = (0.0 if node.parent == ROOT else scores[node.parent]) + math.log(node.q)
        scores.append(score)
    deepest = max_depth or max(d)
    fed = [i for i in range(n) if d[i] < deepest]  # the draft never feeds its deepest level
    draft_slot = {node: L + 1 + k for k, node in enumerate(fed)}
    held = []
    for node in path:  # the path nodes the draft holds, contiguous from the root
        if node not in draft_slot:
            break
        held.append(draft_slot[node])
    after = L + len(ids)
    forwards = 1 + len({d[i] for i in fed})
    residual = None
    if kind == NEXT_RESIDUAL:
        rest = 1.0 - rejected_mass
        residual = [{"token_id": ID[next_word], "text": next_word, "p_target": next_p,
                     "residual": next_p / rest if rest > 1e-12 else 0.0}]
    return {
        "type": "cycle", "cycle": cycle, "committed_len_before": committed_len_before, "num_accepted": len(path),
        "committed_token_ids": ids, "committed_token_texts": [VOCAB[i] for i in ids], "finished": finished,
        "next_token_text": next_word,
        "target_cache_len": {"before": L, "after_append": L + n + 1, "after_rollback": after},
        "draft_cache_len": {"before": L, "after_append": L + 1 + len(fed), "after_rollback": after},
        "draft_catch_up": L + 1 + len(held) < after, "verify_positions": n + 1,
        "draft_time_s": 0.004 * forwards, "draft_step_times_s": [0.004] * forwards, "verify_time_s": 0.02,
        "catch_up_time_s": 0.001, "cycle_time_s": 0.004 * forwards + 0.025,
        "tree": {
            "nodes": [{"token_id": ID[x.text], "text": x.text, "parent": x.parent, "depth": d[i], "q": x.q,
                       "score": scores[i], "p": x.p} for i, x in enumerate(nodes)],
            "tried": tried, "path": path, "next_token_id": ID[next_word], "next_token_kind": kind,
            "residual_top": residual, "target_top": target_rows(nodes, next_word, next_p, last),
            "draft_forwards": forwards,
            "compaction": {"target": compaction(L, [L] + [L + 1 + p for p in path], len(ids)),
                           "draft": compaction(L, [L] + held, len(ids))},
        },
    }


# ---------------------------------------------------------------- example trees

def small_tree() -> list[Node]:
    """Root → {'dog' (rejected), 'sat' (accepted)}; 'sat' → {'on' (accepted), 'and'}; 'on' → {'a' (rejected)}; and an
    untried grandchild under 'dog'. With SMALL_US the walk accepts 'sat', 'on', then rejects 'a': residual."""
    return [Node("dog", ROOT, 0.5, 0.2), Node("sat", ROOT, 0.3, 0.6), Node("ran", 0, 0.9, 0.5),
            Node("on", 1, 0.6, 0.7), Node("and", 1, 0.2, 0.1), Node("a", 3, 0.8, 0.3)]


SMALL_US = [0.5, 0.1, 0.2, 0.9]  # dog: 0.5 >= 0.2 rejected; sat: 0.1 < 0.75 accepted; on accepted; a rejected


def wide_tree(n: int = 32, seed: int = 0) -> list[Node]:
    """n nodes: 4 children of the root, then 2-3 children per node, level by level (siblings distinct)."""
    rng = random.Random(seed)
    nodes: list[Node] = []
    level, words = [ROOT], iter(VOCAB[20:])
    while len(nodes) < n:
        nxt = []
        for parent in level:
            for _ in range(4 if parent == ROOT else rng.choice([2, 3])):
                if len(nodes) == n:
                    break
                nodes.append(Node(next(words), parent, round(rng.uniform(0.05, 0.45), 3), round(rng.uniform(0.0, 0.3), 3)))
                nxt.append(len(nodes) - 1)
        level = nxt
    return nodes


def hostile_tree() -> list[Node]:
    """Markup in token texts: the root's child and a grandchild; the walk accepts the first, bonus after the second."""
    return [Node("<script>alert(1)</script>", ROOT, 0.7, 0.9), Node("<img src=x onerror=alert(1)>", 0, 0.6, 0.8)]


# ---------------------------------------------------------------- a whole trace

def tree_header(depth: int, temperature: float = 1.0, layout: str = "dynamic") -> dict:
    """A header as a chain run's, plus settings["tree"] and k = the tree's max depth."""
    return {
        "type": "header", "format": "speclab-trace", "version": 1,
        "target": {"name": "hand-made target", "vocab_size": len(VOCAB)},
        "draft": {"name": "hand-made draft", "vocab_size": len(VOCAB)}, "drafter": {"kind": "model"},
        "settings": {"k": depth, "temperature": temperature, "top_k": 0, "top_p": 1.0, "seed": 0,
                     "max_new_tokens": 64, "trace_top_k": 10, "cache_layout": layout,
                     "tree": {"kind": "dynamic", "top_k": 4, "depth": depth, "nodes": 32}},
        "prompt": " ".join(PROMPT), "prompt_token_ids": [ID[w] for w in PROMPT], "prompt_token_texts": list(PROMPT),
        "cache_convention": {"name": "committed_minus_one", "text": "After each cycle both caches hold K/V for all "
                             "committed tokens except the last; the last committed token is fed at the start of "
                             "the next cycle."},
        "cache_layout": {"name": layout}, "device": "cpu", "dtype": "float32", "versions": {}, "eos_token_ids": [ID["<eos>"]],
    }


def tree_trace() -> Trace:
    """Three cycles: the small tree (residual), the hostile one (bonus), the 32-node one."""
    specs = [(small_tree(), SMALL_US, "mat"), (hostile_tree(), [0.1, 0.1], "far"), (wide_tree(), None, "log")]
    cycles, committed = [], len(PROMPT)
    rng = random.Random(1)
    for i, (nodes, us, next_word) in enumerate(specs):
        c = tree_cycle(i, committed, nodes, us or [rng.random() for _ in range(len(nodes))], next_word,
                       budget=64 - (committed - len(PROMPT)))
        cycles.append(c)
        committed += len(c["committed_token_ids"])
    generated = [t for c in cycles for t in c["committed_token_ids"]]
    accepted = [c["num_accepted"] for c in cycles]
    summary = {"type": "summary", "generated_token_ids": generated, "generated_text": " ".join(VOCAB[t] for t in generated),
               "acceptance_rate": sum(accepted) / sum(len(c["tree"]["nodes"]) for c in cycles),
               "mean_acceptance_length": 1 + sum(accepted) / len(cycles), "per_position_acceptance": [],
               "num_cycles": len(cycles), "num_generated": len(generated), "stop_reason": "max_new_tokens",
               "wall_time_s": 0.2, "tokens_per_s": len(generated) / 0.2}
    return Trace(tree_header(6), cycles, summary)
