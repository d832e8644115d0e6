"""The project's fuzz harness: every kind of input the lab reads, changed from real samples, each case in
a forked child with a time and a memory limit (`python -m bench.fuzz --cases 1000 --out bench/results`).

- cases.py: a case, its oracle (accept, refuse, either), its outcome, the failure classes, the known defects.
- sandbox.py: one case in a forked child: limits, a fresh working folder, the canary, the pipe back.
- run.py: the runner: cases made, run, judged (a refusal must be one line naming its source), tallied.
- report.py: the results as JSON and Markdown.
- mutate.py: changes every kind makes: bytes, lines, JSON values, odd text.
- zips.py: zips built member by member, and damage at the zip's level.
- cli.py: `python -m engine ...` run in the child; metrics_cli.py: `engine metrics` as its command function runs it.
- One module per kind of input: traces.py, prompts.py, workloads.py (with workload_zips.py), batch.py,
  diagnoses.py, answers.py (per-request server answers), scrapes.py (Prometheus scrapes and pairs),
  uploads.py (the app's two uploads, in Streamlit's bare mode).

May import: the engine's and the app's readers (the entry points under test), bench.common, and
tests/hostile.py (the labelled hostile traces, reused rather than written twice).
"""
