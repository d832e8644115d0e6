"""The engine as a server's replica: a server workload's requests run again through the lab's engine,
step by step against what the server reported.

- server_workload.py: the server-workload folder (`python -m engine client` writes it) read as
  untrusted input: its manifest, and each answer's prompt ids, generated ids and per-step counts.
- settings.py: which drafter, K and n-gram range reproduce the server's speculative configuration,
  or a one-line refusal naming what the lab can replicate.
- align.py: the server's per-step lists beside the replica's drafting cycles; where they part.
- comparison.py: replica.json, written beside the replica's workload manifest and read back checked.
- run.py: the replica run itself: an ordinary workload folder fed the server's prompt ids, then replica.json.
- report.py: the comparison as text, for `python -m engine replica`.

May import engine.workload, engine.run, engine.servers and what they may import. server_workload.py,
settings.py, align.py, comparison.py and report.py load no torch (the app reads replica.json through
comparison.py); run.py loads the models.
"""
