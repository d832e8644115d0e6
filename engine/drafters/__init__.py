"""Drafters: what proposes the tokens the target verifies.

- base.py: what the cycle needs from any drafter (`Drafter`, `Proposal`, `CatchUp`).
- model.py: a draft model sharing the target's tokenizer; prompt_lookup.py: n-gram copying;
  other_tokenizer.py: a draft with its own tokenizer (greedy only); eagle.py: an EAGLE-style
  head over the target's features; suffix.py: suffix decoding over suffix trees (suffix_tree.py,
  torch-free) of the request and of earlier requests' outputs; eagle3.py: an EAGLE-3 head over
  three target layers, read from a speculators folder (speculators_format.py).
- registry.py: each kind's class, options, command-line flags and builder (`DRAFTERS`).
- refusals.py: what a kind says when it refuses a setting (a leaf: its drafter and the registry read it).

Nothing is imported here, so that registry.py loads without torch (the CLI's parser reads it).
May import: engine.config, engine.trace, engine.models and engine.kv; never engine.cycle,
which imports this package.
"""
