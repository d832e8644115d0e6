"""Interview questions on draft trees: why draft a tree, what its attention mask looks like, and how the
cache is rolled back after a tree cycle. Each answer shows a cycle of a tree trace (the open one, else
the bundled one: app/ui/tree_trace.py).
"""
import streamlit as st

from app.figures.tree_captions import teaching_tree_cycle
from app.ui import tree_trace
from engine.stats.trees import committed_and_nodes_per_cycle


def tree_example(source: tree_trace.TreeSource) -> dict | None:
    """The tree cycle the tree answers show, or None (with the note saying why there is none)."""
    if source.trace is None:
        st.caption(source.note)
        return None
    return source.trace.cycles[teaching_tree_cycle(source.trace.cycles)]


def tree_trace_words(trace) -> str:
    """What the tree trace's own cycles committed: measured in it, not claimed."""
    cycles = trace.cycles
    per_cycle, nodes = committed_and_nodes_per_cycle(cycles)
    return (f"In this tree trace a cycle committed {per_cycle:.2f} tokens on average, verifying {nodes:.1f} nodes "
            f"(+ the root) per pass, over {len(cycles)} cycles.")


def q_why_tree(source: tree_trace.TreeSource) -> None:
    with st.expander("Why draft a tree of candidates instead of one chain?"):
        st.markdown(
            "A chain offers one guess per position, and the first miss ends the cycle: the acceptance length is "
            "limited by how often the draft's *top* guess is right, position after position. A tree offers "
            "several guesses per position (the draft's few most likely tokens), each with candidates of its own. "
            "The target's walk tries the children of a node one after another, so a position fails only if "
            "*all* its candidates fail. A draft that is often nearly right (the answer is its second or third "
            "choice) then still gets long accepted prefixes. Exactness is kept: each child is a one-hot "
            "proposal, a rejected token is removed from the target's residual before the next sibling is "
            "tried, and the output is distributed as the target's.\n\n"
            "The cost is the verify pass: it scores every node, N+1 positions instead of K+1. That is close to "
            "free while the target is limited by reading its weights (small batches on a GPU) and not free on a "
            "CPU or under load, so the number of nodes is a budget to spend where it pays: Medusa (Cai et al. "
            "2024) uses a fixed tree over its heads' top tokens, SpecInfer (Miao et al. 2023) merges the "
            "guesses of several drafts into one token tree, and EAGLE-2 (Li et al. 2024) grows the tree where "
            "the draft's cumulative confidence is highest and keeps the best N nodes.\n\n"
            "Measured elsewhere: Spec-Bench (Xia et al. 2024), Vicuna-7B on an A100 at greedy decoding, put "
            "EAGLE, which verifies a tree, at 2.29× with 3.61 tokens per step, against 1.49× for a separate "
            "draft model drafting a chain.")
        c = tree_example(source)
        if c is not None:
            if not source.bundled:  # the open trace's own numbers; a bundled example's would read as the open one's
                st.caption(tree_trace_words(source.trace))
            tree_trace.show_tree_figures(source, c, "iv_tree", ("tree",))
            tree_trace.open_in_stepper_button(source, c["cycle"], key="iv_tree_link")


def q_tree_mask(source: tree_trace.TreeSource) -> None:
    with st.expander("What does the tree attention mask look like?"):
        st.markdown(
            "Flatten the tree after the cached prefix: the root (the last committed token), then the nodes level "
            "by level, one position each. A causal mask would let every node see all nodes before it, including "
            "its siblings and cousins, which lie on other branches and are not part of its text. The tree mask "
            "lets the query of node i attend to the whole prefix, to the root, to its own ancestors and to "
            "itself, and to nothing else. Its position id is L + its depth, not its index in the flat sequence: "
            "siblings share a position, each exactly where it would stand in its own chain. In Hugging Face "
            "terms that is a 4D additive mask over the cached and new keys (0 where allowed, −∞ elsewhere) "
            "passed with explicit position ids. One forward pass then gives, for every node, the target's "
            "distribution after the branch that ends in it.")
        c = tree_example(source)
        if c is not None:
            tree_trace.show_tree_figures(source, c, "iv_tree", ("mask",))


def q_tree_rollback(source: tree_trace.TreeSource) -> None:
    with st.expander("How is the KV cache rolled back after a tree cycle?"):
        st.markdown(
            "The verify pass wrote K/V for every node, in node order, after the prefix: node i in slot L+1+i. "
            "Only the accepted path is text now, and its entries are scattered (a path 0 → 3 → 9 sits in slots "
            "L+1, L+4 and L+10), so cutting the tail, the chain's rollback, would keep the wrong ones. The "
            "rollback is a **compaction**: the K/V of the j-th path node move from slot L+1+path[j] to L+1+j, "
            "and the cache length becomes the new committed length minus one; every other node's entry is "
            "discarded. Moving in path order is safe in place, because a path node's index is never smaller "
            "than its place on the path: no move overwrites a slot still to be read.\n"
            "- **Dynamic cache** (growable tensors): gather the kept slots along the sequence dimension into "
            "tensors of the new length.\n"
            "- **Static cache** (a preallocated buffer): copy the kept entries to their slots inside the buffer "
            "and move the write position back; the stale slots behind it stay masked until overwritten.\n"
            "- **Paged cache** (a block table): copy slot to slot through the block table (each slot resolved "
            "to its block and offset), then lower the token count and free the blocks wholly past it.\n\n"
            "The draft's cache keeps the prefix, the root and the path nodes it holds, compacted the same way; "
            "the accepted tokens it never read are then fed to it (the catch-up). Medusa and EAGLE copy the "
            "selected K/V into the contiguous positions; SGLang at page size 1 frees the rejected slots instead.")
        c = tree_example(source)
        if c is not None:
            tree_trace.show_tree_figures(source, c, "iv_tree", ("compaction",))
