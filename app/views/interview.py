"""Interview practice: questions with hidden answers, each tied to live data."""

import streamlit as st

from app.figures import cycle as figures
from app.figures import derive
from app.figures import tree as tree_figures
from app.figures.teaching import acceptance_length_figure, cache_layouts_figure, forward_cost_figure, speedup_figure
from app.runs import teaching_pair
from app.ui import jobs, state, tree_trace
from app.ui.live_work import one_torch_thread
from app.ui.pages import EXACTNESS_LAB, ROLLBACK_DEMO, STATISTICS, STEPPER, WALKTHROUGH
from app.ui.safe import md
from app.ui.widgets import chart, open_in_stepper, stepper_query
from engine.cycle.reference import Pair
from engine.run import encode_prompt
from engine.stats.analysis import DEFINITIONS
from engine.stats.repeats import MAX_SPREAD, Repeated
from engine.teaching.runs import NumericsCheck, batched_vs_stepwise, forward_times, low_precision_copy
from engine.trace import Trace
from engine.trace.metrics import expected_tokens_per_cycle
from engine.trace.schema import EAGLE

LOW_PRECISION_MAX_PARAMS = 50_000_000  # copy the target to bfloat16 only when that is quick

RED_FLAGS = [
    ("Memory is cheap, keep the rejected K/V.",
     "It is not about memory: the next pass would attend to tokens that are not in the text, at shifted "
     "positions. The output stops being the target's (see the rollback demo)."),
    ("Accept a draft token when the target would have sampled the same one.",
     "That keeps a token with probability p_target instead of min(1, p_target/p_draft), and the output "
     "distribution moves (see the exactness lab)."),
    ("After a rejection, just sample from the target again.",
     "Tokens the draft already had a chance to offer get counted twice; only the residual max(0, p_target − p_draft) is exact."),
    ("Speculation changes the output a little; that is the price of the speed.",
     "With the ratio test and the residual the output distribution is exactly the target's. Any measurable "
     "shift is a bug (or floating-point near-ties in greedy mode)."),
    ("Apply temperature and top-p to the target only.",
     "The test compares the two distributions actually sampled from; both must be warped the same way."),
    ("A bigger K is always faster.",
     "Acceptance decays with position and every extra guess costs a draft step; the speedup peaks and falls."),
    ("Acceptance rate and acceptance length are the same number.",
     "One is accepted/drafted (at most 1), the other is tokens per cycle (between 1 and K+1)."),
    ("Any small model can draft for any large one.",
     "Only if token ids mean the same strings, or with an explicit translation between vocabularies."),
]


# ---------------------------------------------------------------- picking cycles of the open trace

def find_cycle(trace: Trace | None, wanted) -> dict | None:
    return next((c for c in trace.cycles if wanted(c)), None) if trace else None


def needs_trace() -> None:
    st.caption("Open a trace (**Choose a trace**) to see this on real cycles.")


def trace_c() -> float | None:
    """The open trace's c, as Statistics and speed shows it (engine/stats/analysis.py); None
    without a step-time calibration."""
    stats = state.current_stats()
    return stats.speed.c if stats is not None and stats.speed is not None else None


# ---------------------------------------------------------------- live measurements (on request)

MEASURED = "iv_measured"  # session_state: {name: result} of the measurements made on request


def timings(pair: Pair, prefix: list[int], k: int) -> list[Repeated]:
    with one_torch_thread():
        return forward_times(pair.target, prefix, k + 1)


def numerics(pair: Pair, ids: list[int], positions: int) -> list[NumericsCheck]:
    checks = [batched_vs_stepwise(pair.target, ids, positions)]
    if sum(p.numel() for p in pair.target.model.parameters()) <= LOW_PRECISION_MAX_PARAMS:
        checks.append(batched_vs_stepwise(low_precision_copy(pair.target), ids, positions))
    return checks


def live_pair() -> tuple[teaching_pair.PairChoice, Pair] | None:
    """The first available teaching pair, loaded once; None if there is none."""
    options = teaching_pair.choices()
    if not options:
        st.caption("No model pair is available for the live measurement on this machine.")
        return None
    pair = teaching_pair.load(options[0])
    return (options[0], pair) if pair else None


def measured(name: str, label: str, measure) -> object | None:
    """A result measured in this session, or a button that measures it now on a worker thread
    (nothing runs on open): `measure(choice, pair)` runs there and its result is kept by name."""
    found = st.session_state.get(MEASURED, {})
    if name not in found:
        if st.button(label, key=f"iv_measure_{name}", icon=":material/timer:"):
            live = live_pair()
            if live is not None:
                choice, pair = live
                jobs.start(f"interview:{name}", f"{label.removesuffix(' now')} on {choice.key}",
                           lambda report: measure(choice, pair), lambda result: keep_measured(name, choice.label, result),
                           alone=True)
        jobs.show(f"interview:{name}")
    return st.session_state.get(MEASURED, {}).get(name)


def keep_measured(name: str, pair_label: str, result) -> None:
    st.session_state.setdefault(MEASURED, {})[name] = (pair_label, result)


def verify_cost_words(times: list[Repeated], k: int) -> str:
    """What the verify-cost chart says, in words, or why it says nothing."""
    shaky = [n for n, t in enumerate(times, start=1) if not t.trustworthy]
    if shaky:
        return (f"The repeats disagree by more than {MAX_SPREAD:.0%} at width(s) {', '.join(map(str, shaky))}: "
                "the machine is busy, so those bars (hatched) are not a measurement. Measure again later.")
    ratio = times[k].median_s / times[0].median_s
    if ratio <= 1.3:
        return (f"Here scoring {k + 1} positions costs {ratio:.2f}× one position: the extra positions are "
                "nearly free, as the answer says.")
    return (f"Here scoring {k + 1} positions costs {ratio:.2f}× one position: on this CPU the extra positions "
            "are **not** free. A small model on a CPU is limited by arithmetic, not by reading its weights, so "
            "the answer's 'almost nothing' holds on a GPU at small batch, not here; that is one reason "
            "speculation gains less on a CPU.")


# ---------------------------------------------------------------- the questions

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
        chart(figures.cache_figure(c, 5, derive.sequence_texts(trace, c), trace.drafter_kind), key="iv_cache")
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
            chart(figures.cycle_figure(c, derive.proposals(c), 4), key="iv_bonus")
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


TOKENIZER_TRACE = "shakespeare-other-tokenizer-greedy-k6.jsonl"  # in assets/traces


def open_bundled(name: str) -> None:
    """Open a bundled trace at its first cycle, stage 1 (where the proposals' origin is shown)."""
    if state.set_current(state.TraceRef("bundled", name), 0, 1) is None:
        st.session_state["_iv_switch_to_stepper"] = True
    else:
        st.session_state["_iv_open_failed"] = True


def q_tokenizers(trace: Trace | None) -> None:
    if st.session_state.pop("_iv_switch_to_stepper", False):
        st.switch_page(STEPPER, query_params=stepper_query(0, 1))
    with st.expander("What changes if the draft and target use different tokenizers?"):
        st.markdown(
            "The acceptance test compares two probabilities of *the same token id*. If the id means different "
            "strings to the two models, the ratio compares unrelated events and the exactness argument falls "
            "apart; even the guesses cannot be fed to the target as they are. This engine refuses such a pair "
            "as a plain draft model (it compares both vocabularies and special tokens), and offers the "
            "other-tokenizer drafter instead (`--drafter other-tokenizer`). Systems handle it in a few ways:\n"
            "- **Require one vocabulary.** Most serving engines do; draft heads such as Medusa or EAGLE are "
            "built on the target's own embeddings and vocabulary.\n"
            "- **Draft over a subset of the target's ids.** The draft's output layer covers only frequent "
            "tokens and a table maps its rows to target ids; tokens outside the subset just get probability 0 "
            "in the draft, which the residual covers. This project's chat draft does this (`draft_vocab.json`).\n"
            "- **Translate through text.** Hugging Face's universal assisted generation decodes the draft's "
            "guesses to text and re-encodes them with the target's tokenizer, re-tokenizing a small window "
            "so token boundaries line up. Exact probability ratios need extra care there (a later variant "
            "restricts sampling to tokens both vocabularies share).\n\n"
            "This project's other-tokenizer drafter translates through text: a Shakespeare draft with its own "
            "2048-token BPE proposes for the byte-level Shakespeare target, so one draft token becomes several "
            "target bytes. Greedy only: it refuses sampling, because the draft gives no probability for each "
            "target token and the ratio test would compare unrelated events.")
        st.button("Open the bundled other-tokenizer trace in the stepper", key="iv_tokenizer_trace",
                  icon=":material/play_circle:", on_click=open_bundled, args=(TOKENIZER_TRACE,))
        if st.session_state.pop("_iv_open_failed", None):
            st.warning(f"The bundled trace {TOKENIZER_TRACE} could not be opened.")
        if trace is not None:
            t, d = trace.header["target"], trace.header["draft"]  # dicts; every entry in them is optional
            kept = f", draft output layer covers {d['kept_vocab']} of them" if d.get("kept_vocab") else ""
            vocab = f"{t['vocab_size']} token ids" if t.get("vocab_size") else "a vocabulary the trace does not size"
            st.caption(f"Open trace: both models use the {md(str(trace.header.get('tokenizer', 'same')))} tokenizer, "
                       f"{md(vocab)}{md(kept)}.")


def numerics_table(checks: list[NumericsCheck]) -> list[dict]:
    return [{"dtype": c.dtype, "positions": c.positions, "max |logit difference|": f"{c.max_abs_logit_diff:.2e}",
             "closest top-2 gap (logits)": f"{c.smallest_top2_gap:.3g}", "greedy picks that differ": c.argmax_flips}
            for c in checks]


def numerics_words(checks: list[NumericsCheck]) -> str:
    """Say what the table shows, including when it goes against the usual expectation."""
    f32 = next((c for c in checks if c.dtype == "float32"), None)
    low = next((c for c in checks if c.dtype != "float32"), None)
    if f32 is None or low is None:
        return ""
    if low.max_abs_logit_diff > f32.max_abs_logit_diff:
        return (f"As expected, {low.dtype} differs more ({low.max_abs_logit_diff:.1e}) than float32 "
                f"({f32.max_abs_logit_diff:.1e}).")
    return (f"Here {low.dtype} happened to give **identical or closer** results ({low.max_abs_logit_diff:.1e}) "
            f"than float32 ({f32.max_abs_logit_diff:.1e}): whether the two ways differ depends on the kernels "
            "this machine picks for each shape, not on the precision alone. On GPUs, where batched and single "
            "rows use different kernels, lower precision usually differs more.")


def closest_tie(trace: Trace) -> tuple[float, int] | None:
    """Smallest gap between the target's two most likely tokens anywhere in the trace."""
    gaps = [(row[0]["p"] - row[1]["p"], c["cycle"]) for c in trace.cycles for row in c["target_top"] if len(row) > 1]
    return min(gaps) if gaps else None


def q_greedy_numerics(trace: Trace | None) -> None:
    with st.expander("Why can greedy output change when speculation is switched on?"):
        st.markdown(
            "On paper it cannot: greedy speculation keeps a guess only if it is the target's argmax, so the text "
            "equals plain greedy decoding. In floating point, the verification pass computes K+1 positions in one "
            "batched matrix product while plain decoding computes one at a time. Different shapes pick different "
            "kernels and sum in a different order, so logits differ in the last bits (more in bfloat16 than in "
            "float32, and more again when a server batches requests differently). Where the top two tokens are "
            "nearly tied, that is enough to flip the argmax, and from there the two texts continue differently. "
            "Neither is wrong; both are the target's greedy text up to rounding. The same effect is why a draft "
            "identical to the target does not always reach 100% acceptance.")
        def measure(choice: teaching_pair.PairChoice, pair: Pair) -> list[NumericsCheck] | None:
            ids = encode_prompt(pair.target.tokenizer, choice.prompt * 3, choice.chat)  # worker thread: no st.*
            return numerics(pair, ids, min(5, len(ids) - 1)) if ids and len(ids) > 5 else None

        result = measured("numerics", "Compare step-by-step and batched logits now", measure)
        if result is not None and result[1]:
            label, checks = result
            st.caption(f"Measured now on {md(label)}: the last positions of the prompt scored step by step "
                       "and in one pass.")
            st.dataframe(numerics_table(checks), hide_index=True, key="iv_numerics")
            st.markdown(numerics_words(checks))
        if trace is not None and (tie := closest_tie(trace)):
            st.caption(f"Closest near-tie in the open trace: the target's top two tokens {tie[0]:.2e} apart "
                       f"(cycle {tie[1]}). Ties that close are where greedy texts part.")


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


def q_payoff(trace: Trace | None) -> None:
    with st.expander("When does speculation stop paying off?"):
        st.markdown(
            "Let α be the chance a guess is accepted and c the time of a draft step divided by the time of a "
            "target step. Per cycle we pay K draft steps plus one target pass and commit on average "
            "(1−α^(K+1))/(1−α) tokens. With K=1 that is a win exactly when α > c, and no larger K helps when "
            "K=1 does not (the extra guesses are accepted less often than the first). Speculation also stops "
            "paying when the target pass over K+1 positions no longer costs one step: at large batch sizes "
            "the GPU is already busy computing, and the 'free' positions cost real time.")
        st.latex(r"\text{speedup}(K) = \frac{1-\alpha^{K+1}}{(1-\alpha)(Kc+1)}, \qquad"
                 r"\text{speedup}(1) > 1 \iff \alpha > c")
        if trace is None:
            needs_trace()
            return
        alpha, c = state.current_stats().alpha, trace_c()
        c = st.slider("c (draft step / target step)", 0.0, 1.0, round(min(c, 1.0), 2) if c is not None else 0.3, 0.01,
                      key="iv_c", help=f"Starts at this trace's c: {DEFINITIONS['c']}" if c is not None else
                      "This trace has no step-time calibration, so no c of its own; 0.3 to start.")
        chart(speedup_figure(alpha, c, 12, trace.k), key="iv_speedup")


def q_acceptance_length(trace: Trace | None) -> None:
    with st.expander("What does 'acceptance length' mean?"):
        st.markdown(
            "The mean number of tokens a cycle commits: accepted guesses plus the one resampled or bonus token, "
            "so it lies between 1 and K+1 (vLLM reports it as 1 + accepted / number of drafts). It is the "
            "number of tokens you get per target pass, which is why it predicts the speedup better than the "
            "acceptance *rate* (accepted / drafted). Under independent acceptance with rate α it is "
            "(1−α^(K+1))/(1−α).")
        if trace is None:
            needs_trace()
            return
        per_cycle = [c["num_accepted"] + 1 for c in trace.cycles]
        stats = state.current_stats()
        m, alpha = stats.acceptance, stats.alpha
        st.caption(f"Open trace: acceptance rate {m['acceptance_rate']:.3f}, mean acceptance length "
                   f"{m['mean_acceptance_length']:.3f}, i.i.d. prediction from α={alpha:.3f}: "
                   f"{expected_tokens_per_cycle(alpha, trace.k):.3f}. The prediction assumes every guess is "
                   f"accepted independently with the same chance; real acceptance comes in streaks (easy and "
                   f"hard stretches of text), so the two differ.")
        chart(acceptance_length_figure(per_cycle, trace.k, alpha), key="iv_length")


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
        if c is None:
            needs_trace() if trace is None else st.caption("No cycle of the open trace needed a catch-up.")
            return
        if trace.drafter_kind == EAGLE:
            st.caption("The open trace drafts with an EAGLE head, whose catch-up is wider: it keeps only cache "
                       "entries built on the target's true features, so after any accepted token it drops the "
                       "entries its later draft steps built on its own predicted features and feeds the accepted "
                       "tokens again with the target's features from the verify pass.")
        chart(figures.cache_figure(c, 5, derive.sequence_texts(trace, c), trace.drafter_kind), key="iv_catch_up")
        open_in_stepper(c["cycle"], 5, key="iv_link_catch_up")


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


def q_pick_k(trace: Trace | None) -> None:
    with st.expander("How do you pick K?"):
        st.markdown(
            "Measure, then predict, then measure again. (1) Measure α, the acceptance per drafted token, on "
            "text like your traffic, and c, the time of a draft step over a target step, on your hardware. "
            "(2) The expected speedup (1−α^(K+1)) / ((1−α)(Kc+1)) rises while an extra guess is still likely to "
            "be accepted and falls once its draft step costs more than it brings: the best K grows with α and "
            "shrinks with c. With K=1 speculation pays only if α > c. (3) Refine the verify cost: scoring K+1 "
            "positions costs about one step on a GPU at small batch, more on a CPU or a busy GPU. (4) Run a K "
            "sweep and keep the measured best; acceptance varies with the text (real acceptance comes in "
            "streaks), which is why engines adapt K per request or per step (EAGLE-2's dynamic trees, Hugging "
            "Face's adaptive schedule).")
        st.page_link(STATISTICS, label="This trace's K advisor and a live K sweep", icon=":material/monitoring:")
        if trace is not None:
            c = trace_c()
            st.caption(f"Open trace: α = {state.current_stats().alpha:.3f}, "
                       f"c = {'not calibrated' if c is None else format(c, '.3f')}, K = {trace.k}. The payoff question "
                       "below has a chart of the predicted speedup against K for these numbers.")


# ---------------------------------------------------------------- draft trees

def tree_example(source: tree_trace.TreeSource) -> dict | None:
    """The tree cycle the tree answers show, or None (with the note saying why there is none)."""
    if source.trace is None:
        st.caption(source.note)
        return None
    return source.trace.cycles[tree_figures.teaching_tree_cycle(source.trace.cycles)]


def tree_trace_words(trace) -> str:
    """What the tree trace's own cycles committed: measured in it, not claimed."""
    cycles = trace.cycles
    per_cycle = sum(len(c["committed_token_ids"]) for c in cycles) / len(cycles)
    nodes = sum(len(c["tree"]["nodes"]) for c in cycles) / len(cycles)
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


def main() -> None:
    st.title("Interview practice")
    st.markdown(
        "Answer each question out loud first, then open it. Every answer points at live data: a cycle of the "
        "open trace (with a link into the stepper) or a measurement made now on a real model.")
    trace = state.current_trace()
    trace = trace if trace is not None and trace.cycles else None
    if trace is not None and tree_figures.is_tree_header(trace.header):
        trace = None  # the chain questions read a chain's per-position fields; the tree questions use it below
    q_exactness(trace)
    q_pick_k(trace)
    q_rejected_cache(trace)
    q_k_plus_one(trace)
    q_tokenizers(trace)
    q_greedy_numerics(trace)
    q_paged(trace)
    q_payoff(trace)
    q_acceptance_length(trace)
    q_catch_up(trace)
    source = tree_trace.teaching_tree_trace()
    q_why_tree(source)
    q_tree_mask(source)
    q_tree_rollback(source)
    st.subheader("Red flags")
    st.markdown("Things that sound reasonable in an interview and are wrong:")
    for claim, why in RED_FLAGS:
        st.markdown(f"- *“{claim}”* {why}")
    st.page_link(EXACTNESS_LAB, label="Test the sampling claims yourself", icon=":material/science:")


main()
