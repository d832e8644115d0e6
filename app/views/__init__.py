"""The app's pages, one module each, run by `st.navigation` from app/main.py (the page
registry is app/ui/pages.py). A page may import everything else in app/ and the engine;
nothing imports a page.
"""
