"""Streamlit widgets every page shares: the one way a figure is shown, and links into the stepper."""
from typing import Callable, Hashable, Sequence
from urllib.parse import urlencode

import plotly.graph_objects as go
import streamlit as st

from app.ui import state
from app.ui.figure_cache import FIGURE_BYTES_KEPT, FIGURES_KEPT, FigureCache, PreparedFigure
from app.ui.pages import STEPPER

# The server's one cache of figures that every session draws alike (app/ui/figure_cache.py).
FIGURES = FigureCache(FIGURES_KEPT, FIGURE_BYTES_KEPT, state.CACHE_TTL_S)


def themed(fig: go.Figure, theme: str | None) -> go.Figure:
    """In the light theme, text drawn on cells gets full-contrast ink (Streamlit's Plotly theme
    greys it, too faint on coloured cells). Changes `fig` and returns it."""
    if theme == "light":
        fig.update_traces(textfont_color="#1b1d26", selector=dict(mode="text"))
    return fig


def plot(fig: go.Figure, key: str | None = None, **kwargs):
    return st.plotly_chart(fig, key=key, config={"displaylogo": False}, **kwargs)


def chart(fig, key: str | None = None, **kwargs):
    """Show a figure (every page draws through here), themed for this session."""
    if not isinstance(fig, PreparedFigure):  # a shared figure is themed already, and nobody may change it
        themed(fig, st.context.theme.type)
    return plot(fig, key, **kwargs)


def shared_figures(name: tuple[Hashable, ...], build: Callable[[], Sequence[go.Figure]]) -> tuple[PreparedFigure, ...]:
    """Figures that are the same for every session with this `name` (the open trace's content key
    first, then all the figure depends on): built and themed once per theme, then shared through
    FIGURES. Never change what this returns. Without a trace key nothing is shared."""
    theme = st.context.theme.type
    if not name or not name[0]:
        return tuple(PreparedFigure(themed(f, theme)) for f in build())
    return FIGURES.get((*name, theme), lambda: [themed(f, theme) for f in build()])


def shared_chart(name: tuple[Hashable, ...], build: Callable[[], go.Figure], key: str | None = None, **kwargs):
    """chart() of a figure every session with this `name` draws alike (see shared_figures)."""
    (fig,) = shared_figures(name, lambda: [build()])
    return plot(fig, key, **kwargs)


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


def remembered_pick(label: str, found: list, *, remember: str, key: str, words: Callable[[object], str],
                    came_from: object = None, empty: str = "") -> object | None:
    """A selectbox over `found` that keeps its choice in session_state[remember] across pages: the
    remembered one, else `came_from` (what the open trace belongs to), else the first. With nothing to
    pick, `empty` is shown and None returned."""
    current = st.session_state.get(remember)
    if current is None:
        current = came_from
    if not found:
        st.info(empty)
        return None
    if current not in found:
        current = found[0]
    picked = st.selectbox(label, found, index=found.index(current), format_func=words, key=key)
    st.session_state[remember] = picked
    return picked
