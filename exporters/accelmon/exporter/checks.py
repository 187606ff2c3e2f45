"""What a collector declares about its judgement, and what its checks read: the verdict of one check (`Check`),
a check of a GPU or of the node (`GpuCheck`, `NodeCheck`), a rehearsable fault (`Drill`, and `ActiveDrill`, one in
force), and the `View` of the latest samples a check reads.

A check looks at one GPU's series and answers ok, warning or failure with a detail for people and an action from
the XID catalogue's list (`accelmon.health.xid.ACTIONS`). `accelmon.exporter.registry` imports these types for a
collector's `Registration`; `accelmon.health` runs the registered checks and combines their verdicts.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Callable, Optional, Union

from accelmon.exporter.metrics import MetricSpec, Samples

VERDICTS = ("ok", "warning", "failure")

Labels = dict[str, str]
Gpu = tuple[str, str]  # (gpu index, uuid): the labels every GPU series carries
GpuKey = Gpu  # the same, for modules that have a Gpu class of their own


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # one of VERDICTS
    detail: str  # for people: never a label
    action: str = "none"  # one of accelmon.health.xid.ACTIONS
    drill: bool = False  # the verdict of a rehearsed fault (accelmon-drill), not of the hardware


@dataclass(frozen=True)
class GpuCheck:
    """A check of one GPU, declared by the collector whose series it judges."""

    name: str  # the `check` label value and the scan's name: bounded, stable
    judge: Callable[[View, Gpu, float], Check]  # (latest samples, (index, uuid), wall clock now) -> its verdict
    # For docs/health.md's table of checks (generated: python -m accelmon.catalogue --checks): what it reads, and
    # what fails and what warns, with the action in backquotes.
    source: str = ""
    failure: str = ""
    warning: str = ""


@dataclass(frozen=True)
class NodeCheck:
    """A check of the node itself (not of a GPU): None where its series are not served (nothing to judge)."""

    name: str
    judge: Callable[[View], Optional[Check]]
    source: str = ""  # as GpuCheck's
    failure: str = ""
    warning: str = ""


@dataclass(frozen=True)
class Drill:
    """A fault rehearsed on one GPU (accelmon-drill), declared by the collector whose check it rehearses: `inject`
    writes into the latest samples what the fault would show (a GPU that stops answering, an XID in the log), so the
    check judges it with its own code and catalogue. Only the judgement sees it: the served device series, the
    kernel log and the driver stay as they are."""

    check: str  # the GPU check it rehearses (its name, as `accelmon-drill start --check` takes it)
    inject: Callable[[View, Gpu, int, float], None]  # (view, GPU, XID code or 0, drill's start) -> None
    takes_xid: bool = False  # rehearses an XID: `--xid CODE` says which


@dataclass(frozen=True)
class ActiveDrill:
    """A drill in force (accelmon.drills.drill keeps them): on GPU `gpu` (its index), of check `check`, until
    `expires`."""

    gpu: str
    check: str
    started: float
    expires: float
    xid: int = 0


def worst(verdicts: Iterable[str]) -> str:
    return max(verdicts, key=VERDICTS.index, default="ok")


class View:
    """The latest samples of every collector, read by metric spec.

    Every check of every GPU reads it (8 GPUs x 5-10 checks each health interval): a metric's rows become label
    dictionaries only when a check first asks for it, grouped by GPU index, so each read looks at its GPU's rows
    alone (scanning every row of 144 NVLink series for each GPU and check cost most of a health sample)."""

    def __init__(self, samples: Iterable[Samples], resets: Optional[dict[str, float]] = None) -> None:
        # GPU uuid -> when the GPU was last reset by the repair loop (accelmon.health.remediation's journal): what a
        # reset clears is judged from then on (the xid check).
        self.resets = resets or {}
        self._sampled: dict[str, list[tuple[tuple[str, ...], list[tuple[tuple[str, ...], float]]]]] = {}
        for sample in samples:
            for spec, rows in sample.rows.items():
                self._sampled.setdefault(spec.name, []).append((spec.labels, rows))
        self._rows: dict[str, list[tuple[Labels, float]]] = {}  # every row of a metric (`of` without a GPU, `put`)
        # metric -> GPU index -> (its rows in order, the UUIDs they name): one UUID (the usual case) needs no filter
        self._by_index: dict[str, dict[Optional[str], tuple[list[tuple[Labels, float]], set[Optional[str]]]]] = {}

    def _all(self, name: str) -> list[tuple[Labels, float]]:
        rows = self._rows.get(name)
        if rows is None:
            rows = self._rows[name] = [
                (dict(zip(label_names, values)), value)
                for label_names, sampled in self._sampled.get(name, ())
                for values, value in sampled
            ]
        return rows

    def _grouped(self, name: str) -> dict[Optional[str], tuple[list[tuple[Labels, float]], set[Optional[str]]]]:
        """A metric's rows by GPU index, made from the label tuples in one pass (from the label dictionaries
        once a drill has changed them)."""
        grouped: dict[Optional[str], tuple[list[tuple[Labels, float]], set[Optional[str]]]] = {}
        if name in self._rows:
            for row in self._rows[name]:
                rows, uuids = grouped.setdefault(row[0].get("gpu"), ([], set()))
                rows.append(row)
                uuids.add(row[0].get("uuid"))
            return grouped
        for label_names, sampled in self._sampled.get(name, ()):
            at_gpu = label_names.index("gpu") if "gpu" in label_names else None
            at_uuid = label_names.index("uuid") if "uuid" in label_names else None
            for values, value in sampled:
                entry = grouped.get(values[at_gpu] if at_gpu is not None else None)
                if entry is None:
                    entry = grouped[values[at_gpu] if at_gpu is not None else None] = ([], set())
                entry[0].append((dict(zip(label_names, values)), value))
                entry[1].add(values[at_uuid] if at_uuid is not None else None)
        return grouped

    def of(self, spec: Union[MetricSpec, str], gpu: Optional[Gpu] = None) -> list[tuple[Labels, float]]:
        """The rows of `spec` (or of the metric so named: one another package serves), of `gpu` or all."""
        name = spec if isinstance(spec, str) else spec.name
        if gpu is None:
            return self._all(name)
        by_index = self._by_index.get(name)
        if by_index is None:
            by_index = self._by_index[name] = self._grouped(name)
        rows, uuids = by_index.get(gpu[0], ([], set()))
        if len(uuids) == 1:
            return rows if _same_gpu((gpu[0], next(iter(uuids))), gpu) else []
        return [row for row in rows if _same_gpu((row[0].get("gpu"), row[0].get("uuid")), gpu)]

    def put(self, spec: MetricSpec, gpu: Gpu, value: float, **labels: str) -> None:
        """A drill's fault: the series of `spec` for `gpu` with `labels` now reads `value` (added if absent)."""
        index, uuid = gpu
        rows = self._all(spec.name)
        rows[:] = [
            row
            for row in rows
            if not (
                _same_gpu((row[0].get("gpu"), row[0].get("uuid")), gpu)
                and all(row[0].get(k) == v for k, v in labels.items())
            )
        ]
        rows.append(({**{name: "" for name in spec.labels}, "gpu": index, "uuid": uuid, **labels}, value))
        self._by_index.pop(spec.name, None)

    def reset_at(self, gpu: Gpu) -> Optional[float]:
        return self.resets.get(gpu[1]) if gpu[1] else None

    def label(self, spec: MetricSpec, gpu: Gpu, name: str) -> str:
        """Label `name` of the GPU's first series of `spec` ("" where it has none)."""
        return next((labels.get(name, "") for labels, _ in self.of(spec, gpu)), "")

    def value(self, spec: MetricSpec, gpu: Gpu, **match: str) -> Optional[float]:
        for labels, value in self.of(spec, gpu):
            if all(labels.get(k) == v for k, v in match.items()):
                return value
        return None

    def gpus(self, listing: Iterable[MetricSpec]) -> list[Gpu]:
        """Every GPU the `listing` series name (the collectors' `lists_gpus`: NVML's and amdsmi's, and the kernel
        log's, where a GPU that fell off the bus before the exporter started is only there). One GPU is one index:
        NVML names a GPU lost at its start without a UUID, the driver's procfs files still give it."""
        uuids: dict[str, str] = {}
        for spec in listing:
            for labels, _ in self.of(spec):
                index = labels.get("gpu", "")
                if index:
                    uuids[index] = uuids.get(index) or labels.get("uuid", "")
        return sorted(uuids.items(), key=lambda gpu: (int(gpu[0]) if gpu[0].isdigit() else 1 << 30, gpu[1]))


def _same_gpu(labels: tuple[Optional[str], Optional[str]], gpu: Gpu) -> bool:
    """Whether a series' (gpu, uuid) names `gpu`: the same index, and the same UUID where both have one."""
    index, uuid = labels
    return index == gpu[0] and (not uuid or not gpu[1] or uuid == gpu[1])


def when(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
