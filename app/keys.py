"""Left/Right arrow keys for Previous/Next cycle.

Streamlit has no key bindings, so a tiny script in an st.iframe (same origin as the
app) listens on the parent page and clicks the buttons with keys nav_prev/nav_next
(Streamlit gives each keyed element the class st-key-<key>). Keys typed into inputs,
sliders and menus are left alone so those widgets keep their own arrow-key behaviour.
"""
import streamlit as st

SCRIPT = """<script>
(() => {
  const page = window.parent;
  const doc = page.document;
  // One listener per page: a rerun or revisit replaces the handler an earlier frame added.
  if (page.__speclabArrowKeys) doc.removeEventListener("keydown", page.__speclabArrowKeys);
  const buttons = {ArrowRight: "nav_next", ArrowLeft: "nav_prev"};
  const handler = (event) => {
    if (event.altKey || event.ctrlKey || event.metaKey || event.shiftKey || !(event.key in buttons)) return;
    const target = event.target;
    if (target && target.closest && target.closest(
        'input, textarea, select, [contenteditable="true"], [role="slider"], [role="combobox"], [role="listbox"], [role="radiogroup"]')) return;
    const button = doc.querySelector(".st-key-" + buttons[event.key] + " button");
    if (button && !button.disabled) { event.preventDefault(); button.click(); }
  };
  page.__speclabArrowKeys = handler;
  doc.addEventListener("keydown", handler);
})();
</script>"""


def arrow_keys() -> None:
    """Install the listener (an invisible frame at the end of the page)."""
    with st.container(key="arrow_keys"):
        st.iframe(SCRIPT, height=1, tab_index=-1, alt="keyboard shortcuts: left and right arrow keys")
    st.html("<style>.st-key-arrow_keys { display: none; }</style>")
