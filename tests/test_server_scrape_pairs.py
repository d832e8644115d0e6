"""engine/servers: two /metrics scrapes are subtracted only when they are one run of one server
(same series, same _created times, no series falling, same server kind, neither empty), SGLang's
ranks are range-checked one by one, and zero drafts read as "nothing drafted" in every view
instead of a rate of 0. Every variant is one of tests/server_samples/ edited as text."""
import re
from dataclasses import replace
from pathlib import Path

import pytest

from engine.cli import main
from engine.servers.explain import NOTHING_WHY, entered_costs, explain
from engine.servers.export import prometheus_text
from engine.servers.read import read_text, read_texts
from engine.servers.report import format_report
from engine.servers.server_metrics import NOTHING_DRAFTED, ServerMetricsError
from engine.trace import load_trace

SAMPLES = Path(__file__).resolve().parent / "server_samples"
TRACE = Path(__file__).resolve().parent.parent / "assets" / "traces" / "default.jsonl"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


FIRST, SECOND, GAUGES = sample("vllm_scrape_1.prom"), sample("vllm_scrape_2.prom"), sample("sglang_gauges.prom")


def refusal(texts: list[str]) -> str:
    with pytest.raises(ServerMetricsError) as err:
        read_texts(texts)
    line = str(err.value)
    assert "\n" not in line
    return line


def with_created(text: str, seconds: float) -> str:
    """Each counter sample followed by its _created sample, as prometheus_client writes them."""
    out = []
    for line in text.splitlines():
        out.append(line)
        found = re.match(r"(\S+)_total(\{[^}]*\})", line)
        if found:
            out.append(f"{found.group(1)}_created{found.group(2)} {seconds}")
    return "\n".join(out) + "\n"


def without_timestamps(text: str) -> str:
    """vLLM's own /metrics carries no sample timestamps; the samples' are dropped here."""
    return re.sub(r"^(\S+ \S+) \d+$", r"\1", text, flags=re.MULTILINE)


def zeroed(text: str) -> str:
    """A fresh server's scrape: every counter still 0."""
    return re.sub(r"\} [0-9.]+", "} 0.0", text)


# ---------------------------------------------------------------- pairs that are not one run of one server

def test_a_second_scrape_of_another_model_is_refused():
    line = refusal([FIRST, SECOND.replace(MODEL, "Qwen/Qwen2.5-7B-Instruct")])
    assert "model_name" in line and "Qwen" in line and "one run of one server" in line


def test_a_restart_shown_by_created_times_is_refused_though_every_counter_grew():
    line = refusal([with_created(FIRST, 1749990000.0), with_created(SECOND, 1749999990.0)])
    assert "_created" in line and "restarted" in line and "earlier first" in line
    same_run = read_texts([with_created(FIRST, 1749990000.0), with_created(SECOND, 1749990000.0)])
    assert (same_run.drafts, same_run.draft_tokens, same_run.accepted_tokens) == (200, 600, 360)


def test_one_engine_falling_is_refused_while_the_sum_over_engines_grows():
    engine_1_restarted = SECOND.replace(
        f'drafts_total{{engine="0",model_name="{MODEL}"}} 160.0', f'drafts_total{{engine="0",model_name="{MODEL}"}} 270.0'
    ).replace(f'drafts_total{{engine="1",model_name="{MODEL}"}} 140.0', f'drafts_total{{engine="1",model_name="{MODEL}"}} 30.0')
    assert engine_1_restarted != SECOND
    line = refusal([FIRST, engine_1_restarted])
    assert "went backwards" in line and "engine='1'" in line and "40 to 30" in line


@pytest.mark.parametrize("pair, words", [
    ((FIRST, GAUGES), "the first scrape is vLLM's and the second SGLang's"),
    ((GAUGES, SECOND), "the first scrape is SGLang's and the second vLLM's"),
])
def test_scrapes_of_two_kinds_of_server_are_refused(pair, words):
    line = refusal(list(pair))
    assert words in line and "one run of one server" in line


@pytest.mark.parametrize("pair, words", [
    ((FIRST, ""), "the second scrape is empty"),
    ((FIRST, "# HELP process_cpu_seconds_total CPU time.\nprocess_cpu_seconds_total 12.5\n"),
     "the second scrape has no speculative-decoding metrics"),
    (("\n", SECOND), "the first scrape is empty"),
])
def test_an_empty_scrape_is_not_read_as_zeros(pair, words):
    line = refusal(list(pair))
    assert words in line and "vLLM's" in line


def test_a_series_given_twice_in_one_scrape_is_refused():
    doubled = FIRST + f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="{MODEL}"}} 1.0\n'
    with pytest.raises(ServerMetricsError, match="appears twice in one scrape"):
        read_text(doubled)


def test_cli_refuses_a_pair_of_two_models_in_one_line_with_exit_2(tmp_path, capsys):
    (tmp_path / "a.prom").write_text(FIRST)
    (tmp_path / "b.prom").write_text(SECOND.replace(MODEL, "another/model"))
    assert main(["metrics", str(tmp_path / "a.prom"), str(tmp_path / "b.prom")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "model_name" in err and err.count("\n") == 1


# ---------------------------------------------------------------- SGLang's ranks, each in range

@pytest.mark.parametrize("old, new, words", [
    ('dp_rank="1"} 0.6', 'dp_rank="1"} 1.4', ["sglang:spec_accept_rate{dp_rank='1'", "between 0 and 1"]),  # mean 0.85
    ('dp_rank="0"} 2.5', 'dp_rank="0"} 0.5', ["sglang:spec_accept_length{dp_rank='0'", "at least one token"]),  # 3.0
])
def test_one_ranks_impossible_gauge_is_not_averaged_into_range(old, new, words):
    text = GAUGES.replace(old, new)
    assert text != GAUGES
    with pytest.raises(ServerMetricsError) as err:
        read_text(text)
    assert all(w in str(err.value) for w in words), str(err.value)


# ---------------------------------------------------------------- nothing drafted

def assert_nothing_drafted(r) -> None:
    assert r.nothing_drafted
    for value in (r.acceptance_rate, r.mean_acceptance_length, r.per_position, r.conditional, r.alpha):
        assert value is NOTHING_DRAFTED
    assert r.advice == [] and r.leviathan is None and r.limits == [NOTHING_WHY]


@pytest.mark.parametrize("texts", [
    [zeroed(FIRST)],  # a fresh server
    [without_timestamps(FIRST)] * 2,  # one scrape given twice: a difference of zero drafts
    [GAUGES.replace("2.5", "0").replace("3.5", "0").replace("0.4", "0").replace("0.6", "0")],  # SGLang, fresh
])
def test_zero_drafts_are_nothing_drafted_with_no_advice(texts):
    m = read_texts(texts)
    assert m.drafts == 0 and m.per_position is None
    assert_nothing_drafted(explain(m, k=3, costs=entered_costs(0.1, 1.0)))
    words = NOTHING_WHY
    assert "drafted nothing" in words and "no requests" in words and "speculative decoding is off" in words
    assert "same scrape" in words


def test_one_scrape_given_twice_with_timestamps_is_refused_as_not_later():
    assert "not later" in refusal([FIRST, FIRST])


def test_an_sglang_rank_still_at_zero_is_left_out_of_the_average():
    m = read_text(GAUGES.replace('dp_rank="1"} 3.5', 'dp_rank="1"} 0').replace('dp_rank="1"} 0.6', 'dp_rank="1"} 0'))
    assert m.acceptance_length == pytest.approx(2.5) and m.acceptance_rate == pytest.approx(0.4)
    assert any("1 of 2 ranks" in n for n in m.notes)
    with pytest.raises(ServerMetricsError, match="is 0 .nothing drafted. but"):
        read_text(GAUGES.replace('dp_rank="1"} 3.5', 'dp_rank="1"} 0'))


def test_cli_says_nothing_drafted_never_zero(tmp_path, capsys):
    scrape = tmp_path / "same.prom"
    scrape.write_text(without_timestamps(FIRST))
    assert main(["metrics", str(scrape), str(scrape), "--c", "0.1"]) == 0
    out = capsys.readouterr().out
    for label in ("draft acceptance rate", "mean acceptance length", "per-position acceptance", "alpha"):
        assert f"  {label}: nothing drafted" in out
    assert "0.000" not in out and "K advisor" not in out and "drafted nothing in this window" in out


def test_a_trace_of_no_cycles_exports_counters_that_read_back_as_nothing_drafted():
    empty = replace(load_trace(TRACE), cycles=[])
    text = prometheus_text(empty)
    assert "vllm:spec_decode_num_drafts_total" in text
    r = explain(read_text(text))
    assert_nothing_drafted(r)
    assert "alpha: nothing drafted" in format_report(r)
