"""Speculative Decoding Lab: the Streamlit app. Run with `streamlit run app/main.py`."""
