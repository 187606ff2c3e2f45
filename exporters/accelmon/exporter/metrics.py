"""The metric model: what a collector may export (`MetricSpec`, declared per collector in a `Catalogue`), the series
of one sample (`Samples`) and their exposition, by prometheus_client's own text and OpenMetrics formats.

Nothing here runs anything: `accelmon.exporter.runtime` samples the collectors on their threads and serves their latest
samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from prometheus_client import exposition as text_exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics_exposition


@dataclass(frozen=True, eq=False)
class MetricSpec:
    """One metric a collector may export: its name, type, help text and label names.

    Specs are declared at module level so that `docs/metrics.md` is generated from the code. A spec is one object
    (made by its catalogue, never copied): it compares and hashes by identity, which keeps the dictionary lookups of
    every series added in a sample at C speed (a field-by-field hash of five strings cost a sixth of a sample).
    """

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...]
    read: str = "every interval"  # how often the collector reads it from the hardware (the catalogue shows it)


class Catalogue:
    """The metric specs of one collector, in declaration order."""

    def __init__(self, collector: str, title: str, note: str = "") -> None:
        self.collector = collector
        self.title = title
        self.note = note  # where the values come from and how they are converted, for docs/metrics.md
        self.specs: list[MetricSpec] = []
        self.shared: list[MetricSpec] = []  # specs another collector declares, served by this one too (`share`)

    def _add(self, kind: str, name: str, text: str, labels: Iterable[str], read: str) -> MetricSpec:
        spec = MetricSpec(name, kind, text, tuple(labels), read)
        self.specs.append(spec)
        return spec

    def share(self, specs: Iterable[MetricSpec]) -> None:
        """Serve specs another collector declares (NVIDIA's and AMD's accelmon_gpu_*): one spec, so the names,
        types and labels cannot drift apart."""
        for spec in specs:
            self.specs.append(spec)
            self.shared.append(spec)

    def gauge(self, name: str, text: str, labels: Iterable[str] = (), read: str = MetricSpec.read) -> MetricSpec:
        return self._add("gauge", name, text, labels, read)

    def counter(self, name: str, text: str, labels: Iterable[str] = (), read: str = MetricSpec.read) -> MetricSpec:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name} must end in _total")
        return self._add("counter", name, text, labels, read)


class Samples:
    """The series of one sample, grouped by metric; rendered to the text exposition format by `render`."""

    def __init__(self) -> None:
        self.rows: dict[MetricSpec, list[tuple[tuple[str, ...], float]]] = {}

    def add(self, spec: MetricSpec, labels: Iterable[str], value: float) -> None:
        if value != value:
            # NaN is "no value" (GPM answers it for too short a window): the series is absent for this sample,
            # never a NaN that dashboards and alerts would have to filter.
            return
        rows = self.rows.get(spec)
        if rows is None:
            rows = self.rows[spec] = []
        rows.append((labels if isinstance(labels, tuple) else tuple(labels), value))

    def extend(self, other: Samples) -> None:
        """Every series of `other` added to this sample."""
        for spec, rows in other.rows.items():
            self.rows.setdefault(spec, []).extend(rows)


def scaled(value: float | None, scale: float) -> float | None:
    """value * scale (None stays None), dividing for scales below 1 so that 123456789 mJ is 123456.789 J, not
    ...790000001."""
    if value is None:
        return None
    if scale < 1:
        return value / round(1 / scale)
    return value * scale


class _Families:
    """What prometheus_client's exposition functions collect from: the metric families of one sample."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def families(samples: Samples) -> list[Metric]:
    """prometheus_client's metric families for one sample: counters as counters (the exposition adds `_total`),
    `_info` gauges as info metrics (OpenMetrics shows them as such), the rest as gauges."""
    out: list[Metric] = []
    for spec, rows in samples.rows.items():
        family: Metric
        if spec.kind == "counter":
            family = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
        elif spec.name.endswith("_info"):
            family = InfoMetricFamily(spec.name[: -len("_info")], spec.help, labels=spec.labels)
        else:
            family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
        for values, value in rows:
            if isinstance(family, InfoMetricFamily):
                family.add_metric(list(values), {})  # an info series is 1; its labels are its value
            else:
                family.add_metric(list(values), value)
        out.append(family)
    return out


def render(samples: Samples, openmetrics: bool = False) -> bytes:
    """One sample in the text format (0.0.4) or in OpenMetrics, by prometheus_client's own exposition; without
    OpenMetrics's `# EOF`, which ends only the whole scrape (`Exporter.exposition` adds it)."""
    registry = _Families(families(samples))
    if openmetrics:
        return openmetrics_exposition.generate_latest(registry)[: -len(EOF)]  # type: ignore[arg-type]
    return text_exposition.generate_latest(registry)  # type: ignore[arg-type]


EOF = b"# EOF\n"
