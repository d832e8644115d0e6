"""Tensor parallelism under torchrun: the target sharded over every rank, the cycle run once on rank 0.

Rank 0 drafts, verifies, runs the ratio test and writes the trace, as a single process does.
Every target forward is a collective (transformers' tensor-parallel plan all-reduces inside
each layer), so rank 0 first tells the other ranks what to feed and, after the decision,
where to roll back; they replay each operation on their own shard of the K/V heads.

- world.py: joining torchrun's process group (backend, device, timeout) and the rank layout.
- sharding.py: whether a model can be sharded over N ranks (a plan, heads divisible by N).
- mirror.py: the operations rank 0 announces (`LeadTarget`) and the loop the others run (`follow`).
- failure.py: telling a broken group from a rank's own error, and the one-line message.
- rank.py: one rank's run (its shard loaded; rank 0 runs the cycle, the others follow), what
  `torchrun ... -m engine run --tp N` runs on every rank.

May import: engine.config, engine.trace, engine.models, engine.kv, engine.drafters, engine.cycle;
rank.py alone also the top-level run (engine.run, engine.mode), and no other module here imports it.
"""
