"""Prometheus text (what a server's /metrics returns), parsed with prometheus_client's parser.

A scrape becomes a Scrape: each metric's value summed over its label sets (one per engine or
rank), per-position counters kept by their `position` label, and the scrape's time when the
samples carry a timestamp. Counters are cumulative since the server started, so two scrapes
of one server, subtracted, give the counts of the time between them (`difference`).
"""
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from engine.servers.server_metrics import MAX_POSITIONS, MAX_RECORDS, ServerMetricsError, check_text_size, number, short

POSITION = "position"  # vLLM's label on the per-position counter


@dataclass
class Scrape:
    values: dict[str, float] = field(default_factory=dict)  # metric name (no _total) -> sum over label sets
    label_sets: dict[str, int] = field(default_factory=dict)  # metric name -> how many label sets were summed
    by_position: dict[str, dict[int, float]] = field(default_factory=dict)  # name -> position -> sum
    timestamp: float | None = None  # seconds since the epoch, the latest sample timestamp
    window_s: float | None = None  # a difference only: the seconds between its two scrapes


def base_name(name: str) -> str:
    """A counter's name without the _total the text format appends (vLLM's own name for it)."""
    return name[:-len("_total")] if name.endswith("_total") else name


def parse_scrape(text: str) -> Scrape:
    """Every sample of the text, summed by name; one line of error for text that is not Prometheus'."""
    check_text_size(text)
    scrape = Scrape()
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except Exception as err:  # noqa: BLE001 - the parser raises several kinds; all mean "not this format"
        raise ServerMetricsError(f"not Prometheus text: {short(str(err))}") from None
    if len(samples) > MAX_RECORDS:
        raise ServerMetricsError(f"{len(samples):,} samples; at most {MAX_RECORDS:,} are read")
    for s in samples:
        if s.name.endswith("_total") and s.value < 0:  # summed over label sets, a negative one could hide
            raise ServerMetricsError(f"{s.name} {short(s.labels)} is {s.value:g}: a counter cannot be negative")
        add_sample(scrape, base_name(s.name), s.labels, s.value, s.timestamp)
    return scrape


def add_sample(scrape: Scrape, name: str, labels: dict, value: float, timestamp) -> None:
    value = number(value, name)
    if timestamp is not None:  # the parser gives a Timestamp object or a float, depending on the format
        seconds = float(timestamp)
        scrape.timestamp = seconds if scrape.timestamp is None else max(scrape.timestamp, seconds)
    if POSITION in labels:
        pos = position_of(labels[POSITION], name)
        by_pos = scrape.by_position.setdefault(name, {})
        by_pos[pos] = by_pos.get(pos, 0.0) + value
        return
    scrape.values[name] = scrape.values.get(name, 0.0) + value
    scrape.label_sets[name] = scrape.label_sets.get(name, 0) + 1


def position_of(raw: str, name: str) -> int:
    if not raw.isdigit() or int(raw) >= MAX_POSITIONS:
        raise ServerMetricsError(f"{name} has position {short(raw)}; positions are 0 to {MAX_POSITIONS - 1}")
    return int(raw)


def difference(first: Scrape, second: Scrape, names: list[str]) -> Scrape:
    """The counts between two scrapes of one server (second minus first), for the named counters.

    A counter that went down means the server restarted between the scrapes (its counters start
    again from zero), so the difference would mean nothing: that is refused.
    """
    out = Scrape()
    for name in names:
        if name in second.values or name in first.values:
            out.values[name] = grown(first.values.get(name, 0.0), second.values.get(name, 0.0), name)
        if name in second.by_position or name in first.by_position:
            a, b = first.by_position.get(name, {}), second.by_position.get(name, {})
            out.by_position[name] = {p: grown(a.get(p, 0.0), b.get(p, 0.0), f"{name}{{position={p}}}")
                                     for p in sorted(set(a) | set(b))}
    if first.timestamp is not None and second.timestamp is not None:
        if second.timestamp <= first.timestamp:
            raise ServerMetricsError("the second scrape is not later than the first: give the earlier scrape first")
        out.window_s = second.timestamp - first.timestamp
    return out


def grown(before: float, after: float, name: str) -> float:
    if after < before:
        raise ServerMetricsError(f"{name} went backwards between the scrapes ({before:g} to {after:g}): the server "
                                 "restarted in between, so take both scrapes from one run, the earlier one first")
    return after - before
