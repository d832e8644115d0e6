"""The EAGLE head drafts trees: exact, one target pass, its cache on true features after every cycle.

Tiny models (tests/eagle_tiny.py): the 2-layer tiny target and an untrained one-layer head. The
untrained head's first choice is often not the target's, so the target's token is often a later
sibling: the tree is really used, paths leave the first branch and the catch-up feeds several
tokens. Every node of a tree is also checked against a chain of head steps along its own path.
"""
import json

import pytest
import torch

from engine.cli import main
from engine.config import SettingsError, SpecSettings, parse_tree
from engine.cycle.pair import Pair, TokenTexts, eos_ids_of
from engine.cycle.plain import target_generate
from engine.cycle.reference import speculative_generate
from engine.kv.layouts import check_invariants
from engine.mode import RunMode
from engine.run import run_to_trace
from engine.trace import TraceError, loads_trace
from engine.trace.schema import EAGLE, LAYOUTS, NEXT_RESIDUAL, ROOT, STATIC_TREE
from engine.tree.cycle import run_tree_cycle, start_tree_run, tree_generate
from engine.tree.draft import confidence
from tests.eagle_tiny import assert_head_is_a_fresh_start, random_eagle_pair, save_eagle_folders
from tests.test_kv_layouts import PROMPT, assert_matches_fresh_prefill, tokens_of
from tests.test_tree_engine import assert_tree_record_describes_its_walk

TREES = ["static:3,2,1", "dynamic:top_k=3,depth=4,nodes=10"]


@pytest.fixture(scope="module")
def eagle_pair() -> Pair:
    return random_eagle_pair(0)


def leaves_first_branch(rec: dict) -> bool:
    """Some accepted node is not the first child its parent's children were tried in."""
    nodes = rec["tree"]["nodes"]
    firsts = {}
    for i, node in enumerate(nodes):
        firsts.setdefault(node["parent"], i)
    return any(firsts[nodes[p]["parent"]] != p for p in rec["tree"]["path"])


def fed_positions(rec: dict, spec) -> int:
    """Head entries a cycle's forwards append: the root and every expanded node (static: all but the deepest)."""
    nodes = rec["tree"]["nodes"]
    if spec.kind == STATIC_TREE:
        return 1 + sum(n["depth"] < spec.max_depth for n in nodes)
    return 1 + len({n["parent"] for n in nodes} - {ROOT})  # at least every node with children was fed


@pytest.mark.parametrize("tree", TREES)
def test_greedy_tree_with_the_head_equals_plain_greedy_on_every_layout(eagle_pair, tree):
    spec = parse_tree(tree)
    plain = target_generate(eagle_pair.target, PROMPT, SpecSettings(temperature=0, max_new_tokens=40),
                            eagle_pair.eos_ids)
    for layout in LAYOUTS:
        s = SpecSettings(k=spec.max_depth, temperature=0, max_new_tokens=40, cache_layout=layout, block_size=4)
        records = list(tree_generate(eagle_pair, PROMPT, s, spec))
        assert tokens_of(records) == plain, layout
        assert any(leaves_first_branch(r) for r in records), "the target's token was always the head's first choice"
        assert any(r["num_accepted"] >= 2 for r in records), "no path read a predicted feature and was kept"
        assert NEXT_RESIDUAL in {r["tree"]["next_token_kind"] for r in records}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_after_every_cycle_both_caches_equal_a_fresh_start(eagle_pair, layout, tree, temperature):
    """The target's cache equals a fresh prefill and the head's a fresh fill on true features; the
    records keep the walk's invariants; the head's compaction keeps the root alone, then catches up."""
    pair, spec = eagle_pair, parse_tree(tree)
    s = SpecSettings(k=spec.max_depth, temperature=temperature, max_new_tokens=24, seed=4, cache_layout=layout,
                     block_size=4)
    gen, texts = torch.Generator().manual_seed(s.seed), TokenTexts(pair.target.tokenizer)
    state = start_tree_run(pair, PROMPT, s, spec)
    cycle, longest_catch_up = 0, 0
    while not state.finished:
        rec = run_tree_cycle(pair, state, s, spec, gen, cycle, texts)
        assert_tree_record_describes_its_walk(rec, spec)
        for cache in (state.target_cache, state.draft_state.cache):
            check_invariants(cache)
        assert_matches_fresh_prefill(pair.target, state.target_cache, state.committed)
        assert_head_is_a_fresh_start(pair.drafter, state.draft_state, state.committed)
        d, n_committed = rec["draft_cache_len"], len(rec["committed_token_ids"])
        assert d["before"] == rec["target_cache_len"]["before"] == rec["committed_len_before"] - 1
        assert d["after_append"] - d["before"] >= fed_positions(rec, spec)
        if spec.kind == STATIC_TREE:
            assert d["after_append"] - d["before"] == fed_positions(rec, spec)
        assert d["after_rollback"] == len(state.committed) - 1
        assert rec["tree"]["compaction"]["draft"] == {"kept_slots": [d["before"]], "moves": []}
        assert rec["draft_catch_up"] == (n_committed >= 2)  # the root's entry is kept; later tokens are fed
        longest_catch_up = max(longest_catch_up, n_committed - 1)
        cycle += 1
    # Greedy, the untrained head gets whole paths accepted (the catch-up then reads the verify's rows along
    # the path); sampled at T=1 it rarely gets more than one node kept, which still feeds the root's row.
    assert longest_catch_up >= (2 if temperature == 0 else 1), "the catch-up never fed the tokens it should test"


@torch.inference_mode()
def chain_confidences(drafter, committed: list[int], ancestors: list[int], s: SpecSettings) -> torch.Tensor:
    """(V,) what a chain of head steps on a fresh head ranks after [root, *ancestors]: the root read with the
    target's feature, each later token with the previous step's predicted feature (the chain's propose)."""
    state = drafter.start(committed)
    position = len(committed) - 1
    prev = drafter.prev_true_features(state, position, 1)
    for offset, token in enumerate([committed[-1], *ancestors]):
        prev = drafter.feed(state, position + offset, [token], prev)
    return confidence(drafter.parts.logits(prev), s)[0]


@pytest.mark.parametrize("tree", TREES)
def test_every_node_is_ranked_as_a_chain_along_its_path_ranks_it(eagle_pair, tree):
    """A tree level's one batched forward under the mask gives each node what the chain gives its path:
    positions by depth, the parent's predicted feature, the prefix, the root and the ancestors only."""
    pair, spec = eagle_pair, parse_tree(tree)
    s = SpecSettings(k=spec.max_depth, temperature=0, max_new_tokens=40, cache_layout="static")
    gen, texts = torch.Generator().manual_seed(0), TokenTexts(pair.target.tokenizer)
    state = start_tree_run(pair, PROMPT, s, spec)
    checked = 0
    for cycle in range(4):
        committed = list(state.committed)
        nodes = run_tree_cycle(pair, state, s, spec, gen, cycle, texts)["tree"]["nodes"]
        for node in nodes:
            ancestors = []
            parent = node["parent"]
            while parent != ROOT:
                ancestors.insert(0, nodes[parent]["token_id"])
                parent = nodes[parent]["parent"]
            chain = chain_confidences(pair.drafter, committed, ancestors, s)
            # one batched masked forward against single-token ones: float32 sums in another order
            assert abs(float(chain[node["token_id"]]) - node["q"]) < 1e-5, (cycle, node)
            checked += node["depth"] >= 2
    assert checked, "no node below depth 1 was checked"


def test_a_chain_shaped_tree_drafts_the_chain_s_tokens(eagle_pair):
    """static:1,1,1 is K=3 greedy chain drafting: the same tokens and the same accepts, cycle by cycle."""
    s = SpecSettings(k=3, temperature=0, max_new_tokens=30)
    chain = list(speculative_generate(eagle_pair, PROMPT, s))
    tree = list(tree_generate(eagle_pair, PROMPT, s, parse_tree("static:1,1,1")))
    assert [[n["token_id"] for n in r["tree"]["nodes"]] for r in tree] == [r["draft_token_ids"] for r in chain]
    assert [r["num_accepted"] for r in tree] == [r["num_accepted"] for r in chain]


def test_a_one_token_prompt_starts_the_head_with_no_feature(eagle_pair):
    """The root at position 0 reads 'no feature' (a zero row), as a chain's first step there does."""
    s = SpecSettings(k=3, temperature=0, max_new_tokens=20)
    records = list(tree_generate(eagle_pair, [3], s, parse_tree("static:3,2,1")))
    assert tokens_of(records) == target_generate(eagle_pair.target, [3], s, eagle_pair.eos_ids)
    assert records[0]["draft_cache_len"]["before"] == 0


def test_one_target_pass_per_tree_cycle(eagle_pair):
    """The prefill, then one verify per cycle: the head's features come from those passes."""
    calls = []
    handle = eagle_pair.target.runner.register_forward_hook(lambda *a: calls.append(1))  # what the engine calls
    try:
        s = SpecSettings(k=3, temperature=0, max_new_tokens=20)
        records = list(tree_generate(eagle_pair, PROMPT, s, parse_tree("static:3,2,1")))
    finally:
        handle.remove()
    assert len(calls) == 1 + len(records)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_eagle_tree_trace_loads_and_a_compacted_head_is_refused(eagle_pair, layout, tmp_path):
    """The loader (engine/trace/tree_checks.py) takes the head's trees, and holds its rollback to the rule:
    the root's entry kept alone, the rest fed again."""
    spec = parse_tree("static:3,2,1")
    s = SpecSettings(k=3, temperature=0, max_new_tokens=24, cache_layout=layout, block_size=4)
    path = tmp_path / "t.jsonl"
    run_to_trace(eagle_pair, "the cat sat on a mat", s, path, RunMode(tree=spec), chat_template=False)
    trace = loads_trace(path.read_text(encoding="utf-8"))
    assert trace.is_tree and trace.complete and trace.drafter_kind == EAGLE
    records = [trace.header, *trace.cycles, trace.summary]
    i = next(i for i, c in enumerate(trace.cycles) if c["tree"]["path"])
    base = trace.cycles[i]["draft_cache_len"]["before"]
    records[1 + i]["tree"]["compaction"]["draft"]["kept_slots"] = [base, base + 1 + trace.cycles[i]["tree"]["path"][0]]
    with pytest.raises(TraceError, match=rf"cycle {i}\): field 'tree.compaction.draft': must be kept_slots \[{base}\]"):
        loads_trace("\n".join(json.dumps(r) for r in records))


def test_prompt_lookup_and_the_other_tokenizer_drafter_are_refused():
    from engine.drafters.prompt_lookup import PromptLookupDrafter
    from tests.test_other_tokenizer import other_tokenizer_pair

    other = other_tokenizer_pair()
    lookup = Pair(other.target, None, set(), PromptLookupDrafter(other.target.full_vocab_size))
    for pair, kind in ((lookup, "prompt-lookup"), (other, "other-tokenizer")):
        with pytest.raises(SettingsError, match=f"draft model or the EAGLE head.*the {kind} drafter proposes chains"):
            next(tree_generate(pair, PROMPT, SpecSettings(k=2), parse_tree("static:2,2")))


def test_cli_runs_a_tree_with_the_eagle_head(tmp_path):
    paths = save_eagle_folders(tmp_path)
    out = tmp_path / "tree.jsonl"
    rc = main(["run", "--target", str(paths["target"]), "--drafter", "eagle", "--draft", str(paths["head"]),
               "--tree", "dynamic:top_k=2,depth=3,nodes=6", "--prompt", "the cat sat", "--max-new-tokens", "12",
               "--temperature", "0", "--out", str(out), "--device", "cpu"])
    assert rc in (0, None)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    header, cycles = lines[0], [r for r in lines if r.get("type") == "cycle"]
    assert header["drafter"]["kind"] == EAGLE and header["settings"]["tree"]["kind"] == "dynamic"
    assert header["settings"]["k"] == 3 and all("tree" in c for c in cycles)
    pair = random_eagle_pair(0)  # the saved target is tiny_llama(0, 2, 32), as this pair's
    greedy = target_generate(pair.target, header["prompt_token_ids"], SpecSettings(temperature=0, max_new_tokens=12),
                             eos_ids_of(pair.target))  # the CLI's run stops at the tokenizer's <eos>
    assert tokens_of(cycles) == greedy


@pytest.mark.slow  # 15 s per tree on a quiet 2-core machine, a minute under load: a 135M target and its head
@pytest.mark.parametrize("tree", ["static:3,2,1", "dynamic:top_k=3,depth=4,nodes=12"])
def test_chat_preset_eagle_tree_equals_plain_greedy(tree):
    from engine.drafters.registry import DrafterOptions
    from engine.models.presets import PRESETS
    from engine.run import encode_prompt, load_preset

    preset = PRESETS["chat"]
    pair = load_preset("chat", device="cpu", drafter=DrafterOptions(kind=EAGLE))
    prompt = encode_prompt(pair.target.tokenizer, preset.example_prompt, preset.use_chat_template)
    spec = parse_tree(tree)
    s = SpecSettings(k=spec.max_depth, temperature=0, max_new_tokens=24)
    records = list(tree_generate(pair, prompt, s, spec))
    assert tokens_of(records) == target_generate(pair.target, prompt, s, pair.eos_ids)
    assert sum(r["num_accepted"] for r in records) > 0  # the shipped head's nodes are kept at all


def test_tree_auto_with_the_head_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import engine.run

    monkeypatch.setattr(engine.run, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    out = tmp_path / "a.jsonl"
    code = main(["run", "--preset", "chat", "--drafter", "eagle", "--tree", "auto", "--prompt", "hi", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: --tree auto sizes trees from the draft model") and not out.exists()
