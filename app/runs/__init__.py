"""Runs the app starts or ships: live runs, the teaching pair, precomputed teaching results.

May import: streamlit, app.ui, app.figures and engine.
"""
