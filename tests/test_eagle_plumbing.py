"""The EAGLE head around the engine: the trace checker, preset defaults, CLI, app default, bench/speed.py.

Every trace here is written by the engine with tests/eagle_tiny.py's untrained head (no
training time); tests/test_eagle.py proves the head exact.
"""
import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from engine.cli import main as cli_main
from engine.models import presets
from engine.models.presets import PRESETS, default_drafter
from engine.trace import TraceError, load_trace, loads_trace
from tests.eagle_tiny import eagle_trace, save_eagle_folders

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def eagle_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("eagle") / "eagle.jsonl"
    eagle_trace(path)
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    return save_eagle_folders(tmp_path_factory.mktemp("eagle-models"))


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def dumped(recs: list[dict]) -> bytes:
    return ("\n".join(json.dumps(r) for r in recs) + "\n").encode()


# ---------------------------------------------------------------- the trace checker on eagle traces

def test_the_engine_s_eagle_trace_loads_and_has_every_kind_of_cycle(eagle_file):
    trace = load_trace(eagle_file)
    assert trace.drafter_kind == "eagle"
    accepted = [c["num_accepted"] for c in trace.cycles]
    assert 0 in accepted and trace.k in accepted and any(0 < n < trace.k for n in accepted)
    for c in trace.cycles:
        assert c["drafter_state"] == {"kind": "eagle", "feature_sources": ["target"] + ["head"] * (trace.k - 1),
                                      "first_feature_position": c["committed_len_before"] - 2}
        assert c["draft_catch_up"] == (c["num_accepted"] > 0)  # accepted tokens are fed again with true features


def partial_cycle(recs: list[dict]) -> int:
    """Index (in the records) of a cycle with some but not all drafts accepted: the head caught up."""
    k = recs[0]["settings"]["k"]
    return next(i for i, r in enumerate(recs) if r.get("type") == "cycle" and 0 < r["num_accepted"] < k)


def bump(field: str, delta: int = 1):
    def edit(c: dict) -> None:
        c["draft_cache_len"][field] += delta
    return edit


def drop_last_draft(c: dict) -> None:
    for name in ("draft_token_ids", "draft_token_texts"):
        c[name].pop()


def flip_catch_up(c: dict) -> None:
    c["draft_catch_up"] = not c["draft_catch_up"]


def all_target_features(c: dict) -> None:
    c["drafter_state"]["feature_sources"] = ["target"] * len(c["draft_token_ids"])


@pytest.mark.parametrize("field, edit", [
    ("draft_cache_len.after_rollback", bump("after_rollback")),
    ("draft_cache_len.after_rollback", bump("after_rollback", -1)),  # the entries built on predicted features stayed
    ("draft_cache_len.after_append", bump("after_append")),
    ("draft_catch_up", flip_catch_up),
    ("draft_token_ids", drop_last_draft),
    ("drafter_state.feature_sources", all_target_features),
])
def test_a_tampered_eagle_trace_is_refused_naming_the_field(eagle_file, field, edit):
    recs = records(eagle_file)
    i = partial_cycle(recs)
    edit(recs[i])
    with pytest.raises(TraceError, match=rf"line {i + 1} \(cycle {i - 1}\): field '{field}'"):
        loads_trace(dumped(recs), "tampered.jsonl")
    loads_trace(dumped(records(eagle_file)), "untouched.jsonl")  # the same bytes untouched pass


def test_an_eagle_trace_without_feature_sources_still_loads(eagle_file):
    """The feature record is optional (traces written before it existed)."""
    recs = records(eagle_file)
    for r in recs[1:-1]:
        r.pop("drafter_state")
    assert loads_trace(dumped(recs), "older.jsonl").drafter_kind == "eagle"


def test_the_catch_up_rule_differs_from_a_draft_model_s(eagle_file):
    """The same cycles claimed by a draft model are refused: a draft model keeps its accepted
    entries, the head rebuilds them from the target's true features."""
    recs = records(eagle_file)
    recs[0]["drafter"]["kind"] = "model"
    with pytest.raises(TraceError, match="field 'draft_catch_up'"):
        loads_trace(dumped(recs), "claims-model.jsonl")


# ---------------------------------------------------------------- the preset's default drafter

def test_presets_default_to_the_separate_draft_model_today():
    assert {name: p.default_drafter for name, p in PRESETS.items()} == {"chat": "model", "tiny-shakespeare": "model"}
    assert default_drafter("chat") == "model" and default_drafter("") == "model"


def test_a_preset_default_must_be_a_drafter_it_can_run():
    base = PRESETS["tiny-shakespeare"]
    with pytest.raises(ValueError, match="not one of"):
        dataclasses.replace(base, default_drafter="medusa")
    with pytest.raises(ValueError, match="needs an eagle_head"):
        dataclasses.replace(base, default_drafter="eagle")  # tiny-shakespeare ships no head
    assert dataclasses.replace(PRESETS["chat"], default_drafter="eagle").default_drafter == "eagle"


@pytest.fixture
def eagle_default_preset(folders, tmp_path, monkeypatch) -> str:
    """tiny-shakespeare rebuilt over tiny models, with an EAGLE head as its default drafter."""
    assets = tmp_path / "assets"
    (assets / "models" / "tiny-shakespeare").mkdir(parents=True)
    for name in ("target", "draft"):
        (assets / "models" / "tiny-shakespeare" / name).symlink_to(folders[name])
    (assets / "models" / "tiny-head").symlink_to(folders["head"])
    monkeypatch.setattr(presets, "ASSETS", assets)
    preset = dataclasses.replace(PRESETS["tiny-shakespeare"], eagle_head="tiny-head", default_drafter="eagle")
    monkeypatch.setitem(PRESETS, "tiny-shakespeare", preset)
    return preset.name


def cli_trace(tmp_path, *extra: str):
    out = tmp_path / f"run{len(list(tmp_path.glob('run*.jsonl')))}.jsonl"
    rc = cli_main(["run", "--preset", "tiny-shakespeare", "--prompt", "the cat sat", "--k", "2",
                   "--max-new-tokens", "6", "--device", "cpu", "--out", str(out), *extra])
    assert rc == 0
    return load_trace(out)


def test_the_cli_honours_the_preset_s_default_drafter(eagle_default_preset, tmp_path):
    trace = cli_trace(tmp_path)
    assert trace.drafter_kind == "eagle" and trace.header["draft"]["name"] == "assets/models/tiny-head"
    assert cli_trace(tmp_path, "--drafter", "model").drafter_kind == "model"  # the separate draft stays selectable
    assert cli_trace(tmp_path, "--drafter", "prompt-lookup").drafter_kind == "prompt-lookup"


def test_the_cli_uses_a_draft_model_when_models_are_named(eagle_default_preset, folders, tmp_path):
    out = tmp_path / "named.jsonl"
    rc = cli_main(["run", "--target", str(folders["target"]), "--draft", str(folders["draft"]), "--prompt", "the cat",
                   "--k", "2", "--max-new-tokens", "4", "--device", "cpu", "--out", str(out)])
    assert rc == 0 and load_trace(out).drafter_kind == "model"


@pytest.mark.parametrize("default", ["eagle", "model"])
def test_the_live_run_form_selects_the_preset_s_default_drafter(monkeypatch, tmp_path, default):
    from streamlit.testing.v1 import AppTest
    monkeypatch.setitem(PRESETS, "chat", dataclasses.replace(PRESETS["chat"], default_drafter=default))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60)
    at.run()
    at.switch_page("views/trace_source.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.radio(key="live_drafter").value == default
    at.selectbox(key="live_preset").set_value("tiny-shakespeare").run()  # its own default: a draft model
    assert at.radio(key="live_drafter").value == "model"


# ---------------------------------------------------------------- bench/speed.py

def speed_module():
    return importlib.import_module("bench.speed")


def test_bench_speed_runs_the_head_in_the_engine_and_the_separate_draft_in_hf(folders, tmp_path):
    speed = speed_module()
    common = ["--target", str(folders["target"]), "--draft", str(folders["draft"]), "--max-new-tokens", "8",
              "--repeats", "1", "--prompts", "1", "--temperatures", "1", "--threads", "1", "--out", str(tmp_path)]
    assert speed.main([*common, "--drafter", "eagle", "--head", str(folders["head"]), "--k", "auto"]) == 0
    assert speed.main([*common, "--k", "2"]) == 0  # the default for named models: the draft model
    eagle = json.loads((tmp_path / "speed-custom-eagle.json").read_text())
    model = json.loads((tmp_path / "speed-custom.json").read_text())  # not overwritten by the eagle run
    assert (eagle["drafter"], eagle["drafter_name"], model["drafter"]) == ("eagle", "tiny-eagle", "model")
    assert eagle["draft"] == model["draft"] == str(folders["draft"])  # method c's assistant either way
    st = eagle["settings"][0]
    assert st["pilot"]["k"] in range(1, 9)  # the K advisor ran on the head's calibrated step time
    assert st["calibration"]["draft_step_s"] > 0 and st["c"] > 0
    md = (tmp_path / "speed-custom-eagle.md").read_text()
    assert "because Hugging Face has no EAGLE drafter" in md and "tiny-eagle" in md
    assert "no EAGLE drafter" not in (tmp_path / "speed-custom.md").read_text()
    combined = (tmp_path / "speed.md").read_text()
    assert "### custom-eagle" in combined and "### custom:" in combined


def test_bench_speed_refuses_an_eagle_run_without_a_head(folders):
    speed = speed_module()
    with pytest.raises(SystemExit):
        speed.parse_args(["--target", str(folders["target"]), "--draft", str(folders["draft"]), "--drafter", "eagle"])


def test_bench_speed_names_eagle3_results_apart_and_needs_its_head(folders):
    speed = speed_module()
    with pytest.raises(SystemExit):
        speed.parse_args(["--target", str(folders["target"]), "--draft", str(folders["draft"]), "--drafter", "eagle3"])
    with pytest.raises(SystemExit):  # --head belongs to a head
        speed.parse_args(["--preset", "chat", "--drafter", "model", "--head", str(folders["head"])])
    names = {d: speed.results_name(speed.parse_args(["--preset", "chat", "--drafter", d])) for d in ("model", "eagle", "eagle3")}
    assert names == {"model": "chat", "eagle": "chat-eagle", "eagle3": "chat-eagle3"}


def test_old_results_files_still_render():
    from bench.bench_report import markdown
    old = json.loads((ROOT / "bench" / "results" / "speed-chat.json").read_text())
    assert "drafter" not in old  # written before --drafter
    text = markdown(old)
    assert "separate draft model" in text and "no EAGLE drafter" not in text


# ---------------------------------------------------------------- scripts/make_example_traces.py

def examples_module():
    return importlib.import_module("scripts.make_example_traces")


def test_every_bundled_example_names_its_drafter():
    """Flipping a preset's default drafter changes default.jsonl only; a file named for a drafter runs it."""
    from engine.cli import build_parser
    from engine.trace.schema import DRAFTER_KINDS
    ex = examples_module()
    for name, args in ex.EXAMPLES.items():
        parsed = build_parser().parse_args(["run", *args, "--out", "x.jsonl"])
        if name == "default.jsonl":
            assert parsed.drafter is None  # the preset's default drafter
            continue
        assert parsed.drafter is not None, name
        named = [kind for kind in ("eagle", "eagle3", "prompt-lookup", "other-tokenizer", "suffix")
                 if f"-{kind}-" in name]
        assert named == ([] if parsed.drafter == "model" else [parsed.drafter]), name
    assert set(ex.selected(["eagle"])) == {"chat-eagle-sampled-k4.jsonl", "chat-eagle-greedy-k4.jsonl",
                                           "chat-eagle3-greedy-k4.jsonl"}
    named_kinds = {args[args.index("--drafter") + 1] for args in ex.EXAMPLES.values() if "--drafter" in args}
    assert named_kinds == set(DRAFTER_KINDS)  # one example per drafter kind


def test_the_eagle_examples_run_on_the_chat_preset(folders, tmp_path, monkeypatch):
    """The exact entries, on a chat preset whose target and head are the tiny ones."""
    assets = tmp_path / "assets"
    (assets / "models").mkdir(parents=True)
    (assets / "models" / "chat-eagle").symlink_to(folders["head"])
    monkeypatch.setattr(presets, "ASSETS", assets)
    monkeypatch.setattr(presets, "smollm2_folder", lambda: folders["target"])
    ex = examples_module()
    monkeypatch.setattr(ex, "OUT", tmp_path / "traces")
    # Whether a recording was quiet depends on the machine's load, not on the entries: under load every
    # attempt can fail the rule (seen on a busy 2-core machine). The rule has its own tests (test_quiet.py).
    monkeypatch.setattr(ex, "quiet_words", lambda trace: None)
    assert ex.run(["chat-eagle-"]) == 0  # the EAGLE-1 entries (the EAGLE-3 one needs a speculators head)
    for name in ("chat-eagle-sampled-k4.jsonl", "chat-eagle-greedy-k4.jsonl"):
        trace = load_trace(tmp_path / "traces" / name)
        assert trace.drafter_kind == "eagle" and trace.header["preset"] == "chat"
        assert trace.header["draft"]["name"] == "assets/models/chat-eagle"  # portable, never this machine's path
        assert "calibration" in trace.header and trace.complete
