"""Concept walkthrough: one cycle of a real trace, stage by stage, with the formulas."""
import streamlit as st

from app.figures import derive
from app.figures import layouts as figures_layouts
from app.figures.acceptance import WALKTHROUGH_COLUMNS, acceptance_figure, position_rows, resample_figure
from app.figures.caches import cache_figure
from app.figures.cycle import cycle_figure
from app.figures.derive import quoted
from app.figures.explain import stage_caption
from app.figures.tree import root_text
from app.figures.tree_captions import teaching_tree_cycle, tree_summary, tried_rows
from app.figures.tree_record import is_tree_header
from app.runs import live, teaching_pair
from app.ui import jobs, operator, state, tree_trace
from app.ui.first_result import first_result
from app.ui.names import model_label, models_help
from app.ui.pages import EXACTNESS_LAB, ROLLBACK_DEMO
from app.ui.safe import markdown_table, md, table
from app.ui.widgets import chart, open_in_stepper
from engine.config import SpecSettings
from engine.stats.analysis import (
    Calibration,
    drafted_positions,
    extra_position_in_steps,
    median_draft_step_s,
    verify_in_steps,
)
from engine.trace import Trace
from engine.trace.schema import DRAFT_MODEL, FEATURE_HEADS

CITATIONS = (
    "Leviathan, Kalman and Matias (2023), *Fast Inference from Transformers via Speculative Decoding*, ICML 2023.  \n"
    "Chen, Borgeaud, Irving, Lespiau, Sifre and Jumper (2023), *Accelerating Large Language Model Decoding "
    "with Speculative Sampling*, arXiv:2302.01318.")


TREE_CITATIONS = (
    "Miao et al. (2023), *SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative "
    "Inference and Verification* (token trees verified in one pass).  \n"
    "Cai et al. (2024), *Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads* "
    "(a fixed tree over several heads' top tokens).  \n"
    "Li et al. (2024), *EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees* (the tree grown "
    "where the draft is confident).  \n"
    "Xia et al. (2024), *Unlocking Efficiency in Large Language Model Inference: A Comprehensive Survey of "
    "Speculative Decoding* (Spec-Bench).")


# ---------------------------------------------------------------- choosing the cycle

def describe(c: dict, k: int) -> str:
    if c["rejected_position"] is None:
        return f"cycle {c['cycle']}: all {k} accepted + bonus"
    return f"cycle {c['cycle']}: {c['num_accepted']} accepted, rejected at {c['rejected_position']}"


def teaching_cycle(trace: Trace) -> int:
    """The most instructive cycle: some drafts accepted and then a rejection, else any rejection."""
    k = trace.k
    for wanted in (lambda c: 0 < c["num_accepted"] < k, lambda c: c["num_accepted"] < k):
        for c in trace.cycles:
            if wanted(c):
                return c["cycle"]
    return 0


def other_kind(trace: Trace, c: dict) -> dict | None:
    """A cycle that ended the other way (bonus vs resample), to link to."""
    full = c["rejected_position"] is None
    return next((o for o in trace.cycles if (o["rejected_position"] is None) != full), None)


def q(text: str) -> str:
    """A token quoted for Markdown: whitespace visible, everything escaped."""
    return md(quoted(text))


def in_brief(trace: Trace, c: dict) -> str:
    """The chosen cycle's outcome in one line of Markdown, above the five stages (app/ui/first_result.py)."""
    k = derive.proposals(c)
    greedy = trace.header["settings"]["temperature"] == 0
    proposed = ", ".join(q(t) for t in c["draft_token_texts"])
    j, n = c["rejected_position"], c["num_accepted"]
    text = f"**Cycle {c['cycle']} in brief:** "
    if k == 0:  # prompt lookup without a match: a plain target step
        text += f"nothing was proposed, so the target's own token {q(c['next_token_text'])} was taken"
    elif j is None:
        text += f"the draft proposed {proposed}; all {k} accepted, then the bonus token {q(c['next_token_text'])}"
    else:
        instead = "the target's argmax" if greedy else "resampled from the residual"
        text += (f"the draft proposed {proposed}; {n} accepted, position {j} ({q(c['draft_token_texts'][j - 1])}) "
                 f"rejected and {q(c['next_token_text'])} ({instead}) taken there")
    text += f": {len(c['committed_token_ids'])} token(s) committed for one target pass"
    t = c["target_cache_len"]
    return text + f"; the target cache went from {t['after_append']} entries (after the verify pass) to {t['after_rollback']}."


# ---------------------------------------------------------------- the five stages

def stage_draft(trace: Trace, c: dict) -> None:
    k = derive.proposals(c)  # K for a draft model; prompt lookup may propose fewer
    st.header("1 · Draft: the small model guesses ahead")
    st.markdown(
        "The draft model is run K times in a row, each time on its own previous guess. At every step it "
        "produces a whole probability distribution over the vocabulary, warped with the same temperature, "
        "top-k and top-p the target will use, and draws one token from it. The engine writes down how likely "
        "the draft found the token it drew, $p_\\text{draft}$. Nothing is final yet: these are proposals.")
    tokens = ", ".join(f"{q(t)} ({p:.3f})" for t, p in zip(c["draft_token_texts"], c["p_draft"]))
    st.markdown(f"In **cycle {c['cycle']}** the draft proposed K={k} tokens (with $p_\\text{{draft}}$): {tokens}.")
    own = derive.own_prompt(trace)  # a draft model that read the prompt without the chat template
    if trace.drafter_kind != DRAFT_MODEL or own is not None:  # prompt lookup / other tokenizer / EAGLE head / own prompt
        st.info(md(stage_caption(c, k, 1, drafter=trace.drafter_kind, own=own, head=trace.header.get("drafter"))),
                icon=":material/lightbulb:")
    st.latex(r"d_i \sim p_\text{draft}(\,\cdot \mid x_{1..n},\, d_1, \dots, d_{i-1}), \qquad i = 1, \dots, K")
    chart(cycle_figure(c, k, 1), key="wt_cycle_1")
    open_in_stepper(c["cycle"], 1, key="wt_link_1")


def stage_verify(trace: Trace, c: dict) -> None:
    k = derive.proposals(c)  # K for a draft model; prompt lookup may propose fewer
    st.header(f"2 · Verify: one target pass over K+1 = {k + 1} positions")
    st.markdown(
        "The target model reads the last committed token followed by the K guesses in **one** forward pass. "
        "A causal model's output at a position depends only on the positions before it, so this single pass "
        "yields exactly what the target would have predicted at each step had it generated the guesses itself: "
        "at position i, its distribution after the first i−1 guesses. The extra (K+1)-th output is its "
        "prediction after all K guesses, which becomes useful in stage 4.")
    st.latex(r"p_\text{target}(\,\cdot \mid x_{1..n},\, d_1, \dots, d_{i-1}), \qquad i = 1, \dots, K+1"
             r"\quad\text{(one forward pass)}")
    st.markdown(
        "**Why this costs about one decoding step.** Producing one token of a large model is limited by "
        "memory, not arithmetic: every weight has to travel from memory to the compute units, and is then "
        "used for a single multiply-add. Scoring K+1 positions moves the same weights once and uses each "
        "K+1 times. Until K+1 approaches the hardware's ratio of arithmetic speed to memory bandwidth "
        "(hundreds of operations per byte on current GPUs), the pass takes roughly as long as one token.")
    verify = c["verify_time_s"]
    draft_step = median_draft_step_s(c)
    step = f"one draft step {draft_step * 1000:.2f} ms (median)" if draft_step is not None else "no draft step"
    st.caption(f"Recorded in this trace for cycle {c['cycle']}: {step}, "
               f"the target's pass over {k + 1} positions {verify * 1000:.2f} ms. "
               + verify_cost_words(state.current_stats().calibration, k + 1))
    chart(cycle_figure(c, k, 2), key="wt_cycle_2")
    open_in_stepper(c["cycle"], 2, key="wt_link_2")


def verify_cost_words(cal: Calibration | None, positions: int) -> str:
    """What verifying cost on the machine that recorded the trace, from its calibration: the
    claim 'about one step' checked against this trace rather than asserted."""
    if cal is None:
        return "This trace has no step-time calibration, so its verify cost cannot be put in target steps."
    here, widest = verify_in_steps(cal, positions), max(cal.verify_positions)
    per_position = extra_position_in_steps(cal)
    verdict = ("about one step, as the argument above says" if here <= 1.2 else
               "more than one step: on this machine the extra positions are not free")
    return (f"On the machine that recorded it, one target step took {cal.target_step_s * 1000:.2f} ms and a pass "
            f"over {positions} positions {here:.2f} steps, {verdict}; over {widest} positions it took "
            f"{verify_in_steps(cal, widest):.2f} steps, each extra position adding about {per_position:.2f} of a "
            "step (Statistics and speed, Cost tab, draws the whole curve).")


def stage_test(trace: Trace, c: dict) -> None:
    k = derive.proposals(c)  # K for a draft model; prompt lookup may propose fewer
    st.header("3 · Test: keep each guess with probability min(1, ratio)")
    st.markdown(
        "The guesses are checked from left to right. For each, draw a uniform number u and keep the guess "
        "if u falls under the ratio of the two models' probabilities. A token the target likes at least as "
        "much as the draft did is always kept; a token the draft was over-confident about is kept only in "
        "proportion. The first failure ends the test: every later guess was built on the token just thrown "
        "away, so those are discarded without being tested.")
    st.latex(r"\text{keep } d_i \iff u_i < \min\!\left(1,\ \frac{p_\text{target}(d_i)}{p_\text{draft}(d_i)}\right),"
             r"\qquad u_i \sim \mathcal{U}[0, 1)")
    greedy = trace.header["settings"]["temperature"] == 0
    if greedy:
        st.info("This trace is greedy (temperature 0): no u is drawn. Both distributions are one-hot, so the ratio "
                "is 1 when the draft token is the target's argmax and 0 otherwise: the test is an argmax check. "
                "Open a sampled trace to see u at work.", icon=":material/info:")
    else:
        table(position_rows(c, k, WALKTHROUGH_COLUMNS))
    chart(acceptance_figure(c, k, 3, greedy), key="wt_accept")
    open_in_stepper(c["cycle"], 3, key="wt_link_3")


def stage_resample(trace: Trace, c: dict) -> None:
    k = derive.proposals(c)  # K for a draft model; prompt lookup may propose fewer
    st.header("4 · Resample at the rejection, or take the bonus token")
    st.markdown(
        "**At a rejection** the replacement is not drawn from the target's distribution but from the "
        "*residual*: the probability the target puts on tokens beyond what the draft already offered, "
        "rescaled to sum to one.")
    st.latex(r"x \sim \frac{\max\bigl(0,\ p_\text{target}(x) - p_\text{draft}(x)\bigr)}"
             r"{\sum_y \max\bigl(0,\ p_\text{target}(y) - p_\text{draft}(y)\bigr)}")
    st.markdown(
        "Why the residual makes the output exact: a token x can come out in two ways. Proposed and kept: "
        "$p_\\text{draft}(x)\\cdot\\min(1, p_\\text{target}(x)/p_\\text{draft}(x)) = \\min(p_\\text{draft}(x), "
        "p_\\text{target}(x))$. Or rejected (probability $1-\\beta$) and then drawn from the residual, whose "
        "normaliser is exactly $1-\\beta$. Adding the two gives back $p_\\text{target}(x)$ for every x.")
    st.latex(r"\beta = \sum_x \min\bigl(p_\text{target}(x), p_\text{draft}(x)\bigr), \qquad"
             r"\min(p_\text{d}, p_\text{t}) + (1-\beta)\,\frac{\max(0, p_\text{t} - p_\text{d})}{1-\beta}"
             r" = p_\text{t}")
    st.markdown(
        "**When all K guesses pass**, the target's (K+1)-th output from stage 2 already is its prediction "
        "after all of them, so one more token is drawn from it for free: the bonus token. A cycle therefore "
        "commits between 1 and K+1 tokens for one target pass.")
    st.latex(r"x_\text{bonus} \sim p_\text{target}(\,\cdot \mid x_{1..n},\, d_1, \dots, d_K)")
    what = (f"resampled {q(c['next_token_text'])} at position {c['rejected_position']}"
            if c["rejected_position"] else f"added the bonus token {q(c['next_token_text'])}")
    st.markdown(f"Cycle {c['cycle']} {what}, committing {len(c['committed_token_ids'])} token(s).")
    chart(resample_figure(c, k), key="wt_resample")
    open_in_stepper(c["cycle"], 4, key="wt_link_4")
    other = other_kind(trace, c)
    if other is not None:
        kind = "the bonus token" if other["rejected_position"] is None else "a resample"
        open_in_stepper(other["cycle"], 4, key="wt_link_4_other",
                        label=f"See {kind} instead: cycle {other['cycle']}, stage 4")


def stage_rollback(trace: Trace, c: dict) -> None:
    st.header("5 · Roll back: forget what was not kept")
    t, d = c["target_cache_len"], c["draft_cache_len"]
    own = derive.own_prompt(trace)  # a draft model that read the prompt without the chat template
    st.markdown(
        "While drafting and verifying, both models stored keys and values (K/V) for every position they "
        "read, including guesses that were just rejected or discarded. The engine now trims both caches "
        "back to the committed text. This project's convention: after each cycle a cache holds every "
        "committed token except the last, which is fed in at the start of the next cycle."
        + (f" In this run the draft read its own rendering of the prompt, without the chat template, so its cache "
           f"holds that prompt ({len(own.token_ids)} tokens) in place of the target's ({own.target_len} tokens)."
           if own is not None else ""))
    if d is None or trace.drafter_kind in FEATURE_HEADS or own is not None:  # no draft cache, a head's rule, an offset
        st.markdown(md(stage_caption(c, derive.proposals(c), 5, drafter=trace.drafter_kind, own=own,
                                     head=trace.header.get("drafter"))))
    else:
        st.markdown(
            f"Cycle {c['cycle']}: the target cache goes {t['after_append']} → {t['after_rollback']} entries, "
            f"the draft cache {d['after_append']} → {d['after_rollback']}."
            + (" The draft never ran on its own last guess (it only proposed it), so that token is fed to the "
               "draft now: the catch-up." if c["draft_catch_up"] else ""))
    st.info(
        "**An everyday picture.** You dictate a letter to a quick assistant who types ahead, guessing your "
        "next few words. You read the screen: the first two guesses are right, the third is not, and you say "
        "the word you meant. The assistant must delete the wrong word *and everything typed after it* before "
        "adding yours. Leaving them in would put words in the letter you never said, and every later guess "
        "would be made from that garbled letter. The KV cache is the assistant's memory of the letter so far.",
        icon=":material/keyboard:")
    chart(cache_figure(c, 5, derive.sequence_texts(trace, c), trace.drafter_kind, own), key="wt_cache")
    name = figures_layouts.layout_of(trace.header)["name"]
    st.markdown(f"**How this run's cache layout does it: {figures_layouts.LAYOUT_WORDS[name]}.** "
                + figures_layouts.ROLLBACK_WORDS[name])
    for i, fig in enumerate(figures_layouts.layout_figures(trace.header, c, 5, derive.sequence_texts(trace, c))):
        chart(fig, key=f"wt_layout_{i}")
    open_in_stepper(c["cycle"], 5, key="wt_link_5")
    st.page_link(ROLLBACK_DEMO, label="What goes wrong without the rollback: run it", icon=":material/bug_report:")


def payoff(trace: Trace) -> None:
    st.header("What one cycle buys")
    st.markdown(
        "If each guess is accepted with probability α independently, a cycle commits on average the "
        "number below, for the price of K draft steps and one target pass. With c the cost of a draft step "
        "relative to a target step, the expected speedup over plain decoding follows.")
    st.latex(r"\mathbb{E}[\text{tokens per cycle}] = \frac{1-\alpha^{K+1}}{1-\alpha}, \qquad"
             r"\text{speedup} = \frac{1-\alpha^{K+1}}{(1-\alpha)(Kc+1)}, \qquad \alpha = \mathbb{E}[\beta]")
    drafted = drafted_positions(trace.cycles)
    stats = state.current_stats()
    if drafted:
        text = f"This trace: α ≈ mean β = {stats.alpha:.3f} over {drafted} drafted positions, K={trace.k}"
        r = stats.speed
        if r is not None:
            text += (f", c = {r.c:.3f}: E[tokens per cycle] = {r.expected_tokens:.2f} (measured: "
                     f"{stats.acceptance['mean_acceptance_length']:.2f}) and a predicted {r.leviathan:.2f}× "
                     f"against a measured {r.measured:.2f}×")
        st.caption(text + ".")
    st.page_link(EXACTNESS_LAB, label="Check the exactness claim by sampling", icon=":material/science:")
    st.markdown("**Sources.**  \n" + CITATIONS)


# ---------------------------------------------------------------- a tree cycle (draft trees)

def tree_cycle_choice(trace: Trace) -> dict:
    """The tree cycle to show: the most instructive one preselected, any other on request."""
    cycles = trace.cycles
    index = st.selectbox("Tree cycle to walk through", list(range(len(cycles))), key="wt_tree_cycle",
                         index=teaching_tree_cycle(cycles),
                         format_func=lambda i: f"cycle {i}: {tree_summary(cycles[i])}")
    return cycles[index]


def tree_section() -> None:
    """One cycle of a tree trace (the open one, else the bundled one) with the tree, its mask and the compaction."""
    st.header("A tree cycle: several candidates per position")
    st.markdown(
        "A chain bets on one guess per position, so the first miss ends the cycle. A **tree** hedges: at each "
        "position the draft offers its few most likely tokens, each of those gets candidates of its own, and the "
        "target checks the whole tree in one forward pass. The walk from the root then follows the branch the "
        "target agrees with. A weak draft whose top guess often fails still gets long accepted prefixes, because "
        "its second or third guess is often right; the price is a wider verify pass (every node is a position).")
    source = tree_trace.teaching_tree_trace()
    if source.trace is None:
        st.info(md(source.note), icon=":material/account_tree:")
        st.markdown("**Sources.**  \n" + TREE_CITATIONS)
        return
    c = tree_cycle_choice(source.trace)
    root = root_text(source.trace, c)
    st.markdown(f"From {md(source.note)}, cycle {c['cycle']}: {md(tree_summary(c, root))}.")
    st.markdown(
        "**The walk.** Start at the root with r, the target's distribution after the root. Try its children in "
        "order: accept a child t when u < r[t] for a fresh uniform u. On a rejection set r[t] to 0, renormalise "
        "r and try the next sibling. After an accept, move to that child and start again with the target's "
        "distribution after it. Each child is a one-hot proposal, so this is the speculative sampling rule "
        "applied round after round, and the text is still distributed exactly as the target's. When every "
        "child was rejected the next token is drawn from what is left of r (the residual); when the walk "
        "reaches a node without children, from the target's full distribution there (the bonus).")
    tree_trace.show_tree_figures(source, c, "wt_tree", ("tree",))
    st.caption("The walk, try by try:")
    st.markdown(markdown_table(tried_rows(c)))
    st.markdown(
        "**The attention mask.** The verify pass reads the root and all nodes as one flat sequence, so a mask "
        "must stop a node from seeing the nodes of other branches: node i attends to the prefix, its ancestors "
        "and itself. Its position id is L plus its depth, not its place in the flat sequence, so each node sees "
        "exactly what it would see at the end of its own chain.")
    tree_trace.show_tree_figures(source, c, "wt_tree", ("mask",))
    st.markdown(
        "**The rollback is a compaction.** The verify wrote K/V for every node in node order, so the accepted "
        "path's entries are scattered among rejected ones and cutting the tail would keep the wrong ones. The "
        "path's K/V are moved next to the prefix, in order, and everything after them is discarded.")
    tree_trace.show_tree_figures(source, c, "wt_tree", ("compaction",))
    tree_trace.open_in_stepper_button(source, c["cycle"], key="wt_tree_link")
    st.markdown("**Sources.**  \n" + TREE_CITATIONS)


# ---------------------------------------------------------------- no trace: make one

MAKE_JOB = "walkthrough-run"  # the job name of "Make a trace"
MADE_ERROR = "wt_made_error"  # session_state: why the trace just made could not be opened


def make_trace() -> None:
    if operator.read_only():  # nothing live here: a bundled or uploaded trace
        st.info("No trace is open: open one on **Choose a trace**.", icon=":material/folder_open:")
        return
    st.info("No trace is open. Make a short one now with a real model pair (a few seconds), or open one "
            "on **Choose a trace**.", icon=":material/folder_open:")
    if st.session_state.get(MADE_ERROR):
        st.error(f"The trace was made but could not be opened: {md(st.session_state[MADE_ERROR])}",
                 icon=":material/error:")
    picked = teaching_pair.pick("wt")
    if picked is None:
        return
    choice, pair = picked
    prompt = st.text_input("Prompt", choice.prompt, key="wt_prompt")
    if st.button("Make a trace", key="wt_make", type="primary"):
        settings = SpecSettings(k=4, temperature=1.0, max_new_tokens=32, seed=0)
        live.start_run(MAKE_JOB, "Running speculative decoding", pair, prompt, settings, choice.preset,
                       choice.chat, keep_made, stem="walkthrough", calibrate=False)
    jobs.show(MAKE_JOB, live.show_output)


def keep_made(result: live.LiveOutput) -> None:
    """On the script thread: open the trace just made; the rerun then walks through it."""
    st.session_state[MADE_ERROR] = state.set_current(state.TraceRef("run", result.file))


def main() -> None:
    st.title("How one speculative cycle works")
    st.markdown(
        "A language model writes one token per forward pass, and for a large model each pass is slow. "
        "Speculative decoding lets a small **draft** model guess a few tokens ahead and has the large "
        "**target** model check all the guesses in a single pass. The checking rule is built so that the "
        "text that comes out is distributed *exactly* as if the target had written it alone. Below is one "
        "cycle of a real run, stage by stage; every number comes from the open trace.")
    trace = state.current_trace()
    if trace is None or not trace.cycles:
        make_trace()
        return
    if is_tree_header(trace.header):  # the five stages below are a chain's: show the tree cycle
        st.info("The open trace drafts a **tree**, not a chain: its cycles are walked through below. Open a "
                "chain trace on **Choose a trace** for the five stages of a chain cycle.", icon=":material/account_tree:")
        tree_section()
        return
    options = [c["cycle"] for c in trace.cycles]
    cycle = st.selectbox("Cycle to walk through", options, index=teaching_cycle(trace), key="wt_cycle",
                         format_func=lambda i: describe(trace.cycles[i], derive.proposals(trace.cycles[i])))
    c = trace.cycles[cycle]
    h = trace.header
    st.caption(f"Trace: target **{md(model_label(h, 'target').label)}**, draft **{md(model_label(h, 'draft').label)}**, "
               f"K={trace.k}, temperature {h['settings']['temperature']}.", help=md(models_help(h)))
    first_result().markdown(in_brief(trace, c))
    for stage in (stage_draft, stage_verify, stage_test, stage_resample, stage_rollback):
        stage(trace, c)
        st.divider()
    payoff(trace)
    st.divider()
    tree_section()


main()
