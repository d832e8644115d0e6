"""What a trace says about speed and acceptance, and the measurements behind it.

- analysis.py: acceptance, cost and speed computed from a trace (the statistics page and
  `python -m engine stats` both read it); report.py prints it. timings.py: the header's calibration
  and where a typical cycle's time goes, which analysis.py builds on.
- calibrate.py: one target step, one draft step and one verify pass, timed; several calibrations as one.
  fast_calibrate.py: the same on the fast path's own forwards, built once for the pilot and the run.
- sweep.py: one prompt at several K, measured. repeats.py: warm up, repeat, report the spread.
- robust.py: medians and the middle half around them, what every time-based figure is built from.
- layouts.py: slots held, stale slots and blocks, per cache layout.
- quiet.py: whether a trace's own timings say it was recorded on a quiet machine.
- plan.py: K for a run about to start (a pilot for alpha, the calibration, the advisor; K=0 included).
- tree_plan.py: a static draft tree, a chain or plain decoding for a run about to start: a(B) from a
  chain pilot, tokens per cycle, the measured verify (and draft) width curves.
- trees.py: a tree trace's statistics (acceptance by depth, sibling ranks, verify cost by width) and a
  chain and a tree run of one pair compared; tree_report.py prints them.
- paths.py: which linear path ran each forward width, from a calibrated header.
- batch_plan.py: the K advisor per batch size (a batched cycle's cost from this machine's forwards).
  batch_sweep.py: goodput against batch size, measured; batch_results.py: its results as plain data, and
  read back from a file as untrusted input (no torch: the app's pages import it).

May import: everything in the engine below it (config, trace, models, kv, drafters, cycle).
"""
