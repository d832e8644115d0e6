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
              "engine.drafters", "engine.cycle", "engine.tree", "engine.parallel", "engine.stats", "engine.servers",
              "engine.teaching"]
# Each engine package may import the ones before it in ENGINE_LOW (and itself); the top-level
# modules (cli, run, __main__, the package's __init__) may import everything in the engine.
ALLOWED = {name: set(ENGINE_LOW[:i + 1]) for i, name in enumerate(ENGINE_LOW)}
ALLOWED["engine"] = set(ENGINE_LOW) | {"engine"}
ALLOWED["app.figures"] = {"app.figures", *ENGINE_LOW}
ALLOWED["app.ui"] = {"app.ui", "app.figures", *ENGINE_LOW, "engine"}
ALLOWED["app.runs"] = {"app.runs", "app.ui", "app.figures", *ENGINE_LOW, "engine"}
ALLOWED["app.views"] = {"app.ui", "app.figures", "app.runs", *ENGINE_LOW, "engine"}
ALLOWED["app"] = {"app", "app.ui", "app.figures", "app.runs", *ENGINE_LOW, "engine"}

# Third-party packages a part may not import at all.
FORBIDDEN = {
    "engine": {"streamlit", "plotly"},
    "engine.trace": {"torch", "transformers", "numpy"},
    "engine.trace.schema": {"torch", "transformers", "numpy"},
    "engine.config": {"torch", "transformers", "numpy"},
    "app.figures": {"streamlit"},
}


def package_of(module: str) -> str:
    """The most specific key of ALLOWED that `module` lies in (engine.trace.schema before engine.trace)."""
    keys = sorted(ALLOWED, key=len, reverse=True)
    return next(k for k in keys if module == k or module.startswith(k + "."))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file."""
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
            found += [(node.lineno, f"{module}.{a.name}" if module in ("engine", "app") else module)
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
