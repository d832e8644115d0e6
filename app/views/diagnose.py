"""Why is acceptance low? `engine diagnose` in the app: the baseline against arms that each change one
thing on the same requests, ranked, with the traces behind every number (links into the stepper).

Sources: app/views/sections/diagnose_source.py (bundled cases, live diagnoses, a live run); views:
app/views/sections/diagnose_views.py; the diagnoses themselves: app/ui/diagnoses.py. Only the open
tab runs.
"""
import streamlit as st

from app.ui import diagnoses, state
from app.ui.first_result import first_result
from app.ui.safe import md
from app.views.sections import diagnose_source, diagnose_views

TAB = "diagnose_tab"
LIVE = "Run one live"
TABS = ["Ranked report", "Per request", "Draft agreement", LIVE]


def draw_tab(name: str, choice: tuple[str, str], d: dict, manifest: dict | None) -> None:
    if name == "Ranked report":
        diagnose_views.report_tab(choice, d, diagnoses.verdict(choice, d), diagnoses.options(choice, d))
    elif name == "Per request":
        diagnose_views.requests_tab(choice, d)
    elif name == "Draft agreement":
        diagnose_views.probe_tab(choice, d, manifest)
    elif name == LIVE:
        diagnose_source.live_form()


def main() -> None:
    st.title("Why is acceptance low?")
    slot = first_result()
    # the pick and the pair's settings share one row, so the verdict's chart fits the first screen
    pick, about = st.columns([2, 3], vertical_alignment="bottom")
    with pick:
        choice = diagnose_source.choose()
    if choice is None:
        diagnose_source.live_form()
    else:
        show(slot, about, choice)


def show(slot, about, choice: tuple[str, str]) -> None:
    try:
        d = diagnoses.load(choice)
    except (diagnoses.DiagnosisError, OSError) as err:
        st.error(f"Could not read this diagnosis: {md(' '.join(state.shown_paths(str(err)).split()))}",
                 icon=":material/error:")
        return
    manifest = diagnoses.manifest_of(diagnoses.arm_workload(choice, diagnoses.BASELINE)) \
        if diagnoses.has_arm(choice, diagnoses.BASELINE) else None
    advice = diagnoses.advice(choice, d)
    slot.markdown(diagnose_views.headline(d, diagnoses.verdict(choice, d), len(diagnoses.options(choice, d)), advice))
    about.caption(diagnose_views.describe(manifest))
    if st.session_state.pop(diagnose_source.SHOW_REPORT, False):
        st.session_state[TAB] = TABS[0]
    for name, tab in zip(TABS, st.tabs(TABS, key=TAB, on_change="rerun")):
        if tab.open:
            with tab:
                draw_tab(name, choice, d, manifest)


main()
