"""What if we don't roll back? The correct engine beside two deliberately broken ones, and (last
section) the tree engine beside one that rolls back after a tree the chain's way."""
from dataclasses import replace

import streamlit as st

from app.figures.layouts import stale_comparison_figure
from app.figures.teaching import cache_strip_figure, divergence_figure, drift_figure
from app.figures.tree_rollback import output_html, tree_cache_figure
from app.runs import precomputed, teaching_pair
from app.ui.first_result import first_result
from app.ui.live_work import estimate_s, estimate_words, show_live, start_live
from app.ui.pages import WALKTHROUGH
from app.ui.safe import md
from app.ui.widgets import chart
from engine.config import SettingsError, SpecSettings, TreeSpec, parse_tree
from engine.teaching.rollback_facts import largest_target_drift, stale_cycle_to_show, wrong_cache_cycles
from engine.teaching.runs import CORRECT, KEEP_REJECTED, MODE_LABELS, SKIP_CATCH_UP, Comparison, compare_runs, first_divergence
from engine.teaching.stale_slots import StaticRun, static_run
from engine.teaching.tree_rollback import CORRECT as TREE_CORRECT
from engine.teaching.tree_rollback import CROP, DEFAULT_TREE, TREE_MODE_LABELS, TreeComparison, compare_tree_runs
from engine.trace.schema import MAX_NEW_TOKENS

BROKEN_TEXT = {
    KEEP_REJECTED: (
        "**Keeps the rejected K/V.** After the decision it skips trimming the caches. The rejected and "
        "discarded guesses stay in both caches as if they were part of the text, and every later token is "
        "stored at a position shifted by them. From then on the target predicts from a text that does not "
        "exist, so its distributions drift away from the truth and the output is no longer the target's."),
    SKIP_CATCH_UP: (
        "**Forgets the draft catch-up.** After a cycle where all K guesses pass, the draft has never run on its "
        "own last guess, and this mode does not feed it. The draft's cache is now missing a token, and every "
        "later entry sits one position early. The *target* is untouched, so the output is still exactly "
        "distributed like the target's: this bug only shows as a lower acceptance rate, a silent slowdown."),
}


LIVE = "rb_live"  # session_state: {stored-result key: Comparison run live in this session}
PAGE = precomputed.ROLLBACK
TREE_LIVE = "rb_tree_live"  # session_state: {stored-result key: (TreeComparison, seconds) run live here}
TREE_PAGE = precomputed.TREE_ROLLBACK


def new_tokens_of(key: list) -> int:
    """Units of work of a stored entry's key: its new tokens (each run is a few passes per token)."""
    return key[3]["max_new_tokens"]


def run_live(choice: teaching_pair.PairChoice, prompt: str, settings: SpecSettings, key: str) -> None:
    pair = teaching_pair.load(choice)
    prompt_ids = teaching_pair.encode(pair, choice, prompt) if pair else None
    if prompt_ids is None:
        return

    def work(on_progress):  # the three traced runs, then the correct engine on a static cache (~ a fourth)
        cmp = compare_runs(pair, prompt_ids, settings, lambda f: on_progress(0.8 * f))
        static = static_run(pair, prompt_ids, settings)
        on_progress(1.0)
        return cmp, static

    start_live(PAGE, choice.key, settings.max_new_tokens, "Running the correct engine, both broken ones and a static cache",
               work, lambda result, seconds: keep_live(key, result, seconds))


def keep_live(key: str, result: tuple[Comparison, StaticRun], seconds: float) -> None:
    """On the script thread, once the worker has ended: the result, for these settings."""
    cmp, static = result
    st.session_state.setdefault(LIVE, {})[key] = (cmp, static, seconds)


def result_for(choice: teaching_pair.PairChoice, prompt: str, settings: SpecSettings,
               run_now: bool) -> tuple[Comparison, StaticRun | None] | None:
    """This session's live result, else the stored one, else (after a click) a live run on a
    worker thread: its progress meanwhile."""
    key = precomputed.rollback_key(choice.key, prompt, settings.to_dict())
    if run_now:
        run_live(choice, prompt, settings, key)
    busy = show_live(PAGE)
    if key in st.session_state.get(LIVE, {}):
        cmp, static, seconds = st.session_state[LIVE][key]
        st.caption(f"Run live in this session ({seconds:.0f} s).")
        return cmp, static
    stored = precomputed.find(key)
    if stored is not None:
        st.caption(f"Precomputed with the real engine by `scripts/make_teaching_results.py` ({stored['made']}; "
                   f"it took {stored['seconds']:.0f} s there). **Run live** repeats it on this machine.")
        static = precomputed.static_from_dict(stored["static"]) if stored.get("static") else None
        return precomputed.comparison_from_dict(stored["result"]), static
    if busy:
        return None
    estimate = estimate_s(PAGE, choice.key, settings.max_new_tokens,
                          precomputed.seconds_per_unit(PAGE, choice.key, new_tokens_of))
    st.info(f"No stored result for these settings: press **Run live** ({estimate_words(estimate)}).",
            icon=":material/play_arrow:")
    return None


def settings_form(choice: teaching_pair.PairChoice) -> tuple[str, SpecSettings, bool] | None:
    with st.form("rb_form"):
        prompt = st.text_area("Prompt", choice.prompt, key="rb_prompt", height=68)
        cols = st.columns(4)
        k = cols[0].number_input("K (draft tokens per cycle)", 1, 8, 4, key="rb_k")
        temperature = cols[1].number_input("Temperature (0 = greedy)", 0.0, 2.0, 0.0, step=0.1, key="rb_temperature")
        seed = cols[2].number_input("Seed", 0, 2**31 - 1, 0, key="rb_seed")
        max_new = cols[3].number_input("New tokens", 4, min(MAX_NEW_TOKENS, 96), 40, key="rb_max_new")
        buttons = st.columns([1, 1, 4])
        buttons[0].form_submit_button("Show", icon=":material/visibility:",
                                      help="Apply these settings: the stored result if there is one, else a Run live button.")
        clicked = buttons[1].form_submit_button("Run live", type="primary", icon=":material/play_arrow:",
                                                help="Run all three engines now on this machine, with a progress bar.")
    try:
        return prompt, SpecSettings(k=int(k), temperature=float(temperature), seed=int(seed),
                                    max_new_tokens=int(max_new)), clicked
    except SettingsError as err:
        st.error(md(str(err)))
        return None


def in_brief(cmp: Comparison) -> str:
    """The result in one line of Markdown, at the top of the page (app/ui/first_result.py): the same
    numbers as the metrics below, readable before any chart has loaded."""
    correct = cmp.runs[CORRECT]
    parts = [f"the correct engine accepted **{correct.acceptance_rate:.2f}** of the draft tokens"]
    for mode, run in cmp.runs.items():
        if mode == CORRECT:
            continue
        first = first_divergence(run.generated, correct.generated)
        output = "the same output" if first is None else f"output that differs from token **{first}** on"
        parts.append(f"*{md(MODE_LABELS[mode])}* gives {output}, acceptance **{run.acceptance_rate:.2f}**, "
                     f"target drift up to {largest_target_drift(run):.2g} (total variation)")
    return "**Result for the settings below:** " + "; ".join(parts) + "."


def run_metrics(cmp: Comparison) -> None:
    correct = cmp.runs[CORRECT]
    cols = st.columns(len(cmp.runs))
    for col, (mode, run) in zip(cols, cmp.runs.items()):
        with col.container(border=True):
            st.markdown(f"**{md(MODE_LABELS[mode])}**")
            first = first_divergence(run.generated, correct.generated)
            st.metric("First token that differs from the correct run", "none" if first is None else str(first))
            st.metric("Largest target drift (total variation)", f"{largest_target_drift(run):.2g}")
            change = run.acceptance_rate - correct.acceptance_rate
            st.metric("Draft acceptance rate", f"{run.acceptance_rate:.2f}",
                      delta=None if mode == CORRECT or abs(change) < 0.005 else f"{change:+.2f}")


def outputs_section(cmp: Comparison) -> None:
    """The page's first figure, its words after it."""
    st.subheader("Where the outputs part ways")
    chart(divergence_figure(cmp), key="rb_divergence")
    greedy = cmp.settings["temperature"] == 0
    st.caption(
        "All three runs share the prompt, the settings and the random seed, so they agree until a broken "
        "rollback first changes what a model sees. "
        + ("At temperature 0 the correct engine must reproduce plain target decoding token for token, so that "
           "row is shown as the reference." if greedy else
           "At temperature > 0, compare the runs with each other; a plain target sample would use its random "
           "numbers differently, so the drift chart below is the reference instead."))


def drift_section(cmp: Comparison) -> None:
    st.subheader("How far the cache has drifted from the truth")
    st.markdown(
        "After every cycle each model predicts the next token twice: once from the run's own cache, and once "
        "from a fresh pass over the committed text with no cache at all. A correct cache gives the same "
        "distribution up to float rounding (around 1e-7 here); a broken one does not. Measured on the "
        "models' untempered distributions, so greedy runs show a graded distance too.")
    metric = st.radio("Distance", ["tv", "kl"], horizontal=True, key="rb_metric",
                      format_func={"tv": "total variation", "kl": "KL(fresh ‖ cached)"}.get)
    chart(drift_figure(cmp, metric), key="rb_drift")


def cache_section(cmp: Comparison) -> None:
    st.subheader("The stale cells, and how much the target attends to them")
    mode = st.radio("Run", list(cmp.runs), index=1, horizontal=True, key="rb_cache_mode", format_func=MODE_LABELS.get)
    run = cmp.runs[mode]
    last = len(run.cycles) - 1
    cycle = st.slider("After cycle", 0, last, min(3, last), key="rb_cache_cycle") if last > 0 else 0
    probe = run.cycles[cycle]
    stale, share = probe.target_cache.num_stale, probe.stale_attention
    missing = probe.draft_cache.missing
    st.markdown(
        f"After cycle {cycle} the target cache holds **{len(probe.target_cache.token_ids)}** cells for "
        f"**{probe.committed_len - 1}** committed positions: **{stale}** stale. At the next position the target "
        f"puts **{share:.0%}** of its attention (averaged over layers and heads) on stale cells."
        + (f" The draft cache is missing committed position(s) {', '.join(map(str, missing[:8]))}."
           if missing else ""))
    chart(cache_strip_figure(probe.target_cache, probe.draft_cache, probe.attention, cmp.texts,
                             f"{MODE_LABELS[mode]}: both caches after cycle {cycle}"), key="rb_cache")


def stale_section(cmp: Comparison, static: StaticRun) -> None:
    st.subheader("Stale K/V that corrupts, and stale K/V that does not")
    st.markdown(
        "A static cache (gpt-fast, Hugging Face `StaticCache`) also keeps rejected K/V in memory: its rollback "
        "only moves the write position back. The difference is *where* the leftovers sit. The broken run never "
        "moves its length back, so the rejected entries stay **inside** the range the next query reads, and "
        "every later token is written after them, at a shifted position. The static cache's leftovers sit "
        "**past** the write position: a query at position p attends to slots 0..p only (the causal mask), so "
        "they get an attention weight of exactly 0 and the next append overwrites them. Both numbers below are "
        "measured on the real models: the attention the next position gives to the stale entries.")
    bug_run = cmp.runs[KEEP_REJECTED]
    last = min(len(bug_run.cycles), len(static.cycles)) - 1
    start = stale_cycle_to_show(bug_run, static)  # a cycle where both kinds of leftovers exist
    cycle = st.slider("After cycle", 0, last, start, key="rb_stale_cycle") if last > 0 else 0
    bug, sc = bug_run.cycles[cycle], static.cycles[cycle]
    cols = st.columns(3)
    cols[0].metric("Bug: attention on rejected K/V", f"{bug.stale_attention:.1%}")
    cols[1].metric("Static cache: attention on stale slots", f"{sc.attention_on_stale:.1%}",
                   help=f"{sc.stale_slots} stale slot(s) after the rollback; the next position's own write "
                        "overwrites the first, the rest stay masked")
    same = static.generated == cmp.runs[CORRECT].generated
    cols[2].metric("Static cache output equals the correct run", "yes" if same else "no")
    chart(stale_comparison_figure(bug.target_cache.status, bug.stale_attention, sc.write_position,
                                  sc.stale_slots, sc.attention_on_stale, cycle), key="rb_stale")


def first_sections(headline, cmp: Comparison) -> None:
    """What the page opens on: the result in a line, the outputs parting ways, the three runs' numbers."""
    headline.markdown(in_brief(cmp))
    outputs_section(cmp)
    run_metrics(cmp)


def later_sections(cmp: Comparison, static: StaticRun | None) -> None:
    """Below the settings: why the outputs part, cache by cache."""
    drift_section(cmp)
    cache_section(cmp)
    if static is not None:
        stale_section(cmp, static)
    else:
        st.info("The static-cache comparison was not stored with this result: press **Run live**.")


# ---------------------------------------------------------------- after a tree: crop is not enough

TREE_TEXT = (
    "A chain's rollback is a crop: the accepted guesses already sit, in order, right after the last "
    "committed token, so cutting the cache to the new length keeps exactly them. A tree's verify pass "
    "writes **every** node side by side: if the cache held L positions, the root (the last committed "
    "token) goes to slot L and node i to slot L+1+i, level by level, siblings in the order they are "
    "tried. The accepted path lies in slots L+1, L+2, ... only if it ran through nodes 0, 1, 2, ... in "
    "that order: with more than one node on the first level, only an empty path or one that stops at "
    "node 0 does. Otherwise (the path *left the first branch*) a crop "
    "keeps, in the slots of committed tokens, the K/V of nodes that were *not* accepted: a rejected "
    "sibling, or a node on another branch, at the wrong position. The tokens are right; the cache behind "
    "them describes a text nobody wrote, and every later query reads it. The engine instead *compacts*: "
    "it moves each path node's K/V down into place and drops the rest (`engine/tree/compact.py`). The "
    "broken run below crops both caches (a fault only this page can select); after each cycle both runs' "
    "caches are compared slot by slot with a fresh prefill of the committed text.")


def tree_settings(settings: SpecSettings, spec: TreeSpec) -> SpecSettings:
    """The form's settings for a tree run: K is the tree's depth (as engine/run.py records it)."""
    return replace(settings, k=spec.max_depth)


def run_tree_live(choice: teaching_pair.PairChoice, prompt: str, settings: SpecSettings, spec: TreeSpec,
                  key: str) -> None:
    pair = teaching_pair.load(choice)
    prompt_ids = teaching_pair.encode(pair, choice, prompt) if pair else None
    if prompt_ids is None:
        return

    def work(on_progress):
        return compare_tree_runs(pair, prompt_ids, settings, spec, on_progress)

    def keep(result: TreeComparison, seconds: float) -> None:
        st.session_state.setdefault(TREE_LIVE, {})[key] = (result, seconds)

    start_live(TREE_PAGE, choice.key, settings.max_new_tokens, "Running the tree engine, compacting and cropping",
               work, keep)


def tree_result_for(choice: teaching_pair.PairChoice, prompt: str, settings: SpecSettings, spec: TreeSpec,
                    run_now: bool) -> TreeComparison | None:
    """As `result_for`: this session's live result, else the stored one, else a Run live button's run."""
    key = precomputed.tree_rollback_key(choice.key, prompt, settings.to_dict(), spec.describe())
    if run_now:
        run_tree_live(choice, prompt, settings, spec, key)
    busy = show_live(TREE_PAGE)
    if key in st.session_state.get(TREE_LIVE, {}):
        cmp, seconds = st.session_state[TREE_LIVE][key]
        st.caption(f"Run live in this session ({seconds:.0f} s).")
        return cmp
    stored = precomputed.find(key)
    if stored is not None:
        st.caption(f"Precomputed with the real engine by `scripts/make_teaching_results.py` ({md(stored['made'])}; "
                   f"it took {stored['seconds']:.0f} s there). **Run live** repeats it on this machine.")
        return precomputed.tree_comparison_from_dict(stored["result"])
    if not busy:
        estimate = estimate_s(TREE_PAGE, choice.key, settings.max_new_tokens,
                              precomputed.seconds_per_unit(TREE_PAGE, choice.key, new_tokens_of))
        st.info(f"No stored tree result for these settings and this tree: press **Run live** beside the tree "
                f"({estimate_words(estimate)}).", icon=":material/play_arrow:")
    return None


def tree_form() -> tuple[TreeSpec | None, bool]:
    """The tree to draft (outside the form above: it applies at once) and this section's Run live button."""
    cols = st.columns([3, 1])
    text = cols[0].text_input("Tree (as --tree: static:B1,B2,... or dynamic:top_k=K,depth=D,nodes=N)", DEFAULT_TREE,
                              key="rb_tree")
    clicked = cols[1].button("Run live", key="rb_tree_run", icon=":material/play_arrow:",
                             help="Run the tree engine twice now on this machine (compacting, then cropping).")
    try:
        return parse_tree(text), clicked
    except SettingsError as err:
        st.error(md(str(err)))
        return None, False


def tree_metrics(cmp: TreeComparison) -> None:
    correct, broken = cmp.runs[TREE_CORRECT], cmp.runs[CROP]
    cols = st.columns(4)
    cols[0].metric("Paths off the first branch", f"{broken.bites} of {len(broken.cycles)}",
                   help="Cycles of the broken run whose accepted path left the first branch: only there do crop "
                        "and compaction keep different slots.")
    first = broken.first_target_mismatch
    cols[1].metric("Broken cache wrong from", "never" if first is None else f"cycle {first}",
                   help="The first cycle after which the cropping run's target cache differs from a fresh prefill.")
    wrong = wrong_cache_cycles(correct)
    cols[2].metric("Correct engine: wrong caches", str(wrong),
                   help="Cycles after which either cache of the compacting run differs from a fresh prefill.")
    divergence = cmp.first_divergence
    cols[3].metric("First output token that differs", "none" if divergence is None else str(divergence))


def tree_outputs(cmp: TreeComparison) -> None:
    """Both outputs side by side, the first divergence outlined; at T=0 whether the correct one is greedy's."""
    first = cmp.first_divergence
    cols = st.columns(2)
    for col, mode in zip(cols, (TREE_CORRECT, CROP)):
        col.html(output_html(cmp.runs[mode].generated, cmp.texts, first, TREE_MODE_LABELS[mode]))
    if cmp.reference is not None:
        same = cmp.runs[TREE_CORRECT].generated == cmp.reference
        st.caption("At temperature 0 the correct tree engine must reproduce plain greedy decoding of the target: "
                   + ("it does, token for token." if same else "**it does not** here, which a near-tie between two "
                      "tokens' logits can cause (a batched pass and a one-token pass round differently)."))
    if first is None:
        st.caption("The outputs agree here: a wrong cache shifts the target's distributions, and at temperature 0 "
                   "the output changes only once the argmax flips. More tokens or another prompt show it.")


def tree_section(choice: teaching_pair.PairChoice, prompt: str, settings: SpecSettings) -> None:
    st.subheader("After a tree: crop is not enough")
    st.markdown(TREE_TEXT)
    spec, clicked = tree_form()
    if spec is None:
        return
    cmp = tree_result_for(choice, prompt, tree_settings(settings, spec), spec, clicked)
    if cmp is None:
        return
    tree_metrics(cmp)
    chart(tree_cache_figure(cmp), key="rb_tree_cache")
    st.caption("Rings mark the cycles whose accepted path left the first branch. The correct engine has them "
               "too and stays at zero: compaction moved those nodes' K/V into place. In the cropping run the "
               "count only grows: every slot written after a wrong one was computed while attending to it.")
    tree_outputs(cmp)


def main() -> None:
    """The result first (the outputs parting ways), under a one-line question; what the page runs, its
    settings and the tree's section after (a first screen at 1366x768 used to be paragraphs only)."""
    st.title("What if we don't roll back?")
    st.markdown("A rejected guess must leave no trace: its keys and values have to go from both caches. Here the "
                "real engine runs correctly and in two deliberately broken ways on one prompt and seed.")
    headline = first_result()  # filled once the result is known
    shown = st.container()  # the result, drawn here once the settings below are known
    with st.expander("The two broken modes, and what this page runs"):
        st.markdown(
            "The broken modes exist only for this demonstration (the command line and the live-run page cannot "
            "select them). The last section does the same for a draft tree, whose rollback a plain crop gets wrong.")
        for text in BROKEN_TEXT.values():
            st.markdown("- " + text)
        st.page_link(WALKTHROUGH, label="What the rollback is, step by step", icon=":material/school:")
    st.markdown("##### Settings for the runs above")
    choice = teaching_pair.choose("rb")
    if choice is None:
        return
    form = settings_form(choice)
    if form is None:
        return
    with shown:
        found = result_for(choice, *form)
        if found is not None:
            first_sections(headline, found[0])
    if found is not None:
        later_sections(*found)
    tree_section(choice, form[0], form[1])


main()
