"""engine/servers per-request metrics: vLLM's metrics.speculative_decoding and SGLang's meta_info /
sglext read request by request (samples in tests/server_samples/, sources in its README), turned
into a workload's statistics shape with answers worked out by hand, and hostile inputs refused in
one line that names the field."""
import json
from collections import Counter
from pathlib import Path

import pytest

from engine.cli import main
from engine.servers import per_request
from engine.servers.read import read_requests_text, read_text
from engine.servers.request_stats import (
    GROUP_KEYS,
    conditional_acceptance,
    requests_stats,
    to_server_metrics,
)
from engine.servers.server_metrics import ServerMetricsError, ServerRequest, ServerRequests

SAMPLES = Path(__file__).resolve().parent / "server_samples"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def rates_of(g: dict) -> list[float | None]:
    return [row["rate"] for row in g["conditional_acceptance"]]


# ---------------------------------------------------------------- documented shapes

def test_vllm_documented_response():
    """The example of vLLM PR #48915 (and its docs): K=3, histogram [39, 1, 0, 3]."""
    reqs = read_requests_text(sample("vllm_response.json"))
    (r,) = reqs.requests
    assert (r.id, r.category, r.steps, r.drafted, r.accepted, r.k) == ("chatcmpl-1234567", None, 43, 129, 10, 3)
    assert r.accepted_histogram == [39, 1, 0, 3] and r.accepted_per_step is None and reqs.k == 3
    st = requests_stats(reqs)
    g = st["overall"]
    assert set(g) == set(GROUP_KEYS)
    assert g["acceptance_rate"] == pytest.approx(10 / 129) and g["mean_acceptance_length"] == pytest.approx(1 + 10 / 43)
    # steps accepting at least 1, 2, 3: 4, 3, 3 of 43
    assert rates_of(g) == pytest.approx([4 / 43, 3 / 4, 3 / 3])
    assert list(st["categories"]) == ["uncategorised"]


def test_vllm_earlier_per_choice_shape_reads_as_the_current_one():
    """--per-request-spec-decode-stats: choices[].speculative_decoding_stats, a sparse histogram; the
    documentation's example has the numbers of the current shape's example, and reads the same."""
    earlier = read_requests_text(sample("vllm_choice_stats.json"))
    current = read_requests_text(sample("vllm_response.json"))
    assert earlier.requests == current.requests
    assert "choices[].speculative_decoding_stats" in earlier.source
    assert requests_stats(earlier)["overall"] == requests_stats(current)["overall"]


def choice(**stats) -> dict:
    return {"index": 0, "message": {"role": "assistant", "content": "..."}, "speculative_decoding_stats": stats}


def test_each_choice_of_the_earlier_shape_is_a_request():
    detailed = {"acceptance_histogram": {"0": 1, "2": 1}, "num_spec_steps": 2, "num_accepted_draft_tokens": 2,
                "num_draft_tokens": 4, "num_spec_tokens": 2, "per_step_accepted": [0, 2], "per_step_drafted": [2, 2]}
    answer = {"id": "cmpl-n", "choices": [choice(**detailed), choice(**detailed | {"acceptance_histogram": {"1": 2},
                                                                                    "per_step_accepted": [1, 1]}),
                                          {"index": 2, "speculative_decoding_stats": None}]}
    reqs = read_requests_text(json.dumps(answer))
    assert [r.id for r in reqs.requests] == ["cmpl-n/0", "cmpl-n/1"]
    assert [r.accepted_histogram for r in reqs.requests] == [[1, 0, 1], [0, 2, 0]]
    assert reqs.notes == ["1 response with speculative-decoding metrics null (n > 1, or speculative decoding off) left out"]


def test_a_block_of_unknown_fields_is_named_in_one_line():
    # The field names of vLLM PR #47322, which was closed unmerged: not a shape this reader knows.
    unknown = {"num_drafted_tokens": 500, "num_accepted_tokens": 413, "num_draft_steps": 250}
    for answer, where in [({"id": "r", "choices": [choice(**unknown)]}, "choices[0].speculative_decoding_stats"),
                          ({"id": "r", "metrics": {"speculative_decoding": unknown}}, "metrics.speculative_decoding")]:
        with pytest.raises(ServerMetricsError) as err:
            read_requests_text(json.dumps(answer))
        message = str(err.value)
        assert f"request 1 {where} has a speculative-decoding block this reader does not know" in message
        assert "'num_drafted_tokens', 'num_accepted_tokens', 'num_draft_steps'" in message and "\n" not in message


@pytest.mark.parametrize("stats, words", [
    ({"acceptance_histogram": {"4": 1}, "num_spec_steps": 1, "num_spec_tokens": 3},
     "has the key '4': an accepted count from 0 to K = 3"),
    ({"acceptance_histogram": {"0": 1}, "num_spec_steps": 1}, "is sparse (a map) and num_spec_tokens is missing"),
    ({"acceptance_histogram": {"0": 2}, "num_spec_steps": 1, "num_spec_tokens": 3}, "acceptance_histogram sums to 2 steps"),
])
def test_a_broken_sparse_histogram_is_refused_in_one_line(stats, words):
    with pytest.raises(ServerMetricsError) as err:
        read_requests_text(json.dumps({"id": "r", "choices": [choice(**stats)]}))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_vllm_requests_by_category_worked_by_hand():
    reqs = read_requests_text(sample("vllm_requests.jsonl"))
    assert [r.id for r in reqs.requests] == ["chatcmpl-a", "chatcmpl-b", "chatcmpl-c", "chatcmpl-d"]
    assert any("null" in n for n in reqs.notes)  # chatcmpl-e (n > 1) is left out, and said to be
    st = requests_stats(reqs)
    assert st["requests"] == 4 and st["k"] == 3 and list(st["categories"]) == ["chat", "code", "uncategorised"]
    code = st["categories"]["code"]  # a: [1, 1, 2, 4], b: [2, 2, 1, 1]
    assert (code["requests"], code["cycles"], code["draft_tokens"], code["accepted_tokens"]) == (2, 14, 42, 24)
    assert code["acceptance_rate"] == pytest.approx(24 / 42) and code["mean_acceptance_length"] == pytest.approx(1 + 24 / 14)
    assert code["accepted_histogram"] == [3, 3, 3, 5]
    assert rates_of(code) == pytest.approx([11 / 14, 8 / 11, 5 / 8])
    chat = st["categories"]["chat"]
    assert chat["accepted_histogram"] == [4, 3, 2, 1] and rates_of(chat) == pytest.approx([6 / 10, 3 / 6, 1 / 3])
    overall = st["overall"]
    assert (overall["cycles"], overall["draft_tokens"], overall["accepted_tokens"]) == (28, 83, 40)
    assert overall["acceptance_rate"] == pytest.approx(40 / 83)
    assert overall["mean_acceptance_length"] == pytest.approx(1 + 40 / 28)
    assert overall["accepted_histogram"] == [8, 7, 6, 7]
    # d's steps drafted 3, 3, 2, 3 positions: its step that drafted 2 is not "reached" at position 3
    assert [(c["accepted"], c["reached"]) for c in overall["conditional_acceptance"]] == [(20, 28), (13, 20), (7, 13)]
    assert st["median_acceptance_rate"] == pytest.approx((7 / 18 + 6 / 11) / 2)
    row = st["per_request"][3]
    assert (row["id"], row["category"], row["accepted_per_cycle"]) == ("chatcmpl-d", "uncategorised", [3, 0, 1, 2])
    assert row["below_median"] == pytest.approx(st["median_acceptance_rate"] - 6 / 11)
    assert st["what_a_trace_adds"] and any("p_target" in s for s in st["what_a_trace_adds"])
    assert json.loads(json.dumps(st)) == st  # JSON-serialisable, as the app and other tools read it


def test_detailed_steps_give_exact_conditional_acceptance():
    """per_step_drafted [3, 3, 2, 3], accepted [3, 0, 1, 2]: position 3 was drafted by 3 steps, reached by 2."""
    st = requests_stats(read_requests_text(sample("vllm_requests.jsonl")))
    d = st["categories"]["uncategorised"]
    assert [(c["accepted"], c["reached"]) for c in d["conditional_acceptance"]] == [(3, 4), (2, 3), (1, 2)]


def test_sglang_generate_meta_info_per_request():
    reqs = read_requests_text(sample("sglang_requests.jsonl"))
    assert [(r.id, r.category, r.steps, r.accepted, r.drafted, r.k) for r in reqs.requests] == [
        ("s1", "math", 5, 9, 15, 3), ("s2", "math", 4, 3, 12, 3), ("s3", "chat", 6, 12, 18, 3)]
    st = requests_stats(reqs)
    math = st["categories"]["math"]
    assert (math["cycles"], math["accepted_tokens"], math["accepted_histogram"]) == (9, 12, [3, 2, 2, 2])
    assert math["acceptance_rate"] == pytest.approx(12 / 27) and math["mean_acceptance_length"] == pytest.approx(1 + 12 / 9)
    assert rates_of(math) == pytest.approx([6 / 9, 4 / 6, 2 / 4])
    assert st["overall"]["mean_acceptance_length"] == pytest.approx(1 + 24 / 15)
    m = read_text(sample("sglang_requests.jsonl"))  # the server-wide reader adds the same counts up
    assert (m.drafts, m.draft_tokens, m.accepted_tokens, m.k) == (15, 45, 24, 3)
    assert m.per_position == pytest.approx([12 / 15, 8 / 15, 4 / 15])


def test_sglang_sglext_spec_tokens_details():
    """The counts of SGLang PR #33518's example: K = 5 (six buckets), 63 of 215 accepted in 43 passes."""
    reqs = read_requests_text(sample("sglang_sglext.json"))
    (r,) = reqs.requests
    assert (r.steps, r.accepted, r.drafted, r.k) == (43, 63, 215, 5)
    assert r.mean_acceptance_length == pytest.approx(106 / 43)  # SGLang's own: completion tokens / passes
    g = requests_stats(reqs)["overall"]
    assert g["mean_acceptance_length"] == pytest.approx(1 + 63 / 43)  # ours, from the counts
    assert rates_of(g) == pytest.approx([32 / 43, 18 / 32, 7 / 18, 3 / 7, 3 / 3])
    assert read_text(sample("sglang_sglext.json")).accepted_tokens == 63


def test_sglext_for_n_choices_and_an_unkept_histogram():
    details = {"spec_accept_rate": 0.5, "spec_accept_length": 2.0, "spec_num_correct_drafts": 4,
               "spec_num_proposed_drafts": 8, "spec_verify_ct": 4, "spec_correct_drafts_histogram": []}
    reqs = read_requests_text(json.dumps({"id": "c1", "category": "qa", "sglext": {"spec_tokens_details": [details, details]}}))
    assert [(r.id, r.category, r.accepted_histogram) for r in reqs.requests] == [("c1/0", "qa", None), ("c1/1", "qa", None)]
    g = requests_stats(reqs)["overall"]
    assert (g["cycles"], g["acceptance_rate"], g["conditional_acceptance"]) == (8, 0.5, None)


def test_older_sglang_without_counts_gives_none_not_zero():
    """spec_verify_ct and completion_tokens only (tests/server_samples/sglang_generate.jsonl)."""
    st = requests_stats(read_requests_text(sample("sglang_generate.jsonl")))
    g = st["overall"]
    assert (g["cycles"], g["accepted_tokens"], g["acceptance_rate"]) == (40, None, None)
    assert g["accepted_histogram"] is None and g["conditional_acceptance"] is None
    assert g["mean_acceptance_length"] == pytest.approx((64 + 36) / 40)  # SGLang's lengths weighted by passes
    assert [row["mean_acceptance_length"] for row in st["per_request"]] == pytest.approx([64 / 25, 36 / 15])
    assert read_text(sample("sglang_generate.jsonl")).accepted_tokens == 60  # the server-wide reader is unchanged


def test_conditional_acceptance_from_a_histogram():
    """P(position i | position i - 1) = steps accepting >= i / steps accepting >= i - 1."""
    steps = Counter({(4, 0): 10, (4, 1): 20, (4, 2): 30, (4, 3): 0, (4, 4): 40})
    rows = conditional_acceptance(steps, 4)
    assert [(c["accepted"], c["reached"]) for c in rows] == [(90, 100), (70, 90), (40, 70), (40, 40)]
    none = conditional_acceptance(Counter({(2, 0): 5}), 2)
    assert [c["rate"] for c in none] == [0.0, None]  # position 2 never reached: None, not 0


def test_histogram_by_draft_length_and_offline_bare_object():
    line = {"category": "ngram", "spec_decode_metrics": {
        "acceptance_histogram": [3, 2, 1], "acceptance_histogram_by_draft_length": {"1": [2, 1], "2": [1, 1, 1]},
        "num_spec_steps": 6, "num_accepted_draft_tokens": 4, "num_draft_tokens": 9, "num_spec_tokens": 2}}
    reqs = per_request.read_requests([line])
    (r,) = reqs.requests
    assert r.histogram_by_draft_length == {1: [2, 1], 2: [1, 1, 1]} and r.category == "ngram"
    g = requests_stats(reqs)["overall"]
    # position 1: all 6 drafted it, 3 accepted; position 2: only the 3 steps of length 2 drafted it,
    # 2 of them accepted position 1, and 1 accepted position 2
    assert [(c["accepted"], c["reached"]) for c in g["conditional_acceptance"]] == [(3, 6), (1, 2)]


def test_to_server_metrics_feeds_the_explanation():
    m = to_server_metrics(read_requests_text(sample("vllm_requests.jsonl")))
    assert (m.drafts, m.draft_tokens, m.accepted_tokens, m.k) == (28, 83, 40, 3)
    assert m.per_position == pytest.approx([20 / 28, 13 / 28, 7 / 28])
    assert read_text(sample("vllm_requests.jsonl")).per_position == pytest.approx(m.per_position)


def test_record_types_are_frozen():
    r = ServerRequest("x", None, 1, 3, 1, None, None, [0, 1, 0, 0], None, "vLLM", k=3)
    with pytest.raises(AttributeError):
        r.steps = 2
    assert requests_stats(ServerRequests([r], "test"))["overall"]["mean_acceptance_length"] == 2.0


def test_non_per_request_text_is_not_read_as_requests():
    assert read_requests_text(sample("vllm_scrape_1.prom")) is None
    assert read_requests_text(sample("vllm_get_metrics.json")) is None


# ---------------------------------------------------------------- hostile and malformed

def vllm_line(**changes) -> dict:
    block = {"mean_acceptance_length": 1.2325581395348837, "draft_acceptance_rate": 0.07751937984496124,
             "acceptance_histogram": [39, 1, 0, 3], "num_spec_steps": 43, "num_accepted_draft_tokens": 10,
             "num_draft_tokens": 129, "num_spec_tokens": 3}
    block.update(changes)
    return {"id": "r", "metrics": {"speculative_decoding": block}}


def text_of(*items) -> str:
    return "\n".join(json.dumps(i) for i in items)


@pytest.mark.parametrize("text, words", [
    ('{"metrics": {"speculative_decoding": {"num_spec_steps": 4', "not JSON"),
    (text_of(vllm_line(num_spec_steps="43")), "request 1 num_spec_steps is '43', not a number"),
    (text_of(vllm_line(), vllm_line(num_draft_tokens=-1)), "request 2 num_draft_tokens is -1: a count cannot be negative"),
    (text_of(vllm_line(acceptance_histogram=[39, 1, 3])), "acceptance_histogram has 3 entries but K is 3"),
    (text_of(vllm_line(acceptance_histogram="39 1 0 3")), "acceptance_histogram is '39 1 0 3', not a list"),
    (text_of(vllm_line(num_draft_tokens=9)), "num_accepted_draft_tokens is 10 but num_draft_tokens is 9"),
    (text_of(vllm_line(num_spec_steps=44)), "acceptance_histogram sums to 43 steps but num_spec_steps is 44"),
    (text_of(vllm_line(num_accepted_draft_tokens=11)), "acceptance_histogram gives 10 accepted tokens"),
    (text_of(vllm_line(draft_acceptance_rate=0.5)), "draft_acceptance_rate is 0.5 but"),
    (text_of(vllm_line(mean_acceptance_length=3.0)), "mean_acceptance_length is 3 but"),
    (text_of(vllm_line(num_draft_tokens=200)), "num_draft_tokens is 200 in 43 steps of K=3"),
    (text_of(vllm_line(num_spec_tokens=0)), "num_spec_tokens is 0; K must be 1 to"),
    (text_of(vllm_line(per_step_accepted=[1, 2])), "per_step_accepted has 2 entries but num_spec_steps is 43"),
    (text_of(vllm_line(per_step_accepted=[0] * 43, per_step_drafted=[2**40] * 43)), "has a step beyond K=3"),
    (text_of(vllm_line(per_step_drafted=[3] * 43)), "per_step_drafted without per_step_accepted"),
    (text_of(vllm_line(acceptance_histogram=[1], num_spec_tokens=None)), "acceptance_histogram is [1]: it needs K + 1 entries"),
    (text_of(vllm_line(acceptance_histogram_by_draft_length={"x": [1]})), "acceptance_histogram_by_draft_length has the key"),
    (text_of(vllm_line(acceptance_histogram_by_draft_length={"3": [1, 1, 1, 1]})), "does not add up"),
    ('{"id": "r", "metrics": {"speculative_decoding": {"num_spec_steps": NaN}}}', "num_spec_steps is nan, not a finite"),
    ('{"id": "r", "metrics": {"speculative_decoding": {"draft_acceptance_rate": Infinity}}}', "not a finite number"),
    ('{"id": "r", "metrics": {"speculative_decoding": [1, 2]}}', "speculative_decoding is [1, 2], not an object"),
    ('{"id": "r", "metrics": {"speculative_decoding": null}}', "every response's speculative-decoding metrics are null"),
    (text_of(vllm_line(), {"id": "x", "choices": []}), "request 2 has no metrics.speculative_decoding"),
    (text_of({"category": 5.5, **vllm_line()}), "request 1 category is 5.5, not a string"),
    ('{"metrics": {"speculative_decoding": ' + "[" * 100_000 + "]" * 100_000 + "}}", "nested too deeply"),
    ('{"meta_info": {"spec_verify_ct": 4, "spec_accept_histogram": [1, 1, 1]}}', "spec_accept_histogram sums to 3"),
    ('{"meta_info": {"spec_verify_ct": 4, "spec_accept_token_num": 9, "spec_draft_token_num": 8}}',
     "spec_accept_token_num is 9 but spec_draft_token_num is 8"),
    ('{"sglext": {"spec_tokens_details": {"spec_accept_rate": 0.5}}}', "has no spec_verify_ct"),
    ('{"meta_info": {"spec_verify_ct": 4, "spec_num_correct_drafts": 2, "spec_num_proposed_drafts": 8, '
     '"spec_accept_rate": 0.5}}', "spec_accept_rate is 0.5 but spec_num_correct_drafts / spec_num_proposed_drafts"),
    ('{"meta_info": {"spec_verify_ct": 4, "spec_accept_length": 0.5}}', "spec_accept_length is 0.5: a step commits"),
])
def test_hostile_per_request_inputs_are_refused_in_one_line(text, words):
    with pytest.raises(ServerMetricsError) as err:
        read_requests_text(text)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_too_many_requests_are_refused(monkeypatch):
    monkeypatch.setattr(per_request, "MAX_REQUESTS", 2)
    with pytest.raises(ServerMetricsError, match="at most 2 requests"):
        read_requests_text(text_of(vllm_line(), vllm_line(), vllm_line()))


# ---------------------------------------------------------------- command line

def test_cli_metrics_prints_the_per_request_report(capsys):
    assert main(["metrics", str(SAMPLES / "vllm_requests.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "PER REQUEST" in out and "PER CATEGORY" in out and "OVERALL" in out and "WHAT A TRACE" in out
    assert "chatcmpl-d" in out and "code: 2 requests" in out and "draft acceptance rate: 0.571" in out
    assert "conditional acceptance by position: 1: 0.714 (20/28)" in out
    assert "THE REQUESTS ADDED UP" in out and "drafts (cycles): 28" in out  # then the server-wide explanation


def test_cli_metrics_refuses_a_hostile_request_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text_of(vllm_line(), vllm_line(num_spec_steps=-4)))
    assert main(["metrics", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "request 2 num_spec_steps" in err and err.count("\n") == 1
