"""The engine as a server's replica: a server workload's requests run again through the lab's engine,
against what the server reported: greedy ones step by step, sampled ones in aggregate per draft position.

- server_workload.py: the server-workload folder (`python -m engine client` writes it) read as
  untrusted input: its manifest, and each answer's prompt ids, generated ids and per-step counts.
- settings.py: which drafter, K and n-gram range reproduce the server's speculative configuration,
  or a one-line refusal naming what the lab can replicate.
- align.py: the server's per-step lists beside the replica's drafting cycles; where they part.
- sampled.py: sampled requests in aggregate: conditional acceptance per draft position on both sides,
  Wilson intervals, a two-proportion test, and the overall figures with request-bootstrap intervals.
- comparison.py: replica.json, written beside the replica's workload manifest and read back checked.
- run.py: the replica run itself: an ordinary workload folder fed the server's prompt ids, then replica.json.
- report.py: the comparison as text, for `python -m engine replica`.

May import engine.workload, engine.run, engine.servers and what they may import. server_workload.py,
settings.py, align.py, sampled.py, comparison.py and report.py load no torch (the app reads replica.json through
comparison.py); run.py loads the models.
"""
