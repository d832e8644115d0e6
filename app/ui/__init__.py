"""Streamlit pieces the pages share: the page registry, session state, background jobs,
safe (escaped) rendering, the sidebar and the first result each page shows.

May import: streamlit, app.figures and engine. Pages import this package; it never
imports a page.
"""
