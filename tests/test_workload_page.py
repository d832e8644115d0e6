"""The Workload page in the real app (AppTest) on tiny-model workloads.

Every number it shows is compared with engine/workload/stats.py's computation on the same
folder, read independently of the app; every link into the stepper names the right request
and cycle; uploads are checked whole; a live workload runs on the job queue.
"""
import json
import re
import shutil
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from streamlit.testing.v1 import AppTest

from app.ui.state import parse_request_name, parse_token
from engine.config import SpecSettings
from engine.mode import RunMode
from engine.run import run_to_trace
from engine.workload.batched import run_batched_workload
from engine.workload.folder import open_workload, zip_folder
from engine.workload.prompts import parse_prompts
from engine.workload.run import run_workload
from engine.workload.stats import workload_stats
from tests.app_jobs import finish_job
from tests.test_workload_run import zipped
from tests.tiny import noisy_pair

MAIN = Path(__file__).resolve().parent.parent / "app" / "main.py"
PAGE = "views/workload.py"
BATCHED = "zz-batched-k2"
TWIN = "greedy-k2x"  # a copy of greedy-k2.zip
PROMPTS = [{"id": f"{c}-{i}", "category": c, "prompt": p}
           for c, texts in {"pets": ["the cat sat on a mat", "a dog ran far away", "the cat slept"],
                            "logs": ["the log and then it", "a log on a mat"]}.items()
           for i, p in enumerate(texts)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Two workloads (K=2 greedy, K=3 sampled) zipped as bundled ones, and a default trace."""
    root = tmp_path_factory.mktemp("workload_page")
    pair = noisy_pair(0, noise=0.3)
    requests = parse_prompts("\n".join(json.dumps(p) for p in PROMPTS).encode(), "p.jsonl")
    (root / "workloads").mkdir()
    for name, s, mode in (("greedy-k2", SpecSettings(k=2, temperature=0.0, max_new_tokens=16), RunMode(calibrate=True)),
                          ("sampled-k3", SpecSettings(k=3, temperature=1.0, max_new_tokens=16, seed=3), RunMode())):
        run_workload(pair, requests, s, root / "folders" / name, mode)
        (root / "workloads" / f"{name}.zip").write_bytes(zip_folder(root / "folders" / name))
    # the same content under another name, listed right after the default: no comparison may open on it
    shutil.copy(root / "workloads" / "greedy-k2.zip", root / "workloads" / f"{TWIN}.zip")
    # batched (--batch), named to sort last: the page opens the first bundled workload by default
    run_batched_workload(pair, requests, SpecSettings(k=2, temperature=0.0, max_new_tokens=8), root / "folders" / BATCHED,
                         batch=2)
    (root / "workloads" / f"{BATCHED}.zip").write_bytes(zip_folder(root / "folders" / BATCHED))
    run_to_trace(pair, "the dog ran", SpecSettings(k=2, temperature=0.0, max_new_tokens=8),
                 root / "traces" / "default.jsonl")
    return root


def open_page(folder: Path, monkeypatch) -> AppTest:
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder / "traces"))
    monkeypatch.setenv("SPECLAB_WORKLOADS_DIR", str(folder / "workloads"))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(folder / "runs"))
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(folder / "uploads"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(str(MAIN), default_timeout=120)
    at.run()
    at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_tab(at: AppTest, name: str) -> AppTest:
    at.session_state["workload_tab"] = name
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    """The page's Markdown, with md()'s escapes taken out (a "0\\.35" reads "0.35")."""
    return "\n".join(m.value for m in at.markdown).replace("\\", "")


def figure(at: AppTest, key: str) -> dict:
    found = [e for e in at.get("plotly_chart") if e.proto.id.endswith(f"-{key}")]
    assert len(found) == 1, f"figure {key} not shown"
    return json.loads(found[0].proto.spec)


def links(at: AppTest) -> list[tuple[str, dict]]:
    """Every link into the stepper on the page: (its text, its query parameters)."""
    found = re.findall(r"\[([^\]]*)\]\((\./\?[^)]*)\)", texts(at))
    return [(text, {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}) for text, url in found]


def expected(folder: Path, name: str) -> dict:
    return workload_stats(open_workload(folder / "folders" / name).runs())


def test_the_headline_and_categories_are_the_engine_numbers(folder, monkeypatch):
    at = open_page(folder, monkeypatch)
    want = expected(folder, "greedy-k2")
    head = texts(at)
    o = want["overall"]
    assert f"**{want['requests']}** requests, **{o['cycles']}** cycles" in head
    assert f"draft acceptance rate **{o['acceptance_rate']:.3f}**" in head
    iv = o["intervals"]["acceptance_rate"]
    assert f"95% interval over requests {iv[0]:.3f}–{iv[1]:.3f}" in head
    assert f"measured speedup **{o['speedup']['measured']:.2f}×**" in head  # the workload was calibrated
    for name, g in {**want["categories"], "all requests": o}.items():  # the table under the chart, its every cell
        assert category_row(name, g) in head
    bars = figure(at, "wl_categories_chart")["data"][0]
    assert bars["x"] == ["logs", "pets", "all requests"]
    assert [round(v, 9) for v in _values(bars["y"])] == [round(want["categories"]["logs"]["acceptance_rate"], 9),
                                                   round(want["categories"]["pets"]["acceptance_rate"], 9),
                                                   round(o["acceptance_rate"], 9)]


def category_row(name: str, g: dict) -> str:
    """A category's row of the categories table, from the engine's numbers."""
    iv = g["intervals"]["acceptance_rate"]
    speedup = "–" if g["speedup"] is None else f"{g['speedup']['measured']:.2f}×"
    best = "–" if g["best_k"] is None else g["best_k"]
    return (f"| {name} | {g['requests']} | {g['cycles']} | {g['accepted_tokens']}/{g['draft_tokens']} | "
            f"{g['acceptance_rate']:.3f} ({iv[0]:.3f}–{iv[1]:.3f}) | {g['mean_acceptance_length']:.2f} | "
            f"{g['tokens_per_s']:.1f} | {speedup} | {best} |")


def _values(y) -> list[float]:
    """A figure's y values (Plotly sends arrays as typed buffers or lists)."""
    if isinstance(y, dict):
        import base64

        import numpy as np
        return list(np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]))
    return list(y)


def test_every_tab_draws_and_every_link_opens_the_right_request_and_cycle(folder, monkeypatch):
    at = open_page(folder, monkeypatch)
    want = expected(folder, "greedy-k2")
    files = {r["id"]: r["file"] for r in want["per_request"]}
    counted = {}
    for tab in ("Positions and context", "Where the loss is", "Requests"):
        open_tab(at, tab)
        counted[tab] = len(links(at))
        for text, query in links(at):
            ref = parse_token(query["trace"])
            assert ref is not None and ref.kind == "workload"
            kind, workload, file = parse_request_name(ref.name)
            assert (kind, workload) == ("bundled", "greedy-k2.zip")
            request = text.split(" ")[0].split("·")[0].replace("\\", "")
            assert files[request] == file
    assert counted["Requests"] == len(PROMPTS)  # one link per request
    assert counted["Where the loss is"] >= len(want["loss"]["worst_cycles"]) + len(want["loss"]["worst_requests"])
    open_tab(at, "Where the loss is")
    cycles = [(c["request"], c["cycle"]) for c in want["loss"]["worst_cycles"]]
    shown = [(t.split(" · cycle ")[0].replace("\\", ""), int(q["cycle"])) for t, q in links(at) if " · cycle " in t]
    assert shown == cycles and cycles


def test_open_in_the_stepper_opens_that_request_at_that_cycle(folder, monkeypatch):
    at = open_page(folder, monkeypatch)
    open_tab(at, "Requests")
    at.selectbox(key="wl_open_request").set_value("logs-1").run()
    at.number_input(key="wl_open_cycle_4").set_value(2).run()
    at.button(key="wl_open").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["trace_ref"].name == "bundled~greedy-k2.zip~request-0005.jsonl"
    assert at.session_state["cycle"] == 2
    trace = at.session_state["trace"]
    assert trace.header["request"] == {"id": "logs-1", "category": "logs"}
    (opened,) = [c.value for c in at.sidebar.caption if c.value.startswith("Open trace:")]
    assert opened.startswith("Open trace: **logs\\-1 \\(logs\\) of workload greedy\\-k2**")  # its id, not its file
    assert "request-0005" not in opened.replace("\\", "")


def test_two_workloads_side_by_side(folder, monkeypatch):
    at = open_page(folder, monkeypatch)
    open_tab(at, "Compare two workloads")
    bars = figure(at, "wl_categories_chart")["data"]
    other = expected(folder, "sampled-k3")
    assert len(bars) == 2 and "sampled-k3" in bars[1]["name"]
    assert round(_values(bars[1]["y"])[-1], 9) == round(other["overall"]["acceptance_rate"], 9)


def test_an_uploaded_zip_is_checked_whole_before_it_opens(folder, monkeypatch, tmp_path):
    from app.ui import workloads
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path / "uploads"))
    good = (folder / "workloads" / "sampled-k3.zip").read_bytes()
    bad_folder = tmp_path / "bad"
    shutil.copytree(folder / "folders" / "sampled-k3", bad_folder)
    manifest = json.loads((bad_folder / "manifest.json").read_text())
    manifest["requests"][1]["category"] = "<b>other</b>"  # the trace says otherwise
    (bad_folder / "manifest.json").write_text(json.dumps(manifest))
    bad = zipped({p.name: p.read_bytes() for p in bad_folder.iterdir()})
    with monkeypatch.context():
        import streamlit as st
        monkeypatch.setattr(st, "session_state", {})
        choice, error = workloads.open_upload("bad.zip", bad)
        assert choice is None and "the trace is of request" in error
        assert not (tmp_path / "uploads" / "workloads").exists() or not any((tmp_path / "uploads" / "workloads").iterdir())
        choice, error = workloads.open_upload("good.zip", good)
        assert error is None and choice[0] == "upload" and (tmp_path / "uploads" / "workloads" / choice[1]).is_file()


def test_a_live_workload_runs_on_the_queue_and_opens(folder, monkeypatch):
    at = open_tab(open_page(folder, monkeypatch), "Upload or run live")
    at.selectbox(key="wl_preset").set_value("tiny-shakespeare")
    at.multiselect(key="wl_categories").set_value(["coding", "math"])
    at.number_input(key="wl_tokens").set_value(4)
    at.button[[b.label for b in at.button].index("Run this workload live")].click().run()
    finish_job(at, 300)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    kind, name = at.session_state["workload_open"]
    assert kind == "run" and name.startswith("live-tiny-shakespeare-")
    workload = open_workload(folder / "runs" / "workloads" / name)
    assert [(e.category, e.status) for e in workload.entries] == [("coding", "done"), ("math", "done")]
    assert "**2** requests" in texts(at)


def test_a_page_load_draws_no_upload_or_live_form(folder, monkeypatch):
    """They wait in their own tab: their widgets' code must not hold up the first chart."""
    at = open_page(folder, monkeypatch)
    assert not [s for s in at.selectbox if s.key == "wl_preset"] and not at.get("file_uploader")
    figure(at, "wl_categories_chart")


def test_every_workload_figure_is_valid_plotly(folder):
    from app.figures import workload as figs
    from app.figures.style import validated
    one, other = expected(folder, "greedy-k2"), expected(folder, "sampled-k3")
    for fig in (figs.category_figure(one), figs.category_figure(one, "mean_acceptance_length", other),
                figs.conditional_figure(one), figs.conditional_figure(one, ["pets"], other),
                figs.histogram_figure(one, other), figs.context_figure(one, other), figs.rejection_figure(other)):
        validated(fig)
        for axis in ("xaxis", "yaxis"):  # plotly.js reads title.text: a bare string shows no title
            title = fig.to_dict()["layout"][axis]["title"]
            assert isinstance(title, dict) and title["text"], (axis, title)


SAMPLES = Path(__file__).resolve().parent / "server_samples"


@pytest.mark.parametrize("sample", ["vllm_requests.jsonl", "sglang_requests.jsonl"])
def test_a_servers_per_request_file_shows_what_it_carries(folder, monkeypatch, sample):
    from engine.servers.read import read_requests_text
    from engine.servers.request_stats import requests_stats
    text = (SAMPLES / sample).read_text()
    want = requests_stats(read_requests_text(text))
    at = open_tab(open_page(folder, monkeypatch), "Upload or run live")
    at.text_area(key="wl_server_paste").input(text).run()
    assert not at.exception and not at.error, [e.value for e in at.exception] + [e.value for e in at.error]
    shown = texts(at)
    assert f"**{want['requests']}** requests" in shown
    assert f"draft acceptance rate **{want['overall']['acceptance_rate']:.3f}**" in shown
    assert "What a trace of these requests would add" in shown
    bars = figure(at, "wl_server_categories")["data"][0]
    assert round(_values(bars["y"])[-1], 9) == round(want["overall"]["acceptance_rate"], 9)
    if want["overall"]["accepted_histogram"] is not None:
        figure(at, "wl_server_histogram")


def test_a_hostile_server_file_is_one_escaped_line(folder, monkeypatch):
    at = open_tab(open_page(folder, monkeypatch), "Upload or run live")
    at.text_area(key="wl_server_paste").input('{"metrics": {"speculative_decoding": {"num_spec_steps": -3}}}').run()
    assert not at.exception
    assert len(at.error) == 1 and "\n" not in at.error[0].value
    at.text_area(key="wl_server_paste").input("<b>hello</b>").run()
    assert len(at.error) == 1 and "<b>" not in at.error[0].value


def test_the_batch_lanes_show_the_batch_trace_and_link_each_lane_to_its_requests_cycle(folder, monkeypatch):
    at = open_page(folder, monkeypatch)
    open_tab(at, "Batch lanes")
    assert any("ran one request at a time" in i.value for i in at.info)  # the default workload was not batched
    at.selectbox(key="workload_pick").set_value(("bundled", f"{BATCHED}.zip")).run()
    open_tab(at, "Batch lanes")
    workload = open_workload(folder / "folders" / BATCHED)
    batch = workload.batch_trace()
    for cycle in (0, len(batch["cycles"]) - 1):
        at.slider(key="wl_batch_cycle").set_value(cycle).run()
        bars = [t for t in figure(at, "wl_batch_lanes")["data"] if t["type"] == "bar"]
        assert sum(len(t["y"]) for t in bars) == 2 * 3  # two rows, K=2 positions and the target's token
        running = [r for r in batch["cycles"][cycle]["rows"] if not r["idle"]]
        shown = links(at)
        assert len(shown) == len(running)
        for row, (text, query) in zip(running, shown):
            entry = workload.entries[row["request"]]
            assert text.replace("\\", "") == entry.id
            assert parse_request_name(parse_token(query["trace"]).name)[2] == entry.file
            assert int(query["cycle"]) == sum(1 for c in batch["cycles"][:cycle] for r in c["rows"]
                                              if not r["idle"] and r["request"] == row["request"])


def test_the_interview_answers_batching_with_the_bundled_batch_and_the_measured_goodput(folder, monkeypatch, tmp_path):
    from app.runs import batch_bench
    from engine.stats.batch_results import PLAIN_K, BatchSize, BatchSweep, batch_sweep_json
    sweep = BatchSweep("chat", 16, 32, 0.6, [BatchSize(1, 20.0, {3: 26.2, 4: 25.0}, {3: 0.45, 4: 0.41}, 3),
                                            BatchSize(4, 70.0, {3: 65.1, 4: 60.0}, {3: 0.44, 4: 0.40}, PLAIN_K)])
    idle = BatchSweep("tiny", 8, 16, 0.8, [BatchSize(2, 30.0, {2: 40.0}, {2: 0.7}, 2, idle_share={2: 0.125})])
    result = {"machine": {"cpu": "Test CPU <x>"}, "presets": [batch_sweep_json(sweep), batch_sweep_json(idle)]}
    (tmp_path / "batch-test.json").write_text(json.dumps(result))
    monkeypatch.setattr(batch_bench, "BENCH_RESULTS", tmp_path)
    at = open_page(folder, monkeypatch)
    at.switch_page("views/interview.py").run()
    assert not at.exception, [e.value for e in at.exception]
    (shrinks,) = [e for e in at.expander if "help less at high batch sizes" in e.label]
    said = " ".join(m.value for m in shrinks.markdown).replace("\\", "")
    assert "Measured on Test CPU" in said and "<x>" not in said  # a file's text is escaped, never raw HTML
    assert "speculation stops paying at B = 4" in said and "| 1 | 3 | 1.31× | 3 | 0.41 |" in said
    assert "| 4 | 3 | 0.93× | plain | 0.40 |" in said
    assert "| 2 | 2 | 1.33× | 2 | 0.70 | 12% |" in said  # idle rows, where the file has them
    (ragged,) = [e for e in at.expander if "accept different numbers of tokens" in e.label]
    said = " ".join(m.value for m in ragged.markdown).replace("\\", "")
    workload = open_workload(folder / "folders" / BATCHED)
    batch = workload.batch_trace()
    n = next(i for i, c in enumerate(batch["cycles"])
             if len({r["num_accepted"] for r in c["rows"] if not r["idle"]}) > 1)
    assert f"batched cycle {n}:" in said
    for r in batch["cycles"][n]["rows"]:
        t = r["target_cache_len"]
        assert (f"| {r['row']} | {workload.entries[r['request']].id} | {r['num_accepted']} | "
                f"{t['before']} → {t['after_append']} → {t['after_rollback']} |") in said
    assert [p.proto.page for p in ragged.get("page_link")] == ["workload"]


def test_a_sampled_workloads_loss_tab_keeps_its_probabilities(folder, monkeypatch):
    """Above temperature 0 p_draft and p_target say how sure each model was: the table and the scatter stay."""
    at = open_page(folder, monkeypatch)
    at.selectbox(key="workload_pick").set_value(("bundled", "sampled-k3.zip")).run()
    open_tab(at, "Where the loss is")
    want = expected(folder, "sampled-k3")["loss"]
    assert not want["rejected_tokens"]["greedy"] and want["rejected_tokens"]["rejections"]
    dots = figure(at, "wl_rejection_chart")["data"][1]
    assert [round(v, 9) for v in _values(dots["x"])] == [round(p["p_draft"], 9) for p in want["rejected_tokens"]["points"]]
    shown = texts(at)
    assert "| p_draft | p_target |" in shown and "the target's token" not in shown.replace("&#x27;", "'")
    for c in want["worst_cycles"]:
        if c["p_draft"] is not None:
            assert f"| {c['p_draft']:.3f} | {c['p_target']:.3f} | {c['committed_len_before']} |" in shown
