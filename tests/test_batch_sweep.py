"""Goodput against batch size (engine/stats/batch_sweep.py, batch_results.py): a live sweep on tiny models, and a sweep read back
from JSON as untrusted input (the bench's results files and the statistics page both go through it)."""
import copy
import json

import pytest

from engine.config import SettingsError, SpecSettings
from engine.cycle.plain import batched_plain_generate
from engine.stats.batch_results import (
    PLAIN_K,
    BatchSize,
    BatchSweep,
    batch_sweep_from_json,
    batch_sweep_json,
    crossover_words,
)
from engine.stats.batch_sweep import batch_sweep
from tests.test_batch_cycle import PROMPTS
from tests.tiny import noisy_pair


@pytest.fixture(scope="module")
def sweep() -> BatchSweep:
    seen = []
    result = batch_sweep(noisy_pair(2, noise=0.02), PROMPTS[:4], [2, 1], [1, 3], 6, "tiny",
                         on_progress=lambda fraction, text: seen.append(fraction))
    assert seen[0] == 0.0 and seen[-1] == 1.0 and seen == sorted(seen)
    return result


def test_a_live_sweep_measures_every_batch_size_and_k_it_was_asked_for(sweep):
    assert [s.batch for s in sweep.sizes] == [1, 2]  # sorted, each once
    assert sweep.requests == 4 and sweep.max_new_tokens == 6 and 0.0 <= sweep.alpha <= 1.0
    for s in sweep.sizes:
        assert set(s.speculative) == set(s.acceptance_rate) == {1, 3}
        assert s.plain > 0 and min(s.speculative.values()) > 0 and s.prefill_s > 0
        assert all(0.0 <= a <= 1.0 for a in s.acceptance_rate.values())
        assert s.advised_k in {PLAIN_K, 1, 3} and set(s.predicted) == {"plain", "1", "3"}
        assert set(s.idle_share) == {1, 3} and all(0.0 <= v < 1.0 for v in s.idle_share.values())
    assert sweep.sizes[0].idle_share == {1: 0.0, 3: 0.0}  # one row: never waits for another
    # greedy rows commit the same tokens at every batch size, so each K's acceptance is the same at B = 1 and 2
    assert sweep.sizes[0].acceptance_rate == pytest.approx(sweep.sizes[1].acceptance_rate, abs=1e-12)


def size(batch: int, plain: float, spec: dict[int, float], advised: int | None = None) -> BatchSize:
    return BatchSize(batch, plain, spec, {k: 0.5 for k in spec}, advised)


def test_the_crossover_is_the_first_batch_size_where_no_k_beats_plain_decoding():
    pays_then_not = BatchSweep("p", 8, 16, 0.7, [size(1, 10, {1: 11, 2: 14}, 2), size(2, 18, {1: 19, 2: 17}, PLAIN_K),
                                                size(4, 30, {1: 29, 2: 25})])
    assert pays_then_not.crossover == 4
    assert crossover_words(pays_then_not) == "speculation stops paying at B = 4"
    first, second = pays_then_not.sizes[:2]
    assert (first.best_k, first.best_speedup) == (2, pytest.approx(1.4))
    assert first.advised_over_best == pytest.approx(1.0)
    assert second.advised_over_best == pytest.approx(18 / 19)  # plain advised, K=1 was best
    never = BatchSweep("p", 8, 16, 0.3, [size(1, 10, {1: 9})])
    assert never.crossover == 1 and "does not pay even at B = 1" in crossover_words(never)
    assert BatchSweep("p", 8, 16, 0.9, [size(1, 10, {1: 12})]).crossover is None


def test_a_sweep_round_trips_through_json(sweep):
    data = json.loads(json.dumps(batch_sweep_json(sweep)))  # keys become strings, as in a results file
    back = batch_sweep_from_json(data)
    assert back == sweep and data["crossover_batch"] == sweep.crossover


@pytest.mark.parametrize("spoil, words", [
    (lambda d: d["sizes"][0].update(batch=0), "batch must be an integer"),
    (lambda d: d["sizes"].reverse(), "increasing order"),
    (lambda d: d["sizes"][0]["speculative"].update({"1": -3.0}), "must be a finite number"),
    (lambda d: d["sizes"][0]["speculative"].update({"1": float("nan")}), "must be a finite number"),
    (lambda d: d["sizes"][0]["acceptance_rate"].update({"3": 1.5}), "at most 1"),
    (lambda d: d["sizes"][0]["speculative"].pop("3"), "the same K"),
    (lambda d: [d["sizes"][0][f].pop("3") for f in ("speculative", "acceptance_rate", "idle_share")],
     "at the same K values"),
    (lambda d: d["sizes"][0].update(advised_k=5), "the advised K"),
    (lambda d: d["sizes"][0].update(plain=0), "plain goodput must be above 0"),
    (lambda d: d.update(alpha=1.2), "alpha must be at most 1"),
    (lambda d: d["sizes"][1]["idle_share"].update({"1": 1.5}), "idle share at K=1 must be at most 1"),
    (lambda d: d.pop("sizes"), "not a batch sweep"),
    (lambda d: d["sizes"][0]["speculative"].update({"../x": 3.0}), "K must be"),
])
def test_a_spoilt_sweep_file_is_refused_with_what_is_wrong(sweep, spoil, words):
    data = json.loads(json.dumps(batch_sweep_json(sweep)))
    spoilt = copy.deepcopy(data)
    spoil(spoilt)
    with pytest.raises(ValueError, match=words):
        batch_sweep_from_json(spoilt)


def test_out_of_range_sweep_settings_are_refused_before_anything_runs():
    pair = noisy_pair(2, noise=0.02)
    for batches, ks, tokens in (([0], [1], 4), ([1], [0], 4), ([1], [1], 0), ([], [1], 4), ([1], [99], 4)):
        with pytest.raises(SettingsError):
            batch_sweep(pair, PROMPTS[:2], batches, ks, tokens)


def test_plain_batched_decoding_times_its_prefill_apart_from_its_steps():
    pair = noisy_pair(2, noise=0.02)
    out = batched_plain_generate(pair.target, PROMPTS[:3], SpecSettings(temperature=0, max_new_tokens=4), [0, 1, 2],
                                 pair.eos_ids)
    assert out.prefill_s > 0 and out.decode_s > 0 and out.steps == 4
