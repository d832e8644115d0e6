"""Diagnosing low acceptance (issue #39): measurements that find why a pair accepts little.

- agreement.py: the draft's agreement with the target, measured without speculating: one
  teacher-forced forward of each model over the target's own continuation gives, at every
  position, whether the draft's top token is the target's and sum_x min(p, q); greedy
  speculation's acceptance follows from the first exactly (simulate_greedy_cycles).

May import: engine.models, engine.cycle, engine.config and torch. Never the app.
"""
