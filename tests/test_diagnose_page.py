"""The Diagnose page ("Why is acceptance low?") in the real app (AppTest), on a diagnosis of tiny models.

A real `engine diagnose` run (a draft planted to ignore top-k=1, as in tests/test_diagnose.py) is
bundled the way assets/diagnoses/ ships one: <case>.json beside <case>--<arm>.zip. Every verdict and
number the page shows is the diagnosis dict's; every link names the right arm, request and cycle,
read independently from the zips; a hostile case file is one escaped line; a live diagnosis runs on
the queue; the Statistics page's server tab and the interview page point here.
"""
import base64
import html
import json
import re
from dataclasses import asdict
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.ui.state import parse_request_name, parse_token
from engine.config import SpecSettings
from engine.diagnose.diagnosis import diagnose
from engine.diagnose.experiments import Arm
from engine.diagnose.verdict import Advice, option_words, options, verdict
from engine.drafters.registry import DrafterOptions
from engine.run import load_with_drafter, run_to_trace
from engine.trace.metrics import drafted
from engine.workload.folder import open_workload, zip_folder
from engine.workload.prompts import parse_prompts
from tests.app_jobs import finish_job
from tests.tiny import noisy_pair, save_tiny

MAIN = Path(__file__).resolve().parent.parent / "app" / "main.py"
PAGE = "views/diagnose.py"
CASE = "planted-filters"
# eight requests: enough for the planted cause's joint interval to clear zero (four were not, once each request
# drew its own random stream)
TEXTS = ["the cat sat on a mat", "a dog ran far away", "the log and then it slept", "it sat on a log",
         "a cat ran and then", "the dog slept on the mat", "it ran far and then it sat", "a log on the mat"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A diagnosis of a draft that ignores top-k=1 (sampling filters, prompt lookup, the probe), its arms
    zipped into a diagnoses folder as the bundled cases are, and a default trace."""
    root = tmp_path_factory.mktemp("diagnose_page")
    target, draft = save_tiny(noisy_pair(2, noise=0.05), root / "models")
    requests = parse_prompts("\n".join(json.dumps({"id": f"q{i}", "category": "ab"[i % 2], "prompt": t})
                                       for i, t in enumerate(TEXTS)).encode(), "p.jsonl")
    pairs = {}

    def load(options: DrafterOptions):
        if options not in pairs:
            pairs[options] = load_with_drafter(target, options)
        return pairs[options]

    base = Arm("baseline", DrafterOptions(draft_model=draft, draft_filters="temperature only"),
               SpecSettings(k=3, temperature=1.0, top_k=1, max_new_tokens=16))
    found = diagnose(load, base, requests, root / "arms", has_template=False, has_eagle=False,
                     context_prefix="the cat ", only={"sampling filters", "drafter prompt-lookup", "probe"}).as_dict()
    (root / "diagnoses").mkdir()
    for arm in ["baseline"] + [f["arm"] for f in found["findings"] if f["arm"]]:
        (root / "diagnoses" / f"{CASE}--{arm}.zip").write_bytes(zip_folder(root / "arms" / arm))
    (root / "diagnoses" / f"{CASE}.json").write_text(json.dumps(found))
    run_to_trace(load(base.drafter), "the dog ran", SpecSettings(k=2, temperature=0.0, max_new_tokens=8),
                 root / "traces" / "default.jsonl")
    (root / "workloads").mkdir()
    return root


def found(folder: Path) -> dict:
    return json.loads((folder / "diagnoses" / f"{CASE}.json").read_text())


def app(folder: Path, monkeypatch, diagnoses: Path | None = None, runs: Path | None = None) -> AppTest:
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder / "traces"))
    monkeypatch.setenv("SPECLAB_WORKLOADS_DIR", str(folder / "workloads"))
    monkeypatch.setenv("SPECLAB_DIAGNOSES_DIR", str(diagnoses or folder / "diagnoses"))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(runs or folder / "runs"))
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(folder / "uploads"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    return AppTest.from_file(str(MAIN), default_timeout=120)


def open_page(folder: Path, monkeypatch, **dirs) -> AppTest:
    at = app(folder, monkeypatch, **dirs)
    at.run()
    at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_tab(at: AppTest, name: str) -> AppTest:
    at.session_state["diagnose_tab"] = name
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    """What the page says, with md()'s escapes taken out ("0\\.35" reads "0.35", "&gt;" reads ">")."""
    parts = [m.value for m in [*at.markdown, *at.caption, *at.success, *at.info]]
    return html.unescape("\n".join(parts).replace("\\", ""))


def figure(at: AppTest, key: str) -> dict:
    shown = [e for e in at.get("plotly_chart") if e.proto.id.endswith(f"-{key}")]
    assert len(shown) == 1, f"figure {key} not shown"
    return json.loads(shown[0].proto.spec)


def values(a) -> list[float]:
    if isinstance(a, dict):
        return list(np.frombuffer(base64.b64decode(a["bdata"]), dtype=a["dtype"]))
    return list(a)


def links(at: AppTest) -> list[tuple[str, dict]]:
    found_links = re.findall(r"\[([^\]]*)\]\((\./\?[^)]*)\)", "\n".join(m.value for m in at.markdown))
    return [(text.replace("\\", ""), {k: v[0] for k, v in parse_qs(urlparse(url).query).items()})
            for text, url in found_links]


def first_rejections(folder: Path, arm: str) -> dict[str, tuple[str, int | None]]:
    """Per request id: its file and the first cycle that rejected a draft token, read from the zip."""
    runs = open_workload(folder / "diagnoses" / f"{CASE}--{arm}.zip").runs()
    return {r.id: (r.file, next((i for i, c in enumerate(r.trace.cycles) if c["num_accepted"] < drafted(c)), None))
            for r in runs}


def expected_verdict(d: dict) -> tuple[list, list, Advice | None]:
    """The engine's verdict on the file's own figures: (faster changes, every change, the advice)."""
    advice = Advice(**d["advisor"]) if d.get("advisor") else None
    every = options(d["findings"], advice, d["baseline"]["requests"])
    return verdict(d["findings"], advice, d["baseline"]["requests"]), every, advice


def test_the_report_shows_every_verdict_and_the_diagnosis_numbers(folder, monkeypatch):
    want = found(folder)
    at = open_page(folder, monkeypatch)
    shown = texts(at)
    for f in want["findings"]:
        assert f["verdict"] in shown
    b = want["baseline"]
    assert f"Baseline: **{b['requests']}** requests, draft acceptance rate **{b['acceptance_rate']:.3f}**" in shown
    first = want["findings"][0]
    assert first["experiment"] == "sampling filters" and first["acceptance_rate"]["found"]  # the planted cause
    e = first["acceptance_rate"]
    assert (f"Why acceptance is low: **sampling filters** (the draft ignores the request's top-k/top-p): acceptance "
            f"{e['baseline']:.3f} → {e['variant']:.3f} ({e['difference']:+.3f}, 95% joint interval "
            f"{e['interval'][0]:+.3f} to {e['interval'][1]:+.3f})") in shown
    faster, every, advice = expected_verdict(want)
    if faster:  # which change is fastest depends on this machine's timings; the page must say the engine's
        o = faster[0]
        assert len(at.success) == 1 and at.success[0].value.startswith("**Change first.** 1. ")
        assert option_words(o) in html.unescape(at.success[0].value.replace("\\", ""))
        assert f"**Change first: {o.name}**" in shown and f"(**×{o.speedup:.2f}**, over {o.requests} requests" in shown
    else:
        assert not at.success and "**Keep these settings**" in shown
    chart = figure(at, "dg_verdict_chart")
    points = {y: x for trace in chart["data"] for y, x in zip(trace["y"], values(trace["x"]))}
    assert len(points) == len(every)
    labels = chart["layout"]["yaxis"]["categoryarray"]
    assert [label.split(". ", 1)[1].split(" ×")[0] for label in labels[:len(faster)]] == [o.name for o in faster]
    for label, o in zip(labels, faster + [o for o in every if o not in faster]):
        assert points[label] == pytest.approx(o.speedup) and f"×{o.speedup:.2f} (n={o.requests})" in label
    chart = figure(at, "dg_effects_chart")
    points = {y: (x, plus, minus) for trace in chart["data"]
              for y, x, plus, minus in zip(trace["y"], values(trace["x"]), values(trace["error_x"]["array"]),
                                           values(trace["error_x"]["arrayminus"]))}
    measured = [f for f in want["findings"] if f["acceptance_rate"] and f["acceptance_rate"]["difference"] is not None]
    assert set(points) == {f"{f['experiment']} (n={f['requests']})" for f in measured}  # each with its count
    for f in measured:
        x, plus, minus = points[f"{f['experiment']} (n={f['requests']})"]
        e = f["acceptance_rate"]
        assert x == pytest.approx(e["difference"])
        assert (x - minus, x + plus) == pytest.approx(tuple(e["interval"]))
    assert chart["layout"]["shapes"][0]["x0"] == 0  # the zero line
    assert not at.error


DECIMAL = re.compile(r"\d+\.\d+")


def diagnosis_numbers(d: dict, every: list, advice: Advice | None) -> set[str]:
    """Every figure of the diagnosis (and of its changes' ratios), written to 1, 2 and 3 decimals."""
    values = [v for v in d["baseline"].values() if isinstance(v, float)]
    for f in d["findings"]:
        for e in (f["acceptance_rate"], f["tokens_per_s"], f["step_tokens_per_s"]):
            if e is not None:
                values += [e["baseline"], e["variant"], e["difference"], *(e["interval"] or [])]
    values += [v for o in every for v in (o.baseline, o.variant, o.speedup, o.variant - o.baseline, *(o.interval or []))]
    values += [] if advice is None else [advice.plain_tokens_per_s, advice.baseline_step_tokens_per_s]
    return {f"{abs(v):.{n}f}" for v in values if v is not None for n in (1, 2, 3)}


def test_every_number_the_report_shows_is_the_diagnosis_own(folder, monkeypatch):
    """Not one figure on the report made up or left over from an older wording: each decimal shown (the
    headline, the verdict, every finding) is one of the diagnosis's numbers, rounded."""
    want = found(folder)
    at = open_page(folder, monkeypatch)
    _, every, advice = expected_verdict(want)
    settings = open_workload(folder / "diagnoses" / f"{CASE}--baseline.zip").manifest["settings"]  # the caption's
    allowed = diagnosis_numbers(want, every, advice) | {str(v) for v in settings.values() if isinstance(v, float)}
    shown = DECIMAL.findall(texts(at))
    assert len(shown) > 20
    assert [n for n in shown if n not in allowed] == []
    if advice is not None and advice.baseline_step_tokens_per_s is not None:  # both clocks, each named
        assert (f"**{want['baseline']['tokens_per_s']:.1f}** wall-clock tokens/s (**"
                f"{advice.baseline_step_tokens_per_s:.1f}** on this machine's calibrated step times)") in texts(at)


def test_every_request_of_every_arm_links_to_its_request_and_first_rejection(folder, monkeypatch):
    want = found(folder)
    at = open_tab(open_page(folder, monkeypatch), "Per request")
    arms = [f for f in want["findings"] if f["arm"]]
    seen = set()
    for f in arms:
        at.selectbox(key="dg_experiment").set_value(f["experiment"]).run()
        assert not at.exception
        expected = {"baseline": first_rejections(folder, "baseline"), f["arm"]: first_rejections(folder, f["arm"])}
        for text, query in links(at):
            kind, workload, file = parse_request_name(parse_token(query["trace"]).name)
            assert kind == "diagnosis" and workload.startswith(f"{CASE}--")
            arm = workload.removeprefix(f"{CASE}--").removesuffix(".zip")
            assert arm in expected
            if text.startswith("cycle "):  # a request's first rejection, at the test stage
                cycle = int(text.removeprefix("cycle "))
                assert any(v == (file, cycle) for v in expected[arm].values()) and query["stage"] == "3"
                assert query["cycle"] == str(cycle)
            else:
                request = text.split(" in ")[0]
                assert expected[arm][request][0] == file and query["cycle"] == "0"
                seen.add((arm, request))
        rows = [r for r in texts(at).splitlines() if r.startswith("| [q")]
        assert len(rows) == f["requests"] == len(TEXTS)
        figure(at, "dg_paired_chart")
    assert seen == {(a, f"q{i}") for a in ["baseline", *(f["arm"] for f in arms)] for i in range(len(TEXTS))}


def test_a_link_opens_the_arm_in_the_stepper_and_the_sidebar_leads_back(folder, monkeypatch):
    at = app(folder, monkeypatch)
    at.query_params.update({"trace": f"workload:diagnosis~{CASE}--draft-filters-request.zip~request-0002.jsonl",
                            "cycle": "1", "stage": "3"})
    at.run()
    assert not at.exception and at.session_state["cycle"] == 1
    assert at.session_state["trace"].header["request"] == {"id": "q1", "category": "b"}
    assert [p.proto.page for p in at.sidebar.get("page_link")] == ["diagnose"]
    at.switch_page(PAGE).run()
    assert at.session_state["diagnose_open"] == ("bundled", CASE)


def test_the_probe_table_is_the_diagnosis_probe_with_one_column_where_overlap_is_agreement(folder, monkeypatch):
    """The case runs with top-k 1: both warped distributions are one-hot, so the overlap is the top-1
    agreement at every position; the table shows it once and says why."""
    probe = found(folder)["probe"]
    groups = [*probe["categories"].items(), ("all requests", probe["overall"])]
    assert all(g["top1_agreement"] == pytest.approx(g["mean_overlap"], abs=1e-9) for _, g in groups)
    at = open_tab(open_page(folder, monkeypatch), "Draft agreement")
    shown = texts(at)
    assert "| category | requests | top-1 agreement = overlap | predicted greedy acceptance rate |" in shown
    assert "overlap sum min(p, q)" not in shown
    assert ("One column holds both top-1 agreement and overlap here: with top-k 1 the run's sampling makes both "
            "models' distributions one-hot") in shown
    for name, g in groups:
        assert f"| {name} | {g['requests']} | {g['top1_agreement']:.3f} | {g['predicted_greedy_acceptance_rate']:.3f} |" \
            in shown


def test_the_probe_table_keeps_both_columns_where_the_sampling_is_not_one_hot():
    from app.views.sections.diagnose_views import one_hot_reason
    assert one_hot_reason({"settings": {"temperature": 0.0}}) == "at temperature 0"
    assert one_hot_reason({"settings": {"temperature": 1.0, "top_k": 1}}) == "with top-k 1"
    assert one_hot_reason({"settings": {"temperature": 0.7, "top_p": 0.9}}) is None
    assert one_hot_reason(None) is None


def with_vocab(folder: Path, tmp_path: Path) -> tuple[Path, dict]:
    """The case, its baseline's output held against a draft vocabulary that leaves out its two most frequent
    tokens (engine/diagnose/vocab.py), with token texts that are HTML: a diagnosis folder and that coverage."""
    from collections import Counter

    from engine.diagnose.vocab import coverage
    runs = open_workload(folder / "diagnoses" / f"{CASE}--baseline.zip").runs()
    made = Counter(t for r in runs for t in r.trace.summary["generated_token_ids"])
    left_out = {t for t, _ in made.most_common(2)}
    v = coverage(set(range(64)) - left_out, runs, lambda t: f"<b>{t}</b>")
    root = tmp_path / "diagnoses"
    root.mkdir()
    for zipped in (folder / "diagnoses").glob("*.zip"):
        (root / zipped.name).write_bytes(zipped.read_bytes())
    (root / f"{CASE}.json").write_text(json.dumps(found(folder) | {"draft_vocab": v}))
    return root, v


def test_the_draft_vocabulary_shows_the_engine_coverage_of_the_output(folder, monkeypatch, tmp_path):
    root, v = with_vocab(folder, tmp_path)
    assert 0 < v["outside"] < v["tokens"] and len(v["most_missed"]) == 2
    at = open_tab(open_page(folder, monkeypatch, diagnoses=root), "Draft agreement")
    shown = texts(at).replace("**", "")
    assert (f"{v['outside']:,} of the baseline's {v['tokens']:,} output tokens ({v['outside_share']:.1%}) lie "
            f"outside the head's {v['draft_vocab_size']:,} draft tokens") in shown
    for m in v["most_missed"]:
        assert f"| '<b>{m['token_id']}</b>' | {m['token_id']} | {m['count']} |" in shown
    assert "<b>" not in "\n".join(m.value for m in at.markdown)  # the token texts reach the page escaped
    assert "| category | requests |" in shown  # the probe still follows


def test_the_trained_length_shows_the_engine_counts_of_the_baseline(folder, monkeypatch, tmp_path):
    from engine.diagnose.trained_length import past_trained_length
    runs = open_workload(folder / "diagnoses" / f"{CASE}--baseline.zip").runs()
    trained = len(runs[0].trace.header["prompt_token_ids"]) + 3  # the first request goes past it
    counts = past_trained_length(runs, trained)
    assert counts["drafted_past"] and counts["drafted_within"]
    root, _ = with_vocab(folder, tmp_path)
    (root / f"{CASE}.json").write_text(json.dumps(found(folder) | {"trained_length": {
        "trained_positions": trained, "arms": {"baseline": counts}}}))
    at = open_tab(open_page(folder, monkeypatch, diagnoses=root), "Draft agreement")
    shown = texts(at).replace("**", "")
    assert f"trained on sequences of at most {trained:,} tokens" in shown
    past = f"{counts['accepted_past'] / counts['drafted_past']:.3f} ({counts['accepted_past']:,} / {counts['drafted_past']:,})"
    within = (f"{counts['accepted_within'] / counts['drafted_within']:.3f} "
              f"({counts['accepted_within']:,} / {counts['drafted_within']:,})")
    assert f"| your requests | {counts['requests_past']} of {counts['requests']} | {within} | {past} |" in shown


def test_the_live_form_plants_a_head_without_its_aux_states_on_an_eagle3_head_only():
    from app.views.sections.diagnose_source import AUX, planted
    from engine.config import SettingsError
    from engine.drafters.registry import DrafterOptions
    assert planted(AUX, "chat", "eagle3", 3, 0.0, 1.0) == (DrafterOptions("eagle3", eagle3_features="top layer"), 3)
    with pytest.raises(SettingsError, match="only an EAGLE-3 head"):
        planted(AUX, "chat", "eagle", 3, 0.0, 1.0)


def test_a_head_that_covers_the_output_says_so():
    from app.views.sections.diagnose_views import vocab_words
    covered = {"draft_vocab_size": 17812, "tokens": 48, "outside": 0, "outside_share": 0.0, "most_missed": []}
    assert "Every one of the baseline's **48** output tokens is among the head's **17,812**" in vocab_words(covered)


def test_the_bundled_arms_stay_off_the_workload_page(folder, monkeypatch):
    at = app(folder, monkeypatch)
    at.run()
    from app.ui import workloads
    assert not [c for c in workloads.listed() if c[0] == "diagnosis"]
    assert (folder / "diagnoses" / f"{CASE}--baseline.zip").is_file()


def test_the_figures_are_valid_plotly(folder):
    from app.figures import diagnose as figs
    from app.figures.style import validated
    from app.ui import diagnoses
    from engine.diagnose import experiments
    d = diagnoses.check(found(folder), CASE)
    validated(figs.effects_figure(d))
    validated(figs.effects_figure({"findings": []}))
    rows = [{"base": r, "arm": r} for r in [{"id": "<b>x</b>", "category": "c", "accepted": 1, "drafted": 2,
                                              "acceptance_rate": 0.5}]]
    validated(figs.paired_figure(rows, "k-2"))
    validated(figs.paired_figure([], "k-2"))
    faster, every, _ = expected_verdict(found(folder))
    validated(figs.verdict_figure([asdict(o) | {"speedup": o.speedup} for o in every], len(faster)))
    assert (figs.CAUSE, figs.TUNING, figs.ALTERNATIVE, figs.PROPERTY) == (
        experiments.CAUSE, experiments.TUNING, experiments.ALTERNATIVE, experiments.PROPERTY)


def test_the_charts_axes_fit_their_data():
    """Acceptance rates of 0.04 to 0.12 fill the per-request chart (no 0-1 axis), on one range for both
    axes; the verdict chart's range holds every point, every interval and the baseline's line at 1."""
    from app.figures import diagnose as figs
    rows = [{"base": {"id": f"q{i}", "category": "c", "accepted": a, "drafted": 100, "acceptance_rate": a / 100},
             "arm": {"id": f"q{i}", "category": "c", "accepted": b, "drafted": 100, "acceptance_rate": b / 100}}
            for i, (a, b) in enumerate([(4, 6), (12, 9), (7, 11)])]
    layout = figs.paired_figure(rows, "k-2").layout
    assert layout.xaxis.range == layout.yaxis.range
    low, high = layout.xaxis.range
    assert 0.03 < low < 0.04 and 0.12 < high < 0.13
    option = {"name": "drafter prompt-lookup", "kind": "alternative", "clock": "wall clock", "baseline": 10.0,
              "variant": 30.0, "interval": [12.0, 30.0], "joint": 3, "requests": 20, "faster": True, "speedup": 3.0}
    slower = option | {"name": "drafter eagle", "variant": 8.0, "interval": [-3.0, -1.0], "faster": False,
                       "speedup": 0.8}
    fig = figs.verdict_figure([option, slower], 1)
    low, high = fig.layout.xaxis.range
    assert low < 0.7 and 4.0 < high < 4.5  # the interval's +30 tokens/s on 10 reaches x4
    assert list(fig.layout.yaxis.categoryarray) == ["1. drafter prompt-lookup ×3.00 (n=20)", "drafter eagle ×0.80 (n=20)"]


def hostile(good: dict, change) -> dict:
    d = json.loads(json.dumps(good))
    change(d)
    return d


CHANGES = {
    "a path for an arm": lambda d: d["findings"][0].update(arm="../../<b>etc</b>"),
    "a number as text": lambda d: d["findings"][0]["acceptance_rate"].update(difference="<b>0.2</b>"),
    "a count that is a bool": lambda d: d["baseline"].update(requests=True),
    "findings not a list": lambda d: d.update(findings={"x": 1}),
    "an interval upside down": lambda d: d["findings"][0]["acceptance_rate"].update(interval=[0.3, -0.1]),
    "a probe group not an object": lambda d: d["probe"]["categories"].update({"<i>a</i>": 3}),
    "an unknown kind": lambda d: d["findings"][0].update(kind="<script>x</script>"),
    "found with an interval across 0": lambda d: d["findings"][0]["acceptance_rate"].update(interval=[-0.1, 0.2],
                                                                                            found=True),
    "a difference that is not variant - baseline": lambda d: d["findings"][0]["acceptance_rate"].update(
        difference=0.9),
    "more tokens outside the draft vocabulary than generated": lambda d: d.update(draft_vocab={
        "draft_vocab_size": 10, "tokens": 5, "outside": 7, "outside_share": 1.4, "most_missed": []}),
    "a vocabulary share that is not outside / tokens": lambda d: d.update(draft_vocab={
        "draft_vocab_size": 10, "tokens": 10, "outside": 2, "outside_share": 0.5,
        "most_missed": [{"token_id": 3, "text": "<b>a</b>", "count": 2}]}),
    "most missed counts past the tokens outside": lambda d: d.update(draft_vocab={
        "draft_vocab_size": 10, "tokens": 10, "outside": 2, "outside_share": 0.2,
        "most_missed": [{"token_id": 3, "text": "<b>a</b>", "count": 2}, {"token_id": 4, "text": "b", "count": 1}]}),
    "more drafts accepted past the trained length than drafted": lambda d: d.update(trained_length={
        "trained_positions": 200, "arms": {"baseline": {"drafted_within": 5, "accepted_within": 1, "drafted_past": 2,
                                                        "accepted_past": 3, "requests": 2, "requests_past": 1}}}),
    "a trained length arm that is not an arm": lambda d: d.update(trained_length={
        "trained_positions": 200, "arms": {"<b>x</b>": {}}}),
    "requests past the trained length with no draft past it": lambda d: d.update(trained_length={
        "trained_positions": 200, "arms": {"baseline": {"drafted_within": 5, "accepted_within": 1, "drafted_past": 0,
                                                        "accepted_past": 0, "requests": 2, "requests_past": 2}}}),
    "an advisor's K of 0": lambda d: d.update(advisor={"best_k": 0, "plain_better": True,
                                                       "plain_tokens_per_s": 3.0}),
    "a plain decoding speed below 0": lambda d: d.update(advisor={"best_k": 2, "plain_better": "<b>yes</b>",
                                                                  "plain_tokens_per_s": -3.0}),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_hostile_case_file_is_refused_in_one_escaped_line(folder, monkeypatch, tmp_path, change):
    (tmp_path / "diagnoses").mkdir()
    (tmp_path / "diagnoses" / f"{CASE}.json").write_text(json.dumps(hostile(found(folder), CHANGES[change])))
    at = open_page(folder, monkeypatch, diagnoses=tmp_path / "diagnoses")
    assert len(at.error) == 1, [e.value for e in at.error]
    line = at.error[0].value
    assert "\n" not in line and "<b>" not in line and "<script>" not in line and "<i>" not in line
    assert not at.get("plotly_chart")


def test_not_json_and_a_hostile_verdict_are_shown_as_text(folder, monkeypatch, tmp_path):
    (tmp_path / "diagnoses").mkdir()
    (tmp_path / "diagnoses" / "a-broken.json").write_text("{not json <b>")
    at = open_page(folder, monkeypatch, diagnoses=tmp_path / "diagnoses")
    assert len(at.error) == 1 and "not JSON" in at.error[0].value and "<b>" not in at.error[0].value
    (tmp_path / "diagnoses" / "a-broken.json").write_text("[" * 100_000)
    at = open_page(folder, monkeypatch, diagnoses=tmp_path / "diagnoses")
    assert len(at.error) == 1 and "nested too deep" in at.error[0].value
    hostile_words = "<b>bold</b> [x](javascript:alert(1)) $x$"
    (tmp_path / "diagnoses" / "a-broken.json").write_text(json.dumps(hostile(
        found(folder), lambda d: d["findings"][0].update(verdict="<i>made up</i>", now=hostile_words))))
    at = open_page(folder, monkeypatch, diagnoses=tmp_path / "diagnoses")
    assert not at.error
    page = "\n".join(m.value for m in [*at.markdown, *at.caption, *at.success])
    assert "<b>" not in page and "](javascript" not in page
    assert hostile_words in texts(at)  # shown, as text
    # the file's own verdict is never shown: the page words each finding again from its numbers
    assert "made up" not in texts(at) and f"sampling filters: {hostile_words}: acceptance" in texts(at)


def test_a_live_diagnosis_runs_on_the_queue_and_opens(folder, monkeypatch, tmp_path):
    at = open_tab(open_page(folder, monkeypatch, runs=tmp_path / "runs"), "Run one live")
    at.selectbox(key="dg_preset").set_value("tiny-shakespeare")
    at.multiselect(key="dg_categories").set_value(["coding", "math"])
    at.number_input(key="dg_tokens").set_value(4)
    at.button[[b.label for b in at.button].index("Run this diagnosis live")].click().run()
    assert not at.error, [e.value for e in at.error]
    finish_job(at, 600)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    kind, name = at.session_state["diagnose_open"]
    assert kind == "run" and name.startswith("diagnose-tiny-shakespeare-")
    want = json.loads((tmp_path / "runs" / "diagnoses" / f"{name}.json").read_text())
    baseline = open_workload(tmp_path / "runs" / "workloads" / f"{name}-baseline")
    assert [(e.category, e.status) for e in baseline.entries] == [("coding", "done"), ("math", "done")]
    shown = texts(at)
    assert f"Baseline: **2** requests, draft acceptance rate **{want['baseline']['acceptance_rate']:.3f}**" in shown
    for f in want["findings"]:
        assert f["verdict"] in shown
    from app.ui import workloads  # each arm is an ordinary live workload too
    assert ("run", f"{name}-baseline") in workloads.listed()


def test_a_planted_mis_setting_that_cannot_show_is_refused_before_anything_runs(folder, monkeypatch, tmp_path):
    at = open_tab(open_page(folder, monkeypatch, runs=tmp_path / "runs"), "Run one live")
    at.selectbox(key="dg_preset").set_value("tiny-shakespeare")
    at.selectbox(key="dg_plant").set_value("raw")
    at.button[[b.label for b in at.button].index("Run this diagnosis live")].click().run()
    assert len(at.error) == 1 and "chat template" in at.error[0].value
    assert "background_job" not in at.session_state


LOW = ("vllm:spec_decode_num_drafts_total 100\nvllm:spec_decode_num_draft_tokens_total 300\n"
       "vllm:spec_decode_num_accepted_tokens_total {}\n")


@pytest.mark.parametrize("accepted, linked", [(60, True), (270, False)])
def test_a_server_with_low_acceptance_is_pointed_here(folder, monkeypatch, accepted, linked):
    at = app(folder, monkeypatch)
    at.run()
    at.switch_page("views/statistics.py").run()
    at.session_state["stats_tab"] = "Your server"
    at.run()
    at.text_area(key="server_paste").input(LOW.format(accepted)).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    pages = [p.proto.page for p in at.main.get("page_link")]
    assert ("diagnose" in pages) == linked
    if linked:
        label = next(p.proto.label for p in at.main.get("page_link") if p.proto.page == "diagnose")
        assert label == "Why is acceptance low? Diagnose a pair by experiment"
        assert "under 0.5" in texts(at)


def test_the_interview_asks_about_each_planted_cause_and_points_here(folder, monkeypatch):
    at = open_page(folder, monkeypatch)
    at.switch_page("views/interview.py").run()
    assert not at.exception, [e.value for e in at.exception]
    labels = [e.label for e in at.expander]
    for words in ("without the chat template", "ignores top-p/top-k", "K is far too deep"):
        (question,) = [e for e in at.expander if words in e.label]
        answer = " ".join(m.value for m in question.markdown)
        assert "**The cause.**" in answer and "**Why the output stays exact.**" in answer
        assert "**How the diagnosis finds it.**" in answer
        assert [p.proto.page for p in question.get("page_link")] == ["diagnose"]
    assert len(labels) >= 18
    (rate,) = [e for e in at.expander if "Did the draft get better?" in e.label]
    assert "by arithmetic alone" in " ".join(m.value for m in rate.markdown)
    (joint,) = [e for e in at.expander if "eight experiments" in e.label]
    assert "34%" in " ".join(m.value for m in joint.markdown) and round(1 - 0.95 ** 8, 2) == 0.34
    filters = next(e for e in at.expander if "ignores top-p/top-k" in e.label)
    verdict = found(folder)["findings"][0]["verdict"]  # the bundled case's measurement of it
    assert verdict in html.unescape(" ".join(c.value for c in filters.caption).replace("\\", ""))


def test_no_diagnosis_offers_a_live_one(folder, monkeypatch, tmp_path):
    at = open_page(folder, monkeypatch, diagnoses=tmp_path / "none", runs=tmp_path / "runs")
    assert any("No diagnosis here yet" in i.value for i in at.info)
    assert [b for b in at.button if b.label == "Run this diagnosis live"]


def test_the_page_opens_without_loading_a_model(folder):
    """A fresh process: the report, the requests and the probe need no torch (the live form may)."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, SPECLAB_TRACES_DIR=str(folder / "traces"), SPECLAB_DIAGNOSES_DIR=str(folder / "diagnoses"),
               SPECLAB_WORKLOADS_DIR=str(folder / "workloads"), SPECLAB_RUNS_DIR=str(folder / "runs"))
    code = (f"import sys; from streamlit.testing.v1 import AppTest; at = AppTest.from_file({str(MAIN)!r}, "
            "default_timeout=60).run(); at.switch_page('views/diagnose.py').run()\n"
            "for tab in ('Per request', 'Draft agreement'):\n    at.session_state['diagnose_tab'] = tab; at.run()\n"
            "print(len(at.exception), len(at.markdown) > 2, 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                         cwd=MAIN.parent.parent)
    assert out.stdout.split("\n")[-2] == "0 True False False", out.stderr[-2000:]


def effect(measure: str, baseline: float, variant: float, interval: tuple[float, float]) -> dict:
    return {"measure": measure, "baseline": baseline, "variant": variant, "difference": variant - baseline,
            "interval": list(interval), "found": interval[0] > 0 or interval[1] < 0}


def test_the_headline_changes_first_what_is_fastest_and_never_a_k_the_advisor_beats_with_plain_decoding():
    from app.ui import diagnoses
    from app.views.sections.diagnose_views import headline

    def finding(name: str, kind: str, acceptance: dict, step: dict | None = None) -> dict:
        return {"experiment": name, "arm": name.replace(" ", "-"), "kind": kind, "now": "now", "change": "changed",
                "skipped": None, "error": None, "requests": 20, "acceptance_rate": acceptance,
                "tokens_per_s": effect("tokens_per_s", 10, 30, (15, 25)), "step_tokens_per_s": step,
                "verdict": name}

    def page(d: dict) -> str:
        choice = ("bundled", "case")
        faster = diagnoses.verdict(choice, d)
        return headline(d, faster, len(diagnoses.options(choice, d)), diagnoses.advice(choice, d)).replace("\\", "")

    template_right = finding("chat template", "cause", effect("acceptance_rate", 0.12, 0.07, (-0.07, -0.02)))
    deeper = finding("draft depth", "tuning", effect("acceptance_rate", 0.05, 0.20, (0.12, 0.2)),
                     effect("step_tokens_per_s", 4.0, 19.0, (12.0, 17.0)))
    plain_wins = {"best_k": 2, "plain_better": True, "plain_tokens_per_s": 20.0, "baseline_step_tokens_per_s": 4.0}
    raw = {"baseline": {"requests": 20, "acceptance_rate": 0.05, "tokens_per_s": 4.0}, "advisor": plain_wins,
           "findings": [template_right, deeper]}
    said = page(diagnoses.check(raw, "case"))
    assert "**Change first: plain decoding**: tokens/s on this machine's step times 4.0 → 20.0 with the target alone " \
           "(**×5.00**, over 20 requests;" in said
    assert "Then: draft depth ×4.75 (step times); chat template ×3.00 (wall clock)." in said
    assert "**4.0** wall-clock tokens/s (**4.0** on this machine's calibrated step times)" in said
    # where the advisor picks a K over plain decoding, the K measured fastest goes first
    raw["advisor"] = plain_wins | {"plain_better": False, "plain_tokens_per_s": 6.0}
    assert ("**Change first: draft depth** (now): tokens/s on this machine's step times 4.0 → 19.0 changed "
            "(**×4.75**, over 20 requests; +15.0, 95% interval +12.0 to +17.0).") in page(diagnoses.check(raw, "case"))
    # a K whose acceptance rose (by arithmetic) but whose cycles are slower is not a change, however fast the wall clock
    raw["findings"][1] = finding("draft depth", "tuning", effect("acceptance_rate", 0.05, 0.20, (0.12, 0.2)),
                                 effect("step_tokens_per_s", 4.0, 3.0, (-1.5, -0.5)))
    d = diagnoses.check(raw, "case")
    assert [o.name for o in diagnoses.verdict(("bundled", "case"), d)] == ["chat template"]
    assert "No drafter setting tested (1) raised acceptance" in page(d)
    raw["findings"][0] = finding("chat template", "cause", effect("acceptance_rate", 0.07, 0.12, (0.02, 0.07)))
    d = diagnoses.check(raw, "case")
    assert diagnoses.cause_found(d)["experiment"] == "chat template"
    assert "Why acceptance is low: **chat template** (now): acceptance 0.070 → 0.120" in page(d)
    assert "as a change it ranks 1 of 1 by tokens/s" in page(d)
