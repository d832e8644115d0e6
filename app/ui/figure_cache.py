"""Figures that every session draws alike, built once for the whole server (#26).

A class steps through the same cycles of the same bundled trace, and each Next used to build
the stepper's five or six figures again and have Plotly turn each into the dict it sends
(`Figure.to_dict`: a deep copy of the figure, then every numpy array encoded as base64): 26 of
the 51 ms of CPU a Next took (bench/results/next-profile-main.md). Here a figure is built once
per key (trace content, figure, step, theme): `PreparedFigure` keeps the dict Plotly would send,
made once, and hands the same one to st.plotly_chart on every draw. A Next to a step drawn
before costs about 19 ms; the first one to a step costs more than without the cache (the copy
kept), 66 ms against 51 (bench/results/next-profile.md).

The cache is shared by every session and bounded like the app's other caches (app/ui/state.py):
at most `max_entries` figures and `max_bytes` of estimated memory, least recently used dropped
first, none older than `ttl_s`. Nobody may change a figure it returns (`cached_figures` says
so): two sessions' threads read it at once.

Plain Python and Plotly, no Streamlit: tests drive it directly.
"""
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import plotly.graph_objects as go
import plotly.io as pio

# Bytes of Python objects a cached figure holds per byte of the JSON it sends: its Plotly figure
# and the dict sent, each with its own copy of Plotly's template (most of a small figure). Measured
# with tracemalloc on every stage of bundled traces: 7.7-9.8x (about 60 KiB a stepper figure);
# tests/test_figure_cache.py checks that this estimate is not below what entries hold.
MEMORY_PER_JSON_BYTE = 14
FIGURES_KEPT = 1024  # figures; every stage of a cycle draws about 20 between them (default.jsonl: 35 cycles)
FIGURE_BYTES_KEPT = 64 * 2**20  # estimated memory of all cached figures together: about 700 stepper figures


class PreparedFigure(go.Figure):
    """A Plotly figure whose `to_dict()` is computed once and then returned as it is.

    st.plotly_chart calls `to_dict()` on every draw; the plain Figure deep-copies itself and
    re-encodes its arrays each time. The dict returned is shared: read it, never change it
    (Plotly's own `to_json` only reads it: it would pop trace "uid"s, which these have none of)."""

    def __init__(self, fig: go.Figure) -> None:
        sent = fig.to_dict()
        super().__init__(sent, _validate=False)  # copies `sent`: the figure's own properties stay apart from it
        self._sent = sent

    def to_dict(self) -> dict:
        return self._sent

    def json_bytes(self) -> int:
        return len(pio.to_json(self._sent, validate=False))


@dataclass
class Entry:
    figures: tuple[PreparedFigure, ...]
    size: int  # estimated bytes held (MEMORY_PER_JSON_BYTE x their JSON)
    made_at: float


class FigureCache:
    """Bounded, thread-safe, least recently used first out; keys name everything a figure depends on."""

    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries, self.max_bytes, self.ttl_s, self.clock = max_entries, max_bytes, ttl_s, clock
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    @property
    def bytes(self) -> int:
        return self._bytes

    def keys(self) -> list[Hashable]:
        """Oldest (next to go) first."""
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def get(self, key: Hashable, build: Callable[[], Sequence[go.Figure]]) -> tuple[PreparedFigure, ...]:
        """The figures cached under `key`, or `build()`'s, prepared and kept. Built outside the lock:
        two sessions missing the same key at once both build it, and the later one is kept."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self.clock() - entry.made_at <= self.ttl_s:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry.figures
            self.misses += 1
        figures = tuple(PreparedFigure(f) for f in build())
        self._put(key, Entry(figures, MEMORY_PER_JSON_BYTE * sum(f.json_bytes() for f in figures), self.clock()))
        return figures

    def _put(self, key: Hashable, entry: Entry) -> None:
        with self._lock:
            self._drop(key)
            if entry.size > self.max_bytes:
                return  # larger than the whole cache: drawn, not kept
            self._entries[key] = entry
            self._bytes += entry.size
            now = self.clock()
            for old in [k for k, e in self._entries.items() if now - e.made_at > self.ttl_s]:
                self._drop(old)
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size
