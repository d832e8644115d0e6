"""Runs the app starts or ships: live runs, the teaching pair, precomputed teaching results, and the shipped
batch benchmarks (batch_bench.py).

May import: streamlit, app.ui, app.figures and engine.
"""
