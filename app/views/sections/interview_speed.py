"""Interview questions on speed: how to pick K, when speculation stops paying off (with the predicted
speedup for the open trace's alpha and c), and what 'acceptance length' means.
"""
import streamlit as st

from app.figures.teaching import acceptance_length_figure, speedup_figure
from app.ui import state
from app.ui.pages import STATISTICS
from app.ui.widgets import chart
from app.views.sections.interview_live import needs_trace, trace_c
from engine.stats.analysis import DEFINITIONS, acceptance_lengths
from engine.trace import Trace
from engine.trace.metrics import expected_tokens_per_cycle


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
        per_cycle = acceptance_lengths(trace.cycles)
        stats = state.current_stats()
        m, alpha = stats.acceptance, stats.alpha
        st.caption(f"Open trace: acceptance rate {m['acceptance_rate']:.3f}, mean acceptance length "
                   f"{m['mean_acceptance_length']:.3f}, i.i.d. prediction from α={alpha:.3f}: "
                   f"{expected_tokens_per_cycle(alpha, trace.k):.3f}. The prediction assumes every guess is "
                   f"accepted independently with the same chance; real acceptance comes in streaks (easy and "
                   f"hard stretches of text), so the two differ.")
        chart(acceptance_length_figure(per_cycle, trace.k, alpha), key="iv_length")
