"""The three KV-cache layouts: same tokens, honest bookkeeping, rollbacks that leave no trace in the output."""
import random

import pytest
import torch

from engine.config import SettingsError, SpecSettings
from engine.cycle.pair import TokenTexts
from engine.cycle.plain import target_generate
from engine.cycle.reference import run_cycle, speculative_generate, start_run
from engine.kv.layouts import (
    BlockPool,
    CacheFullError,
    CacheLayout,
    PagedKVCache,
    StaticKVCache,
    attended_kv,
    check_invariants,
    new_cache,
    roll_back_cache,
)
from engine.kv.ops import prefill
from engine.trace.schema import LAYOUTS
from tests.tiny import noisy_pair, tiny_pair

PROMPT = [1, 2, 4, 6, 7]
CACHE_FIELDS = ("target_cache_layout_state", "draft_cache_layout_state")


def tokens_of(records: list[dict]) -> list[int]:
    return [t for r in records for t in r["committed_token_ids"]]


def without_cache_fields(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in CACHE_FIELDS and not k.endswith("_s")}


def assert_same_record(a, b, where: str = "") -> None:
    """Ids, texts, draws and decisions exactly equal; probabilities equal to float32 rounding.

    A static buffer attends over its whole preallocated length (masked slots weigh
    exactly 0), so its matmuls sum in another order than a cropped tensor's: the
    probabilities can differ in the 7th digit, never the draws or the tokens.
    """
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same_record(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_record(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not where.split(".")[-1].startswith("u["):
        assert b == pytest.approx(a, rel=1e-4, abs=1e-7), where
    else:
        assert a == b, where


def assert_matches_fresh_prefill(model, cache, committed: list[int]) -> None:
    """Every attended position holds the K/V a fresh prefill of the committed sequence computes."""
    fresh = prefill(model, committed)
    assert int(cache.get_seq_length()) == len(committed) - 1 == int(fresh.get_seq_length())
    for (k, v), (fk, fv) in zip(attended_kv(cache), attended_kv(fresh), strict=True):
        torch.testing.assert_close(k, fk, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v, fv, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_tokens_equal_across_layouts_and_plain_decoding(k):
    pair = noisy_pair(0)
    plain = target_generate(pair.target, PROMPT, SpecSettings(k=k, temperature=0, max_new_tokens=40), pair.eos_ids)
    for layout in LAYOUTS:
        s = SpecSettings(k=k, temperature=0, max_new_tokens=40, cache_layout=layout, block_size=4)
        records = list(speculative_generate(pair, PROMPT, s))
        assert tokens_of(records) == plain, layout
        accepted = [r["num_accepted"] for r in records]
        assert max(accepted) >= 1 and min(accepted) < k  # both rollback paths ran


@pytest.mark.parametrize("layout", ["static", "paged"])
def test_sampled_trace_is_the_same_as_dynamic_apart_from_cache_fields(layout):
    pair = noisy_pair(1, noise=0.1)
    base = SpecSettings(k=3, temperature=1.0, max_new_tokens=30, seed=11)
    dynamic = [without_cache_fields(r) for r in speculative_generate(pair, PROMPT, base)]
    other = list(speculative_generate(pair, PROMPT, SpecSettings(**{**base.to_dict(), "cache_layout": layout,
                                                                     "block_size": 4})))
    assert_same_record([without_cache_fields(r) for r in other], dynamic)
    assert any(r["rejected_position"] for r in other) and all(r["target_cache_layout_state"] for r in other)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_invariants_and_committed_kv_after_every_cycle(layout, temperature):
    pair = noisy_pair(1, noise=0.04)
    s = SpecSettings(k=4, temperature=temperature, max_new_tokens=30, seed=5, cache_layout=layout, block_size=4)
    gen, texts = torch.Generator().manual_seed(s.seed), TokenTexts(pair.target.tokenizer)
    state = start_run(pair, PROMPT, s)
    cycle = 0
    while not state.finished:
        rec = run_cycle(pair, state, s, gen, cycle, texts)
        for model, cache in ((pair.target, state.target_cache), (pair.draft, state.draft_cache)):
            check_invariants(cache)
            assert_matches_fresh_prefill(model, cache, state.committed)
        assert_layout_record(rec, layout, len(state.committed) - 1)
        cycle += 1


def assert_layout_record(rec: dict, layout: str, committed_minus_one: int) -> None:
    lens = rec["target_cache_len"]
    assert lens["after_rollback"] == committed_minus_one
    if layout == "dynamic":  # its state is its length: no layout fields
        assert "target_cache_layout_state" not in rec and "draft_cache_layout_state" not in rec
        return
    t = rec["target_cache_layout_state"]
    if layout == "static":
        assert [t[w]["write_position"] for w in ("before", "after_append", "after_rollback")] == \
            [lens["before"], lens["after_append"], lens["after_rollback"]]
        # the rejected positions stay in the buffer as stale slots
        assert t["after_rollback"]["stale_slots"] == lens["after_append"] - lens["after_rollback"]
    if layout == "paged":
        size = 4
        for when in ("before", "after_append", "after_rollback"):
            assert len(t[when]["block_table"]) == -(-lens[when] // size)
            assert t[when]["num_tokens"] == lens[when]
        assert t["blocks_freed"] == t["after_append"]["block_table"][len(t["after_rollback"]["block_table"]):]
        assert t["blocks_allocated"] == t["after_append"]["block_table"][len(t["before"]["block_table"]):]


@torch.inference_mode()  # the buffers were made in inference mode
def poison(cache: StaticKVCache, start: int, end: int, value: float = 1e9) -> None:
    for layer in cache.layers:
        layer.keys[:, :, start:end] = value
        layer.values[:, :, start:end] = -value


def run_poisoned(pair, s, poison_from_write_position: int) -> tuple[list[int], int]:
    """A static run that overwrites slots with huge values after every rollback.

    With offset 0 it poisons exactly the stale slots (write position .. high water);
    with a negative offset it also poisons committed slots, which the model does read.
    """
    gen, texts = torch.Generator().manual_seed(s.seed), TokenTexts(pair.target.tokenizer)
    state = start_run(pair, PROMPT, s)
    out, poisoned, cycle = [], 0, 0
    while not state.finished:
        rec = run_cycle(pair, state, s, gen, cycle, texts)
        out += rec["committed_token_ids"]
        for cache in (state.target_cache, state.draft_cache):
            pos, high = cache.write_position(), cache.high_water()
            poison(cache, max(0, pos + poison_from_write_position), high)
            poisoned += high - pos
        cycle += 1
    return out, poisoned


def test_static_stale_slots_are_never_read():
    """Masked means never read: huge values in the rejected slots change nothing.

    Huge finite values, not NaN: attention here is dense, so a masked slot still meets a
    weight of exactly 0 in the matmul, and 0 * NaN is NaN while 0 * 1e9 is 0. A kernel
    that skipped masked slots would tolerate NaN too; this one proves the weight is 0.
    """
    pair = tiny_pair(2)
    s = SpecSettings(k=4, temperature=1.0, max_new_tokens=30, seed=3, cache_layout="static")
    clean = tokens_of(list(speculative_generate(pair, PROMPT, s)))
    poisoned, stale = run_poisoned(pair, s, 0)
    assert stale > 20 and poisoned == clean
    corrupted, _ = run_poisoned(pair, s, -2)  # the same poison on two committed slots is read
    assert corrupted != clean


class RandomSequence:
    """One sequence in a paged cache, driven by verify-like appends and random accept lengths.

    A dynamic cache gets the same appends and crops, as a cheap reference for every cycle.
    """

    def __init__(self, model, cache, rng: random.Random) -> None:
        self.model, self.cache, self.rng = model, cache, rng
        self.reference = model.new_cache()
        self.committed = [1, 2, 3]
        for c in (cache, self.reference):
            prefill(model, self.committed, c)

    def cycle(self, k: int) -> int:
        """One verify of K+1 positions, a random accept length, the rollback; returns the blocks it freed."""
        if len(self.committed) > 120:  # a new request: start over from a short prompt
            self.committed = self.committed[:3]
            for c in (self.cache, self.reference):
                roll_back_cache(c, 2)
        vocab = self.model.full_vocab_size
        proposal = [self.rng.randrange(vocab) for _ in range(k)]
        for c in (self.cache, self.reference):
            self.model.forward([self.committed[-1], *proposal], c)
        self.committed += proposal[: self.rng.randint(0, k)] + [self.rng.randrange(vocab)]
        blocks_before = len(self.cache.block_table)
        for c in (self.cache, self.reference):
            roll_back_cache(c, len(self.committed) - 1)
            missing = self.committed[int(c.get_seq_length()):len(self.committed) - 1]
            if missing:
                self.model.forward(missing, c)  # the resampled token's K/V, which the verify did not hold
        return max(0, blocks_before - len(self.cache.block_table))

    def check(self, fresh: bool) -> None:
        check_invariants(self.cache)
        for (k, v), (rk, rv) in zip(attended_kv(self.cache), attended_kv(self.reference), strict=True):
            torch.testing.assert_close(k, rk, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(v, rv, rtol=1e-4, atol=1e-5)
        if fresh:
            assert_matches_fresh_prefill(self.model, self.cache, self.committed)


def test_paged_thousand_random_cycles_leak_no_block_and_keep_committed_kv():
    """Two sequences share one pool, as in a serving engine; 1,000 cycles with random accept lengths."""
    model = tiny_pair(0).target
    pool = BlockPool(num_blocks=80, block_size=4)
    rng = random.Random(0)
    seqs = [RandomSequence(model, PagedKVCache(2, pool), rng) for _ in range(2)]
    freed = 0
    for cycle in range(1000):
        seq = seqs[cycle % 2]
        freed += seq.cycle(k=4)
        seq.check(fresh=cycle % 50 < 2)
        assert len(pool.free) + len(pool.used) == pool.num_blocks  # no block leaked
        assert set(seqs[0].cache.block_table).isdisjoint(seqs[1].cache.block_table)
        assert pool.used == set(seqs[0].cache.block_table) | set(seqs[1].cache.block_table)
    assert freed > 100  # rollbacks really returned blocks
    for seq in seqs:
        seq.check(fresh=True)
        roll_back_cache(seq.cache, 0)
    assert len(pool.free) == pool.num_blocks and not pool.used
    assert len(pool.storage) == 2  # one K/V tensor pair per layer, shared by both sequences


def test_paged_rollback_keeps_the_partial_block_and_frees_whole_ones():
    model = tiny_pair(0).target
    cache = new_cache(CacheLayout("paged", capacity=64, block_size=4), model.model.config)
    model.forward(list(range(1, 12)), cache)  # 11 positions: blocks 0,1,2 (the last holds 3)
    assert cache.block_table == [0, 1, 2]
    roll_back_cache(cache, 5)  # position 4 lives in logical block 1: keep it, free block 2
    assert cache.block_table == [0, 1] and list(cache.pool.free)[-1] == 2 and cache.get_seq_length() == 5
    model.forward([3, 4, 5, 6], cache)  # fills the partial block and takes the next free one
    assert cache.block_table == [0, 1, 3]


def test_paged_pool_and_static_buffer_refuse_to_overflow():
    model = tiny_pair(0).target
    for layout in (CacheLayout("paged", capacity=8, block_size=4), CacheLayout("static", capacity=8)):
        cache = new_cache(layout, model.model.config)
        model.forward(list(range(1, 9)), cache)
        with pytest.raises(CacheFullError):
            model.forward([1], cache)


def test_block_pool_refuses_a_double_free():
    pool = BlockPool(4, 2)
    block = pool.allocate()
    pool.release([block])
    with pytest.raises(KeyError):
        pool.release([block])


def test_settings_check_the_layout():
    with pytest.raises(SettingsError, match="cache_layout"):
        SpecSettings(cache_layout="ring")
    with pytest.raises(SettingsError, match="block_size"):
        SpecSettings(cache_layout="paged", block_size=0)
    assert isinstance(new_cache(CacheLayout("paged", 10, 4), tiny_pair(0).target.model.config), PagedKVCache)


# ---------------------------------------------------------------- traces, the CLI and stats

@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from tests.tiny import save_tiny
    return save_tiny(noisy_pair(0, noise=0.08), tmp_path_factory.mktemp("models"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cli_records_the_layout_and_stats_report_it(folders, tmp_path, capsys, layout):
    from engine.cli import main
    from engine.stats.layouts import layout_stats
    from engine.trace import load_trace
    out = tmp_path / f"{layout}.jsonl"
    assert main(["run", "--prompt", "the cat sat", "--target", folders[0], "--draft", folders[1], "--k", "4",
                 "--temperature", "0", "--max-new-tokens", "24", "--cache", layout, "--block-size", "4",
                 "--out", str(out)]) == 0
    trace = load_trace(out)
    assert trace.header["cache_layout"]["name"] == layout == trace.header["settings"]["cache_layout"]
    ls = layout_stats(trace)
    peak = max(c["target_cache_len"]["after_append"] for c in trace.cycles)
    assert ls.target.peak_slots_attended == peak
    if layout == "static":
        assert ls.target.peak_slots_held == trace.header["cache_layout"]["capacity"] >= peak
        stale = [c["target_cache_layout_state"]["after_rollback"]["stale_slots"] for c in trace.cycles]
        assert ls.target.stale_slots_max == max(stale) > 0
    if layout == "paged":
        freed = sum(len(c["target_cache_layout_state"]["blocks_freed"]) for c in trace.cycles)
        assert ls.target.blocks_freed == freed and ls.target.peak_slots_held % 4 == 0 >= peak - ls.target.peak_slots_held
    if layout == "dynamic":
        assert ls.target.peak_slots_held == peak
    capsys.readouterr()
    assert main(["stats", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"KV-CACHE LAYOUT: {layout}" in printed
    row = next(line for line in printed.splitlines() if line.strip().startswith("target") and "  " in line
               and line.split()[1].isdigit() and int(line.split()[1]) == peak)
    assert int(row.split()[2]) == ls.target.peak_slots_held


def test_cli_refuses_an_unknown_layout(tmp_path, capsys):
    from engine.cli import main
    with pytest.raises(SystemExit):
        main(["run", "--prompt", "x", "--cache", "ring", "--out", str(tmp_path / "x.jsonl")])
    assert "invalid choice: 'ring'" in capsys.readouterr().err


@pytest.mark.parametrize("layout, path, value, message", [
    ("static", ("target_cache_layout_state", "after_rollback", "write_position"), 999, "write_position"),
    ("static", ("draft_cache_layout_state", "after_rollback", "stale_slots"), -1, "stale_slots"),
    ("paged", ("target_cache_layout_state", "after_append", "block_table"), [0, 0], "block table"),
    ("paged", ("target_cache_layout_state", "before", "block_table"), [10 ** 9], "block table"),
    ("paged", ("target_cache_layout_state", "blocks_freed"), ["x"], "blocks_freed"),
    ("static", ("draft_cache_layout_state",), None, "draft_cache_layout_state"),
    ("paged", ("target_cache_layout_state", "after_rollback", "blocks_free"), 10 ** 12, "block table"),
])
def test_loader_refuses_layout_fields_that_disagree(folders, tmp_path, layout, path, value, message):
    import json

    from engine.run import run_to_trace
    from engine.trace import TraceError, loads_trace
    from tests.tiny import tiny_pair
    pair = tiny_pair(0)
    out = tmp_path / "t.jsonl"
    run_to_trace(pair, "the cat sat", SpecSettings(k=3, max_new_tokens=10, cache_layout=layout, block_size=4), out)
    lines = out.read_text().splitlines()
    loads_trace("\n".join(lines))  # the real trace loads
    rec = json.loads(lines[1])
    target = rec
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    lines[1] = json.dumps(rec)
    with pytest.raises(TraceError, match=message):
        loads_trace("\n".join(lines))
    header = json.loads(lines[0])
    header["cache_layout"]["name"] = "ring"
    with pytest.raises(TraceError, match="cache_layout"):
        loads_trace("\n".join([json.dumps(header), *lines[1:]]))


# ---------------------------------------------------------------- the bundled trace of each layout

def test_one_bundled_trace_per_layout_with_the_same_tokens():
    from pathlib import Path

    from engine.stats.layouts import layout_stats
    from engine.trace import load_trace
    from tests.checks import assert_self_consistent
    folder = Path(__file__).resolve().parent.parent / "assets" / "traces"
    traces = {layout: load_trace(folder / f"shakespeare-cache-{layout}.jsonl") for layout in LAYOUTS}
    for layout, trace in traces.items():
        assert_self_consistent(trace)
        assert trace.header["cache_layout"]["name"] == layout and trace.header["preset"] == "tiny-shakespeare"
    tokens = {layout: t.summary["generated_token_ids"] for layout, t in traces.items()}
    assert tokens["static"] == tokens["dynamic"] == tokens["paged"]
    static, paged = layout_stats(traces["static"]), layout_stats(traces["paged"])
    assert static.target.stale_slots_max > 0 and paged.target.blocks_freed > 0
    assert paged.block_size == 4 and any(c["rejected_position"] for c in traces["paged"].cycles)


def test_a_run_that_never_rolls_back_fits_every_layout_and_breaks_the_same_way():
    """The teaching fault keeps every rejected entry: the capacity covers it, and the tokens match dynamic's."""
    from engine.teaching.faults import Faults
    pair = tiny_pair(1)
    faults = Faults(keep_rejected_kv=True)
    runs = {}
    for layout in LAYOUTS:
        s = SpecSettings(k=4, temperature=0, max_new_tokens=20, cache_layout=layout, block_size=4)
        records = list(speculative_generate(pair, PROMPT, s, faults))
        runs[layout] = tokens_of(records)
        assert records[-1]["target_cache_len"]["after_rollback"] > len(PROMPT) + 20  # the rejected K/V stayed
    assert runs["static"] == runs["dynamic"] == runs["paged"]
    plain = target_generate(pair.target, PROMPT, SpecSettings(k=4, temperature=0, max_new_tokens=20), set())
    assert runs["dynamic"] != plain


def test_stats_of_a_trace_from_before_layouts_report_a_dynamic_cache(tmp_path):
    import json
    from pathlib import Path

    from engine.stats.layouts import layout_stats
    from engine.stats.report import format_stats
    from engine.trace import load_trace
    records = [json.loads(line) for line in
               (Path(__file__).resolve().parent.parent / "assets" / "traces" / "default.jsonl").read_text().splitlines()]
    for field in ("cache_layout", "drafter"):  # written before layouts and drafters existed
        records[0].pop(field, None)
    (tmp_path / "old.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    trace = load_trace(tmp_path / "old.jsonl")
    assert "cache_layout" not in trace.header
    ls = layout_stats(trace)
    peak = max(c["target_cache_len"]["after_append"] for c in trace.cycles)
    assert ls.name == "dynamic" and ls.target.peak_slots_attended == ls.target.peak_slots_held == peak
    assert "KV-CACHE LAYOUT: dynamic" in format_stats(trace)
