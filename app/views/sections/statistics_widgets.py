"""What the statistics page's sections draw alike, for a chain trace and a tree trace: a row of metrics
with their definitions under them, a line of rates numbered by position or depth, two charts side by
side, and the tab widgets that keep the user's choice while another tab is open.
"""
from typing import Sequence

import plotly.graph_objects as go
import streamlit as st

from app.ui.widgets import chart


def metric_row(metrics: Sequence[tuple[str, str, str | None]]) -> None:
    """Metrics side by side, one column each: (label, value, the caption under it or None)."""
    for col, (label, value, caption) in zip(st.columns(len(metrics)), metrics):
        col.metric(label, value)
        if caption is not None:
            col.caption(caption)


def numbered_line(title: str, values: Sequence[float]) -> None:
    """'**title**: 1: 0.812 · 2: 0.640 · ...': one rate per position (a chain) or depth (a tree)."""
    st.markdown(f"**{title}**: " + " · ".join(f"{i}: {p:.3f}" for i, p in enumerate(values, start=1)))


def chart_pair(left: tuple[go.Figure, str], right: tuple[go.Figure, str]) -> None:
    """Two (figure, key) charts in two columns."""
    for col, (fig, key) in zip(st.columns(2), (left, right)):
        with col:
            chart(fig, key=key)


def keep_tab_widgets(keys: Sequence[str]) -> None:
    """Only the open tab runs, and Streamlit forgets a widget's value after a run that did not
    draw it. Storing every value back at the top of each run keeps what the user chose when
    they switch tabs and back (Streamlit's documented way). The widgets take their starting
    values from start_at, not from a default argument, which Streamlit would warn about.
    Leaving the page still resets them, as on every page."""
    for key in keys:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def start_at(key: str, value) -> None:
    """A tab widget's starting value, unless the user already chose one."""
    if key not in st.session_state:
        st.session_state[key] = value
