"""bench/vllm_suffix.py without a server or a model: its in-flight variant of the lab's suffix drafter puts the
request in flight into the global tree once, and its replay counts steps the way vLLM's metrics do."""
from bench.vllm_suffix import InFlightSuffix, counts, lab_replay
from engine.config import SpecSettings
from engine.drafters.suffix import SuffixDrafter
from engine.drafters.suffix_tree import speculate

VOCAB = 50


def test_counts_leave_out_steps_without_a_draft_and_stop_at_the_first_miss():
    out = [1, 2, 3, 4, 5, 6]
    # step 1 drafts [2, 3, 9] at position 1: two accepted, then 4 is the bonus; step 2 drafts nothing; step 3 [6]
    assert counts([[2, 3, 9], [], [6]], out) == {"per_step_drafted": [3, 1], "per_step_accepted": [2, 1]}


def test_the_request_in_flight_drafts_through_the_global_tree_and_joins_it_once():
    drafter = InFlightSuffix(VOCAB)
    state = drafter.start([7, 8])
    drafter.propose(state, [7, 8, 1, 2, 3, 1], 4, SpecSettings(k=4), None)
    assert list(speculate(drafter.cache.trie, [7, 8, 1, 2, 3, 1], 4, 1.0, 0.1).tokens) == [2]  # its own output, before it ends
    state.catch_up([7, 8, 1, 2, 3, 1, 2])
    drafter.start([9])
    assert [list(o) for o in drafter.cache.outputs] == [[1, 2, 3, 1, 2]]
    assert drafter.cache.trie.find([1, 2]).count == 2  # caught up with the last tokens, and counted once


def test_the_lab_as_is_keeps_the_request_in_flight_out_of_the_global_tree():
    drafter = SuffixDrafter(VOCAB)
    state = drafter.start([7, 8])
    drafter.propose(state, [7, 8, 1, 2, 3, 1], 4, SpecSettings(k=4), None)
    assert len(drafter.cache) == 0 and not speculate(drafter.cache.trie, [7, 8, 1, 2, 3, 1], 4, 1.0, 0.1).tokens


def test_the_replay_of_a_repeated_answer_drafts_it_from_the_global_tree():
    answer = [1, 2, 3, 4, 5, 6, 7, 8]
    first, second = (lab_replay(v, [([9], answer), ([10], answer)], 4, VOCAB) for v in ("as-is", "in-flight"))
    assert first[1]["per_step_accepted"] and sum(first[1]["per_step_accepted"]) == sum(first[1]["per_step_drafted"])
    assert second == first  # nothing in these answers repeats within one, so the order changes nothing
