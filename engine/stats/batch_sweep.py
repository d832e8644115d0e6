"""Goodput against batch size: plain batched decoding and batched speculation at each K, measured, with the
crossover and the K advisor's choice per batch size (engine/stats/batch_plan.py).

`batch_sweep` runs a set of requests at each batch size B, in batches of B one after another, greedy, so
every method commits the same tokens (checked). Goodput is committed tokens over all rows per second of
**decoding**: each request's prompt is read alone before either method starts (engine/batch/cycle.py
prefill_rows), at the same cost for both, and that time is left out, as the K sweep of one prompt does
(engine/stats/sweep.py). It is kept beside as `prefill_s`. The cost model predicts decoding too.

`BatchSweep` is plain data: `python -m bench.batch` writes it as JSON (adding Hugging Face's `generate`),
`batch_sweep_from_json` reads such a file back as untrusted input, and the statistics page draws either.
"""
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from statistics import median

from engine.batch.cycle import batched_generate
from engine.batch.plain import batched_plain_generate
from engine.config import SettingsError, SpecSettings
from engine.cycle.pair import Pair
from engine.stats.batch_plan import PLAIN_K, advise_batch_k, measure_batch_costs
from engine.trace.schema import MAX_K

Progress = Callable[[float, str], None]  # (fraction done, what is running)
MAX_SWEEP_BATCH = 256  # as engine/trace/batch.py's MAX_BATCH


@dataclass(frozen=True)
class BatchSize:
    """One batch size's measurements (goodput: committed tokens per second of decoding, over all rows)."""

    batch: int
    plain: float  # plain batched decoding in the engine
    speculative: dict[int, float]  # K -> batched speculation
    acceptance_rate: dict[int, float]  # K -> accepted / drafted, over every running row
    advised_k: int | None = None  # the advisor's K (PLAIN_K: do not speculate); None when not asked
    predicted: dict[str, float] = field(default_factory=dict)  # "plain" and str(K) -> the cost model's goodput
    hf_generate: float | None = None  # Hugging Face's generate on the same padded batches (bench only)
    prefill_s: float = 0.0  # reading every prompt once, outside the goodput

    @property
    def best_k(self) -> int:
        """The measured fastest K (ties: the smaller)."""
        return max(sorted(self.speculative), key=lambda k: self.speculative[k])

    @property
    def best_speedup(self) -> float:
        """The best K's goodput over plain batched decoding's."""
        return self.speculative[self.best_k] / self.plain

    @property
    def advised_goodput(self) -> float | None:
        if self.advised_k is None:
            return None
        return self.plain if self.advised_k == PLAIN_K else self.speculative.get(self.advised_k)

    @property
    def advised_over_best(self) -> float | None:
        """What the advised choice measured, over the best measured choice (plain decoding included)."""
        got = self.advised_goodput
        return None if got is None else got / max(self.plain, self.speculative[self.best_k])


@dataclass(frozen=True)
class BatchSweep:
    """One pair's sweep over batch sizes; `sizes` in increasing B."""

    preset: str
    requests: int
    max_new_tokens: int
    alpha: float  # measured at B = 1 and the pilot's K (greedy acceptance does not depend on B)
    sizes: list[BatchSize]
    machine: str = ""  # the CPU (or GPU) it was measured on

    @property
    def crossover(self) -> int | None:
        """The smallest B where no K beats plain batched decoding; None when speculation pays at every B."""
        return next((s.batch for s in self.sizes if s.best_speedup < 1.0), None)


def crossover_words(sweep: BatchSweep) -> str:
    first = sweep.sizes[0].batch if sweep.sizes else None
    if sweep.crossover is None:
        return "speculation pays at every batch size measured"
    if sweep.crossover == first:
        return f"speculation does not pay even at B = {first}: no K beats plain batched decoding"
    return f"speculation stops paying at B = {sweep.crossover}"


# ---------------------------------------------------------------- measuring

def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def plain_run(pair: Pair, prompts: list[list[int]], s: SpecSettings, b: int) -> tuple[list[list[int]], float, float]:
    """Each request's tokens, the decoding seconds and the prefill seconds, B requests at a time."""
    outputs, decode_s, prefill_s = [], 0.0, 0.0
    for rows in chunks(prompts, b):
        run = batched_plain_generate(pair.target, rows, s, list(range(len(rows))), pair.eos_ids)
        outputs += run.outputs
        decode_s += run.decode_s
        prefill_s += run.prefill_s
    return outputs, decode_s, prefill_s


def speculative_run(pair: Pair, prompts: list[list[int]], s: SpecSettings, b: int) -> dict:
    """Each request's tokens, the decoding seconds (the cycles' own times) and the acceptance, B requests at a time."""
    outputs, cycles = [], []
    for rows in chunks(prompts, b):
        out, batch_cycles = batched_generate(pair, rows, s, list(range(len(rows))))
        outputs += out
        cycles += batch_cycles
    tested = [r for c in cycles for r in c.rows if not r.idle]
    accepted = sum(r.num_accepted for r in tested)
    rejections = sum(r.num_accepted < s.k for r in tested)
    return {"outputs": outputs, "decode_s": sum(c.cycle_s for c in cycles),
            "acceptance_rate": accepted / (s.k * len(tested)),
            "alpha": accepted / (accepted + rejections) if accepted + rejections else 0.0,
            "other_s": median(c.bookkeeping_s for c in cycles)}


def one_batch_size(pair: Pair, prompts: list[list[int]], max_new_tokens: int, b: int, ks: list[int],
                   alpha: float) -> BatchSize:
    """Plain batched decoding, speculation at every K, then the advisor's K from this machine's forwards at B."""
    greedy = SpecSettings(k=1, temperature=0.0, max_new_tokens=max_new_tokens)
    plain_outputs, plain_s, prefill_s = plain_run(pair, prompts, greedy, b)
    tokens = sum(len(o) for o in plain_outputs)
    speculative, acceptance, other = {}, {}, []
    for k in ks:
        spec = speculative_run(pair, prompts, replace(greedy, k=k), b)
        if spec["outputs"] != plain_outputs:
            raise AssertionError(f"B={b} K={k}: speculation's rows differ from plain greedy decoding")
        speculative[k] = tokens / spec["decode_s"]
        acceptance[k] = spec["acceptance_rate"]
        other.append(spec["other_s"])
    costs = replace(measure_batch_costs(pair, prompts[:b], [k + 1 for k in ks]), other_s=median(other))
    return BatchSize(b, tokens / plain_s, speculative, acceptance, advise_batch_k(alpha, costs),
                     {"plain": costs.plain_goodput()} | {str(k): costs.goodput(alpha, k) for k in ks},
                     prefill_s=prefill_s)


def check_sweep_settings(prompts: list[list[int]], batches: list[int], ks: list[int], max_new_tokens: int) -> None:
    if not prompts or not batches or not ks:
        raise SettingsError("a batch sweep needs requests, batch sizes and K values")
    if any(not 1 <= b <= MAX_SWEEP_BATCH for b in batches) or any(not 1 <= k <= MAX_K for k in ks):
        raise SettingsError(f"batch sizes 1 to {MAX_SWEEP_BATCH} and K from 1 to {MAX_K}, got {batches} and {ks}")
    if not 1 <= max_new_tokens <= 512:
        raise SettingsError(f"max new tokens between 1 and 512, got {max_new_tokens}")


def batch_sweep(pair: Pair, prompts: list[list[int]], batches: list[int], ks: list[int], max_new_tokens: int,
                preset: str = "", machine: str = "", pilot_k: int = 4,
                on_progress: Progress | None = None) -> BatchSweep:
    """A warm-up, a pilot at B = 1 for alpha, then every batch size in increasing order."""
    check_sweep_settings(prompts, batches, ks, max_new_tokens)
    report = on_progress or (lambda fraction, text: None)
    batches = sorted(set(batches))
    report(0.0, "warm-up and the pilot at B = 1 (alpha)")
    pilot_settings = SpecSettings(k=pilot_k, temperature=0.0, max_new_tokens=max_new_tokens)
    speculative_run(pair, prompts[:2], pilot_settings, 2)  # one-off costs (kernels for these shapes) before timing
    alpha = speculative_run(pair, prompts, pilot_settings, 1)["alpha"]
    sizes = []
    for i, b in enumerate(batches):
        report((i + 1) / (len(batches) + 1), f"batch size {b}: plain decoding, then K = {', '.join(map(str, ks))}")
        sizes.append(one_batch_size(pair, prompts, max_new_tokens, b, ks, alpha))
    report(1.0, "done")
    return BatchSweep(preset, len(prompts), max_new_tokens, alpha, sizes, machine)


# ---------------------------------------------------------------- as JSON

def batch_sweep_json(sweep: BatchSweep) -> dict:
    return asdict(sweep) | {"crossover_batch": sweep.crossover}


def _number(value, what: str, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < low:
        raise ValueError(f"{what} must be a finite number >= {low}, got {value!r}")
    return float(value)


def _per_k(value, what: str, upper: float = math.inf) -> dict[int, float]:
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{what} must map K to a number")
    out = {}
    for key, number in value.items():
        # JSON keys are strings; a sweep not yet written keeps its int keys
        k = int(key) if isinstance(key, str) and key.isdigit() else key if type(key) is int else None
        if k is None or not 1 <= k <= MAX_K:
            raise ValueError(f"{what}: K must be 1 to {MAX_K}, got {key!r}")
        out[k] = _number(number, f"{what} at K={k}")
        if out[k] > upper:
            raise ValueError(f"{what} at K={k} must be at most {upper}, got {number!r}")
    return out


def batch_size_from_json(row: dict) -> BatchSize:
    """One batch size, checked: positive goodputs, acceptance in [0, 1], the advised K one of the K measured."""
    b = row["batch"]
    if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_SWEEP_BATCH:
        raise ValueError(f"batch must be an integer from 1 to {MAX_SWEEP_BATCH}, got {b!r}")
    speculative = _per_k(row["speculative"], f"B={b} speculative goodput")
    acceptance = _per_k(row["acceptance_rate"], f"B={b} acceptance rate", upper=1.0)
    if set(acceptance) != set(speculative) or any(v <= 0 for v in speculative.values()):
        raise ValueError(f"B={b}: goodput and acceptance must be given for the same K, goodput above 0")
    advised = row.get("advised_k")
    if advised is not None and (isinstance(advised, bool) or advised not in {PLAIN_K, *speculative}):
        raise ValueError(f"B={b}: the advised K must be 0 (plain) or one of the K measured, got {advised!r}")
    plain = _number(row["plain"], f"B={b} plain goodput")
    hf = row.get("hf_generate")
    predicted = {str(key): _number(v, f"B={b} predicted goodput") for key, v in dict(row.get("predicted") or {}).items()}
    if plain <= 0:
        raise ValueError(f"B={b}: plain goodput must be above 0")
    return BatchSize(b, plain, speculative, acceptance, advised, predicted,
                     None if hf is None else _number(hf, f"B={b} generate goodput"),
                     _number(row.get("prefill_s", 0.0), f"B={b} prefill seconds"))


def alpha_of(value) -> float:
    alpha = _number(value, "alpha")
    if alpha > 1.0:
        raise ValueError(f"alpha must be at most 1, got {value!r}")
    return alpha


def batch_sweep_from_json(data: dict) -> BatchSweep:
    """A sweep written by `batch_sweep_json` (or by bench/batch.py), checked; ValueError says what is wrong."""
    try:
        sizes = [batch_size_from_json(row) for row in data["sizes"]]
        batches = [s.batch for s in sizes]
        if not sizes or batches != sorted(set(batches)):
            raise ValueError(f"batch sizes must be given once each, in increasing order, got {batches}")
        requests, tokens = data["requests"], data["max_new_tokens"]
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in (requests, tokens)):
            raise ValueError("requests and max_new_tokens must be positive integers")
        return BatchSweep(str(data["preset"]), requests, tokens, alpha_of(data["alpha"]), sizes,
                          str(data.get("machine", "")))
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"not a batch sweep: {type(err).__name__} {err}") from None
