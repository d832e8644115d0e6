"""Streamlit pieces the pages share. A part of one page lives next to that page, in app/views/sections/.

- pages.py: the page registry; state.py: which trace is open; sidebar.py: the sidebar every page shares.
- names.py: what the pages call a trace's models and the shape of its drafts.
- jobs.py: live work on a background thread; job_queue.py: the server's queue of it (plain Python);
  live_work.py: the live work a page starts; timing.py: the server time of recent script runs.
- operator.py: what the person running the server decides (environment variables).
- safe.py: untrusted text escaped into Markdown; widgets.py: showing a figure, links into the stepper.
- figure_cache.py: the figures every session draws alike, built once per server.
- first_result.py: where each page puts its first result.
- tree_trace.py: the tree cycle two pages show (the walkthrough and the interview).
- workloads.py and diagnoses.py: the workloads and diagnoses the app can show (bundled, live, uploaded).
- replicas.py: a live workload's comparison with the server it replicates (engine replica).

May import: streamlit, app.figures and engine. Pages import this package; it never
imports a page.
"""
