"""Streamlit widgets every page shares: the one way a figure is shown, and links into the stepper."""
from urllib.parse import urlencode

import streamlit as st

from app.ui import state
from app.ui.pages import STEPPER


def chart(fig, key: str | None = None, **kwargs):
    """Show a figure (every page draws through here); in the light theme, text drawn on cells gets
    full-contrast ink (Streamlit's Plotly theme greys it, too faint on coloured cells)."""
    if st.context.theme.type == "light":
        fig.update_traces(textfont_color="#1b1d26", selector=dict(mode="text"))
    return st.plotly_chart(fig, key=key, config={"displaylogo": False}, **kwargs)


def stepper_query(cycle: int, stage: int) -> dict[str, str] | None:
    """The stepper's deep-link parameters for the open trace, or None without one."""
    ref = state.current_ref()
    if ref is None:
        return None
    return {"trace": ref.token, "cycle": str(cycle), "stage": str(stage)}


def open_in_stepper(cycle: int, stage: int, key: str, label: str | None = None) -> None:
    """A button that opens the stepper at this cycle and stage in this session, and a
    plain link with the same parameters that opens it in a new tab (shareable).

    The stepper reads trace/cycle/stage from the URL only when a session starts, so
    within a session the button sets the step itself before switching page.
    """
    query = stepper_query(cycle, stage)
    if query is None:
        return
    cols = st.columns([2, 3], vertical_alignment="center")
    if cols[0].button(label or f"Open cycle {cycle} at stage {stage} in the stepper", key=key,
                      icon=":material/play_circle:"):
        state.set_step(cycle, stage)
        st.switch_page(STEPPER, query_params=query)
    cols[1].markdown(f"[or in a new tab](./?{urlencode(query)})", help="A link that reopens this exact view.")
