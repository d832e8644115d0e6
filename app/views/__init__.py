"""The app's pages, one module each, run by `st.navigation` from app/main.py (the page
registry is app/ui/pages.py): trace_source.py, stepper.py, walkthrough.py, statistics.py,
workload.py, diagnose.py, exactness_lab.py, rollback_demo.py, interview.py. A page may import
everything else in app/ and the engine, including its own sections (sections/, a module per part
of a page); nothing imports a page.
Pages draw only: numbers come from the engine, figures and tables from app/figures, and no
page imports torch (tests/test_layout.py checks it).
"""
