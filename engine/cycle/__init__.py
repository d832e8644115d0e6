"""The speculative cycle: draft, verify in one target pass, the ratio test, commit and roll back.

- reference.py: the cycle as the design notes lay it out, one step per function; the
  ratio test (`accept_reject`, `RATIO_TEST`) lives here and nowhere else.
- fast.py: the same cycle kept on the device over static caches (`--fast`), checked
  against reference.py token for token.
- record.py: the one builder of a cycle's trace record, used by both.

May import: engine.config, engine.trace, engine.models, engine.kv, engine.drafters.
"""
