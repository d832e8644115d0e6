"""docs/architecture.md names every module under engine/ and app/, and no module that is gone; its table
of import rules says what tests/test_layout.py's ALLOWED and FORBIDDEN say.

A module is named by a bullet that opens with its file name in backticks, under a heading that gives
its folder in backticks: "- `format.py`: ..." under "### `engine/trace/`" names engine/trace/format.py.
Other backticked names in a line (a module the description mentions) do not count.
"""
import re
from pathlib import Path

from tests.test_layout import ALLOWED, ENGINE_LOW, forbidden_for

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
HEADING = re.compile(r"^#{2,4} `((?:engine|app)(?:/[\w.]+)*)/`\s*$")
BULLET = re.compile(r"^- `([\w.]+\.py)`")
ROW = re.compile(r"^\| `([\w.]+)` \|")


def modules_on_disk(root: Path = ROOT) -> set[str]:
    return {p.relative_to(root).as_posix() for part in ("engine", "app") for p in (root / part).rglob("*.py")
            if "__pycache__" not in p.parts}


def modules_named(text: str) -> set[str]:
    """engine/trace/format.py for "- `format.py`" under "### `engine/trace/`"."""
    named, folder = set(), None
    for line in text.splitlines():
        heading = HEADING.match(line)
        if heading:
            folder = heading.group(1)
        elif line.startswith("#"):
            folder = None
        elif folder and (bullet := BULLET.match(line)):
            named.add(f"{folder}/{bullet.group(1)}")
    return named


def differences(on_disk: set[str], named: set[str]) -> list[str]:
    problems = []
    if missing := sorted(on_disk - named):
        problems.append("add a line for each of these modules (under the heading of its folder): " + ", ".join(missing))
    if gone := sorted(named - on_disk):
        problems.append("remove (or rename) these lines, their modules do not exist: " + ", ".join(gone))
    return problems


def test_the_page_names_every_module_and_only_those():
    problems = differences(modules_on_disk(), modules_named(PAGE.read_text()))
    assert not problems, "docs/architecture.md: " + "; ".join(problems)


def rows(text: str) -> dict[str, tuple[set[str], set[str]]]:
    """part -> (the parts it may import, the packages it must not import), from the table's rows."""
    found = {}
    for line in text.splitlines():
        if ROW.match(line):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            found[cells[0].strip("`")] = (set(re.findall(r"`([\w.]+)`", cells[1])),
                                          set(re.findall(r"`([\w.]+)`", cells[2])))
    return found


def test_the_import_table_says_what_test_layout_checks():
    table = rows(PAGE.read_text())
    wrong = []
    for part in sorted(set(ALLOWED) | set(table)):
        if part not in ALLOWED:
            wrong.append(f"the row {part} is no part of tests/test_layout.py's ALLOWED: remove it")
        elif part not in table:
            wrong.append(f"add a row for {part}")
        else:
            may, may_not = table[part]
            want = ALLOWED[part] - {part}
            if may != want:
                wrong.append(f"{part} may import: add {sorted(want - may)}, remove {sorted(may - want)}")
            if may_not != forbidden_for(part):
                wrong.append(f"{part} must not import: say {sorted(forbidden_for(part))}, not {sorted(may_not)}")
    assert not wrong, "docs/architecture.md's import table: " + "; ".join(wrong)
    assert set(ENGINE_LOW) <= set(table)


def test_the_check_can_fail(tmp_path):
    """A module missing from the page and a line for a module that is gone are both reported, by path."""
    for name in ("engine/__init__.py", "engine/run.py", "engine/trace/__init__.py", "engine/trace/format.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    page = ("### `engine/`\n\n- `__init__.py`: the engine.\n- `cli.py`: moved away.\n\n"
            "### `engine/trace/`\n\n- `__init__.py`: the format, and `format.py` named in passing.\n")
    assert differences(modules_on_disk(tmp_path), modules_named(page)) == [
        "add a line for each of these modules (under the heading of its folder): engine/run.py, engine/trace/format.py",
        "remove (or rename) these lines, their modules do not exist: engine/cli.py"]
