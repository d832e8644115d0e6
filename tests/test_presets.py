"""Both shipped pairs load offline and decode greedily exactly like their target."""
import pytest

from engine.config import SpecSettings
from engine.cycle.plain import target_generate
from engine.cycle.reference import speculative_generate
from engine.models.presets import PRESETS
from engine.run import encode_prompt, load_preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_greedy_equals_target_and_drafts_get_accepted(name):
    preset = PRESETS[name]
    pair = load_preset(name, device="cpu")
    prompt = encode_prompt(pair.target.tokenizer, preset.example_prompt, preset.use_chat_template)
    s = SpecSettings(k=4, temperature=0, max_new_tokens=24)
    records = list(speculative_generate(pair, prompt, s))
    spec = [t for r in records for t in r["committed_token_ids"]]
    assert spec == target_generate(pair.target, prompt, s, pair.eos_ids)
    pair.target.fast_linear = False  # the model as loaded (F.linear), not the engine's packed CPU path
    assert spec == target_generate(pair.target, prompt, s, pair.eos_ids)
    assert sum(r["num_accepted"] for r in records) > 0  # the draft is worth running at all


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("tree", ["static:3,2,1", "dynamic:top_k=3,depth=4,nodes=12"])
def test_preset_greedy_tree_equals_target(name, tree):
    """A tree run at T=0 commits exactly plain greedy decoding's tokens on the shipped pairs."""
    from engine.config import parse_tree
    from engine.tree.cycle import tree_generate

    preset = PRESETS[name]
    pair = load_preset(name, device="cpu")
    prompt = encode_prompt(pair.target.tokenizer, preset.example_prompt, preset.use_chat_template)
    spec = parse_tree(tree)
    s = SpecSettings(k=spec.max_depth, temperature=0, max_new_tokens=24)
    records = list(tree_generate(pair, prompt, s, spec))
    assert [t for r in records for t in r["committed_token_ids"]] == target_generate(pair.target, prompt, s,
                                                                                     pair.eos_ids)
    assert sum(r["num_accepted"] for r in records) > 0  # the tree is worth drafting at all
