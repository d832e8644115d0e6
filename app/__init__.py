"""Speculative Decoding Lab: the Streamlit app. Run with `streamlit run app/main.py`.

- main.py: the entry point; builds the navigation from app/ui/pages.py.
- figures/: what the pages draw, computed from a trace (no Streamlit).
- ui/: the Streamlit pieces every page shares.
- runs/: the runs the app starts or ships (live runs, diagnoses, precomputed teaching results).
- views/: the pages, and sections/ for their parts.
"""
