"""Diagnosing low acceptance: measurements that find why a pair accepts little.

- agreement.py: the draft's agreement with the target, measured without speculating: one
  teacher-forced forward of each model over the target's own continuation gives, at every
  position, whether the draft's top token is the target's and sum_x min(p, q); greedy
  speculation's acceptance follows from the first exactly (simulate_greedy_cycles).
- probe.py: that agreement on a workload's requests, per category, with the acceptance it predicts.
- vocab.py: how much of the baseline's output an EAGLE head's own draft vocabulary leaves out.
- trained_length.py: how much an EAGLE head drafted past the longest sequence it was trained on, and its
  acceptance there against within.
- experiments.py: the arms, each differing from the user's run in one thing (`Arm`, `plan`).
- run.py: running the arms as workload folders, interleaved request by request.
- paired.py: one change's effect on paired runs, with a bootstrap interval over requests.
- diagnosis.py: `diagnose`: the baseline, the experiments it leads to, the probe, the findings.
- report.py: the findings ranked, in plain words.
- verdict.py: what to change first: every change ranked by the tokens/s it gives on this machine against
  the baseline's on the same clock, plain decoding (the K advisor's figure) included.
- requests.py: the requests a diagnosis runs (the bundled prompt set, the first N per category)
  and the unrelated text the context-length experiment puts before each.
- pairs.py: the target loaded once, each drafter an experiment needs built around it (PairLoader).

May import: engine.models, engine.cycle, engine.config and torch; the run and the workloads
(engine.run, engine.mode, engine.workload) for the arms. Never the command line or the app.
"""
