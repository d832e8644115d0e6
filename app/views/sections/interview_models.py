"""Interview questions on the two models: what changes when draft and target use different tokenizers,
and why greedy output can change when speculation is switched on (batched against stepwise logits,
measured on request, and the open trace's closest near-tie).
"""
import streamlit as st

from app.runs import teaching_pair
from app.ui import state
from app.ui.pages import STEPPER
from app.ui.safe import md
from app.ui.widgets import stepper_query
from app.views.sections.interview_live import measured
from engine.cycle.pair import Pair
from engine.run import encode_prompt
from engine.teaching.numerics import closest_tie, numerics_checks
from engine.teaching.runs import NumericsCheck
from engine.trace import Trace

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
            return numerics_checks(pair.target, ids, min(5, len(ids) - 1)) if ids and len(ids) > 5 else None

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
