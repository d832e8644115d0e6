"""The speculative-decoding engine and its trace format. The app imports this package; never the reverse."""
import os

# Offline by default: a hub id resolves from the local Hugging Face cache only, and a
# missing one fails at once instead of waiting on the network. HF_HUB_OFFLINE=0 opts in.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
