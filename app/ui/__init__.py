"""Streamlit pieces the pages share: the page registry, session state, background jobs and
the server's queue of them (job_queue.py, plain Python), the operator's settings (operator.py),
safe (escaped) rendering, the server's cache of the figures every session draws alike
(figure_cache.py), the sidebar and the first result each page shows, and the views that a page
draws in one of its parts (drafter_view.py for the stepper, server_view.py for the statistics
page's Your server tab, tree_stats_view.py for its tree traces, tree_trace.py for the
walkthrough's and interview's tree cycle).

May import: streamlit, app.figures and engine. Pages import this package; it never
imports a page.
"""
