"""Streamlit pieces the pages share: the page registry, session state, background jobs and
the server's queue of them (job_queue.py, plain Python), the operator's settings (operator.py),
safe (escaped) rendering, the server's cache of the figures every session draws alike
(figure_cache.py), the sidebar and the first result each page shows, and the tree cycle that
two pages show (tree_trace.py, for the walkthrough and the interview). A part of one page
lives next to that page, in app/views/sections/.

May import: streamlit, app.figures and engine. Pages import this package; it never
imports a page.
"""
