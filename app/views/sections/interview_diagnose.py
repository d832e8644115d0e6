"""Interview questions on low acceptance from a mis-set draft: a draft fed the prompt without the chat
template, a draft that ignores top-p/top-k, and K far too deep. Each answer says the cause, why the output
stays exactly the target's, and how a diagnosis finds it; each points at the Diagnose page, and at what a
bundled diagnosis measured for that experiment where one did. Then two on reading a diagnosis: why a
shorter K's higher acceptance rate proves nothing, and why eight experiments need wider intervals.
"""
import streamlit as st

from app.ui import diagnoses
from app.ui.pages import DIAGNOSE
from app.ui.safe import md

LINK = "Diagnose a pair by experiment"


def measured_in_a_case(experiment: str) -> None:
    """The bundled diagnosis that found the largest effect for this experiment, in one line (none: nothing)."""
    best = None
    for choice in diagnoses.listed():
        if choice[0] != "bundled":
            continue
        try:
            d = diagnoses.load(choice)
        except (diagnoses.DiagnosisError, OSError):
            continue  # the Diagnose page says what is wrong with it
        for f in d["findings"]:
            e = diagnoses.judged(f)  # what an experiment of its kind is judged by (K: tokens/s)
            if f["experiment"] == experiment and diagnoses.ran(f) and e is not None and e["found"] and \
                    (best is None or abs(e["difference"]) > abs(diagnoses.judged(best[1])["difference"])):
                best = (choice[1], f)
    if best is not None:
        st.caption(f"Measured in the bundled diagnosis **{md(best[0])}**: {md(best[1]['verdict'])}.")


def q_chat_template() -> None:
    with st.expander("The draft was fed the prompt without the chat template. What happens, and how do you find it?"):
        st.markdown(
            "**The cause.** The target reads the request wrapped in its chat template (role markers, the "
            "assistant's turn opened); the draft reads the bare text. Each model predicts the continuation of "
            "what it was shown, so the draft guesses what follows a bare question (often more of the question, "
            "or a different register) while the target writes an assistant's reply. Its guesses land where the "
            "target puts little probability, and the ratio test rejects them. Serving stacks hit this when the "
            "draft has its own tokenizer config or prompt path (SafeAILab/EAGLE #196).\n\n"
            "**Why the output stays exact.** The ratio test never asks *why* the draft proposed a token: it "
            "accepts x with min(1, p(x)/q(x)), where q is the distribution the draft actually sampled from, "
            "whatever it was conditioned on, and a rejection resamples from the residual max(0, p − q). Any "
            "valid q gives exactly p; a bad q only costs acceptance. Greedy output is the target's own greedy "
            "text.\n\n"
            "**How the diagnosis finds it.** It reruns the same requests with the same seeds, changing only "
            "how the draft reads the prompt, and compares acceptance request by request (a paired bootstrap "
            "over requests gives the interval). A gain whose interval lies above zero puts the chat template "
            "first among the things to change; the probe's low top-1 agreement says the same without "
            "speculating.")
        measured_in_a_case("chat template")
        st.page_link(DIAGNOSE, label=LINK, icon=":material/troubleshoot:")


def q_draft_filters() -> None:
    with st.expander("The draft samples at the temperature but ignores top-p/top-k. Why does acceptance drop?"):
        st.markdown(
            "**The cause.** The request's top-k/top-p cut the target's distribution p to a few tokens; "
            "everything else has p = 0. A draft that applies only the temperature samples from its whole "
            "softened distribution q, so it often proposes a token outside that set, and the test accepts it "
            "with min(1, 0/q) = 0: a certain rejection. Even inside the set its q is spread thinner than p, so "
            "p/q is smaller than it should be (vLLM #56724).\n\n"
            "**Why the output stays exact.** Both sides of the test use the distributions actually sampled "
            "from: the warped, filtered p for the target and the unfiltered q the draft drew from. With "
            "min(1, p/q) and the residual max(0, p − q), the committed token has distribution p, filters "
            "included. Only the rate at which drafts pass changes. (At temperature 0 the filters change "
            "nothing, so neither does this mistake.)\n\n"
            "**How the diagnosis finds it.** At temperature > 0 with a top-k or top-p set, it reruns the requests "
            "with the draft following the request's filters; the paired difference in acceptance and its "
            "interval rank it. In the stepper the mis-set arm's rejected tokens show p_target = 0.")
        measured_in_a_case("sampling filters")
        st.page_link(DIAGNOSE, label=LINK, icon=":material/troubleshoot:")


def q_deep_k() -> None:
    with st.expander("K is far too deep, say 16 where 3 would do. What does that cost, and how do you find it?"):
        st.markdown(
            "**The cause.** A cycle's accepted prefix ends at the first rejection, and acceptance decays with "
            "position: the chance that all of the first i guesses pass shrinks geometrically. With K far past "
            "that point most drafted tokens sit behind a rejection and are thrown away, so the acceptance "
            "*rate* (accepted / drafted) falls, and every cycle still pays K draft steps and a verify pass over "
            "K+1 positions, so tokens/s falls too, while tokens per cycle barely grows.\n\n"
            "**Why the output stays exact.** K only sets how many proposals a cycle tests. Each one goes through "
            "the same ratio test in order, the first rejection resamples from the residual (or all pass and the "
            "target adds a bonus token), and both caches roll back to the committed text. The committed tokens "
            "are distributed as the target's for every K.\n\n"
            "**How the diagnosis finds it.** The baseline runs calibrated (both models' step times on this "
            "machine), so the K advisor picks the K that maximises the expected speedup for the measured "
            "acceptance. The diagnosis reruns the same requests at that K and judges it by tokens/s: both arms' "
            "cycles timed on the same calibrated step times, with a paired interval over requests. Not by the "
            "acceptance rate, which a shorter K raises by arithmetic alone (next question). K comes after the "
            "causes in the report, because the best K depends on the acceptance they change. Conditional "
            "acceptance by position (the Workload page on the baseline's arm) shows where guesses stop paying.")
        measured_in_a_case("draft depth")
        st.page_link(DIAGNOSE, label=LINK, icon=":material/troubleshoot:")


def q_shorter_k_rate() -> None:
    with st.expander("At K=2 instead of 12 the acceptance rate rose from 0.05 to 0.20. Did the draft get better?"):
        st.markdown(
            "**No: the draft is the same model on the same requests.** The acceptance rate is accepted / "
            "drafted. A cycle's accepted tokens stop at its first rejection, so a deep K adds drafted tokens "
            "at late positions that are rarely even tested: they sit behind a rejection. Cutting K removes "
            "them from the denominator and hardly changes the numerator, so the rate rises by arithmetic "
            "alone. Compare like with like instead: conditional acceptance at each position (accepted at i "
            "given i was reached), which does not depend on K, and tokens/s, which is what K is for.\n\n"
            "**What the diagnosis does with it.** It judges K by tokens/s on the machine's calibrated step "
            "times, never by the acceptance rate, and ranks it after the settings that change what the draft "
            "sees (the chat template, the sampling filters): those move the per-position acceptance the "
            "best K is chosen from.")
        st.page_link(DIAGNOSE, label=LINK, icon=":material/troubleshoot:")


def q_joint_intervals() -> None:
    with st.expander("A diagnosis runs eight experiments, each with a 95% interval. Why are its intervals wider "
                     "than one experiment's would be?"):
        st.markdown(
            "**Because eight 95% intervals are wrong somewhere more often than one is.** If no change had any "
            "effect, each interval would still exclude zero 5% of the time, and at least one of eight would "
            "do so about 1 − 0.95^8 ≈ 34% of the time: a correctly set pair would often be told it has a "
            "cause it does not have, and another seed would not find it again. The report makes the eight "
            "intervals hold *together* 95% of the time (Bonferroni): each at 1 − 0.05/8 ≈ 99.4%, so a "
            "little wider.\n\n"
            "**What stays the same.** Each interval is still a paired bootstrap over requests (the same draw "
            "of requests in both arms), so a request's own difficulty cancels. A real effect the size of the "
            "planted causes still clears zero; an effect that does not is reported as \"no effect found\", "
            "which says these requests cannot tell, not that there is none.")
        st.page_link(DIAGNOSE, label=LINK, icon=":material/troubleshoot:")
