"""Exactness lab: sample the next token many times and compare with the target distribution."""
import streamlit as st

from app.figures.teaching import histogram_entries, lab_histogram_figure
from app.runs import precomputed, teaching_pair
from app.ui import jobs
from app.ui.first_result import first_result
from app.ui.live_work import estimate_s, estimate_words, job_name, show_live, start_live
from app.ui.pages import WALKTHROUGH
from app.ui.safe import md
from app.ui.widgets import chart
from engine.config import SettingsError, SpecSettings
from engine.teaching.exactness import MAX_VOCAB_FOR_SECOND_TOKEN, LabResult, run_lab
from engine.teaching.faults import Faults
from engine.teaching.power import (
    DEFAULT_SAMPLES,
    LAB_POWER,
    SAMPLE_COUNTS,
    SIGNIFICANCE,
    catch_chance,
    rule_distance,
    samples_for_result,
)
from engine.trace.schema import ACCEPTANCE_RULE_TEXT

TOP_TOKENS = 20  # bars in the histogram; the rest is one "other" bar
LIVE = "lab_live"  # session_state: {stored-result key: (LabResult, texts, seconds)} run live in this session
PAGE = precomputed.EXACTNESS
RULE_NAMES = {
    "ratio": "min(1, p_target/p_draft), residual (correct)",
    "token_match": "accept when a target sample matches the draft token",
    "no_residual": "on rejection, draw from the target instead of the residual",
    "p_target_only": "accept with probability p_target alone",
}
RULE_SHORT = {"ratio": "ratio rule", "token_match": "token match", "no_residual": "no residual",
              "p_target_only": "p_target only"}
RULE_WHY = {
    "ratio": "The correct rule. Proposed-and-kept gives min(p_draft, p_target); the residual supplies exactly "
             "the rest, so every token comes out with the target's probability.",
    "token_match": "Looks natural (\"did the target pick the same token?\") but keeps a guess with probability "
                   "p_target(d) instead of min(1, p_target/p_draft): tokens both models like are kept too "
                   "rarely, and the fallback residual then over-supplies others.",
    "no_residual": "The acceptance step is right, but the fallback draws from the full target distribution. "
                   "Tokens the draft already offered get a second chance through the fallback, so they come "
                   "out too often: the overlap is counted twice.",
    "p_target_only": "Ignores how often the draft proposes a token. A token the draft proposes rarely but the "
                     "target likes is under-produced, and the residual cannot make up for it.",
}
GREEDY_WHY = ("**Greedy draft**: the draft always proposes its most likely token but is judged with its sampling "
              "distribution. The test assumes the proposal was *drawn* from p_draft; a deterministic proposal "
              "breaks that, and the output leans towards the draft's favourite.")


def samples_of(key: list) -> int:
    """Units of work of a stored entry's key: samples times the tokens each one generates."""
    return key[6] * key[7]


def run_live(choice: teaching_pair.PairChoice, prompt: str, s: SpecSettings, rule: str, greedy: bool,
             n: int, position: int, key: str) -> None:
    pair = teaching_pair.load(choice)
    prompt_ids = teaching_pair.encode(pair, choice, prompt) if pair else None
    if prompt_ids is None:
        return
    faults = Faults(acceptance_rule=rule, greedy_draft=greedy)

    def work(on_progress):  # a ValueError (the token after next on a large vocabulary) is shown as the job's error
        res = run_lab(pair, prompt_ids, s, faults, n, position, on_progress)
        return res, teaching_pair.texts_of(pair, histogram_entries(res, TOP_TOKENS))

    start_live(PAGE, choice.key, n * position, f"Sampling {n} times with the real engine ({RULE_SHORT[rule]})", work,
               lambda result, seconds: keep_live(key, result, seconds))


def keep_live(key: str, result: tuple[LabResult, dict[int, str]], seconds: float) -> None:
    """On the script thread, once the worker has ended: the result, for these settings."""
    res, texts = result
    st.session_state.setdefault(LIVE, {})[key] = (res, texts, seconds)


def result_for(choice: teaching_pair.PairChoice, prompt: str, s: SpecSettings, rule: str, greedy: bool,
               n: int, position: int, run_now: bool) -> tuple[LabResult, dict[int, str]] | None:
    """This session's live result, else the stored one, else a button that runs it live on a
    worker thread (its progress meanwhile)."""
    key = precomputed.exactness_key(choice.key, prompt, s.to_dict(), rule, greedy, n, position)
    estimate = estimate_s(PAGE, choice.key, n * position, precomputed.seconds_per_unit(PAGE, choice.key, samples_of))
    if (not run_now and not jobs.running(job_name(PAGE)) and key not in st.session_state.get(LIVE, {})
            and precomputed.find(key) is None):
        st.info(f"No stored result for this rule and these settings: press **Run live** "
                f"({estimate_words(estimate)}).", icon=":material/play_arrow:")
        run_now = st.button("Run live", key="lab_run", type="primary", icon=":material/play_arrow:")
    if run_now:
        run_live(choice, prompt, s, rule, greedy, n, position, key)
    show_live(PAGE)
    if key in st.session_state.get(LIVE, {}):
        res, texts, seconds = st.session_state[LIVE][key]
        st.caption(f"Sampled live in this session ({seconds:.0f} s).")
        return res, texts
    stored = precomputed.find(key)
    if stored is None:
        return None
    st.caption(f"Precomputed with the real engine by `scripts/make_teaching_results.py` ({stored['made']}; "
               f"{stored['seconds']:.0f} s there). **Run live** samples again on this machine "
               f"({estimate_words(estimate)}).")
    return precomputed.lab_from_dict(stored["result"])


def stored_distributions(choice: teaching_pair.PairChoice, rule: str, greedy: bool) -> LabResult | None:
    """A stored next-token result for this rule at the form's current settings (any sample count):
    it holds the target's distribution and the rule's, worked out from both models."""
    state = st.session_state
    try:
        s = SpecSettings(k=int(state.get("lab_k", 1)), temperature=float(state.get("lab_temperature", 1.0)),
                         top_k=int(state.get("lab_top_k", 0)), seed=int(state.get("lab_seed", 0)))
    except SettingsError:
        return None
    prompt = state.get("lab_prompt", choice.prompt)
    for n in SAMPLE_COUNTS:
        stored = precomputed.find(precomputed.exactness_key(choice.key, prompt, s.to_dict(), rule, greedy, n, 1))
        if stored is not None:
            return precomputed.lab_from_dict(stored["result"])[0]
    return None


def rule_samples(choice: teaching_pair.PairChoice) -> None:
    """When the rule changes: the sample count whose test catches it with LAB_POWER on this pair."""
    found = stored_distributions(choice, st.session_state["lab_rule"], st.session_state["lab_greedy"])
    st.session_state["lab_n"] = samples_for_result(found)


def settings_form(choice: teaching_pair.PairChoice) -> tuple | None:
    """The run's settings (the rule is chosen outside the form, above the histogram): prompt, settings,
    samples, position and whether Run live was pressed; None with an error when they are not valid."""
    with st.form("lab_form"):
        prompt = st.text_area("Prefix", choice.prompt, key="lab_prompt", height=68)
        cols = st.columns(5)
        temperature = cols[0].number_input("Temperature", 0.05, 2.0, 1.0, step=0.05, key="lab_temperature")
        top_k = cols[1].number_input("Top-k (0 = off)", 0, 1000, 0, key="lab_top_k")
        k = cols[2].number_input("K", 1, 4, 1, key="lab_k",
                                 help="Only draft position 1 can decide the next token, so K=1 is enough for it "
                                      "(and fastest); the token after next also meets position 2 and the bonus.")
        n = cols[3].select_slider("Samples", SAMPLE_COUNTS, DEFAULT_SAMPLES, key="lab_n",
                                  help=f"Set for each rule: the fewest samples whose test catches it at least "
                                       f"{LAB_POWER:.0%} of the time on this pair. 200 samples take about 10 s "
                                       "live on the tiny-shakespeare pair here; 2000 a few minutes.")
        seed = cols[4].number_input("Seed", 0, 2**31 - 1, 0, key="lab_seed")
        position = st.radio("Which token", [1, 2], horizontal=True, key="lab_position",
                            format_func={1: "the next token", 2: "the token after next (passes a bonus or a second "
                                         f"cycle; vocabularies up to {MAX_VOCAB_FOR_SECOND_TOKEN} tokens)"}.get)
        buttons = st.columns([1, 1, 4])
        buttons[0].form_submit_button("Show", icon=":material/visibility:",
                                      help="Apply these settings: the stored result if there is one, else a Run live button.")
        clicked = buttons[1].form_submit_button("Run live", type="primary", icon=":material/play_arrow:",
                                                help="Sample now on this machine, with a progress bar.")
    try:
        s = SpecSettings(k=int(k), temperature=float(temperature), top_k=int(top_k), seed=int(seed))
    except SettingsError as err:
        st.error(md(str(err)))
        return None
    return prompt, s, int(n), int(position), clicked


def rule_controls(choice: teaching_pair.PairChoice) -> tuple[str, bool]:
    """The acceptance rule and the greedy draft: outside the form, so switching redraws at once (each
    rule's result is cached)."""
    cols = st.columns([3, 1], vertical_alignment="bottom")
    rule = cols[0].radio("Acceptance rule", list(RULE_NAMES), key="lab_rule", format_func=RULE_NAMES.get,
                         on_change=rule_samples, args=(choice,), horizontal=True)
    greedy = cols[1].checkbox("Greedy draft", key="lab_greedy", on_change=rule_samples, args=(choice,),
                              help="The draft proposes its argmax instead of sampling it.")  # the label fits its column
    st.caption(RULE_WHY[rule] if not greedy else GREEDY_WHY)  # our own Markdown
    return rule, greedy


def verdict(name: str, p_value: float) -> str:
    if p_value >= SIGNIFICANCE:
        return f"{name}: consistent with the target (p = {p_value:.3g} ≥ {SIGNIFICANCE})"
    return f"{name}: **not** the target's distribution (p = {p_value:.2g} < {SIGNIFICANCE})"


def in_brief(res: LabResult, rule: str, greedy: bool) -> str:
    """The verdict in one line of Markdown, at the top of the page (app/ui/first_result.py)."""
    label = RULE_SHORT[rule] + (" + greedy draft" if greedy else "")
    return (f"**Result for the settings below ({label}, {res.samples} samples):** "
            + verdict("speculative sampling", res.speculative_test.p_value) + "; "
            + verdict("plain target sampling", res.plain_test.p_value)
            + f"; first draft token accepted {res.acceptance_rate:.0%}.")


def results(res: LabResult, texts: dict[int, str], rule: str, greedy: bool) -> None:
    label = RULE_SHORT[rule] + (" + greedy draft" if greedy else "")
    chart(lab_histogram_figure(res, texts, label, TOP_TOKENS), key="lab_histogram")
    cols = st.columns(4)
    cols[0].metric("Chi-square, speculative", f"{res.speculative_test.statistic:.1f}",
                   help=f"{res.speculative_test.dof} degrees of freedom")
    cols[1].metric("Chi-square, plain sampling", f"{res.plain_test.statistic:.1f}",
                   help=f"{res.plain_test.dof} degrees of freedom")
    cols[2].metric("First draft token accepted", f"{res.acceptance_rate:.0%}")
    gap = rule_distance(res)
    if gap is not None:
        cols[3].metric("Rule vs target, on paper", f"{gap:.3f}",
                       help="Total variation between what this rule samples (worked out from both models' "
                            "distributions) and the target's distribution: 0 for the correct rule.")
    passed = res.speculative_test.p_value >= SIGNIFICANCE
    chance = catch_chance(res)
    words = (verdict("Speculative sampling", res.speculative_test.p_value) + "  \n"
             + verdict("Plain target sampling", res.plain_test.p_value))
    if not passed:
        st.error(words)
    elif chance is None:
        st.success(words)
    else:  # a broken rule that passed: the test could not tell, which is not a green result
        st.warning(words + f"  \n**Undecided:** this rule is wrong (it is {gap:.3f} away from the target in "
                   f"total variation), and at {res.samples} samples the test catches it only {chance:.0%} of the "
                   "time. Take more samples.", icon=":material/help:")
    if chance is not None:
        st.caption(f"At {res.samples} samples this test catches this rule {chance:.1%} of the time "
                   "(its power, from both models' distributions: engine/teaching/power.py).")
    st.caption(f"Pearson chi-square against the exact target distribution, tokens expecting fewer than 5 "
               f"samples pooled into one cell ({res.speculative_test.cells} cells). At p < {SIGNIFICANCE} a "
               f"correct sampler is flagged by chance about once in {round(1 / SIGNIFICANCE)} runs; change the "
               f"seed to see that. A wrong rule close to the truth needs more samples to be caught.")


def main() -> None:
    """The histogram first, under a one-line promise and the result in words; the rule to switch right
    under it; the settings, the formula and the long explanation after (a first screen at 1366x768 used
    to end before the histogram began)."""
    st.title("Exactness you can see")
    st.markdown("Speculative sampling draws each token from *exactly* the target's distribution. The histogram "
                "samples the next token many times with the real engine and from the target alone; switch the "
                "rule under it to a common mistake and watch it move.")
    headline = first_result()  # filled once the result is known
    shown, rules = st.container(), st.container()  # drawn in this order, filled once the settings are known
    with st.expander("Settings: model pair, prefix, temperature, top-k, K, samples, seed, which token"):
        choice = teaching_pair.choose("lab")
        form = settings_form(choice) if choice is not None else None
    if form is not None:
        prompt, s, n, position, clicked = form
        with rules:
            rule, greedy = rule_controls(choice)
        with shown:
            top = st.container()  # the result above where it came from (result_for's caption)
            found = result_for(choice, prompt, s, rule, greedy, n, position, clicked)
        if found is not None:
            headline.markdown(in_brief(found[0], rule, greedy))
            with top:
                results(*found, rule, greedy)
    about()


def about() -> None:
    """What the page tests and how, below the result."""
    st.markdown(
        "Every sample is a full cycle (draft, verify, test, resample or bonus, rollback); both histograms "
        "are compared with the target's exact distribution, worked out from the models:")
    st.latex(r"P(x) = \underbrace{\min\bigl(p_\text{draft}(x), p_\text{target}(x)\bigr)}_{\text{proposed and kept}}"
             r" + \underbrace{\max\bigl(0, p_\text{target}(x) - p_\text{draft}(x)\bigr)}_{\text{from the residual}}"
             r" = p_\text{target}(x)")
    st.page_link(WALKTHROUGH, label="Where these terms come from", icon=":material/school:")
    with st.expander("The rules in the engine"):
        for name, text in ACCEPTANCE_RULE_TEXT.items():
            st.markdown(f"- `{name}`: {md(text)}")


main()
