"""The speculative-decoding engine and its trace format. The app imports this package; never the reverse.

Top-level modules: config.py (`SpecSettings`: every setting's range checked in one place), mode.py
(the run mode: chain or tree, reference or fast, faults, ranks), run.py (from a pair, a prompt,
settings and a mode to a trace file; parallel/rank.py runs it under torchrun), __main__.py
(`python -m engine`, handed to cli/). Packages by role, each opening with what it holds and may
import: trace, models, kv, drafters, cycle, tree, batch (many requests in one cycle), parallel,
stats, servers, teaching, workload (many requests read as a whole), diagnose (why a pair accepts
little), and cli (`python -m engine`).
"""
import os

# Offline by default: a hub id resolves from the local Hugging Face cache only, and a
# missing one fails at once instead of waiting on the network. HF_HUB_OFFLINE=0 opts in.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
