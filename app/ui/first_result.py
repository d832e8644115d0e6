"""Where each page puts its first result: the page's point in plain Markdown, near the top.

A chart needs Plotly's 4.7 MB script, which Streamlit loads only when a page's first chart
arrives; parsing it blocks the browser for about a second. Markdown (with escaped token
texts, app.ui.safe.md) needs no extra script, so this line shows with the page's title.
bench/app_speed.py times each page to this container (its CSS class is st-key-first_result).
"""
import streamlit as st

FIRST_RESULT = "first_result"  # the container's key


def first_result():
    """The page's first-result container (one per page); fill it with .markdown(...)."""
    return st.container(key=FIRST_RESULT)
