"""Regenerate the bundled example traces in assets/traces/ with the CLI.

    python -m scripts.make_example_traces            # all of them
    python -m scripts.make_example_traces chat       # only those whose name (or arguments) contain "chat"
    python -m scripts.make_example_traces eagle      # only the EAGLE head's (assets/models/chat-eagle)

Each trace is an ordinary `python -m engine run` on a shipped preset, on the CPU, so
anyone can reproduce them. default.jsonl is the one the app opens on: it runs the chat
preset's default drafter (engine/models/presets.py Preset.default_drafter). Every other trace
names its drafter with --drafter, and a trace of a drafter other than the separate draft
model has the drafter in its file name.

Record on an idle machine: each trace is checked against engine/stats/quiet.py's rule
(no verify pass over 3x the trace's median) and recorded again, up to ATTEMPTS times,
when it fails; the script says so, and gives up with an error if it never passes.
"""
import sys
from pathlib import Path

from engine.cli import main
from engine.stats.quiet import quiet_words
from engine.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "assets" / "traces"
ATTEMPTS = 3

EXAMPLES = {
    "default.jsonl": ["--preset", "chat", "--prompt", "What is a good way to learn to cook?",
                      "--k", "4", "--temperature", "0.7", "--max-new-tokens", "64", "--seed", "1"],
    "chat-greedy-k4.jsonl": ["--drafter", "model", "--preset", "chat", "--prompt", "Explain why the sky is blue.",
                             "--k", "4", "--temperature", "0", "--max-new-tokens", "64"],
    "chat-sampled-k2.jsonl": ["--drafter", "model", "--preset", "chat", "--prompt", "List the days of the week.",
                                              "--k", "2", "--temperature", "0.5", "--max-new-tokens", "48", "--seed", "2"],
    "chat-sampled-k6-hot-low-acceptance.jsonl": ["--drafter", "model", "--preset", "chat",
                                                 "--prompt", "Invent a name for a purple dragon who bakes bread.",
                                                 "--k", "6", "--temperature", "1.2", "--max-new-tokens", "48", "--seed", "3"],
    "shakespeare-sampled-k4-high-acceptance.jsonl": ["--drafter", "model", "--preset", "tiny-shakespeare", "--prompt", "Romeo.\n",
                                     "--k", "4", "--temperature", "0.8", "--max-new-tokens", "160", "--seed", "4"],
    "shakespeare-greedy-k8.jsonl": ["--drafter", "model", "--preset", "tiny-shakespeare", "--prompt", "King Henry.\nWhat say you",
                                    "--k", "8", "--temperature", "0", "--max-new-tokens", "160"],
    "shakespeare-sampled-k2-hot.jsonl": ["--drafter", "model", "--preset", "tiny-shakespeare", "--prompt", "Enter a Messenger.\n",
                                         "--k", "2", "--temperature", "1.3", "--max-new-tokens", "120", "--seed", "5"],
    # One per drafter that is not a draft model (see engine/drafters/); the EAGLE head also greedy,
    # so its traces show both the argmax test and the ratio test:
    "chat-eagle-sampled-k4.jsonl": ["--preset", "chat", "--drafter", "eagle", "--prompt", "What is a good way to learn to cook?",
                                    "--k", "4", "--temperature", "0.7", "--max-new-tokens", "64", "--seed", "1"],
    "chat-eagle-greedy-k4.jsonl": ["--preset", "chat", "--drafter", "eagle", "--prompt", "Explain why the sky is blue.",
                                   "--k", "4", "--temperature", "0", "--max-new-tokens", "64"],
    "chat-prompt-lookup-greedy-k4.jsonl": [
        "--preset", "chat", "--drafter", "prompt-lookup", "--max-ngram", "3", "--prompt",
        "Fix the spelling in this paragraph and write it out again: The quick brown fox jumpd over the lazy dog. "
        "The dog was not amused and barked at the fox untill it ran away into the forest.",
        "--k", "4", "--temperature", "0", "--max-new-tokens", "64"],
    # The same prompt as prompt lookup's, so the two drafters read side by side (suffix decoding also
    # counts every earlier occurrence and caps its draft by the match length); one request, so its own tree.
    "chat-suffix-greedy-k4.jsonl": [
        "--preset", "chat", "--drafter", "suffix", "--prompt",
        "Fix the spelling in this paragraph and write it out again: The quick brown fox jumpd over the lazy dog. "
        "The dog was not amused and barked at the fox untill it ran away into the forest.",
        "--k", "4", "--temperature", "0", "--max-new-tokens", "64"],
    # The EAGLE-1 head's greedy prompt, so the two heads compare cycle by cycle.
    "chat-eagle3-greedy-k4.jsonl": ["--preset", "chat", "--drafter", "eagle3", "--prompt", "Explain why the sky is blue.",
                                    "--k", "4", "--temperature", "0", "--max-new-tokens", "64"],
    "shakespeare-other-tokenizer-greedy-k6.jsonl": [
        "--preset", "tiny-shakespeare", "--drafter", "other-tokenizer", "--prompt", "Romeo.\n",
        "--k", "6", "--temperature", "0", "--max-new-tokens", "120"],
    # One short run per KV-cache layout: the same prompt, settings and seed, so the tokens agree.
    **{f"shakespeare-cache-{layout}.jsonl": ["--drafter", "model", "--preset", "tiny-shakespeare", "--prompt", "Juliet.\n",
                                              "--k", "4",
                                              "--temperature", "0.8", "--max-new-tokens", "48", "--seed", "6",
                                              "--cache", layout, "--block-size", "4"]
       for layout in ("dynamic", "static", "paged")},
    # Draft trees (docs/trees.md): a static and a dynamic tree per preset, greedy and sampled. Tree runs
    # record no calibration (engine run refuses --calibrate with --tree).
    "chat-tree-static-greedy.jsonl": ["--drafter", "model", "--preset", "chat", "--tree", "static:3,2,1", "--prompt",
                                      "Explain why the sky is blue.", "--temperature", "0", "--max-new-tokens", "48"],
    "chat-tree-dynamic-sampled.jsonl": ["--drafter", "model", "--preset", "chat",
                                        "--tree", "dynamic:top_k=3,depth=4,nodes=12",
                                        "--prompt", "What is a good way to learn to cook?", "--temperature", "0.7",
                                        "--max-new-tokens", "48", "--seed", "1"],
    "shakespeare-tree-static-sampled.jsonl": ["--drafter", "model", "--preset", "tiny-shakespeare",
                                              "--tree", "static:3,2,1", "--prompt", "Romeo.\n", "--temperature", "0.8",
                                              "--max-new-tokens", "96", "--seed", "4"],
    "shakespeare-tree-dynamic-greedy.jsonl": ["--drafter", "model", "--preset", "tiny-shakespeare", "--tree",
                                              "dynamic:top_k=4,depth=6,nodes=24", "--prompt",
                                              "King Henry.\nWhat say you", "--temperature", "0",
                                              "--max-new-tokens", "96"],
}


def selected(filters: list[str]) -> dict[str, list[str]]:
    """The examples whose file name contains a filter word or whose arguments include one."""
    return {name: args for name, args in EXAMPLES.items() if not filters or any(f in name or f in args for f in filters)}


def record(name: str, args: list[str]) -> bool:
    """Record one trace until its timings pass the quiet rule; False if they never do."""
    for attempt in range(1, ATTEMPTS + 1):
        calibrate = [] if "--tree" in args else ["--calibrate"]
        if main(["run", *args, "--device", "cpu", *calibrate, "--out", str(OUT / name)]) != 0:
            return False
        loud = quiet_words(load_trace(OUT / name))
        if loud is None:
            return True
        print(f"   attempt {attempt} of {ATTEMPTS} was not quiet: {loud}", flush=True)
    print(f"   {name} never passed the quiet rule: record it again when the machine is idle", flush=True)
    return False


def run(filters: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, args in selected(filters).items():
        print(f"== {name}", flush=True)
        if not record(name, args):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
