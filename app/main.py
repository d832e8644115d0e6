"""Speculative Decoding Lab: `streamlit run app/main.py`.

Builds the navigation from PAGES (add a page: one st.Page line) and opens the trace
the URL names, or the default bundled trace, before any page runs.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # so `app` and `engine` import

import streamlit as st  # noqa: E402

from app import sidebar, state  # noqa: E402

PAGES = [
    st.Page("pages/stepper.py", title="Step through cycles", icon=":material/play_circle:", default=True),
    st.Page("pages/trace_source.py", title="Choose a trace", icon=":material/folder_open:", url_path="source"),
]


def main() -> None:
    st.set_page_config(page_title="Speculative Decoding Lab", page_icon=":material/fast_forward:", layout="wide")
    state.open_from_url_or_default()
    page = st.navigation(PAGES)
    sidebar.render()
    page.run()


main()
