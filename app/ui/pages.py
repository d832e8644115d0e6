"""The app's pages: the one registry that app/main.py builds the navigation from and that
every link and page switch names.

A page's path is relative to app/main.py, as `st.Page` and `st.switch_page` take it.
Page modules live in app/views/, not app/pages/: Streamlit still treats a `pages/` folder
next to the main script as a legacy multipage app and, on reruns, can run a page without
main.py (no sidebar, no trace opened).
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class PageSpec:
    path: str  # relative to app/main.py
    title: str
    icon: str
    url_path: str  # "" for the default page, which opens at the app's root URL


STEPPER = "views/stepper.py"
TRACE_SOURCE = "views/trace_source.py"
WALKTHROUGH = "views/walkthrough.py"
ROLLBACK_DEMO = "views/rollback_demo.py"
EXACTNESS_LAB = "views/exactness_lab.py"
INTERVIEW = "views/interview.py"
STATISTICS = "views/statistics.py"
WORKLOAD = "views/workload.py"
DIAGNOSE = "views/diagnose.py"

PAGES = (
    PageSpec(STEPPER, "Step through cycles", ":material/play_circle:", ""),
    PageSpec(TRACE_SOURCE, "Choose a trace", ":material/folder_open:", "source"),
    PageSpec(WALKTHROUGH, "How a cycle works", ":material/school:", "walkthrough"),
    PageSpec(ROLLBACK_DEMO, "Why rollback matters", ":material/bug_report:", "rollback"),
    PageSpec(EXACTNESS_LAB, "Exactness lab", ":material/science:", "exactness"),
    PageSpec(INTERVIEW, "Interview practice", ":material/quiz:", "interview"),
    PageSpec(STATISTICS, "Statistics and speed", ":material/monitoring:", "statistics"),
    PageSpec(WORKLOAD, "Workload", ":material/stacked_bar_chart:", "workload"),
    PageSpec(DIAGNOSE, "Why is acceptance low?", ":material/troubleshoot:", "diagnose"),
)


def spec(path: str) -> PageSpec:
    return next(p for p in PAGES if p.path == path)
