"""What a goodput-against-batch-size sweep found, as plain data: per batch size, plain batched decoding and
speculation at each K (committed tokens per second of decoding, over all rows), the acceptance, and the K
advisor's choice; the crossover. Measured by engine/stats/batch_sweep.py, written by `python -m bench.batch`.

`batch_sweep_from_json` reads a results file back as untrusted input: it checks the numbers' meaning
(positive goodputs, acceptance and alpha in [0, 1], batch sizes once each and increasing, the advised K one
of those measured), not only their types. No torch here: the app's pages import this module.

May import: engine.trace.schema.
"""
import math
from dataclasses import asdict, dataclass, field

from engine.trace.schema import MAX_K

PLAIN_K = 0  # the advice "do not speculate at this batch size"
MAX_SWEEP_BATCH = 256  # as engine/trace/batch_reader.py's MAX_BATCH


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
    idle_share: dict[int, float] = field(default_factory=dict)  # K -> row slots of the cycles spent on finished rows

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
    idle = _per_k(row["idle_share"], f"B={b} idle share", upper=1.0) if row.get("idle_share") else {}
    if idle and set(idle) != set(speculative):
        raise ValueError(f"B={b}: the idle shares must be given for the K measured")
    return BatchSize(b, plain, speculative, acceptance, advised, predicted,
                     None if hf is None else _number(hf, f"B={b} generate goodput"),
                     _number(row.get("prefill_s", 0.0), f"B={b} prefill seconds"), idle)


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
        if any(set(s.speculative) != set(sizes[0].speculative) for s in sizes):
            raise ValueError("every batch size must be measured at the same K values")
        requests, tokens = data["requests"], data["max_new_tokens"]
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in (requests, tokens)):
            raise ValueError("requests and max_new_tokens must be positive integers")
        return BatchSweep(str(data["preset"]), requests, tokens, alpha_of(data["alpha"]), sizes,
                          str(data.get("machine", "")))
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"not a batch sweep: {type(err).__name__} {err}") from None
