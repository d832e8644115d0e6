"""The folders show the design: imports between packages run one way only.

Every import in engine/ and app/ (function-local ones too) is read with `ast` and mapped
to the package it lands in. A package may import only the packages listed under it in
ALLOWED; so a new import that goes the wrong way (the engine reaching into the app, the
trace module pulling in torch, a figure calling Streamlit) fails here with its file and line.
"""
import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

ENGINE_LOW = ["engine.trace.schema", "engine.config", "engine.trace", "engine.models", "engine.kv",
              "engine.drafters", "engine.cycle", "engine.batch", "engine.tree", "engine.parallel", "engine.stats",
              "engine.servers", "engine.teaching"]
# Each engine package may import the ones before it in ENGINE_LOW (and itself); the top-level
# modules (cli, run, __main__, the package's __init__) may import everything in the engine.
ALLOWED = {name: set(ENGINE_LOW[:i + 1]) for i, name in enumerate(ENGINE_LOW)}
ALLOWED["engine"] = set(ENGINE_LOW) | {"engine"}
ALLOWED["app.figures"] = {"app.figures", *ENGINE_LOW}
ALLOWED["app.ui"] = {"app.ui", "app.figures", *ENGINE_LOW, "engine"}
ALLOWED["app.runs"] = {"app.runs", "app.ui", "app.figures", *ENGINE_LOW, "engine"}
ALLOWED["app.views"] = {"app.ui", "app.figures", "app.runs", "app.views.sections", *ENGINE_LOW, "engine"}
ALLOWED["app.views.sections"] = {"app.views.sections", "app.ui", "app.figures", "app.runs", *ENGINE_LOW, "engine"}
ALLOWED["app"] = {"app", "app.ui", "app.figures", "app.runs", *ENGINE_LOW, "engine"}

# Third-party packages a part may not import at all.
FORBIDDEN = {
    "engine": {"streamlit", "plotly"},
    "engine.trace": {"torch", "transformers", "numpy"},
    "engine.trace.schema": {"torch", "transformers", "numpy"},
    "engine.config": {"torch", "transformers", "numpy"},
    "app.figures": {"streamlit"},
    "app.views": {"torch", "transformers"},  # pages draw only: live runs and models go through app/runs and the engine
}


def package_of(module: str) -> str:
    """The most specific key of ALLOWED that `module` lies in (engine.trace.schema before engine.trace)."""
    keys = sorted(ALLOWED, key=len, reverse=True)
    return next(k for k in keys if module == k or module.startswith(k + "."))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_submodule(module: str, name: str, modules: set[str] | None) -> bool:
    return f"{module}.{name}" in modules if modules is not None else module in ("engine", "app")


def imports_of(path: Path, modules: set[str] | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file. `from x import y` names the submodule x.y
    where y is one: one of `modules` when given, else any name imported from engine or app."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            # `from engine import trace` imports the submodule engine.trace
            found += [(node.lineno, f"{module}.{a.name}" if is_submodule(module, a.name, modules) else module)
                      for a in node.names]
    return found


def sources() -> list[Path]:
    return sorted(p for part in ("engine", "app") for p in (ROOT / part).rglob("*.py"))


def violations(path: Path) -> list[str]:
    own = package_of(module_name(path))
    bad = []
    for line, module in imports_of(path):
        top = module.split(".")[0]
        where = f"{path.relative_to(ROOT)}:{line} imports {module}"
        if top in ("engine", "app"):
            if package_of(module) not in ALLOWED[own]:
                bad.append(f"{where} ({own} may import only {', '.join(sorted(ALLOWED[own]))})")
        elif any(own == k or own.startswith(k + ".") for k in FORBIDDEN) and top in forbidden_for(own):
            bad.append(f"{where} ({own} must not import {top})")
    return bad


def forbidden_for(own: str) -> set[str]:
    return set().union(*(v for k, v in FORBIDDEN.items() if own == k or own.startswith(k + ".")))


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_one_way(path):
    assert violations(path) == []


def test_every_package_says_what_it_holds_and_may_import():
    for init in [*(ROOT / "engine").rglob("__init__.py"), *(ROOT / "app").rglob("__init__.py")]:
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        subpackage = init.parent not in (ROOT / "engine", ROOT / "app")
        assert doc, f"{init.relative_to(ROOT)} has no docstring"
        if subpackage:
            assert "import" in doc, f"{init.relative_to(ROOT)} does not say what it may import"


def test_the_check_catches_a_wrong_way_import(tmp_path, monkeypatch):
    """The check itself can fail: a trace module importing torch, an engine module importing the app."""
    fake_root = tmp_path
    (fake_root / "engine" / "trace").mkdir(parents=True)
    (fake_root / "engine" / "trace" / "format.py").write_text("import torch\nfrom engine.cycle import reference\n")
    (fake_root / "engine" / "run.py").write_text("from app.ui import state\n")
    (fake_root / "app" / "figures").mkdir(parents=True)
    (fake_root / "app" / "figures" / "cycle.py").write_text("import streamlit as st\nfrom app.ui import jobs\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    found = [v for p in sources() for v in violations(p)]
    assert len(found) == 5, found


# ---------------------------------------------------------------- no import circles between modules
#
# A circle between two modules works today only because one side imports the other inside a
# function, after both have loaded; it breaks as soon as someone moves that import to the top,
# and it hides which module is the lower one. So every import counts: function-local ones,
# `from engine.x import y` where y is a submodule, `from . import y`. Imports under
# `if TYPE_CHECKING:` count too: they never run, but a circle through them is still two modules
# that each need the other's names, and moving them out (a dataclass field, a runtime check) would
# make the circle real; breaking it costs a small leaf module, as for any other circle.

def known_modules() -> set[str]:
    return {module_name(p) for p in sources()}


def edges_of(path: Path, modules: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every import in the file that lands in engine/ or app/, naming the
    submodule where a `from x import y` imports one."""
    return [(line, module) for line, module in imports_of(path, modules) if module in modules]


def import_graph() -> dict[str, dict[str, str]]:
    """importer -> {imported: "file:line" of the first import of it}."""
    modules = known_modules()
    graph: dict[str, dict[str, str]] = {m: {} for m in modules}
    for path in sources():
        importer = module_name(path)
        for line, imported in edges_of(path, modules):
            if imported != importer:
                graph[importer].setdefault(imported, f"{path.relative_to(ROOT)}:{line}")
    return graph


def circles(graph: dict[str, dict[str, str]]) -> list[str]:
    """One circle of each strongly connected group of modules, each import named by file and line."""
    found = []
    for group in strongly_connected(graph):
        if len(group) > 1:
            found.append(" -> ".join(describe(cycle_through(graph, group))))
    return found


def strongly_connected(graph: dict[str, dict[str, str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative: the groups of modules that can each reach the others."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                groups.append(group)
    return groups


def cycle_through(graph: dict[str, dict[str, str]], group: set[str]) -> list[tuple[str, str]]:
    """A shortest circle from the group's first module back to itself, breadth first inside the
    group: each step is (module, "file:line" where it imports the next one)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while start not in came_from:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child in group and child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    steps = [came_from[start]]
    while steps[-1] != start:
        steps.append(came_from[steps[-1]])
    steps.reverse()  # start, ..., the module that imports start
    return [(m, graph[m][steps[(i + 1) % len(steps)]]) for i, m in enumerate(steps)]


def describe(cycle: list[tuple[str, str]]) -> list[str]:
    return [f"{module} ({where})" for module, where in cycle] + [cycle[0][0]]


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_the_check_catches_an_import_circle(tmp_path, monkeypatch):
    """The circle check itself can fail: one circle through a function-local import and a
    `from package import submodule`, one through `from . import`, and none where imports run one way."""
    fake_root = tmp_path
    (fake_root / "engine" / "trace").mkdir(parents=True)
    (fake_root / "engine" / "trace" / "__init__.py").write_text('"""Fake."""\n')
    (fake_root / "engine" / "trace" / "checks.py").write_text("from engine.trace import tree_checks\n")
    (fake_root / "engine" / "trace" / "tree_checks.py").write_text(
        "def check():\n    from engine.trace.checks import BrokenInvariant\n")
    (fake_root / "engine" / "trace" / "schema.py").write_text("")
    (fake_root / "engine" / "trace" / "format.py").write_text("from engine.trace import schema\n")
    (fake_root / "app" / "ui").mkdir(parents=True)
    (fake_root / "app" / "ui" / "__init__.py").write_text('"""Fake."""\n')
    (fake_root / "app" / "ui" / "state.py").write_text("from . import jobs\n")
    (fake_root / "app" / "ui" / "jobs.py").write_text("from app.ui.state import remember\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    found = circles(import_graph())
    assert sorted(found) == [
        "app.ui.jobs (app/ui/jobs.py:1) -> app.ui.state (app/ui/state.py:1) -> app.ui.jobs",
        "engine.trace.checks (engine/trace/checks.py:1) -> engine.trace.tree_checks (engine/trace/tree_checks.py:2)"
        " -> engine.trace.checks",
    ], found


def test_no_page_imports_torch(tmp_path, monkeypatch):
    """Pages draw only: no module in app/views/ (the pages and their sections, function-local imports
    included) imports torch or transformers. The check can fail: a page importing torch at the top
    and a section importing transformers inside a function are both caught."""
    pages = sorted((ROOT / "app" / "views").rglob("*.py"))
    assert {p.name for p in pages} >= {"stepper.py", "statistics.py", "exactness_lab.py", "interview.py"}
    assert [v for p in pages for v in violations(p) if "must not import" in v] == []
    (tmp_path / "app" / "views" / "sections").mkdir(parents=True)
    (tmp_path / "app" / "views" / "lab.py").write_text("import torch\nimport streamlit as st\n")
    (tmp_path / "app" / "views" / "sections" / "part.py").write_text(
        "def load():\n    from transformers import AutoModel\n    return AutoModel\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = [v for p in sources() for v in violations(p)]
    assert len(found) == 2 and all("must not import" in v for v in found), found
