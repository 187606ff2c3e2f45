"""Samples folded into one period's datums, and the datums split into requests within PutMetricData's limits."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from accelmon.cloudwatch.limits import (
    DEVICE_DIMENSIONS,
    LARGEST_VALUE,
    MAX_DATUMS_PER_REQUEST,
    MAX_DIMENSIONS,
    MAX_REQUEST_BYTES,
    SMALLEST_VALUE,
)
from accelmon.exporter.metrics import MetricSpec, Samples

if TYPE_CHECKING:
    from accelmon.cloudwatch.settings import CloudWatchSettings, MetricChoice


@dataclass
class Statistics:
    """The observations of one datum over one period."""

    count: int = 0
    total: float = 0.0
    minimum: float = math.inf
    maximum: float = -math.inf

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)


def _publishable(value: float) -> float | None:
    """value as CloudWatch accepts it: None for NaN, infinities and magnitudes over 2^360; tiny ones as 0."""
    if not math.isfinite(value) or abs(value) > LARGEST_VALUE:
        return None
    return 0.0 if abs(value) < SMALLEST_VALUE else value


# (metric name, unit, dimensions as ((name, value), ...)) of one datum
DatumKey = tuple[str, str, tuple[tuple[str, str], ...]]


class Aggregator:
    """Folds samples into one period's datums: gauges into statistic sets over every sample of every series that
    maps to the datum; counters into the increase over the period (a reset counts from 0, as `increase()` does)."""

    def __init__(self, settings: CloudWatchSettings, specs: dict[str, MetricSpec]) -> None:
        self.settings = settings
        # spec -> [(choice, label positions to match, device dimensions as (name, label position))]
        self.plan: dict[MetricSpec, list[tuple[MetricChoice, list[tuple[int, str]], list[tuple[str, int]]]]] = {}
        for choice in settings.metrics:
            spec = specs[choice.metric]
            where = [(spec.labels.index(label), value) for label, value in choice.match]
            device: list[tuple[str, int]] = []
            for dimension, labels in DEVICE_DIMENSIONS.items():
                label = labels[-1] if settings.gpu_dimension == "uuid" else labels[0]
                if dimension in settings.dimensions and label in spec.labels:
                    device.append((dimension, spec.labels.index(label)))
            self.plan.setdefault(spec, []).append((choice, where, device))
        self.gauges: dict[DatumKey, Statistics] = {}
        # counters: the latest value of each series, and what it was at the end of the last closed period
        self.counter_latest: dict[tuple[DatumKey, tuple[str, ...]], float] = {}
        self.counter_baseline: dict[tuple[DatumKey, tuple[str, ...]], float] = {}

    def observe(self, samples: Samples) -> None:
        for spec, choices in self.plan.items():
            rows = samples.rows.get(spec)
            if not rows:
                continue
            for choice, where, device in choices:
                for labels, value in rows:
                    if any(labels[i] != wanted for i, wanted in where):
                        continue
                    dims = tuple((name, labels[i]) for name, i in device if labels[i])
                    key = (choice.name, choice.unit, dims)
                    if spec.kind == "counter":
                        self.counter_latest[(key, labels)] = value
                    else:
                        stats = self.gauges.get(key)
                        if stats is None:
                            stats = self.gauges[key] = Statistics()
                        stats.add(value * choice.scale)

    def close(self) -> tuple[dict[DatumKey, Statistics], dict[DatumKey, float]]:
        """The period's gauge statistics and counter increases; starts the next period."""
        gauges, self.gauges = self.gauges, {}
        increases: dict[DatumKey, float] = {}
        scale = {choice.name: choice.scale for choice in self.settings.metrics}
        for series, latest in self.counter_latest.items():
            baseline = self.counter_baseline.get(series)
            if baseline is None:
                continue  # first seen: its value so far is not this period's (the energy counter counts from boot)
            increase = latest - baseline if latest >= baseline else latest
            key = series[0]
            increases[key] = increases.get(key, 0.0) + increase * scale[key[0]]
        # Series not seen this period are gone (an exited runtime): their baselines go with them.
        self.counter_baseline, self.counter_latest = dict(self.counter_latest), {}
        return gauges, increases


def datums(
    gauges: dict[DatumKey, Statistics],
    increases: dict[DatumKey, float],
    instance: list[tuple[str, str]],
    timestamp: float,
    resolution: int,
) -> list[dict[str, Any]]:
    """PutMetricData's MetricData entries for one closed period."""
    out = []
    for (name, unit, device), stats in gauges.items():
        low, high, total = _publishable(stats.minimum), _publishable(stats.maximum), _publishable(stats.total)
        if stats.count == 0 or low is None or high is None or total is None:
            continue
        values = {"SampleCount": float(stats.count), "Sum": total, "Minimum": low, "Maximum": high}
        out.append(datum(name, unit, [*instance, *device], timestamp, resolution, StatisticValues=values))
    for (name, unit, device), increase in increases.items():
        value = _publishable(increase)
        if value is not None:
            out.append(datum(name, unit, [*instance, *device], timestamp, resolution, Value=value))
    return out


def datum(
    name: str, unit: str, dims: list[tuple[str, str]], timestamp: float, resolution: int, **value: Any
) -> dict[str, Any]:
    return {
        "MetricName": name,
        "Dimensions": [{"Name": k, "Value": v[:1024]} for k, v in dims[:MAX_DIMENSIONS]],
        "Timestamp": timestamp,
        "Unit": unit,
        "StorageResolution": resolution,
        **value,
    }


def datum_size(datum: dict[str, Any]) -> int:
    """An upper bound of the datum's bytes in a request: twice its JSON text (CBOR, boto3's protocol for CloudWatch
    today, and JSON are at most that) plus 32 bytes a field (the query protocol names each field, e.g.
    `MetricData.member.7.Dimensions.member.2.Value=`). Measured on the wire by the tests."""
    fields = 8 + 2 * len(datum["Dimensions"])
    return 2 * len(json.dumps(datum, default=str)) + 32 * fields


def batches(entries: Iterable[dict[str, Any]], namespace: str) -> list[list[dict[str, Any]]]:
    """entries split into requests within PutMetricData's limits: at most 1000 datums and 1 MB each."""
    out: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    size = 200 + 3 * len(namespace)  # Action, Version, Namespace
    for entry in entries:
        entry_size = datum_size(entry)
        if current and (len(current) >= MAX_DATUMS_PER_REQUEST or size + entry_size > MAX_REQUEST_BYTES):
            out.append(current)
            current, size = [], 200 + 3 * len(namespace)
        current.append(entry)
        size += entry_size
    if current:
        out.append(current)
    return out
