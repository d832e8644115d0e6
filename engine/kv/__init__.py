"""KV caches: the three layouts a model writes into and how each is rolled back.

- layouts.py: dynamic (crop the tail), static (move the write position, stale slots
  masked) and paged (a block table; free the blocks past the end), and their state.
- ops.py: the calls the cycle and the drafters make (`crop`, `cache_len`, `prefill`).
- prefix.py: reusing the K/V of the start a prompt shares with the previous one (`PrefixStore`).
- rows.py: one cache for B ragged rows (a buffer per layer, a length per row) and the forward over it.

May import: engine.config, engine.trace, engine.models.
"""
