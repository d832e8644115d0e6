"""Figures that every session draws alike, built once for the whole server.

A class steps through the same cycles of the same bundled trace, and each Next used to build
the stepper's five or six figures again and have Plotly turn each into the dict it sends
(`Figure.to_dict`: a deep copy of the figure, then every numpy array encoded as base64): 26 of
the 51 ms of CPU a Next took (bench/results/next-profile-main.md). Here a figure is built once
per key (trace content, figure, step, theme) and kept as the JSON Plotly makes of it;
`PreparedFigure` hands that to st.plotly_chart, which then only parses it and writes it out
again (bench/results/next-profile.md has what a Next costs now).

Kept as a string, a figure holds about twice its JSON (15-17 KiB for a stepper figure), no dict
that two sessions' threads could share, and next to nothing for Python's garbage collector to
walk (a cache of dicts made every full collection several times slower). The cache is shared by
every session and bounded like the app's other caches (app/ui/state.py): at most `max_entries`
figures and `max_bytes` of estimated memory, least recently used dropped first, none older than
`ttl_s`.

Plain Python and Plotly, no Streamlit: tests drive it directly.
"""
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import plotly.graph_objects as go
import plotly.io as pio

# Bytes a cached figure holds beyond its JSON (the empty Plotly figure that carries it, the entry).
# Measured with tracemalloc on every stage of bundled traces: 7.3-8.3 KiB on JSON of 6.7-8.2 KiB;
# tests/test_figure_cache.py checks that the estimate (JSON + this) is not below what entries hold.
FIGURE_OVERHEAD_BYTES = 12 * 1024
FIGURES_KEPT = 2048  # entries, a figure each (the KV-layout strips: one entry); a cycle's five stages draw about 20
FIGURE_BYTES_KEPT = 32 * 2**20  # estimated memory of all cached figures: about 1600 stepper figures


class PreparedFigure(go.Figure):
    """A stand-in that st.plotly_chart draws as `fig`: the figure's JSON, as Plotly makes it to send,
    made once, and a Plotly figure with nothing in it (Streamlit draws Plotly figures, and would
    validate a plain dict at full cost).

    st.plotly_chart calls `to_dict()` on every draw, and a plain Figure deep-copies itself and
    re-encodes its arrays each time; this one parses its JSON (a fresh dict each call: nobody
    shares one). It has no traces or layout of its own: draw it; to change a figure, build another.
    A string is most of what it keeps: about 20 objects a figure for Python's garbage collector to walk."""

    def __init__(self, fig: go.Figure) -> None:
        super().__init__(layout={"template": {}}, _validate=False)  # empty, without the default template's copy
        self._sent = pio.to_json(fig.to_dict(), validate=False)

    def to_dict(self) -> dict:
        return json.loads(self._sent)

    def json_bytes(self) -> int:
        return len(self._sent)


@dataclass
class Entry:
    figures: tuple[PreparedFigure, ...]
    size: int  # estimated bytes held: their JSON and FIGURE_OVERHEAD_BYTES each
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
        self._put(key, Entry(figures, sum(f.json_bytes() + FIGURE_OVERHEAD_BYTES for f in figures), self.clock()))
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
