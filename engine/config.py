"""Settings of one speculative run, range-checked in one place."""
from dataclasses import asdict, dataclass

from engine.trace.schema import LAYOUTS, MAX_BLOCK_SIZE, MAX_K, MAX_NEW_TOKENS, MAX_TRACE_TOP_K


class SettingsError(ValueError):
    """A setting outside its allowed range; the message names the setting."""


@dataclass(frozen=True)
class SpecSettings:
    k: int = 4  # draft tokens proposed per cycle
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0  # 1 disables nucleus filtering
    seed: int = 0
    max_new_tokens: int = 64
    trace_top_k: int = 10  # entries of each distribution kept in the trace for charts
    cache_layout: str = "dynamic"  # KV-cache layout of both models: dynamic, static or paged
    block_size: int = 16  # slots per block of the paged layout

    def __post_init__(self) -> None:
        validate_settings(self)

    def to_dict(self) -> dict:
        return asdict(self)


def _check_int(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise SettingsError(f"{name} must be between {low} and {high}, got {value}")


def validate_settings(s: SpecSettings) -> None:
    _check_int("k", s.k, 1, MAX_K)
    _check_int("top_k", s.top_k, 0, 1_000_000)
    _check_int("seed", s.seed, 0, 2**63 - 1)
    _check_int("max_new_tokens", s.max_new_tokens, 1, MAX_NEW_TOKENS)
    _check_int("trace_top_k", s.trace_top_k, 1, MAX_TRACE_TOP_K)
    _check_int("block_size", s.block_size, 1, MAX_BLOCK_SIZE)
    if s.cache_layout not in LAYOUTS:
        raise SettingsError(f"cache_layout must be one of {', '.join(LAYOUTS)}, got {s.cache_layout!r}")
    if isinstance(s.temperature, bool) or not isinstance(s.temperature, (int, float)):
        raise SettingsError(f"temperature must be a number, got {s.temperature!r}")
    if not 0.0 <= s.temperature <= 100.0 or s.temperature != s.temperature:
        raise SettingsError(f"temperature must be between 0 (greedy) and 100, got {s.temperature}")
    if isinstance(s.top_p, bool) or not isinstance(s.top_p, (int, float)):
        raise SettingsError(f"top_p must be a number, got {s.top_p!r}")
    if not 0.0 < s.top_p <= 1.0:
        raise SettingsError(f"top_p must be in (0, 1], got {s.top_p}")
