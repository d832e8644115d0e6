"""scripts/review_screenshots.py's list of shots: every page, every bundled trace, workload and diagnosis,
each shot under its own name (the script itself drives a browser; run it by hand for the review)."""
import ast
from pathlib import Path

from app.ui.pages import PAGES
from scripts.review_screenshots import shots

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "assets"


def literal_tabs(view: str) -> list[str]:
    """A page's TABS list, where it is written out as string literals."""
    tree = ast.parse((ROOT / "app" / view).read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "TABS")
    return ast.literal_eval(node.value)


def test_every_page_and_bundled_item_is_shot_once():
    found = shots()
    names = [s.name for s in found]
    assert len(names) == len(set(names))
    paths = [s.path for s in found]
    for page in PAGES:  # the default page opens at the root
        assert any(p.split("?")[0] == f"/{page.url_path}" for p in paths), page.title
    for trace in ASSETS.glob("traces/*.jsonl"):
        assert f"stepper--{trace.stem}" in names
    workloads = sorted(p.name for p in ASSETS.glob("workloads/*.zip"))
    assert all(any(w in p for p in paths) for w in workloads[1:])  # the first: the page's default, opened bare
    cases = sorted(p.stem for p in ASSETS.glob("diagnoses/*.json"))
    assert all(any(f"~{c}--baseline.zip~" in p for p in paths) for c in cases[1:])
    stats_tabs = {s.tab for s in found if s.path.startswith("/statistics?trace=bundled:default")}
    assert stats_tabs == set(literal_tabs("views/statistics.py"))
