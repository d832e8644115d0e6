"""Interview questions on low acceptance from a mis-set draft: a draft fed the prompt without the chat
template, a draft that ignores top-p/top-k, and K far too deep. Each answer says the cause, why the output
stays exactly the target's, and how a diagnosis finds it; each points at the Diagnose page, and at what a
bundled diagnosis measured for that experiment where one did.
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
            e = f["acceptance_rate"]
            if f["experiment"] == experiment and diagnoses.measured(f) and e["found"] and \
                    (best is None or abs(e["difference"]) > abs(best[1]["acceptance_rate"]["difference"])):
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
            "over requests gives the interval). A large gain with an interval above zero ranks the chat template "
            "first; the probe's low top-1 agreement says the same without speculating.")
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
            "acceptance. The diagnosis reruns the same requests at that K and reports the paired change in "
            "acceptance rate and tokens/s; conditional acceptance by position (the Workload page on the "
            "baseline's arm) shows where guesses stop paying.")
        measured_in_a_case("draft depth")
        st.page_link(DIAGNOSE, label=LINK, icon=":material/troubleshoot:")
