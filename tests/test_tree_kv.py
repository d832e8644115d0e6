"""A draft tree's forward pass and the cache compaction after it, on the dynamic, static and paged layouts.

What is checked is what a chain run already guarantees: every node's logits are the ones a
plain forward of its path computes, and after compaction the cache holds exactly what a fresh
prefill of the committed sequence holds, so decoding carries on as if no tree had been drafted.
"""
from pathlib import Path

import pytest
import torch

from engine.kv.layouts import ROLL_BACK_LISTENER, CacheLayout, check_invariants, new_cache
from engine.kv.ops import prefill
from engine.models.loading import LoadedModel, wrap_model
from engine.trace.schema import LAYOUTS, ROOT
from engine.tree.attention import TreeUnsupportedError, tree_forward, verify_tree
from engine.tree.compact import compact
from engine.tree.shape import DraftTree
from tests.test_kv_layouts import assert_matches_fresh_prefill, poison
from tests.tiny import tiny_llama, tiny_pair, tiny_tokenizer

PROMPT = [1, 2, 4, 6, 7, 3, 5]  # 7 tokens: the cache holds 6 (L = 6) and the root is 5
L = len(PROMPT) - 1
CAPACITY, BLOCK = 64, 4  # blocks of 4 slots: a verify of 12 positions spans three blocks compaction frees
# Float32 logits of a few units: the tree pass and the chain pass run the same kernels over other
# shapes (12 rows at once against one, a whole static buffer against a cropped tensor, oneDNN's packed
# path against MKL at other widths), so sums are taken in another order; seen: about 1e-6 relative,
# a few 1e-6 absolute. A wrong mask or a wrong position moves logits by tenths.
LOGIT_TOL = {"rtol": 1e-5, "atol": 1e-4}


def hand_tree() -> DraftTree:
    """Three branches under the root, depth 3, uneven: nodes numbered level by level, best first.

    root -> a(8) -> a1(11) -> a11(15)
                 -> a2(12)
         -> b(9) -> b1(13) -> b11(3), b12(4)
                 -> b2(14) -> b21(5)
         -> c(10)
    """
    tree = DraftTree()
    a, b, _ = tree.add(8, ROOT, 0.5), tree.add(9, ROOT, 0.3), tree.add(10, ROOT, 0.1)
    a1, _, b1, b2 = tree.add(11, a, 0.5), tree.add(12, a, 0.2), tree.add(13, b, 0.4), tree.add(14, b, 0.1)
    tree.add(15, a1, 0.5), tree.add(3, b1, 0.5), tree.add(4, b1, 0.3), tree.add(5, b2, 0.3)
    return tree


TREE = hand_tree()
A, B, C, A1, A2, B1, B2, A11, B11, B12, B21 = range(11)


def make_cache(model: LoadedModel, layout: str):
    if layout == "dynamic":
        return model.new_cache()
    cache = new_cache(CacheLayout(layout, capacity=CAPACITY, block_size=BLOCK), model.model.config)
    if layout == "paged":  # hand blocks out last first, as a pool other sequences use would: slot order != block order
        cache.pool.free.reverse()
    return cache


def chain_logits(model: LoadedModel, ids: list[int]) -> torch.Tensor:
    """The reference: one plain causal forward of `ids` on a fresh cache, the last row (V,)."""
    return model.forward(ids, model.new_cache())[-1]


def tokens(path: list[int]) -> list[int]:
    return [TREE.token_ids[i] for i in path]


def verified(model: LoadedModel, layout: str):
    cache = make_cache(model, layout)
    prefill(model, PROMPT, cache)
    return cache, verify_tree(model, PROMPT[-1], TREE, cache)


def eager_target() -> LoadedModel:
    model = tiny_llama(0, 2, 32)
    model.set_attn_implementation("eager")
    return wrap_model("tiny-target-eager", model, tiny_tokenizer())


# ---------------------------------------------------------------- the verify pass


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_node_sees_exactly_its_path(layout, attention):
    model = tiny_pair(0).target if attention == "sdpa" else eager_target()
    assert model.model.config._attn_implementation == attention
    cache, logits = verified(model, layout)
    assert logits.shape == (len(TREE) + 1, model.full_vocab_size) and logits.dtype == torch.float32
    assert int(cache.get_seq_length()) == L + len(TREE) + 1
    check_invariants(cache)
    torch.testing.assert_close(logits[0], chain_logits(model, PROMPT), **LOGIT_TOL)
    for node in range(len(TREE)):
        want = chain_logits(model, PROMPT + tokens(TREE.path_to(node)))
        torch.testing.assert_close(logits[1 + node], want, **LOGIT_TOL, msg=lambda m, n=node: f"node {n}: {m}")


def test_the_reference_tells_paths_apart():
    """Siblings and cousins really differ, so the comparison above would catch a node seeing the wrong slots."""
    model = tiny_pair(0).target
    _, logits = verified(model, "dynamic")
    for node, other in ((B12, B11), (B11, B21), (A11, B11)):  # same depth, other paths
        wrong = chain_logits(model, PROMPT + tokens(TREE.path_to(other)))
        assert (logits[1 + node] - wrong).abs().max() > 100 * LOGIT_TOL["atol"]


def test_static_tree_forward_never_reads_the_buffer_past_its_slots():
    """Huge values in every slot from the write position to the end of the buffer change nothing:
    the mask spans the whole preallocated buffer and hides what lies past the new slots."""
    model = tiny_pair(0).target
    clean = verified(model, "static")[1]
    cache = make_cache(model, "static")
    prefill(model, PROMPT, cache)
    poison(cache, L, CAPACITY)
    torch.testing.assert_close(verify_tree(model, PROMPT[-1], TREE, cache), clean, rtol=0, atol=0)


# ---------------------------------------------------------------- compaction: the cache equals a fresh prefill

CASES = {  # name: (path, committed tokens this cycle = path tokens (maybe cut) + next token)
    "empty path": ([], [12]),
    "first child only (no move: a plain crop)": ([A], [8, 2]),
    "deep path through the second branch": ([B, B1, B12], [9, 13, 4, 6]),
    "deep path through the first branch": ([A, A1, A11], [8, 11, 15, 1]),
    "path cut short (the token budget ends after two tokens)": ([B, B2, B21], [9, 14]),
}


def kept_slots_for(path: list[int], committed: list[int]) -> list[int]:
    """The contract's rule: the root, then each path node's slot, truncated to the committed count."""
    return ([L] + [L + 1 + p for p in path])[: len(committed)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_compaction_leaves_the_cache_of_a_fresh_prefill_and_decoding_carries_on(layout, case):
    path, new_tokens = CASES[case]
    model = tiny_pair(0).target
    cache, _ = verified(model, layout)
    kept = kept_slots_for(path, new_tokens)
    moves = compact(cache, L, kept)
    assert moves == [(src, L + j) for j, src in enumerate(kept) if src != L + j]
    assert all(dst < src for src, dst in moves)
    if path == [A]:
        assert moves == []
    committed = PROMPT + new_tokens
    check_invariants(cache)
    assert_matches_fresh_prefill(model, cache, committed)
    assert_layout_after_compaction(cache, layout, len(committed) - 1)
    if layout == "static":  # poison the stale slots: the next forwards must not read them
        poison(cache, cache.write_position(), CAPACITY)
    for _ in range(3):  # the compacted cache is usable: each step equals a fresh full forward
        step = model.forward([committed[-1]], cache)[-1]
        torch.testing.assert_close(step, chain_logits(model, committed), **LOGIT_TOL)
        committed.append(int(step.argmax()))
    check_invariants(cache)
    assert int(cache.get_seq_length()) == len(committed) - 1


def assert_layout_after_compaction(cache, layout: str, length: int) -> None:
    after_verify = L + len(TREE) + 1
    if layout == "static":  # the write position moved back; the high water of the verify stays
        assert cache.write_position() == length and cache.high_water() == after_verify
        assert cache.stale_slots() == cache.high_water() - cache.write_position() == after_verify - length
    if layout == "paged":  # blocks wholly past the end went back to the pool
        assert len(cache.block_table) == -(-length // BLOCK) < -(-after_verify // BLOCK)
        assert cache.pool.used == set(cache.block_table)
        assert len(cache.pool.free) == cache.pool.num_blocks - len(cache.block_table)
        assert cache.events[-1][0] == "free"


def test_poison_on_a_kept_slot_is_read():
    """The static poisoning check can fail: the same poison one slot below the write position is read."""
    model = tiny_pair(0).target
    cache, _ = verified(model, "static")
    compact(cache, L, kept_slots_for([B, B1, B12], [9, 13, 4, 6]))
    committed = PROMPT + [9, 13, 4, 6]
    poison(cache, cache.write_position() - 1, cache.write_position())
    step = model.forward([committed[-1]], cache)[-1]
    assert (step - chain_logits(model, committed)).abs().max() > 1.0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_keeping_a_rejected_sibling_fails_the_fresh_prefill_check(layout):
    """The check can fail: path b -> b1 -> b12 committed, but the slot of its sibling b11 kept
    instead of b12's (same depth, same position, another token); and a plain crop that moves nothing."""
    model = tiny_pair(0).target
    committed = PROMPT + [9, 13, 4, 6]
    for wrong in ([L, L + 1 + B, L + 1 + B1, L + 1 + B11], [L, L + 1, L + 2, L + 3]):
        cache, _ = verified(model, layout)
        compact(cache, L, wrong)
        check_invariants(cache)  # the bookkeeping is fine; the K/V are not
        with pytest.raises(AssertionError):
            assert_matches_fresh_prefill(model, cache, committed)


# ---------------------------------------------------------------- the draft side: one level per forward


@pytest.mark.parametrize("layout", LAYOUTS)
def test_draft_side_levels_then_compaction_then_catch_up(layout):
    """The draft feeds the root, then level 1, then only part of level 2 (a dynamic tree's frontier,
    in frontier order, not node order); the deepest level is never fed. Each forward's rows equal a
    chain forward of the node's path; after compaction the draft cache keeps the path nodes it holds."""
    model = tiny_pair(0).target
    cache = make_cache(model, layout)
    prefill(model, PROMPT, cache)
    slot_of: dict[int, int] = {ROOT: L}
    levels = [[ROOT], [A, B, C], [B1, A1]]  # b1 is the better-scored frontier node here: fed first
    for level in levels:
        first = int(cache.get_seq_length())
        slot_of.update({node: first + j for j, node in enumerate(level) if node != ROOT})
        ids = [PROMPT[-1] if n == ROOT else TREE.token_ids[n] for n in level]
        paths = [[] if n == ROOT else TREE.path_to(n) for n in level]
        positions = [L + len(p) for p in paths]
        attends = [[L] + [slot_of[a] for a in p] for p in paths]
        logits = tree_forward(model, ids, positions, attends, L, cache)
        for row, p in enumerate(paths):
            torch.testing.assert_close(logits[row], chain_logits(model, PROMPT + tokens(p)), **LOGIT_TOL)
    assert int(cache.get_seq_length()) == L + 6
    path, committed = [B, B1, B12], PROMPT + [9, 13, 4, 6]  # b12 is at depth 3: never fed to the draft
    held = [slot_of[n] for n in path if n in slot_of]
    assert compact(cache, L, [L] + held) == [(L + 2, L + 1), (L + 4, L + 2)]
    check_invariants(cache)
    assert_matches_fresh_prefill(model, cache, PROMPT + [9, 13, 4])  # prefix, root, b, b1
    model.forward([4], cache)  # catch-up: the committed token the draft cache does not hold yet
    assert_matches_fresh_prefill(model, cache, committed)


# ---------------------------------------------------------------- a pruned-vocabulary draft


CHAT_DRAFT = Path(__file__).resolve().parent.parent / "assets" / "models" / "chat-draft"


def test_pruned_vocabulary_chat_draft_tree_rows_equal_chain_forwards():
    """The shipped chat draft numbers its inputs by its own rows (model_input) and scatters its
    outputs back into the 49k vocabulary; a tree forward goes through both like a chain one."""
    from engine.models.loading import load_model
    model = load_model(str(CHAT_DRAFT), torch.device("cpu"), torch.float32)
    assert model.full_to_row is not None
    kept = model.kept_token_ids.tolist()
    known = set(kept)
    prompt, unknown = [kept[5], kept[40], kept[300], kept[7]], next(i for i in range(model.full_vocab_size) if i not in known)
    tree = DraftTree()
    x, y = tree.add(kept[11], ROOT, 0.6), tree.add(unknown, ROOT, 0.2)  # an id the draft maps to its bucket row
    tree.add(kept[12], x, 0.5), tree.add(kept[13], y, 0.5)
    cache = prefill(model, prompt)
    logits = verify_tree(model, prompt[-1], tree, cache)
    assert logits.shape == (5, model.full_vocab_size)
    for row, path in enumerate([[], [0], [1], [0, 2], [1, 3]]):
        want = model.forward(prompt + [tree.token_ids[i] for i in path], model.new_cache())[-1]
        kept_rows = torch.isfinite(want)
        assert torch.equal(kept_rows, torch.isfinite(logits[row]))
        torch.testing.assert_close(logits[row][kept_rows], want[kept_rows], **LOGIT_TOL)


# ---------------------------------------------------------------- refusals: a clear error, nothing lost


def test_a_tensor_parallel_cache_is_refused_untouched():
    model = tiny_pair(0).target
    cache = prefill(model, PROMPT)
    setattr(cache, ROLL_BACK_LISTENER, lambda keep: None)
    with pytest.raises(TreeUnsupportedError, match="tensor-parallel"):
        verify_tree(model, PROMPT[-1], TREE, cache)
    with pytest.raises(TreeUnsupportedError, match="tensor-parallel"):
        compact(cache, L - 2, [L - 1])
    assert int(cache.get_seq_length()) == L


def test_a_tensor_parallel_target_is_refused_before_its_first_append():
    """Rank 0's target (engine/parallel/mirror.py) announces plain appends only; on an empty cache
    there is no listener yet, so the model itself must be recognised."""
    from engine.parallel.mirror import LeadTarget
    lead_target = LeadTarget.of(tiny_pair(0).target, lead=None)
    cache = lead_target.new_cache()
    with pytest.raises(TreeUnsupportedError, match="tensor-parallel"):
        verify_tree(lead_target, 5, TREE, cache)
    assert int(cache.get_seq_length()) == 0


@pytest.mark.parametrize("kept, message", [
    ([L + 2, L + 1], "strictly increasing"),
    ([L - 1, L + 1], "must lie in"),
    ([L, L + len(TREE) + 1], "must lie in"),
])
def test_compaction_refuses_kept_slots_it_cannot_keep(kept, message):
    model = tiny_pair(0).target
    cache, _ = verified(model, "paged")
    table = list(cache.block_table)
    with pytest.raises(ValueError, match=message):
        compact(cache, L, kept)
    assert int(cache.get_seq_length()) == L + len(TREE) + 1 and cache.block_table == table


@pytest.mark.parametrize("attends, message", [
    ([[L + 1]], "its own new slot"),
    ([[L, L + 1]], "may attend to slots"),
])
def test_tree_forward_refuses_a_query_that_would_see_the_future_or_not_itself(attends, message):
    model = tiny_pair(0).target
    cache = prefill(model, PROMPT)
    with pytest.raises(ValueError, match=message):
        tree_forward(model, [PROMPT[-1]], [L], attends, L, cache)
    assert int(cache.get_seq_length()) == L
