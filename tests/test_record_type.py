"""The typed cycle record in engine/trace/format.py is what the engine writes and what the loader checks."""
import json

import pytest

from engine.config import SpecSettings
from engine.cycle.reference import speculative_generate
from engine.trace.format import CYCLE_FIELDS, NUM, CycleRecord, TraceError, loads_trace
from tests.test_prompt_lookup import lookup_pair
from tests.tiny import noisy_pair


def test_loader_table_is_derived_from_the_typed_record():
    assert list(CYCLE_FIELDS) == [k for k in CycleRecord.__annotations__ if k in CycleRecord.__required_keys__]
    assert CYCLE_FIELDS["rejected_position"] == (int, None)
    assert CYCLE_FIELDS["draft_cache_len"] == (dict, None)
    assert CYCLE_FIELDS["cycle_time_s"] == NUM
    assert "drafter_state" not in CYCLE_FIELDS and "drafter_state" in CycleRecord.__optional_keys__


@pytest.mark.parametrize("make_pair, extra", [(lambda: noisy_pair(0), set()), (lambda: lookup_pair(0), {"drafter_state"})],
                         ids=["model", "prompt-lookup"])
def test_engine_writes_exactly_the_typed_fields(make_pair, extra):
    for rec in speculative_generate(make_pair(), [1, 2, 4, 1, 2], SpecSettings(k=3, temperature=0, max_new_tokens=8)):
        assert set(rec) == set(CYCLE_FIELDS) | extra


# ---------------------------------------------------------------- old and new traces in the loader


def lines_of(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def dumps(records: list[dict]) -> str:
    return "\n".join(json.dumps(r) for r in records)


def test_a_trace_without_a_drafter_entry_is_a_draft_model_trace(example_traces):
    records = lines_of(example_traces["sampled"])
    assert records[0]["drafter"] == {"kind": "model"}
    del records[0]["drafter"]  # as traces were written before drafters had names
    trace = loads_trace(dumps(records))
    assert trace.drafter_kind == "model" and len(trace.cycles) == len(records) - 2


def test_loader_refuses_drafter_records_that_do_not_fit(example_traces):
    records = lines_of(example_traces["sampled"])
    bad = json.loads(json.dumps(records))
    bad[0]["drafter"] = {"kind": "telepathy"}
    with pytest.raises(TraceError, match="'drafter'"):
        loads_trace(dumps(bad))
    bad = json.loads(json.dumps(records))
    bad[1]["draft_cache_len"] = None  # a draft model always keeps a cache
    with pytest.raises(TraceError, match="draft_cache_len"):
        loads_trace(dumps(bad))
    bad = json.loads(json.dumps(records))
    for name in ("draft_token_ids", "draft_token_texts", "p_draft", "p_target", "accept_prob", "beta", "draft_top"):
        bad[1][name] = bad[1][name][:-1]  # a draft model proposes exactly K
    bad[1]["target_top"] = bad[1]["target_top"][:-1]
    with pytest.raises(TraceError, match="expected 4"):
        loads_trace(dumps(bad))


def test_prompt_lookup_may_propose_fewer_but_never_more_than_k(tmp_path):
    from engine.run import run_to_trace
    out = tmp_path / "pl.jsonl"
    run_to_trace(lookup_pair(0), "the cat sat on the cat sat", SpecSettings(k=3, temperature=0, max_new_tokens=12), out)
    records = lines_of(out)
    assert loads_trace(dumps(records)).drafter_kind == "prompt-lookup"
    c = next(r for r in records[1:-1] if r["draft_token_ids"])
    c["draft_token_ids"] = c["draft_token_ids"] + [1] * 4
    with pytest.raises(TraceError, match="more than K=3"):
        loads_trace(dumps(records))
