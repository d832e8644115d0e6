"""The sections of the pages in app/views/, one module per part of a page, named after its page:
statistics_*.py for Statistics and speed (statistics.py), interview_*.py for Interview practice
(interview.py), workload_*.py for Workload, diagnose_*.py for Diagnose, stepper_drafter.py for the
stepper. A page draws its sections in order; a section draws with Streamlit and takes
every number from the engine and every figure from app/figures, so the pages keep drawing only.

May import: app.ui, app.figures, app.runs, the engine and this package; never a page (nothing imports
a page, and st.navigation finds only the modules app/ui/pages.py registers).
"""
