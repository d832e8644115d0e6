"""The acceptance figures count drafts, the cycles that proposed at least one token, as vLLM V1 does; a
trace written when the lab counted every cycle still loads."""
import json

import pytest

from engine.trace import TraceError, loads_trace
from engine.trace.metrics import acceptance_metrics, legacy_acceptance, trace_acceptance
from engine.workload.requests import RequestRun
from engine.workload.stats import workload_stats
from tests import golden_traces


def test_a_cycle_that_drafted_nothing_is_left_out_of_length_and_positions():
    # Three cycles at K=3: a lookup that found nothing, then 3 of 3 and 1 of 3 accepted.
    m = acceptance_metrics([0, 3, 1], 3, [0, 3, 3])
    assert m["mean_acceptance_length"] == pytest.approx(1 + 4 / 2)  # not 1 + 4 / 3
    assert m["per_position_acceptance"] == pytest.approx([2 / 2, 1 / 2, 1 / 2])
    assert m["acceptance_rate"] == pytest.approx(4 / 6)  # accepted / drafted: unchanged
    assert m["num_cycles"] == 3


def test_nothing_drafted_has_no_length():
    m = acceptance_metrics([0, 0], 3, [0, 0])
    assert (m["mean_acceptance_length"], m["acceptance_rate"], m["num_cycles"]) == (0.0, 0.0, 2)


@pytest.fixture(scope="module")
def lookup_file(tmp_path_factory):
    """The golden prompt-lookup case run now (tiny models, K=3): 12 cycles, 2 of which found no match."""
    out = tmp_path_factory.mktemp("lookup") / "prompt_lookup.jsonl"
    golden_traces.prompt_lookup(out)
    return out


@pytest.fixture
def lookup_records(lookup_file) -> list[dict]:
    return [json.loads(line) for line in lookup_file.read_text().splitlines()]


def as_text(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_the_golden_lookup_trace_counts_its_drafts(lookup_records):
    trace = loads_trace(as_text(lookup_records))
    drafting = [c for c in trace.cycles if c["draft_token_ids"]]
    assert len(drafting) == len(trace.cycles) - 2
    accepted = sum(c["num_accepted"] for c in trace.cycles)
    assert trace.summary["mean_acceptance_length"] == pytest.approx(1 + accepted / len(drafting))


def test_a_summary_written_with_the_older_definition_still_loads(lookup_records):
    records = lookup_records
    cycles = [r for r in records if r["type"] == "cycle"]
    records[-1].update(legacy_acceptance([c["num_accepted"] for c in cycles], 3))
    assert records[-1]["mean_acceptance_length"] != trace_acceptance(cycles, 3)["mean_acceptance_length"]
    assert loads_trace(as_text(records)).complete


def test_a_summary_that_mixes_the_definitions_is_refused(lookup_records):
    records = lookup_records
    cycles = [r for r in records if r["type"] == "cycle"]
    records[-1]["mean_acceptance_length"] = legacy_acceptance([c["num_accepted"] for c in cycles], 3)["mean_acceptance_length"]
    with pytest.raises(TraceError, match="mean_acceptance_length"):
        loads_trace(as_text(records))


def test_a_workload_counts_drafts_as_the_trace_does(lookup_records):
    trace = loads_trace(as_text(lookup_records))
    stats = workload_stats([RequestRun("r1", "chat", "r1.jsonl", trace)], bootstrap_samples=20)
    row, overall = stats["per_request"][0], stats["overall"]
    assert (row["cycles"], row["drafts"]) == (12, 10)
    assert row["mean_acceptance_length"] == pytest.approx(trace.summary["mean_acceptance_length"])
    assert sum(overall["accepted_histogram"]) == overall["drafts"] == 10
    low, high = overall["intervals"]["mean_acceptance_length"]
    assert low == high == pytest.approx(row["mean_acceptance_length"])  # one request: every resample is it
