"""bench/vllm_suffix.py without a server or a model: its tail variant of the lab's suffix drafter, and its replay
counting steps the way vLLM's metrics do."""
from bench.vllm_suffix import TailSuffix, counts, lab_replay
from engine.drafters.suffix_tree import speculate

VOCAB = 50


def test_counts_leave_out_steps_without_a_draft_and_stop_at_the_first_miss():
    out = [1, 2, 3, 4, 5, 6]
    # step 1 drafts [2, 3, 9] at position 1: two accepted, then 4 is the bonus; step 2 drafts nothing; step 3 [6]
    assert counts([[2, 3, 9], [], [6]], out) == {"per_step_drafted": [3, 1], "per_step_accepted": [2, 1]}


def test_the_tail_past_the_cut_joins_the_global_tree_with_the_output_but_not_the_request():
    drafter = TailSuffix(VOCAB)
    state = drafter.start([7, 8])
    state.catch_up([7, 8, 1, 2, 3])
    drafter.add_tail(state, [4, 1, 2])
    assert state.output == [1, 2, 3]  # the request's output ends at the cut
    assert drafter.cache.trie.find([1, 2]).count == 2 and drafter.cache.trie.find([3, 4]).count == 1
    drafter.start([9])
    assert [list(o) for o in drafter.cache.outputs] == [[1, 2, 3, 4, 1, 2]]  # counted once, tail included
    assert list(speculate(drafter.cache.trie, [9, 2, 3], 2, 1.0, 0.1).tokens) == [4, 1]


def test_the_replay_of_a_repeated_answer_drafts_it_from_the_global_tree():
    answer = [1, 2, 3, 4, 5, 6, 7, 8]
    first, second = lab_replay([([9], answer), ([10], answer)], 4, VOCAB)
    assert not first["per_step_accepted"]  # nothing in the first answer repeats within it
    assert second["per_step_accepted"] and sum(second["per_step_accepted"]) == sum(second["per_step_drafted"])
