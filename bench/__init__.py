"""Benchmarks: timed runs of the engine against Hugging Face, the fast path on a GPU, the KV-cache
layouts, the cost of a verify pass, and the app's page times. Each runs from the repository root as
a module, e.g. `python -m bench.speed --preset chat`, and writes bench/results/.

bench/common.py holds what they share (prompts, the clock, the pair they load, the machine they ran
on); bench/hf.py the Hugging Face baselines; bench/bench_report.py the speed benchmark's report.
A benchmark may import engine; it never imports app, except one that times the app
(bench/app_speed.py).
"""
