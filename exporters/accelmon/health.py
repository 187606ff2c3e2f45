"""Is each GPU healthy, and if not, what to do: checks over what the collectors already sampled (no second path to
the hardware), one verdict type shared by the served metrics (the `health` collector), `accelmon-exporter --scan`
and the Slurm and OAR health hooks that take a node out.

The checks belong to the collectors whose series they judge: a collector's `Registration` declares its `GpuCheck`s
and `NodeCheck`s (over its own metric specs), the specs whose series name the GPUs to judge (`lists_gpus`) and
whether `--scan` samples it. This module is the framework: the verdicts, the view of the latest samples, and
`evaluate`, which runs every registered check in registration order (collectors by name, then as each declares
them). A check looks at one GPU's series and answers ok, warning or failure with a detail for people and an action
from the XID catalogue's list (`accelmon.xid.ACTIONS`). A GPU's verdict is its worst check; the node's is its worst
GPU or node check. docs/health.md lists the checks, their thresholds and what each action means.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from accelmon import xid as catalogue
from accelmon.core import MetricSpec, Samples

VERDICTS = ("ok", "warning", "failure")

Labels = dict[str, str]
Gpu = tuple[str, str]  # (gpu index, uuid): the labels every GPU series carries
GpuKey = Gpu  # the same, for modules that have a Gpu class of their own


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # one of VERDICTS
    detail: str  # for people: never a label
    action: str = "none"  # one of accelmon.xid.ACTIONS
    drill: bool = False  # the verdict of a rehearsed fault (accelmon-drill), not of the hardware


@dataclass(frozen=True)
class GpuCheck:
    """A check of one GPU, declared by the collector whose series it judges."""

    name: str  # the `check` label value and the scan's name: bounded, stable
    judge: Callable[[View, Gpu, float], Check]  # (latest samples, (index, uuid), wall clock now) -> its verdict


@dataclass(frozen=True)
class NodeCheck:
    """A check of the node itself (not of a GPU): None where its series are not served (nothing to judge)."""

    name: str
    judge: Callable[[View], Optional[Check]]


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
    """A drill in force (accelmon.drill keeps them): on GPU `gpu` (its index), of check `check`, until `expires`."""

    gpu: str
    check: str
    started: float
    expires: float
    xid: int = 0


@dataclass
class GpuHealth:
    index: str
    uuid: str
    checks: list[Check] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return worst(check.verdict for check in self.checks)

    @property
    def action(self) -> str:
        """What to do first: the most disruptive action of the worst checks (a failure's, before a warning's)."""
        verdict = self.verdict
        return catalogue.most_disruptive([c.action for c in self.checks if c.verdict == verdict != "ok"])


@dataclass
class NodeHealth:
    gpus: list[GpuHealth]
    checks: list[Check]  # about the node, not one GPU (the kernel log unreadable, say)

    @property
    def verdict(self) -> str:
        return worst([*(gpu.verdict for gpu in self.gpus), *(check.verdict for check in self.checks)])

    def as_json(self) -> dict[str, object]:
        """The scan's JSON (docs/health.md): `verdict`, `checks` of the node and `gpus`, each with its checks."""

        def checks(items: list[Check]) -> list[dict[str, object]]:
            return [
                {"name": c.name, "verdict": c.verdict, "detail": c.detail, "action": c.action, "drill": c.drill}
                for c in items
            ]

        return {
            "verdict": self.verdict,
            "checks": checks(self.checks),
            "gpus": [
                {"index": g.index, "uuid": g.uuid, "verdict": g.verdict, "action": g.action, "checks": checks(g.checks)}
                for g in self.gpus
            ],
        }

    def exit_status(self) -> int:
        return VERDICTS.index(self.verdict)

    def table(self) -> str:
        """For people: one line per check that is not ok, and a line per healthy GPU."""
        lines = [f"node verdict: {self.verdict}"]
        for check in self.checks:
            if check.verdict != "ok":
                lines.append(f"  node      {check.verdict:8} {check.name:16} {check.detail} -> {check.action}")
        for gpu in self.gpus:
            bad = [check for check in gpu.checks if check.verdict != "ok"]
            if not bad:
                lines.append(f"  GPU {gpu.index:<5} ok       {len(gpu.checks)} checks passed ({gpu.uuid})")
            for check in bad:
                lines.append(f"  GPU {gpu.index:<5} {check.verdict:8} {check.name:16} {check.detail} -> {check.action}")
        return "\n".join(lines) + "\n"

    def drain_reason(self) -> str:
        """Slurm's drain reason: the failing GPUs and checks, short (Slurm keeps reasons in its state file)."""
        failing = [
            f"GPU {gpu.index} {check.name}: {check.action}"
            for gpu in self.gpus
            for check in gpu.checks
            if check.verdict == "failure"
        ]
        failing += [f"{check.name}: {check.action}" for check in self.checks if check.verdict == "failure"]
        drilled = any(check.drill and check.verdict == "failure" for gpu in self.gpus for check in gpu.checks)
        # A drill says so first, where a person reading `sinfo -R` sees it: nobody opens a hardware case for it.
        return ("accelmon DRILL, no fault: " if drilled else "accelmon: ") + "; ".join(failing)[:200]


def worst(verdicts: Iterable[str]) -> str:
    return max(verdicts, key=VERDICTS.index, default="ok")


class View:
    """The latest samples of every collector, read by metric spec.

    Every check of every GPU reads it (8 GPUs x 5-10 checks each health interval): a metric's rows become label
    dictionaries only when a check first asks for it, grouped by GPU index, so each read looks at its GPU's rows
    alone (scanning every row of 144 NVLink series for each GPU and check cost most of a health sample)."""

    def __init__(self, samples: Iterable[Samples]) -> None:
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

    def of(self, spec: MetricSpec, gpu: Optional[Gpu] = None) -> list[tuple[Labels, float]]:
        if gpu is None:
            return self._all(spec.name)
        by_index = self._by_index.get(spec.name)
        if by_index is None:
            by_index = self._by_index[spec.name] = self._grouped(spec.name)
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


def evaluate(
    samples: Iterable[Samples],
    now: float,
    registrations: Optional[Iterable[Any]] = None,
    drills: Iterable[ActiveDrill] = (),
) -> NodeHealth:
    """Every check the collectors declare, over their latest `samples` (`registrations`: every collector's by
    default; a test passes its own), with the `drills` in force written into them first."""
    if registrations is None:
        from accelmon.registry import collectors  # the registry imports this module's types

        registrations = collectors().values()
    chosen = list(registrations)
    view = View(samples)
    gpu_checks = [check for registration in chosen for check in registration.gpu_checks]
    listing = [spec for registration in chosen for spec in registration.lists_gpus]
    listed = view.gpus(listing)
    drilled = inject_drills(view, listed, chosen, drills, now)
    gpus = [
        GpuHealth(
            index,
            uuid,
            [
                drilled_check(check.judge(view, (index, uuid), now), drilled.get((index, check.name)))
                for check in gpu_checks
            ],
        )
        for index, uuid in listed
    ]
    node = [check.judge(view) for registration in chosen for check in registration.node_checks]
    return NodeHealth(gpus, [check for check in node if check is not None])


def inject_drills(
    view: View, gpus: list[Gpu], registrations: list[Any], drills: Iterable[ActiveDrill], now: float
) -> dict[tuple[str, str], ActiveDrill]:
    """Writes each drill in force on a GPU of this node into the view; which (GPU index, check) each one drills."""
    declared = {drill.check: drill for registration in registrations for drill in getattr(registration, "drills", ())}
    by_index = dict(gpus)
    injected: dict[tuple[str, str], ActiveDrill] = {}
    for active in drills:
        drill = declared.get(active.check)
        if drill is None or active.gpu not in by_index or not active.started <= now < active.expires:
            continue
        drill.inject(view, (active.gpu, by_index[active.gpu]), active.xid, active.started)
        injected[(active.gpu, active.check)] = active
    return injected


def drilled_check(check: Check, active: Optional[ActiveDrill]) -> Check:
    """A drilled check's verdict says it is a drill, in its detail, wherever a person reads it."""
    if active is None:
        return check
    ends = datetime.datetime.fromtimestamp(active.expires, datetime.timezone.utc).strftime("%H:%M UTC")
    detail = f"DRILL (accelmon-drill until {ends}), no real fault: {check.detail}"
    return Check(check.name, check.verdict, detail, check.action, drill=True)


def check_names(registrations: Optional[Iterable[Any]] = None) -> tuple[list[str], list[str]]:
    """(GPU check names, node check names) in the order `evaluate` runs them."""
    if registrations is None:
        from accelmon.registry import collectors

        registrations = collectors().values()
    chosen = list(registrations)
    return (
        [check.name for registration in chosen for check in registration.gpu_checks],
        [check.name for registration in chosen for check in registration.node_checks],
    )


def dumps(health: NodeHealth) -> str:
    return json.dumps(health.as_json(), indent=2)
