"""Hostile traces (tests/hostile.py) against the loader, `engine stats` and the app's pages.

Every case must end as its label says: a valid trace loads and its statistics print; an
invalid one is refused with one clear line (a TraceError, exit code 2). Nothing may raise
anything else or run past a per-case time limit.
"""
import html
import signal
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine.cli import main as cli_main
from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.mode import RunMode
from engine.run import run_to_trace
from engine.teaching.faults import Faults
from engine.trace.format import MAX_TRACE_BYTES, TraceError, loads_trace
from tests.eagle_tiny import eagle_trace
from tests.hostile import INVALID, PARTIAL, VALID, Base, generate
from tests.tiny import noisy_pair, tiny_pair

ROOT = Path(__file__).resolve().parent.parent
CASE_SECONDS = 10  # far above any case's real cost (milliseconds): reaching it means a hang


class Hang(BaseException):
    """Raised by the timer; a BaseException so no `except Exception` in the code under test swallows it."""


@contextmanager
def time_limit(seconds: float):
    def alarm(signum, frame):
        raise Hang()
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def write_bases(folder: Path) -> list[Base]:
    """Real engine traces from tiny models (every kind of cycle and every declared fault) and two bundled ones."""
    pair, noisy, eos_pair = tiny_pair(), noisy_pair(0, noise=0.1), tiny_pair(3, eos=True)
    same = Pair(noisy.target, noisy.target, set())
    runs = {
        "sampled": (noisy, SpecSettings(k=4, temperature=1.0, max_new_tokens=30, seed=1), Faults(), True),
        "eos": (eos_pair, SpecSettings(k=3, temperature=1.0, max_new_tokens=40, seed=5), Faults(), False),
        "greedy": (noisy, SpecSettings(k=3, temperature=0.0, max_new_tokens=20), Faults(), False),
        "same-model": (same, SpecSettings(k=3, temperature=1.0, max_new_tokens=14, seed=2), Faults(), False),
        "k32": (pair, SpecSettings(k=32, temperature=0.9, top_k=6, top_p=0.9, max_new_tokens=16, seed=4,
                                   trace_top_k=3), Faults(), False),
        "keep-rejected": (pair, SpecSettings(k=3, max_new_tokens=20, seed=3), Faults(keep_rejected_kv=True), False),
        "skip-catch-up": (same, SpecSettings(k=2, max_new_tokens=12, seed=3), Faults(skip_draft_catch_up=True), False),
        "p-target-only": (pair, SpecSettings(k=3, max_new_tokens=16, seed=6), Faults(acceptance_rule="p_target_only"), False),
        "token-match": (pair, SpecSettings(k=3, max_new_tokens=16, seed=7), Faults(acceptance_rule="token_match"), False),
        "no-residual": (pair, SpecSettings(k=3, max_new_tokens=16, seed=8), Faults(acceptance_rule="no_residual",
                                                                                   greedy_draft=True), False),
    }
    bases = []
    for name, (p, s, faults, calibrate) in runs.items():
        path = folder / f"{name}.jsonl"
        run_to_trace(p, "the cat sat on", s, path,
                     RunMode(faults=faults if faults != Faults() else None, calibrate=calibrate))
        bases.append(Base.read(name, path))
    eagle_trace(folder / "eagle.jsonl")  # an EAGLE head: partial accepts, full accepts and head catch-ups
    bases.append(Base.read("eagle", folder / "eagle.jsonl"))
    for name in ("default.jsonl", "shakespeare-greedy-k8.jsonl", "shakespeare-cache-paged.jsonl",
                 "chat-prompt-lookup-greedy-k4.jsonl", "shakespeare-other-tokenizer-greedy-k6.jsonl"):
        bases.append(Base.read(name, ROOT / "assets" / "traces" / name))
    return bases


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return generate(write_bases(tmp_path_factory.mktemp("bases")))


def outcome(fn, *args, **kwargs) -> str:
    """How fn(*args, **kwargs) ended: 'accepted', 'refused: ...', 'crash: ...' or 'hang'."""
    try:
        with time_limit(CASE_SECONDS):
            fn(*args, **kwargs)
        return "accepted"
    except Hang:
        return "hang"
    except TraceError as err:
        message = str(err)
        if "\n" in message or not message.strip():
            return f"crash: refusal is not one line: {message[:200]!r}"
        return "refused: " + message
    except Exception as err:  # noqa: BLE001 - any other exception is the bug this test looks for
        return f"crash: {type(err).__name__}: {err}"[:300]


def kept(results: list, fn, *args):
    """fn(*args), its result appended to `results` (outcome() keeps only how the call ended)."""
    results.append(fn(*args))


def test_the_generator_covers_every_category(cases):
    assert len(cases) >= 1000
    by_category = Counter(c.category for c in cases)
    assert set(by_category) >= {"valid", "truncated", "retyped", "out-of-range", "inconsistent", "huge", "deep",
                                "non-finite", "structure"}
    assert Counter(c.expect for c in cases)[VALID] >= 100


def test_load_trace_refuses_exactly_the_bad_ones(cases):
    failures = []
    for case in cases:
        # The app and `engine stats` read with allow_incomplete=True; False is stricter (a missing summary
        # or a cut last line is refused too), so a case refused with True needs no second run.
        for allow in ((False, True) if case.expect != INVALID else (True,)):
            limit = case.max_bytes or MAX_TRACE_BYTES
            got = outcome(loads_trace, case.data, case.name, allow_incomplete=allow, max_bytes=limit)
            want = "accepted" if case.expect == VALID or (case.expect == PARTIAL and allow) else "refused"
            if not got.startswith(want):
                failures.append(f"{case.name} (allow_incomplete={allow}): expected {want}, got {got}")
            elif case.category in ("inconsistent", "out-of-range") and got.startswith("refused") \
                    and not ("line " in got and "field '" in got):
                failures.append(f"{case.name}: the refusal names no line and field: {got}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])


def test_engine_stats_prints_or_refuses_every_case(cases, tmp_path, capsys):
    """`python -m engine stats` in-process on every case (the CLI reads incomplete traces too)."""
    failures = []
    path = tmp_path / "case.jsonl"
    for i, case in enumerate(cases):
        if case.max_bytes or (case.expect == INVALID and i % 4):
            continue  # size limits are tested above; a refusal is the loader's, so a quarter of them suffice
        path.write_bytes(case.data)
        code = []
        got = outcome(kept, code, cli_main, ["stats", str(path)])
        out, err = capsys.readouterr()
        want = 2 if case.expect == INVALID else 0
        if got != "accepted" or code != [want]:
            failures.append(f"{case.name}: expected exit {want}, got {got} {code} {err.strip()[:200]}")
        elif want == 2 and len(err.strip().splitlines()) != 1:
            failures.append(f"{case.name}: the error is not one line: {err[:300]!r}")
        elif want == 0 and "ACCEPTANCE" not in out:
            failures.append(f"{case.name}: no statistics printed")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])


def test_the_checker_knows_every_fault_the_engine_can_declare():
    """engine.trace.checks mirrors engine.teaching.faults.Faults and TreeFaults without importing torch: the two
    must not drift apart."""
    from dataclasses import fields

    from engine.drafters.registry import DRAFTERS as DRAFTER_KINDS
    from engine.teaching.faults import Faults, TreeFaults
    from engine.trace.checks import FAULT_FIELDS, TREE_FAULT_FIELDS
    from engine.trace.schema import ACCEPTANCE_RULE_TEXT as ACCEPTANCE_RULES
    from engine.trace.schema import ACCEPTANCE_RULES as CHECKED_RULES
    from engine.trace.schema import DRAFTER_KINDS as CHECKED_KINDS
    from engine.trace.schema import MAX_NGRAM
    from engine.trace.schema import MAX_NGRAM as CHECKED_MAX_NGRAM
    assert {f.name: f.type for f in fields(Faults)} == FAULT_FIELDS
    assert {f.name: f.type for f in fields(TreeFaults)} == TREE_FAULT_FIELDS
    assert tuple(ACCEPTANCE_RULES) == CHECKED_RULES
    assert tuple(DRAFTER_KINDS) == CHECKED_KINDS and MAX_NGRAM == CHECKED_MAX_NGRAM


def test_a_declared_fault_is_checked_not_excused(tmp_path):
    """A run that keeps its rejected K/V loads with its fault declared and is refused without it."""
    import json
    pair = tiny_pair()
    path = tmp_path / "keep.jsonl"
    run_to_trace(pair, "the cat sat on", SpecSettings(k=3, max_new_tokens=20, seed=3), path,
                 RunMode(faults=Faults(keep_rejected_kv=True)))
    text = path.read_text()
    assert loads_trace(text).header["faults"]["keep_rejected_kv"] is True
    header, rest = text.split("\n", 1)
    undeclared = json.dumps({k: v for k, v in json.loads(header).items() if k != "faults"}) + "\n" + rest
    with pytest.raises(TraceError, match=r"cycle \d+\): field 'target_cache_len.after_rollback': must be \d+: "
                                         "committed length - 1 by the convention"):
        loads_trace(undeclared)


# ---------------------------------------------------------------- the app's pages

APP_SAMPLE = {  # case name -> what the page must do with it
    "sampled/target-empty": VALID, "sampled/odd-text-3": VALID, "default.jsonl/odd-text-0": VALID,
    "k32/identity": VALID, "keep-rejected/names-are-paths": VALID, "eos/cut-line-1": PARTIAL,
    "sampled/numeric-model-name": INVALID, "sampled/deep-1000": INVALID,
    "greedy/inconsistent-target_cache_len.after_rollback+1@0": INVALID,
}
TRACE_PAGES = ["views/stepper.py", "views/trace_source.py", "views/interview.py", "views/statistics.py"]
MODEL_PAGES = ["views/walkthrough.py", "views/rollback_demo.py", "views/exactness_lab.py"]


@pytest.fixture(scope="module")
def app_folder(tmp_path_factory, cases):
    from tests.test_teaching_pages import make_teaching_folder
    root = make_teaching_folder(tmp_path_factory.mktemp("app"))  # tiny teaching pair and a default trace
    by_name = {c.name: c for c in cases}
    for i, name in enumerate(APP_SAMPLE):
        (root / "traces" / f"hostile-{i}.jsonl").write_bytes(by_name[name].data)
    return root


def render(folder: Path, monkeypatch, trace_file: str, page: str, stage: int = 5):
    from streamlit.testing.v1 import AppTest
    monkeypatch.setenv("SPECLAB_TEACHING_PAIR", str(folder / "pair"))
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder / "traces"))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(folder / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60)
    at.query_params.update({"trace": f"bundled:{trace_file}", "cycle": "1", "stage": str(stage)})
    at.run()
    if page != "views/stepper.py":
        at.switch_page(page).run()
    return at


@pytest.mark.parametrize("index", range(len(APP_SAMPLE)), ids=list(APP_SAMPLE))
def test_every_page_draws_or_explains_a_hostile_trace(app_folder, monkeypatch, index):
    """Valid traces draw on every page with no error; refused ones leave the default trace open
    and say why in one line naming the line of the file."""
    name, expect = list(APP_SAMPLE.items())[index]
    views = [(page, 5) for page in TRACE_PAGES + (MODEL_PAGES if index < 2 else [])]
    views += [("views/stepper.py", stage) for stage in (1, 3)] if expect != INVALID else []  # other cache figures
    for page, stage in views:
        shown = []
        got = outcome(kept, shown, render, app_folder, monkeypatch, f"hostile-{index}.jsonl", page, stage)
        assert got == "accepted", f"{name} on {page}: {got}"
        at = shown[0]
        assert not at.exception, f"{name} on {page}: {[e.value for e in at.exception]}"
        errors = [html.unescape(e.value.replace("\\", "")) for e in at.error]  # as the reader sees them
        opened = at.session_state["trace_ref"].name
        if expect == INVALID:
            assert opened == "default.jsonl", f"{name} on {page}: a refused trace was opened"
            assert any("line" in e and f"hostile-{index}.jsonl" in e for e in errors), f"{name} on {page}: {errors}"
        else:
            assert opened == f"hostile-{index}.jsonl" and not errors, f"{name} on {page}: {errors}"
            if page == "views/statistics.py":  # only the open tab runs: open each of the others too
                for tab in [t.label for t in at.tabs][1:]:
                    at.session_state["stats_tab"] = tab
                    assert outcome(at.run) == "accepted", f"{name} on the {tab} tab"
                    assert not at.exception and not at.error, f"{name} on the {tab} tab: {[e.value for e in at.error]}"
