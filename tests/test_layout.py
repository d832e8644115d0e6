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
# modules (run, mode, the package's __init__) may import everything in the engine but the command line.
# engine/parallel/rank.py is the top-level run under torchrun: it may import what the top level may,
# and no other module of engine.parallel may import it. The command line (engine.cli) may import
# everything in the engine; only engine/__main__.py imports it (never the library or the app).
ALLOWED = {name: set(ENGINE_LOW[:i + 1]) for i, name in enumerate(ENGINE_LOW)}
ALLOWED["engine"] = set(ENGINE_LOW) | {"engine", "engine.parallel.rank"}
ALLOWED["engine.parallel.rank"] = ALLOWED["engine"]
ALLOWED["engine.cli"] = ALLOWED["engine"] | {"engine.cli"}
ALLOWED["engine.__main__"] = {"engine.cli"}
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
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return [(line, name) for line, name, _ in resolved(path, nodes, modules)]


def resolved(path: Path, nodes: list[ast.Import | ast.ImportFrom],
             modules: set[str] | None) -> list[tuple[int, str, bool]]:
    """(line, absolute module, whether the import reads names from that module) of each name the
    import statements bring in. `from x import y` names the submodule x.y where y is one (one of
    `modules` when given, else any name imported from engine or app), else x, whose names it reads."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, False) for a in node.names]
        else:
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            # `from engine import trace` imports the submodule engine.trace
            found += [(node.lineno, f"{module}.{a.name}", False) if is_submodule(module, a.name, modules)
                      else (node.lineno, module, True) for a in node.names]
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


def test_only_main_imports_the_command_line(tmp_path, monkeypatch):
    """The command line and the torchrun rank sit on top: engine/__main__.py may import the CLI and the
    CLI may import the rank's run, but the library, the app and the rest of engine.parallel may not."""
    files = {"engine/__main__.py": "from engine.cli import main\n",
             "engine/cli/run.py": "from engine.parallel.rank import run_lead\nfrom engine.run import run_to_trace\n",
             "engine/parallel/rank.py": "from engine.run import run_to_trace\nfrom engine.mode import RunMode\n",
             "engine/run.py": "from engine.cli import run\n",
             "engine/parallel/mirror.py": "from engine.parallel.rank import RankModels\n",
             "app/runs/diagnose.py": "from engine.cli.diagnose import PairLoader\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = sorted(v.split(" (")[0] for p in sources() for v in violations(p))
    assert found == ["app/runs/diagnose.py:1 imports engine.cli.diagnose",
                     "engine/parallel/mirror.py:1 imports engine.parallel.rank",
                     "engine/run.py:1 imports engine.cli"], found


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


# ---------------------------------------------------------------- no import-time loops through packages
#
# Python runs a package's __init__.py before any module in it: importing engine.trace.schema runs
# engine/trace/__init__.py first, and whatever that imports. The graph above leaves those edges
# out, so it cannot see a loop such as engine.config -> engine.trace.schema -> (engine/trace/__init__.py)
# -> engine.trace.format -> ... -> engine.config. This graph adds them: importing a.b.c (or
# `from a.b import c`) imports a, a.b and a.b.c.
#
# Only the imports that run while the module loads count here: those at module level, in a class
# body, under a module-level if/try/with (every branch, as any may run). A function-local import
# runs when the function is called, after every module involved has finished loading, so it cannot
# make an import fail; an import under `if TYPE_CHECKING:` never runs. (The graph above still holds
# those to the one-way rule; a PEP 562 `__getattr__` that imports on first use is one of them.)
# An edge from a module to its own enclosing package is left out unless it reads names from it
# (`from engine.trace import load_trace` inside engine/trace/): Python started that package's
# __init__ before the module, so importing a submodule of it needs nothing more from it.

def runs_at_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported, in line order."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            todo += node.orelse
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo += ast.iter_child_nodes(node)
    return sorted(found, key=lambda n: n.lineno)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def load_graph() -> dict[str, dict[str, str]]:
    """importer -> {module whose loading it waits for: "file:line" of the import, and which
    package __init__ it runs when that is not the module named}."""
    modules = known_modules()
    graph: dict[str, dict[str, str]] = {m: {} for m in modules}
    for path in sources():
        importer = module_name(path)
        own_packages = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 2)}
        nodes = runs_at_import(ast.parse(path.read_text(), filename=str(path)))
        for line, name, reads_names in resolved(path, nodes, modules):
            where = f"{path.relative_to(ROOT)}:{line}"
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                loaded = ".".join(parts[:i])
                if loaded not in modules or loaded == importer:
                    continue
                if loaded in own_packages and not (reads_names and loaded == name):
                    continue
                how = where if loaded == name else f"{where}: importing {name} runs {loaded.replace('.', '/')}/__init__.py"
                graph[importer].setdefault(loaded, how)
    return graph


def test_no_import_time_loops_through_packages():
    """No chain of imports that run at load time, package __init__s included, comes back to its start."""
    found = circles(load_graph())
    assert found == [], "modules that need each other while loading:\n" + "\n".join(found)


def test_the_check_catches_a_loop_through_a_package_init(tmp_path, monkeypatch):
    """The check itself can fail: settings importing a schema whose package __init__ imports the reader,
    whose checks import the settings at the top. A function-local import, an import under
    TYPE_CHECKING and an __init__ importing its own submodules make no loop."""
    (tmp_path / "engine" / "trace").mkdir(parents=True)
    (tmp_path / "engine" / "__init__.py").write_text("import os\n")
    (tmp_path / "engine" / "config.py").write_text("from engine.trace.schema import MAX_K\n")
    (tmp_path / "engine" / "trace" / "__init__.py").write_text("from engine.trace.format import load_trace\n")
    (tmp_path / "engine" / "trace" / "schema.py").write_text("MAX_K = 8\n")
    (tmp_path / "engine" / "trace" / "format.py").write_text(
        "from engine.trace import checks\nfrom engine.trace.schema import MAX_K\n")
    (tmp_path / "engine" / "trace" / "checks.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.mode import Mode\n"
        "try:\n    from engine.config import MAX_K\nexcept ImportError:\n    pass\n")
    (tmp_path / "engine" / "mode.py").write_text("def f():\n    from engine.trace import load_trace\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert circles(load_graph()) == [
        "engine.config (engine/config.py:1: importing engine.trace.schema runs engine/trace/__init__.py)"
        " -> engine.trace (engine/trace/__init__.py:1) -> engine.trace.format (engine/trace/format.py:1)"
        " -> engine.trace.checks (engine/trace/checks.py:5) -> engine.config"]
    # the same package with the checks' import of the settings inside a function: no loop
    (tmp_path / "engine" / "trace" / "checks.py").write_text("def check():\n    from engine.config import MAX_K\n")
    assert circles(load_graph()) == []


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


def test_the_capture_plugin_imports_nothing_of_the_lab():
    """vllm_capture/ runs inside vLLM's own environment, where neither the engine nor the app is installed:
    it imports vLLM, torch, transformers, the standard library and itself (docs/architecture.md)."""
    allowed = {"vllm", "torch", "transformers", "speclab_vllm_capture"}
    plugin = ROOT / "vllm_capture" / "speclab_vllm_capture"
    sources = sorted(plugin.rglob("*.py"))
    assert sources
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for name in names:
                top = name.split(".")[0]
                assert top in allowed or top in sys.stdlib_module_names, f"{path.relative_to(ROOT)} imports {name}"
