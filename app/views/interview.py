"""Interview practice: questions with hidden answers, each tied to live data.

The questions are drawn in order from their section modules (app/views/sections/interview_*.py):
the cycle, the two models, speed, low acceptance from a mis-set draft, batching, then draft trees; the red
flags close the page.
"""

import streamlit as st

from app.figures.tree_record import is_tree_header
from app.ui import state, tree_trace
from app.ui.pages import EXACTNESS_LAB
from app.views.sections.interview_batch import q_batch_shrinks, q_ragged_rollback
from app.views.sections.interview_cycle import q_catch_up, q_exactness, q_k_plus_one, q_paged, q_rejected_cache
from app.views.sections.interview_diagnose import (
    q_chat_template,
    q_deep_k,
    q_draft_filters,
    q_joint_intervals,
    q_shorter_k_rate,
)
from app.views.sections.interview_models import q_greedy_numerics, q_tokenizers
from app.views.sections.interview_speed import q_acceptance_length, q_payoff, q_pick_k
from app.views.sections.interview_trees import q_tree_mask, q_tree_rollback, q_why_tree

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


def main() -> None:
    st.title("Interview practice")
    st.markdown(
        "Answer each question out loud first, then open it. Every answer points at live data: a cycle of the "
        "open trace (with a link into the stepper) or a measurement made now on a real model.")
    trace = state.current_trace()
    trace = trace if trace is not None and trace.cycles else None
    if trace is not None and is_tree_header(trace.header):
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
    q_chat_template()
    q_draft_filters()
    q_deep_k()
    q_shorter_k_rate()
    q_joint_intervals()
    q_batch_shrinks()
    q_ragged_rollback()
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
