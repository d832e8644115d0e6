"""Reusing the K/V of a prompt start shared with the previous request (engine/kv/prefix.py)."""
import json

import pytest
import torch

from engine.config import SpecSettings
from engine.kv.layouts import attended_kv
from engine.kv.ops import prefill
from engine.kv.prefix import MIN_REUSE, PrefixReuse, PrefixStore
from engine.mode import RunMode
from engine.run import run_to_trace
from engine.trace.errors import TraceError
from engine.trace.format import load_trace, loads_trace
from tests.tiny import noisy_pair

START = [(i * 7) % 15 + 1 for i in range(40)]  # 40 shared tokens, more than MIN_REUSE
# float32 products round with the number of rows they multiply (and differently per CPU: oneDNN's packed
# path or MKL's, AVX2 or AVX-512): a start read within a 45-token forward and within a 40-token one agree to
# about 1e-6 on these O(1) values here, not bit for bit. 1e-4, as tests/test_batch_cycle.py allows for the
# same reason; K/V of another token or position differ by O(0.1)
KV_TOLERANCE = 1e-4


def test_a_shared_start_is_copied_and_the_rest_read_and_the_cache_equals_a_fresh_prefill():
    pair = noisy_pair(1)
    store = PrefixStore()
    pair.target.prefix_store = store
    try:
        prefill(pair.target, START + [3, 4, 5, 6])  # the store now holds that prompt's K/V
        second = START + [9, 9, 2]
        assert store.reusable(second[:-1]) == len(START)
        cache = prefill(pair.target, second)
    finally:
        pair.target.prefix_store = None
    assert store.ids == second[:-1]
    fresh = prefill(pair.target, second)  # no store: the whole prompt read
    for (k, v), (k0, v0) in zip(attended_kv(cache), attended_kv(fresh), strict=True):
        assert k.shape == k0.shape == (1, k0.shape[1], len(second) - 1, k0.shape[3])
        torch.testing.assert_close(k, k0, atol=KV_TOLERANCE, rtol=KV_TOLERANCE)
        torch.testing.assert_close(v, v0, atol=KV_TOLERANCE, rtol=KV_TOLERANCE)


def test_short_shared_starts_and_whole_prompts_are_not_taken():
    store = PrefixStore(ids=START)
    assert store.reusable(START[:MIN_REUSE - 1] + [0]) == 0  # too short to be worth a copy
    assert store.reusable(START) == len(START) - 1  # the last prefilled token is always read again
    assert store.reusable([0] + START) == 0


def run_two(tmp_path, mode: RunMode, layout: str = "dynamic") -> list:
    pair = noisy_pair(1)
    words = "the cat sat on a mat and then the dog ran far away while it slept "
    s = SpecSettings(k=3, temperature=0.0, max_new_tokens=8, cache_layout=layout)
    return [run_to_trace(pair, words * 4 + tail, s, tmp_path / f"{i}.jsonl", mode, chat_template=False)
            for i, tail in enumerate(["a dog", "the cat sat"])]


def test_a_run_that_reuses_a_start_says_so_and_commits_what_a_full_prefill_would(tmp_path):
    reused = run_two(tmp_path / "reused", RunMode(prefix_reuse=PrefixReuse()))
    plain = run_two(tmp_path / "plain", RunMode())
    assert reused[0].header["prefix_reuse"] == {"target": 0, "draft": 0}  # nothing remembered yet
    shared = reused[1].header["prefix_reuse"]
    assert shared["target"] == shared["draft"] >= MIN_REUSE and "prefix_reuse" not in plain[1].header
    for a, b in zip(reused, plain):
        assert a.summary["generated_token_ids"] == b.summary["generated_token_ids"]
        assert [c["target_cache_len"] for c in a.cycles] == [c["target_cache_len"] for c in b.cycles]
    assert load_trace(tmp_path / "reused" / "1.jsonl").header["prefix_reuse"] == shared
    static = run_two(tmp_path / "static", RunMode(prefix_reuse=PrefixReuse()), layout="static")
    assert "prefix_reuse" not in static[1].header  # only dynamic caches take a copied start


@pytest.mark.parametrize("bad", [{"target": -1}, {"target": 10**6}, {"other": 3}, {}, [4], {"draft": 1.5}])
def test_a_bad_prefix_reuse_field_is_refused(tmp_path, bad):
    run_two(tmp_path, RunMode(prefix_reuse=PrefixReuse()))
    lines = (tmp_path / "1.jsonl").read_text().splitlines()
    lines[0] = json.dumps(json.loads(lines[0]) | {"prefix_reuse": bad})
    with pytest.raises(TraceError, match="prefix_reuse"):
        loads_trace("\n".join(lines) + "\n")
