"""engine/servers: each server's documented format read (samples in tests/server_samples/, their
sources named in its README), hostile inputs refused in one line, and a trace of ours exported
under vLLM's names and read back giving the trace statistics' own numbers."""
import math
from pathlib import Path

import pytest

from engine.cli import main
from engine.servers.explain import (
    alpha_from_curve,
    alpha_from_length,
    calibrated_costs,
    entered_costs,
    explain,
    overhead_costs,
)
from engine.servers.export import prometheus_text
from engine.servers.read import decode, read_text, read_texts
from engine.servers.server_metrics import MAX_INPUT_BYTES, ServerMetrics, ServerMetricsError
from engine.stats.analysis import trace_stats
from engine.trace import load_trace
from engine.trace.metrics import expected_tokens_per_cycle

SAMPLES = Path(__file__).resolve().parent / "server_samples"
TRACES = Path(__file__).resolve().parent.parent / "assets" / "traces"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


# ---------------------------------------------------------------- each documented format

def test_vllm_one_scrape_sums_the_engines():
    m = read_text(sample("vllm_scrape_1.prom"))
    assert (m.drafts, m.draft_tokens, m.accepted_tokens, m.k) == (100, 300, 150, 3)
    assert m.per_position == pytest.approx([0.7, 0.5, 0.3])
    assert m.window_s is None and m.tokens_per_s is None  # one scrape: counts since the start, no window


def test_vllm_two_scrapes_give_the_window_between():
    m = read_texts([sample("vllm_scrape_1.prom"), sample("vllm_scrape_2.prom")])
    assert (m.drafts, m.draft_tokens, m.accepted_tokens) == (200, 600, 360)
    assert m.per_position == pytest.approx([0.8, 0.6, 0.4])
    assert m.window_s == pytest.approx(60.0) and m.tokens_per_s == pytest.approx(10.0)
    r = explain(m)
    assert r.acceptance_rate == pytest.approx(0.6) and r.mean_acceptance_length == pytest.approx(2.8)


def test_vllm_get_metrics_dump():
    m = read_text(sample("vllm_get_metrics.json"))
    assert (m.drafts, m.draft_tokens, m.accepted_tokens, m.k) == (50, 100, 60, 2)
    assert m.per_position == pytest.approx([0.8, 0.4])


def test_vllm_log_lines_are_added_up():
    m = read_text(sample("vllm.log"))
    assert (m.drafts, m.draft_tokens, m.accepted_tokens, m.k) == (200, 400, 200, 2)
    assert m.per_position == pytest.approx([0.65, 0.35])
    assert m.window_s == pytest.approx(20.0) and m.tokens_per_s == pytest.approx(10.0)


def test_sglang_server_info():
    m = read_text(sample("sglang_server_info.json"))
    assert (m.method, m.k) == ("EAGLE", 3)
    assert m.acceptance_length == pytest.approx(2.7) and m.tokens_per_s == pytest.approx(401.0)
    r = explain(m)
    assert r.acceptance_rate == pytest.approx(1.7 / 3)  # derived, and said to be
    assert r.derived and expected_tokens_per_cycle(r.alpha, 3) == pytest.approx(2.7, abs=1e-9)


def test_sglang_gauges_need_k_from_the_user():
    m = read_text(sample("sglang_gauges.prom"))
    assert m.acceptance_length == pytest.approx(3.0) and m.acceptance_rate == pytest.approx(0.5)
    assert explain(m).alpha is None  # no K, no alpha
    assert explain(m, k=4).alpha == pytest.approx(alpha_from_length(3.0, 4))


def test_sglang_generate_responses():
    m = read_text(sample("sglang_generate.jsonl"))
    assert (m.drafts, m.accepted_tokens) == (40, 60)
    assert explain(m).mean_acceptance_length == pytest.approx(2.5)


def test_tensorrt_llm_iteration_stats():
    m = read_text(sample("trtllm_metrics.json"))
    assert (m.drafts, m.draft_tokens, m.accepted_tokens, m.k) == (4, 16, 8, 4)
    assert m.window_s == pytest.approx(0.04) and m.draft_overhead == pytest.approx(0.25)
    r = explain(m)
    assert r.mean_acceptance_length == pytest.approx(3.0)
    assert r.costs is not None and r.costs.c == pytest.approx(0.25 / (4 * 0.75))  # f = Kc / (Kc + 1)


# ---------------------------------------------------------------- our terms

def test_alpha_from_a_geometric_curve_is_its_ratio():
    assert alpha_from_curve([0.7 ** i for i in range(1, 6)]) == pytest.approx(0.7)
    assert alpha_from_curve([0.0, 0.0]) == 0.0
    assert alpha_from_curve([0.5, 0.0, 0.0]) == pytest.approx(0.5)  # stops at the first zero


def test_alpha_from_length_inverts_the_expected_tokens():
    for alpha, k in [(0.3, 2), (0.8, 5), (0.95, 8)]:
        assert alpha_from_length(expected_tokens_per_cycle(alpha, k), k) == pytest.approx(alpha, abs=1e-9)


def test_collapse_and_k_too_high_are_named():
    collapsing = ServerMetrics("test", k=4, drafts=100, draft_tokens=400, accepted_tokens=95,
                               per_position=[0.8, 0.1, 0.04, 0.01])
    r = explain(collapsing, costs=entered_costs(0.05, 1.0))
    words = " ".join(r.limits)
    assert "collapses after position 1" in words and "K too high" in words
    steady = ServerMetrics("test", k=3, drafts=100, draft_tokens=300, accepted_tokens=219,
                           per_position=[0.9, 0.81, 0.729 - 0.249])
    assert not any("collapses" in t for t in explain(steady, costs=entered_costs(0.05)).limits)


def test_a_costly_draft_is_named():
    m = ServerMetrics("test", k=4, drafts=10, draft_tokens=40, accepted_tokens=30, per_position=[0.9, 0.8, 0.7, 0.6])
    assert any(t.startswith("c:") for t in explain(m, costs=entered_costs(0.4, 1.0)).limits)
    assert not any(t.startswith("c:") for t in explain(m, costs=entered_costs(0.02, 1.0)).limits)


def test_speedups_are_the_analysis_formulas():
    m = read_texts([sample("vllm_scrape_1.prom"), sample("vllm_scrape_2.prom")])
    r = explain(m, costs=entered_costs(0.1, 1.5))
    e = expected_tokens_per_cycle(r.alpha, 3)
    assert r.leviathan == pytest.approx(e / (3 * 0.1 + 1)) and r.refined == pytest.approx(e / (3 * 0.1 + 1.5))
    assert r.advice and all(not a.extrapolated for a in r.advice if a.k <= 31)


# ---------------------------------------------------------------- hostile and malformed

VLLM_HEAD = "vllm:spec_decode_num_drafts_total {d}\nvllm:spec_decode_num_draft_tokens_total 40\n"


@pytest.mark.parametrize("text, words", [
    (VLLM_HEAD.format(d="1e400"), "not a finite number"),
    (VLLM_HEAD.format(d="1e300"), "beyond"),
    (VLLM_HEAD.format(d="-5"), "cannot be negative"),
    (VLLM_HEAD.format(d="2.5"), "not a whole number"),
    (VLLM_HEAD.format(d="10") + "vllm:spec_decode_num_accepted_tokens_total 41\n", "more draft tokens than it drafted"),
    (VLLM_HEAD.format(d="10") + 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 5\n'
     'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 1\n', "lacks position 1"),
    (VLLM_HEAD.format(d="10") + 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 2\n'
     'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 5\n', "exceeds position 0"),
    (VLLM_HEAD.format(d="10") + 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="-1"} 2\n', "position"),
    ("# just a comment\nhttp_requests_total 3\n", "no speculative-decoding metrics"),
    ("this is { not prometheus", "not Prometheus text"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"internal_states": [{"avg_spec_accept_length": 0.5}]}', "at least one token"),
    ('[{"specDecodingStats": {"numDraftTokens": 4, "numAcceptedTokens": 9, "numRequestsWithDraftTokens": 1}}]',
     "more draft tokens than it drafted"),
    ('{"meta_info": {"spec_verify_ct": true}}', "not a number"),
    ("", "empty"),
])
def test_hostile_inputs_are_refused_in_one_line(text, words):
    with pytest.raises(ServerMetricsError) as err:
        read_text(text)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_counters_that_go_backwards_are_refused():
    with pytest.raises(ServerMetricsError, match="went backwards"):
        read_texts([sample("vllm_scrape_2.prom"), sample("vllm_scrape_1.prom")])


def test_ten_megabytes_are_refused_before_parsing():
    huge = "vllm:spec_decode_num_drafts_total 1\n" * (10 * 2**20 // 36 + 1)
    assert len(huge) > MAX_INPUT_BYTES
    with pytest.raises(ServerMetricsError, match="MiB"):
        read_text(huge)
    with pytest.raises(ServerMetricsError, match="MiB"):
        decode(huge.encode())
    with pytest.raises(ServerMetricsError, match="not UTF-8"):
        decode(b"\xff\xfe vllm")


# ---------------------------------------------------------------- agreement with a trace, both directions

@pytest.mark.parametrize("name", ["default.jsonl", "chat-sampled-k6-hot-low-acceptance.jsonl",
                                  "chat-prompt-lookup-greedy-k4.jsonl"])
def test_a_trace_exported_as_vllm_counters_reads_back_as_its_statistics(name):
    trace = load_trace(TRACES / name, allow_incomplete=True)
    st = trace_stats(trace)
    r = explain(read_text(prometheus_text(trace)))
    assert r.k == st.k and r.metrics.drafts == sum(1 for c in trace.cycles if c["draft_token_ids"])
    assert r.acceptance_rate == pytest.approx(st.acceptance["acceptance_rate"], abs=1e-12)
    assert r.mean_acceptance_length == pytest.approx(st.acceptance["mean_acceptance_length"], abs=1e-12)
    assert r.per_position == pytest.approx(st.acceptance["per_position_acceptance"], abs=1e-12)


def test_calibrated_costs_are_the_traces_own():
    st = trace_stats(load_trace(TRACES / "default.jsonl"))
    assert st.calibration is not None and st.speed is not None
    costs = calibrated_costs(st.calibration, st.k)
    assert costs.verify_steps == pytest.approx(st.speed.verify_in_steps)
    assert costs.c == pytest.approx(st.calibration.draft_step_s / st.calibration.target_step_s)
    assert overhead_costs(0.0, 4) is None and math.isclose(overhead_costs(0.5, 2).c, 0.5)


# ---------------------------------------------------------------- command line

def test_cli_metrics_prints_the_explanation(capsys):
    assert main(["metrics", str(SAMPLES / "vllm_scrape_1.prom"), str(SAMPLES / "vllm_scrape_2.prom"),
                 "--c", "0.1", "--trace", str(TRACES / "default.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "difference of two scrapes, 60 s apart" in out and "draft acceptance rate: 0.600" in out
    assert "K advisor: Best K" in out and "SIDE BY SIDE WITH THE TRACE" in out


def test_cli_metrics_refuses_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.prom"
    bad.write_text(VLLM_HEAD.format(d="-3"))
    assert main(["metrics", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "negative" in err and err.count("\n") == 1
    assert main(["metrics", str(SAMPLES / "sglang_gauges.prom"), "--k", "0"]) == 2


def test_cli_stats_prometheus_round_trips(tmp_path, capsys):
    trace = TRACES / "default.jsonl"
    assert main(["stats", "--prometheus", str(trace)]) == 0
    text = capsys.readouterr().out
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0"' in text
    st = trace_stats(load_trace(trace))
    assert read_text(text).per_position == pytest.approx(st.acceptance["per_position_acceptance"])
