"""The speculative-decoding engine and its trace format. The app imports this package; never the reverse.

Top-level modules: mode.py (the run mode: chain or tree, reference or fast, faults, ranks),
run.py (from a pair, a prompt, settings and a mode to a trace file; parallel/rank.py runs it
under torchrun). Packages by role, each opening with what it holds and may import: trace, models,
kv, drafters, cycle, tree, parallel, stats, servers, teaching, and cli (`python -m engine`).
"""
import os

# Offline by default: a hub id resolves from the local Hugging Face cache only, and a
# missing one fails at once instead of waiting on the network. HF_HUB_OFFLINE=0 opts in.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
