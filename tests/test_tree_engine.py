"""Tree runs end to end on tiny random models: the tokens, the caches and the records.

What the acceptance walk, the tree forward and the compaction do on their own is tested in
test_tree_accept.py and test_tree_kv.py; here they run together as the engine runs them.
"""
import pytest
import torch

from engine.config import SettingsError, SpecSettings, TreeSpec, parse_tree
from engine.cycle.pair import TokenTexts
from engine.cycle.plain import target_generate
from engine.kv.layouts import check_invariants
from engine.trace.schema import LAYOUTS, NEXT_BONUS, NEXT_RESIDUAL, ROOT
from engine.tree.cycle import run_tree_cycle, start_tree_run, tree_generate
from tests.test_kv_layouts import PROMPT, assert_matches_fresh_prefill, tokens_of
from tests.tiny import noisy_pair, tiny_pair

TREES = ["static:3,2,1", "static:1,1,1,1", "dynamic:top_k=3,depth=4,nodes=10"]


@pytest.mark.parametrize("tree", TREES)
def test_greedy_tree_output_equals_plain_greedy_on_every_layout(tree):
    pair = noisy_pair(0, noise=0.08)
    plain = target_generate(pair.target, PROMPT, SpecSettings(temperature=0, max_new_tokens=40), pair.eos_ids)
    for layout in LAYOUTS:
        s = SpecSettings(k=parse_tree(tree).max_depth, temperature=0, max_new_tokens=40, cache_layout=layout,
                         block_size=4)
        records = list(tree_generate(pair, PROMPT, s, parse_tree(tree)))
        assert tokens_of(records) == plain, layout
        kinds = {r["tree"]["next_token_kind"] for r in records}
        assert NEXT_RESIDUAL in kinds, "no cycle rejected anything: the test would not see a compaction that moves"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_both_caches_equal_a_fresh_prefill_after_every_tree_cycle(layout, temperature):
    pair = noisy_pair(1, noise=0.06)
    spec = parse_tree("dynamic:top_k=2,depth=3,nodes=6")
    s = SpecSettings(k=3, temperature=temperature, max_new_tokens=30, seed=5, cache_layout=layout, block_size=4)
    gen, texts = torch.Generator().manual_seed(s.seed), TokenTexts(pair.target.tokenizer)
    state = start_tree_run(pair, PROMPT, s, spec)
    cycle, moved = 0, 0
    while not state.finished:
        rec = run_tree_cycle(pair, state, s, spec, gen, cycle, texts)
        for model, cache in ((pair.target, state.target_cache), (pair.draft, state.draft_cache)):
            check_invariants(cache)
            assert_matches_fresh_prefill(model, cache, state.committed)
        lens = rec["target_cache_len"]
        assert lens["after_append"] - lens["before"] == len(rec["tree"]["nodes"]) + 1 == rec["verify_positions"]
        assert lens["after_rollback"] == len(state.committed) - 1
        moved += len(rec["tree"]["compaction"]["target"]["moves"])
        cycle += 1
    assert moved, "no path ever left the first branch: compaction never moved a slot"


def assert_tree_record_describes_its_walk(rec: dict, spec: TreeSpec) -> None:
    """What one engine tree record must say about its own walk, whatever drafted the tree."""
    tree = rec["tree"]
    nodes, path = tree["nodes"], tree["path"]
    assert rec["num_accepted"] == len(path)
    assert [nodes[i]["parent"] for i in path] == [ROOT, *path][: len(path)]
    assert [t["node"] for t in tree["tried"] if t["accepted"]] == path
    assert all(t["accepted"] == (t["u"] < t["p_residual"]) for t in tree["tried"])
    tokens = [nodes[i]["token_id"] for i in path] + [tree["next_token_id"]]
    assert rec["committed_token_ids"] == tokens[: len(rec["committed_token_ids"])]
    assert (tree["residual_top"] is None) == (tree["next_token_kind"] == NEXT_BONUS)
    assert tree["draft_forwards"] == len(rec["draft_step_times_s"]) <= spec.max_depth
    assert len(tree["target_top"]) == len(nodes) + 1
    for node in nodes:  # children of one parent are distinct tokens, best draft first
        siblings = [n for n in nodes if n["parent"] == node["parent"]]
        assert len({n["token_id"] for n in siblings}) == len(siblings)
        assert [n["q"] for n in siblings] == sorted((n["q"] for n in siblings), reverse=True)


def test_a_tree_cycle_record_describes_its_walk():
    pair = noisy_pair(2, noise=0.1)
    spec = parse_tree("static:3,2")
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=24, seed=3)
    for rec in tree_generate(pair, PROMPT, s, spec):
        assert_tree_record_describes_its_walk(rec, spec)


def test_a_tree_run_refuses_a_drafter_without_a_draft_model():
    from engine.cycle.pair import Pair
    from engine.drafters.prompt_lookup import PromptLookupDrafter

    pair = tiny_pair(0)
    lookup = Pair(pair.target, None, pair.eos_ids, PromptLookupDrafter(pair.target.full_vocab_size))
    with pytest.raises(SettingsError, match="draft model"):
        next(tree_generate(lookup, PROMPT, SpecSettings(k=2), parse_tree("static:2,2")))
