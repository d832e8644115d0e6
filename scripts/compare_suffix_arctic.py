"""Compare the lab's suffix trees (engine/drafters/suffix_tree.py) with Arctic Inference's, draft by draft.

Arctic Inference (`pip install arctic-inference numpy`, a C++ build; not a dependency of the lab) is the
implementation vLLM's `suffix` method calls. This feeds both the same random token streams, with
random options, and counts per tree:
- drafts whose tokens differ;
- drafts that are not a most-frequent walk in the lab's trie with the lab's probabilities and limits
  (a real difference of meaning: ties between equally frequent children can go either way, this cannot).
The request's tree is compared as the stream grows; the global tree over finished outputs, with FIFO
eviction (Arctic Inference counts the request in flight against its limit, so it gets one more slot,
and each query runs right after a request starts, before it has any output).

    /tmp/arctic-venv/bin/python scripts/compare_suffix_arctic.py   # from the repository root
"""
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: E402

from engine.drafters.suffix_tree import GlobalCache, SuffixTrie, draft_limit, f32, speculate  # noqa: E402


def is_greedy_walk(trie: SuffixTrie, context: list[int], draft, factor: float, k: int) -> bool:
    """Is the reference's draft a most-frequent walk in our trie, with our probabilities and within our limit?"""
    if not draft.token_ids:
        return True
    node = trie.find(context[-trie.depth:][-draft.match_len:])
    if node is None or len(draft.token_ids) > draft_limit(draft.match_len, factor, k):
        return False
    prob = 1.0
    for token, p in zip(draft.token_ids, draft.probs):
        child = node.children.get(token)
        if child is None or child.count != max(c.count for c in node.children.values()):
            return False
        prob = f32(prob * f32(child.count / node.count))
        if abs(prob - p) > 1e-6:
            return False
        node = child
    return True


def options(rng: random.Random) -> dict:
    return {"depth": rng.choice([3, 6, 24]), "vocab": rng.choice([2, 3, 5, 20]), "factor": rng.choice([0.5, 1.0, 2.0]),
            "min_prob": rng.choice([0.0, 0.1, 0.3]), "k": rng.choice([1, 4, 8])}


def request_tree(seed: int, tally: dict) -> None:
    rng = random.Random(seed)
    o = options(rng)
    ref = SuffixDecodingCache(max_tree_depth=o["depth"], max_cached_requests=0)
    seq = [rng.randrange(o["vocab"]) for _ in range(rng.randrange(1, 20))]
    ref.start_request(0, seq)
    ours, open_nodes = SuffixTrie(o["depth"]), []
    for token in seq:
        open_nodes = ours.grow(open_nodes, token)
    for _ in range(200):
        a = ref.speculate(0, seq, max_spec_tokens=o["k"], max_spec_factor=o["factor"], min_token_prob=o["min_prob"])
        b = speculate(ours, seq, o["k"], o["factor"], o["min_prob"])
        tally["drafts"] += 1
        tally["differ"] += list(a.token_ids) != list(b.tokens)
        tally["not_greedy"] += not is_greedy_walk(ours, seq, a, o["factor"], o["k"])
        token = a.token_ids[0] if a.token_ids and rng.random() < 0.6 else rng.randrange(o["vocab"])
        seq.append(token)
        ref.add_active_response(0, [token])
        open_nodes = ours.grow(open_nodes, token)


def global_tree(seed: int, tally: dict) -> None:
    rng = random.Random(seed)
    o, limit = options(rng), rng.choice([1, 3, 10, 1000])
    ref = SuffixDecodingCache(max_tree_depth=o["depth"], max_cached_requests=limit + 1)
    ours = GlobalCache(o["depth"], limit)
    for r in range(30):
        ref.start_request(r, [])
        for _ in range(3):
            context = [rng.randrange(o["vocab"]) for _ in range(rng.randrange(2, 12))]
            a = ref.speculate(r, context, max_spec_tokens=o["k"], max_spec_factor=o["factor"],
                              min_token_prob=o["min_prob"])
            b = speculate(ours.trie, context, o["k"], o["factor"], o["min_prob"])
            tally["drafts"] += 1
            tally["differ"] += list(a.token_ids) != list(b.tokens)
            tally["not_greedy"] += not is_greedy_walk(ours.trie, context, a, o["factor"], o["k"])
        output = [rng.randrange(o["vocab"]) for _ in range(rng.randrange(1, 25))]
        ref.add_active_response(r, output)
        ref.stop_request(r)
        ours.add_request(output)


def main() -> int:
    for name, run, seeds in (("request tree", request_tree, 300), ("global tree", global_tree, 300)):
        tally = {"drafts": 0, "differ": 0, "not_greedy": 0}
        for seed in range(seeds):
            run(seed, tally)
        print(f"{name}: {tally['drafts']} drafts, {tally['differ']} with other tokens "
              f"({tally['differ'] / tally['drafts']:.1%}, ties between equally frequent children), "
              f"{tally['not_greedy']} not a most-frequent walk in the lab's trie")
    return 0


if __name__ == "__main__":
    sys.exit(main())
