"""The words about one tree cycle: its summary in one line, a caption per stepper
stage, the walk as table rows, and the cycle the teaching pages pick to show.

Plain text (the pages escape it with app.ui.safe.md); no Streamlit, no figures.
"""
from app.figures.derive import quoted, visible_text
from engine.trace.schema import NEXT_BONUS, ROOT

COMPACTION_WORDS = {
    "dynamic": "gather: the kept slots are selected along the sequence dimension into tensors of the new length",
    "static": "copy inside the preallocated buffer, then move the write position; the slots past it stay masked "
              "until the next append overwrites them",
    "paged": "copy slot to slot through the block table, then lower the token count and free every block wholly "
             "past it",
}


# ---------------------------------------------------------------- the words

def tree_summary(c: dict, root_text: str = "") -> str:
    """One line: 'accepted 3 of 15 nodes (5 tried) along 'a' → 'b' → 'c', then a bonus 'x''. Plain text."""
    tree = c["tree"]
    nodes, path = tree["nodes"], tree["path"]
    line = f"accepted {len(path)} of {len(nodes)} nodes ({len(tree['tried'])} tried)"
    if path:
        line += " along " + " → ".join(quoted(nodes[i]["text"]) for i in path)
    nxt = quoted(c["next_token_text"])
    if tree["next_token_kind"] == NEXT_BONUS:
        return line + f", then a bonus {nxt}"
    last = quoted(nodes[path[-1]]["text"]) if path else f"the root {quoted(root_text)}" if root_text else "the root"
    return line + f"; every child of {last} was rejected, so {nxt} came from the residual"


def forwards_words(forwards: int, depth: int, n: int) -> str:
    """The draft's forwards against the levels they left: a dynamic tree runs every forward its depth allows,
    and the last ones' candidates may all fall outside the nodes it keeps (6 forwards, 5 levels)."""
    if forwards <= depth:
        return f"{forwards} batched forwards (one per level)"
    extra = forwards - depth
    last = f"those of the last {extra}" if extra > 1 else f"forward {forwards}'s"
    return f"{forwards} batched forwards, one per level of candidates; {last} all fell outside the {n} nodes kept"


def tree_stage_caption(c: dict, stage: int, root_text: str = "", layout: str = "dynamic") -> str:
    """What happens at a stepper stage of a tree cycle, in one or two plain-text sentences."""
    tree = c["tree"]
    n, t = len(tree["nodes"]), c["target_cache_len"]
    depth = max((nd["depth"] for nd in tree["nodes"]), default=0)
    root = quoted(root_text) if root_text else "the last committed token"
    if stage == 1:
        return (f"The draft grows a tree from the root {root}: {n} nodes, {depth} levels deep, in "
                f"{forwards_words(tree['draft_forwards'], depth, n)}. Each expanded node offers several "
                "candidates for the next position, its most likely first; nothing is decided yet.")
    if stage == 2:
        return (f"The target scores the root and all {n} nodes in one forward of {n + 1} positions. Each node "
                "sits at position L + its depth and, through the tree attention mask, sees only the prefix, its "
                "ancestors and itself: one pass computes every branch as if it were a chain of its own.")
    if stage == 3:
        return ("The walk starts at the root and tries its children in order: a child is accepted if u < r[t], "
                "its probability in the residual r; a rejected token is taken out of r, r is renormalised, and "
                "the next sibling is tried. After an accept the walk moves down to that node. This cycle: "
                + tree_summary(c, root_text) + ".")
    if stage == 4:
        if tree["next_token_kind"] == NEXT_BONUS:
            return (f"The walk reached a node with no children, so one more token, {quoted(c['next_token_text'])}, is "
                    "drawn from the target's distribution there: the bonus. "
                    f"{len(c['committed_token_ids'])} token(s) committed for one target pass.")
        return (f"Every candidate at the last step was rejected, so {quoted(c['next_token_text'])} is drawn from the "
                "residual left after removing them (exactly the multi-round speculative sampling rule). "
                f"{len(c['committed_token_ids'])} token(s) committed for one target pass.")
    return (f"Compaction: the verify wrote K/V for every node ({t['before']} → {t['after_append']} slots) but only the "
            f"accepted path is text now. Its K/V move next to the prefix and the rest is discarded "
            f"({t['after_append']} → {t['after_rollback']}); with this {layout} cache: {COMPACTION_WORDS.get(layout, '')}.")


def tried_rows(c: dict) -> list[dict]:
    """The walk, one row per tried node, in the order tried (plain text: the page escapes it)."""
    nodes = c["tree"]["nodes"]
    rows = []
    for k, t in enumerate(c["tree"]["tried"]):
        node = nodes[t["node"]]
        parent = node["parent"]
        rows.append({"try": k + 1, "node": t["node"], "token": visible_text(node["text"]),
                     "under": "root" if parent == ROOT else f"{parent} {visible_text(nodes[parent]['text'])}",
                     "depth": node["depth"], "p (target)": f"{node['p']:.4f}", "q (draft)": f"{node['q']:.4f}",
                     "r[t]": f"{t['p_residual']:.4f}", "u": f"{t['u']:.4f}",
                     "result": "✓ accepted" if t["accepted"] else "✗ rejected"})
    return rows


def teaching_tree_cycle(cycles: list[dict]) -> int:
    """The most instructive tree cycle: a rejection and then an accept further on, else any accept."""
    def rejected_some(c: dict) -> bool:
        return any(not t["accepted"] for t in c["tree"]["tried"])
    for wanted in (lambda c: c["tree"]["path"] and rejected_some(c), lambda c: c["tree"]["path"]):
        for i, c in enumerate(cycles):
            if wanted(c):
                return i
    return 0
