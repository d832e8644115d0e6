"""The drafter registry (engine/drafters/registry.py): one entry per kind the trace format names,
each agreeing with its class, its command-line flags and the options a trace records."""
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from engine.cli import build_parser
from engine.config import SettingsError, SpecSettings
from engine.drafters.registry import (
    DRAFTERS,
    DrafterOptions,
    all_flags,
    build_drafter,
    check_before_loading,
    options_from_args,
    options_from_header,
    with_shipped_draft,
)
from engine.models.presets import PRESETS
from engine.trace import load_trace
from engine.trace.schema import DRAFTER_KINDS, EAGLE, OTHER_TOKENIZER, PROMPT_LOOKUP

ROOT = Path(__file__).resolve().parent.parent


def test_one_entry_per_kind_and_each_agrees_with_its_class():
    assert tuple(DRAFTERS) == DRAFTER_KINDS
    for kind, spec in DRAFTERS.items():
        assert spec.kind == kind
        assert {f.name: f.default for f in fields(spec.cls)}["kind"] == kind
        assert spec.needs.target_features == getattr(spec.cls, "reads_target_features", False), kind
        assert spec.samples == (not spec.refusal), kind
        assert spec.needs.same_tokens <= spec.needs.model and spec.needs.model <= (spec.needs.draft is not None)


def test_every_flag_is_an_option_field_and_the_cli_adds_it():
    option_fields = {f.name for f in fields(DrafterOptions)}
    parsed = build_parser().parse_args(["run", "--prompt", "x", "--out", "x.jsonl"])
    for flag in all_flags():
        assert flag.field in option_fields and getattr(parsed, flag.dest) == flag.default, flag.name
    parsed.drafter = "model"
    assert options_from_args(parsed) == DrafterOptions()


def test_registry_loads_without_torch():
    code = "import sys, engine.drafters.registry; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


@pytest.mark.parametrize("name", ["chat-prompt-lookup-greedy-k4.jsonl", "shakespeare-other-tokenizer-greedy-k6.jsonl",
                                  "chat-eagle-greedy-k4.jsonl", "chat-greedy-k4.jsonl"])
def test_options_from_a_bundled_trace_are_the_ones_it_recorded(name):
    header = load_trace(ROOT / "assets" / "traces" / name).header
    options = options_from_header(header)
    assert options.kind == header.get("drafter", {}).get("kind", "model")
    for flag in DRAFTERS[options.kind].flags:  # a draft model's header names its options only when mis-set
        assert getattr(options, flag.field) == header.get("drafter", {}).get(flag.field, flag.default)


def test_a_preset_s_shipped_draft_fills_the_options_or_is_refused():
    options, shipped = with_shipped_draft(PRESETS["chat"], DrafterOptions(EAGLE))
    assert shipped.name == "assets/models/chat-eagle" and Path(options.draft_model) == shipped.folder
    with pytest.raises(SettingsError, match="ships no EAGLE head"):
        with_shipped_draft(PRESETS["tiny-shakespeare"], DrafterOptions(EAGLE))
    named = DrafterOptions(OTHER_TOKENIZER, draft_model="mine")
    assert with_shipped_draft(PRESETS["chat"], named) == (named, None)
    assert with_shipped_draft(PRESETS["chat"], DrafterOptions(PROMPT_LOOKUP)) == (DrafterOptions(PROMPT_LOOKUP), None)


def test_what_a_drafter_needs_is_refused_before_anything_loads():
    greedy = SpecSettings(temperature=0)
    with pytest.raises(SettingsError, match="runs only greedy"):
        check_before_loading(DrafterOptions(OTHER_TOKENIZER), SpecSettings(temperature=1), None, "draft")
    with pytest.raises(SettingsError, match="ships no draft with another tokenizer"):
        check_before_loading(DrafterOptions(OTHER_TOKENIZER), greedy, PRESETS["chat"], None)
    check_before_loading(DrafterOptions(OTHER_TOKENIZER), greedy, PRESETS["tiny-shakespeare"], None)
    check_before_loading(DrafterOptions(EAGLE), SpecSettings(), None, None)  # a head is looked for when the pair loads
    with pytest.raises(SettingsError, match="the eagle drafter needs a head folder"):
        build_drafter(None, DrafterOptions(EAGLE), lambda folder: pytest.fail("a model was loaded"))
