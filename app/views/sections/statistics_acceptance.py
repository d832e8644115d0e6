"""The statistics page's Acceptance tab for a chain trace: the acceptance metrics, acceptance per
position against the i.i.d. prediction, for prompt lookup acceptance by matched n-gram size, and for
suffix decoding acceptance by the tree that proposed.

Numbers: engine/stats/analysis.py (TraceStats); figures: app/figures/stats.py.
"""
import streamlit as st

from app.figures import stats as figs
from app.views.sections.statistics_widgets import chart_pair, metric_row, numbered_line
from engine.stats.analysis import DEFINITIONS, TraceStats


def acceptance_section(st_: TraceStats) -> None:
    a = st_.acceptance
    metric_row([("Draft acceptance rate", f"{a['acceptance_rate']:.3f}", DEFINITIONS["acceptance_rate"]),
                ("Mean acceptance length", f"{a['mean_acceptance_length']:.3f}", DEFINITIONS["mean_acceptance_length"]),
                ("alpha (mean beta)", f"{st_.alpha:.3f}", DEFINITIONS["alpha"]),
                ("Cycles", f"{st_.num_cycles}", f"K = {st_.k} draft tokens each.")])
    numbered_line("Per-position acceptance", a["per_position_acceptance"])
    st.caption(DEFINITIONS["per_position_acceptance"])
    chart_pair((figs.per_position_figure(st_), "fig_per_position"), (figs.tokens_per_cycle_figure(st_), "fig_tokens_per_cycle"))
    st.caption("The prediction assumes every draft token passes independently with probability alpha "
               "(Leviathan et al. 2023): then a cycle commits n ≤ K tokens with probability "
               "alpha^(n-1)(1 - alpha), and K+1 with probability alpha^K.")
    if st_.by_ngram:
        ngram_section(st_)
    if st_.by_source:
        source_section(st_)


def ngram_section(st_: TraceStats) -> None:
    """Prompt lookup: does a longer matched n-gram predict the continuation better?"""
    st.markdown("**Prompt lookup: acceptance by matched n-gram size**")
    st.dataframe([{"n-gram size": "no match" if r.value is None else str(r.value), "cycles": r.cycles,
                   "proposed": r.proposed, "accepted": r.accepted, "acceptance rate": round(r.acceptance_rate, 3)}
                  for r in st_.by_ngram], hide_index=True, key="ngram_table")
    st.caption("A cycle without a match proposes nothing: it is a plain target step. Prompt lookup runs no "
               "model, so its draft step costs almost nothing and c is close to 0.")


def source_section(st_: TraceStats) -> None:
    """Suffix decoding: are drafts from the global tree kept as often as the request's own tree's?"""
    st.markdown("**Suffix decoding: acceptance by the tree that proposed**")
    st.dataframe([{"tree": {"request": "this request's text", "global": "all outputs (global tree)"}.get(
                       r.value, "neither (nothing proposed)"), "cycles": r.cycles, "proposed": r.proposed,
                   "accepted": r.accepted, "acceptance rate": round(r.acceptance_rate, 3)}
                  for r in st_.by_source], hide_index=True, key="source_table")
    st.caption("Each cycle the tree whose draft scores higher (the sum of its tokens' frequency probabilities) "
               "proposes; a cycle where neither has a continuation is a plain target step. No model runs, so c "
               "is close to 0.")

