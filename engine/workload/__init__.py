"""Workloads: many requests run with one pair and one set of settings, read as a whole.

- requests.py: RequestRun, one request of a workload with its trace, what statistics read.
- prompts.py: the prompt file (JSON Lines or plain text), parsed and refused line by line.
- manifest.py: the workload folder's manifest: settings, pair, machine, and each request's
  id, category, file and summary; its checks on untrusted input.
- folder.py: a workload folder or a zip of one, opened and checked (the CLI and the app).
- captured.py: a folder the vLLM capture plugin wrote (vllm_capture/), read as a workload: its
  finished requests with the most common settings, the others listed as skipped with why.
- zip_checks.py: a zip checked whole before it is believed: names, links, duplicates, budgets,
  every entry read once with its CRC.
- run.py: `python -m engine run --prompts FILE --out FOLDER`: models load once, one trace per
  request, the manifest rewritten after each, `--resume` continues an interrupted workload.
- batched.py: the same with `--batch B`: B requests at a time through the batched cycle
  (engine/batch/), continuous batching, the same folder plus batch.jsonl.
- stats.py: a workload's statistics per request and per category (rates, conditional acceptance
  by position, histograms, context length, intervals over requests, where the loss is).
- intervals.py: stats.py's bootstrap intervals, resampling requests (standard library only).
- loss.py: stats.py's "loss" entry: worst requests and cycles, rejected draft tokens by text and class.
- report.py: those statistics as text, for `python -m engine stats FOLDER`.
- server_stats.py: the same views of a server workload (`engine client`'s folder, read by
  engine/servers/server_workload.py), plus the requests' sum against the server's counters.
- server_report.py: those as text, reusing report.py's sections.

May import: engine.trace, engine.stats, engine.servers, engine.config and the standard library; run.py also
engine.run (torch). Never streamlit: the app reads workloads through these modules.
"""
