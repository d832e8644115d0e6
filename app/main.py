"""Speculative Decoding Lab: `streamlit run app/main.py`.

Builds the navigation from the page registry (app/ui/pages.py) and opens the trace the
URL names, or the default bundled trace, before any page runs.
"""
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # so `app` and `engine` import
# pandas, imported below: Streamlit imports it lazily (st.dataframe), and Plotly checks sys.modules for it
# while building any figure. With several visitors at once, one session's first table imported it
# while another's chart found it half initialised ("partially initialized module 'pandas' has no
# attribute 'Series'", seen by bench/class_load.py). Every script run passes here first.

import pandas  # noqa: F401 - imported whole before any page runs: see above
import streamlit as st

from app.ui import operator, sidebar, state, timing
from app.ui.pages import PAGES
from app.ui.safe import md


def navigation_pages() -> list:
    """st.Page objects for the registry in app/ui/pages.py (add a page there, not here)."""
    return [st.Page(p.path, title=p.title, icon=p.icon, url_path=p.url_path or None, default=not p.url_path)
            for p in PAGES]


def run_page(page) -> None:
    """Run a page; whatever it cannot draw becomes a message, never a traceback in the browser.

    Streamlit's rerun and stop signals are BaseExceptions and pass through. The traceback
    goes to the server's log for whoever runs it.
    """
    try:
        page.run()
    except Exception as err:  # noqa: BLE001 - one odd trace must not take a page down
        traceback.print_exc()
        st.error(f"This page could not be drawn for the open trace ({type(err).__name__}: "
                 f"{md(state.shown_paths(str(err))[:300])}). Open another trace in **Choose a trace**.",
                 icon=":material/error:")


def draw_sidebar(slot) -> None:
    try:
        sidebar.render(slot)
    except Exception:  # noqa: BLE001 - the page still runs and says what is wrong
        traceback.print_exc()


def main() -> None:
    timer = timing.RunTimer()
    st.set_page_config(page_title="Speculative Decoding Lab", page_icon=":material/fast_forward:", layout="wide")
    problem = operator.problem()
    if problem:  # a mistyped setting stops every page rather than being guessed at (app/ui/operator.py)
        st.error(f"This server's settings cannot be used: {md(problem)}. Whoever runs it must fix them.",
                 icon=":material/error:")
        st.stop()
    state.open_from_url_or_default()
    page = st.navigation(navigation_pages())
    slot = st.sidebar.empty()
    draw_sidebar(slot)  # drawn first, so it is there even if the page stops early
    run_page(page)
    draw_sidebar(slot)  # and again: a live run or an upload in this run may have opened another trace
    timer.stop()  # server time of this run, for the speed test (a Next step must stay well under 150 ms)


main()
