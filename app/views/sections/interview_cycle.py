"""Interview questions on the cycle itself: why the output is exactly the target's, why the verify
scores K+1 positions (with its cost measured on request), what happens to rejected K/V, the draft's
catch-up, and how paged caches roll back. Each answer shows a cycle of the open trace.
"""
import streamlit as st

from app.figures import derive
from app.figures.caches import cache_figure
from app.figures.cycle import cycle_figure
from app.figures.teaching import cache_layouts_figure, forward_cost_figure
from app.runs import teaching_pair
from app.ui.pages import EXACTNESS_LAB, ROLLBACK_DEMO, WALKTHROUGH
from app.ui.widgets import chart, open_in_stepper
from app.views.sections.interview_live import find_cycle, measured, needs_trace, timings
from engine.cycle.pair import Pair
from engine.run import encode_prompt
from engine.stats.repeats import MAX_SPREAD, Repeated, untrustworthy_widths, width_cost_ratio
from engine.trace import Trace
from engine.trace.schema import EAGLE


def q_exactness(trace: Trace | None) -> None:
    with st.expander("Why is the output exactly the target's distribution, not just close to it?"):
        st.markdown(
            "Look at one position and a token x. It can come out in two ways. **Proposed and kept**: the draft "
            "proposes x with probability p_draft(x) and keeps it with probability min(1, p_target(x)/p_draft(x)); "
            "together that is min(p_draft(x), p_target(x)). **Rejected, then resampled**: the proposal fails "
            "with probability 1 − β, where β = Σ_y min(p_draft(y), p_target(y)), and the residual "
            "max(0, p_target(x) − p_draft(x)) / (1 − β) is drawn. The 1 − β cancels, and "
            "min(p_d, p_t) + max(0, p_t − p_d) = p_t for every x. By induction over positions the whole text is "
            "distributed like the target's. Two conditions matter: the draft token must really be *drawn* from "
            "p_draft (a greedy draft judged as if it were sampled breaks this), and both distributions must be "
            "warped (temperature, top-k, top-p) the same way. Greedy is the limit case: accept while the draft "
            "token equals the target's argmax, and the text equals plain greedy decoding.")
        st.latex(r"P(x) = \min(p_\text{d}, p_\text{t}) + (1-\beta)\,\frac{\max(0, p_\text{t} - p_\text{d})}{1-\beta}"
                 r" = p_\text{t}(x)")
        st.page_link(EXACTNESS_LAB, label="See it: histograms and a chi-square test, correct and broken rules",
                     icon=":material/science:")
        st.page_link(WALKTHROUGH, label="The derivation, step by step", icon=":material/school:")
        c = find_cycle(trace, lambda c: c["rejected_position"] is not None)
        if c is not None:
            open_in_stepper(c["cycle"], 4, key="iv_link_exact", label=f"A resample from the residual: cycle {c['cycle']}")


def q_rejected_cache(trace: Trace | None) -> None:
    with st.expander("What happens to the KV cache entries of rejected positions?"):
        st.markdown(
            "They are removed before the next cycle, in both models. Verification wrote K/V for all K+1 "
            "positions and drafting wrote K/V for the guesses, but only the committed prefix may stay: "
            "attention reads every cell in the cache, so a left-over cell is a token the model believes is in "
            "the text. How 'removed' is implemented depends on the cache layout (see the paged-cache question): "
            "slicing a tensor, moving a length pointer, or handing slots back. After a full accept the draft "
            "is one entry *short* instead, and is fed its last guess (the catch-up).")
        c = find_cycle(trace, lambda c: c["rejected_position"] is not None)
        if c is None:
            needs_trace()
            return
        chart(cache_figure(c, 5, derive.sequence_texts(trace, c), trace.drafter_kind, derive.own_prompt(trace)),
              key="iv_cache")
        open_in_stepper(c["cycle"], 5, key="iv_link_cache")
        st.page_link(ROLLBACK_DEMO, label="Watch what goes wrong if they stay", icon=":material/bug_report:")


def q_k_plus_one(trace: Trace | None) -> None:
    with st.expander("Why does verification score K+1 positions, not K?"):
        st.markdown(
            "The target is fed the last committed token plus the K guesses. Output 1 (after the last committed "
            "token) judges guess 1, output i judges guess i, and output K+1, after the last guess, is a "
            "prediction nobody has used yet. If every guess passes, a bonus token is drawn from it; if one "
            "fails, the output at that position supplies the residual. Either way a cycle commits at least one "
            "token, so speculation never makes less progress per target pass than plain decoding, and at best "
            "K+1. On a GPU at small batch the extra positions cost almost nothing, because the pass is limited "
            "by reading the weights, not by the number of positions; measure what they cost here below.")
        c = find_cycle(trace, lambda c: c["rejected_position"] is None)
        if c is not None:
            chart(cycle_figure(c, derive.proposals(c), 4), key="iv_bonus")
            open_in_stepper(c["cycle"], 4, key="iv_link_bonus")
        k = trace.k if trace else 4

        def measure(choice: teaching_pair.PairChoice, pair: Pair) -> list[Repeated] | None:
            prefix = encode_prompt(pair.target.tokenizer, choice.prompt, choice.chat)  # worker thread: no st.*
            return timings(pair, prefix, k) if prefix else None

        result = measured("cost", f"Measure the target's pass over 1..{k + 1} positions now", measure)
        if result is not None and result[1]:
            label, times = result
            chart(forward_cost_figure(times, label.split(":")[0]), key="iv_cost")
            st.markdown(verify_cost_words(times, min(k, len(times) - 1)))


def verify_cost_words(times: list[Repeated], k: int) -> str:
    """What the verify-cost chart says, in words, or why it says nothing."""
    shaky = untrustworthy_widths(times)
    if shaky:
        return (f"The repeats disagree by more than {MAX_SPREAD:.0%} at width(s) {', '.join(map(str, shaky))}: "
                "the machine is busy, so those bars (hatched) are not a measurement. Measure again later.")
    ratio = width_cost_ratio(times, k + 1)
    if ratio <= 1.3:
        return (f"Here scoring {k + 1} positions costs {ratio:.2f}× one position: the extra positions are "
                "nearly free, as the answer says.")
    return (f"Here scoring {k + 1} positions costs {ratio:.2f}× one position: on this CPU the extra positions "
            "are **not** free. A small model on a CPU is limited by arithmetic, not by reading its weights, so "
            "the answer's 'almost nothing' holds on a GPU at small batch, not here; that is one reason "
            "speculation gains less on a CPU.")


def q_catch_up(trace: Trace | None) -> None:
    with st.expander("Why is the last draft token fed back into the draft after a full accept?"):
        st.markdown(
            "The draft computed K/V for each token it *read*, and it read the last committed token and its "
            "first K−1 guesses; its K-th guess was only *produced*. When all K pass, that guess is committed but "
            "absent from the draft's cache. Feeding it now (gpt-fast does it at once; others fold it into the "
            "next draft step) keeps the draft's cache aligned with the text. Forgetting it does not break "
            "exactness, since the target decides, but the draft guesses from a text with a hole in it and "
            "acceptance drops.")
        c = find_cycle(trace, lambda c: c["draft_catch_up"])
        if c is None and trace is None:
            needs_trace()
            return
        if c is None:
            st.caption("No cycle of the open trace needed a catch-up.")
            return
        if trace.drafter_kind == EAGLE:
            st.caption("The open trace drafts with an EAGLE head, whose catch-up is wider: it keeps only cache "
                       "entries built on the target's true features, so after any accepted token it drops the "
                       "entries its later draft steps built on its own predicted features and feeds the accepted "
                       "tokens again with the target's features from the verify pass.")
        chart(cache_figure(c, 5, derive.sequence_texts(trace, c), trace.drafter_kind, derive.own_prompt(trace)),
              key="iv_catch_up")
        open_in_stepper(c["cycle"], 5, key="iv_link_catch_up")


def q_paged(trace: Trace | None) -> None:
    with st.expander("How do paged KV caches roll back?"):
        st.markdown(
            "Rolling back always means 'the cache is now N entries long'; what that costs depends on the layout.\n"
            "- **Contiguous growable tensors** (Hugging Face `DynamicCache`): `crop` slices the tail off every "
            "layer's tensors.\n"
            "- **Static preallocated buffer** (gpt-fast, Hugging Face `StaticCache`): nothing is freed or copied; "
            "the current length (the position pointer) moves back. The stale values stay in memory, are masked "
            "out of attention, and are overwritten by the next cycle's writes.\n"
            "- **Paged blocks** (vLLM's PagedAttention): a request owns a table of fixed-size blocks. vLLM moves "
            "the request's count of computed tokens (`num_computed_tokens`) back, and the rejected slots are "
            "simply overwritten later. SGLang hands the rejected slots back to its allocator. Either way a "
            "block (page) can only go back to the pool once *all* its slots are rolled back; a partly used "
            "block stays with the request.")
        c = find_cycle(trace, lambda c: c["rejected_position"] is not None and c["num_accepted"] < trace.k - 1)
        c = c or find_cycle(trace, lambda c: c["rejected_position"] is not None)
        if c is None:
            needs_trace()
            return
        block = st.select_slider("Block size", [2, 4, 8, 16], 4, key="iv_block")
        t = c["target_cache_len"]
        chart(cache_layouts_figure(t["before"], t["after_append"], t["after_rollback"], block), key="iv_layouts")
        st.caption(f"The target cache of cycle {c['cycle']} of the open trace: {t['after_append']} → "
                   f"{t['after_rollback']} entries.")
        open_in_stepper(c["cycle"], 5, key="iv_link_paged")
        st.caption("To watch a real block table: open the example trace `shakespeare-cache-paged.jsonl` (or run "
                   "with `--cache paged --block-size 4`); stages 2 and 5 of the stepper draw its blocks, the "
                   "blocks each cycle allocates and the ones it returns to the free list.")
