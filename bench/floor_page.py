"""The least a chart page can cost: a title and one three-bar Plotly chart, nothing else.

bench/app_speed.py --pages-only times it beside the app's pages, in the same browser, so a
page's time can be read against what Streamlit and Plotly's own script cost on this machine.
"""
import plotly.graph_objects as go
import streamlit as st

st.title("Reference page")
if st.query_params.get("chart", "1") == "1":
    st.plotly_chart(go.Figure(go.Bar(x=[1, 2, 3], y=[1, 3, 2])), key="reference")
else:
    st.table([{"a": 1, "b": "x"}])
