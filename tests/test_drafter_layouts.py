"""Prompt lookup and the other-tokenizer draft on every KV-cache layout of the target."""
import pytest

from engine.config import SpecSettings
from engine.cycle.plain import target_generate
from engine.cycle.reference import speculative_generate
from engine.run import run_to_trace
from engine.trace import load_trace
from engine.trace.schema import LAYOUTS
from tests.checks import assert_self_consistent
from tests.test_other_tokenizer import other_tokenizer_pair, prompt_ids
from tests.test_prompt_lookup import PROMPT, lookup_pair


@pytest.mark.parametrize("layout", LAYOUTS)
def test_drafters_are_greedy_equal_and_their_traces_load_in_every_layout(layout, tmp_path):
    s = SpecSettings(k=4, temperature=0, max_new_tokens=30, cache_layout=layout, block_size=4)
    for pair, ids, text in ((lookup_pair(0), PROMPT, "the cat sat on the cat sat"),
                            (other_tokenizer_pair(0), None, "the cat sat on a mat")):
        ids = ids or prompt_ids(pair)
        tokens = [t for r in speculative_generate(pair, ids, s) for t in r["committed_token_ids"]]
        assert tokens == target_generate(pair.target, ids, s, set())
        out = tmp_path / f"{pair.drafter.kind}.jsonl"
        run_to_trace(pair, text, s, out)
        trace = load_trace(out)
        assert trace.header["cache_layout"]["name"] == layout
        assert_self_consistent(trace)
        if layout != "dynamic":
            assert all("target_cache_layout_state" in c and "draft_cache_layout_state" not in c for c in trace.cycles)
