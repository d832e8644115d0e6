"""Prometheus text (what a server's /metrics returns), parsed with prometheus_client's parser.

A scrape becomes a Scrape: every series (one per label set: engine, rank, model) kept on its
own, each metric's value summed over its series, per-position counters summed by their
`position` label, each counter's `_created` time, and the scrape's time when the samples carry
a timestamp. Counters are cumulative since the server started, so two scrapes of one run of one
server, subtracted series by series, give the counts of the time between them (`difference`);
a pair that is not one run of one server is refused, since its difference would be a made-up count.
"""
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from engine.servers.server_metrics import MAX_POSITIONS, MAX_RECORDS, ServerMetricsError, check_text_size, number, short

POSITION = "position"  # vLLM's label on the per-position counter
CREATED = "_created"  # prometheus_client writes each counter's creation time as <name>_created
ONE_RUN = "take both scrapes from one run of one server, the earlier first"

Labels = tuple[tuple[str, str], ...]  # one series' labels, sorted by name


@dataclass
class Scrape:
    values: dict[str, float] = field(default_factory=dict)  # metric name (no _total) -> sum over its series
    series: dict[str, dict[Labels, float]] = field(default_factory=dict)  # name -> label set -> its own value
    by_position: dict[str, dict[int, float]] = field(default_factory=dict)  # name -> position -> sum
    created: dict[str, dict[Labels, float]] = field(default_factory=dict)  # counter -> label set -> _created time
    timestamp: float | None = None  # seconds since the epoch, the latest sample timestamp
    window_s: float | None = None  # a difference only: the seconds between its two scrapes


def base_name(name: str) -> str:
    """A counter's name without the _total the text format appends (vLLM's own name for it)."""
    return name[:-len("_total")] if name.endswith("_total") else name


def series_text(name: str, labels: Labels) -> str:
    """One series as an error message names it, its untrusted label values shortened."""
    inside = ",".join(f"{key}={short(value)}" for key, value in labels)
    return f"{name}{{{inside}}}" if inside else name


def parse_scrape(text: str) -> Scrape:
    """Every sample of the text, kept by series and summed by name; one line of error for text that is not Prometheus'."""
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
    key = tuple(sorted(labels.items()))
    if name.endswith(CREATED):  # a creation time, not a count: compared between scrapes, never summed
        scrape.created.setdefault(name[:-len(CREATED)], {})[key] = value
        return
    if key in scrape.series.get(name, {}):
        raise ServerMetricsError(f"{series_text(name, key)} appears twice in one scrape")
    add_series(scrape, name, key, value)


def add_series(scrape: Scrape, name: str, key: Labels, value: float) -> None:
    """One series' value, kept on its own and added to its name's (or its position's) sum."""
    scrape.series.setdefault(name, {})[key] = value
    labels = dict(key)
    if POSITION in labels:
        pos = position_of(labels[POSITION], name)
        by_pos = scrape.by_position.setdefault(name, {})
        by_pos[pos] = by_pos.get(pos, 0.0) + value
        return
    scrape.values[name] = scrape.values.get(name, 0.0) + value


def position_of(raw: str, name: str) -> int:
    if not raw.isdigit() or int(raw) >= MAX_POSITIONS:
        raise ServerMetricsError(f"{name} has position {short(raw)}; positions are 0 to {MAX_POSITIONS - 1}")
    return int(raw)


def difference(first: Scrape, second: Scrape, names: list[str]) -> Scrape:
    """The counts between two scrapes of one run of one server (second minus first), for the named counters.

    Each series is subtracted on its own: a sum over engines can grow while one engine's counter
    fell (it restarted), and that fall must not be hidden. Series that differ between the scrapes
    (another model, another engine count), a changed _created time and any counter that went
    down all mean the scrapes are not one run of one server: refused, each in one line.
    """
    out = Scrape()
    for name in names:
        check_same_series(first, second, name)
        check_not_recreated(first, second, name)
        for key, after in second.series.get(name, {}).items():
            add_series(out, name, key, grown(first.series[name][key], after, series_text(name, key)))
    if first.timestamp is not None and second.timestamp is not None:
        if second.timestamp <= first.timestamp:
            raise ServerMetricsError("the second scrape is not later than the first: give the earlier scrape first")
        out.window_s = second.timestamp - first.timestamp
    return out


def check_same_series(first: Scrape, second: Scrape, name: str) -> None:
    a, b = set(first.series.get(name, {})), set(second.series.get(name, {}))
    if a != b:
        raise ServerMetricsError(f"the two scrapes are not one run of one server: {name} {what_differs(a, b)}; {ONE_RUN}")


def what_differs(a: set[Labels], b: set[Labels]) -> str:
    """How two scrapes' label sets of one metric differ, the first differing label named."""
    if not b:
        return "is missing from the second scrape"
    if not a:
        return "is missing from the first scrape"
    in_a, in_b = label_values(a), label_values(b)
    for label in sorted(set(in_a) | set(in_b)):
        if in_a.get(label) != in_b.get(label):
            return (f"has {label} {values_text(in_a.get(label))} in the first scrape and "
                    f"{values_text(in_b.get(label))} in the second")
    return f"has {len(a)} series in the first scrape and {len(b)} in the second, with other label sets"


def label_values(keys: set[Labels]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for key in keys:
        for label, value in key:
            out.setdefault(label, set()).add(value)
    return out


def values_text(values: set[str] | None, most: int = 3) -> str:
    if not values:
        return "absent"
    shown = ", ".join(short(v) for v in sorted(values)[:most])
    return shown + (f" and {len(values) - most} more" if len(values) > most else "")


def check_not_recreated(first: Scrape, second: Scrape, name: str) -> None:
    """A counter created anew between the scrapes restarted from zero, even if it has since grown past its old value."""
    a, b = first.created.get(name, {}), second.created.get(name, {})
    for key in sorted(set(a) & set(b)):
        if a[key] != b[key]:
            raise ServerMetricsError(f"{series_text(name, key)} was created at {a[key]:.3f} in the first scrape and "
                                     f"at {b[key]:.3f} in the second (its {CREATED} time): the server restarted "
                                     f"in between; {ONE_RUN}")


def grown(before: float, after: float, name: str) -> float:
    if after < before:
        raise ServerMetricsError(f"{name} went backwards between the scrapes ({before:g} to {after:g}): the server "
                                 f"restarted in between, or the scrapes are in the wrong order; {ONE_RUN}")
    return after - before
