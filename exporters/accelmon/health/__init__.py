"""Is each GPU healthy, and if not, what to do: checks over what the collectors already sampled (no second path to
the hardware), one verdict type shared by the served metrics (the `health` collector), `accelmon-exporter --scan`
and the Slurm and OAR health hooks that take a node out.

The checks belong to the collectors whose series they judge: a collector's `Registration` declares its `GpuCheck`s
and `NodeCheck`s (`accelmon.exporter.checks`, over its own metric specs), the specs whose series name the GPUs to judge
(`lists_gpus`) and whether `--scan` samples it. This module combines them: `evaluate` runs the checks of the
collectors it is given (those running on this node: a check whose collector does not run gives no verdict, not a
false "ok") in registration order (collectors by name, then as each declares them). A GPU's verdict is its worst
check; the node's is its worst GPU or node check. docs/health.md lists the checks, their thresholds and what each
action means.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Optional, TypeVar

from accelmon.exporter.checks import VERDICTS, ActiveDrill, Check, Gpu, GpuCheck, NodeCheck, View, worst
from accelmon.exporter.metrics import Samples
from accelmon.exporter.registry import Registration
from accelmon.health import xid as catalogue
from accelmon.health.gpu_metrics import INFO, MIG_MODE, UP

Checked = TypeVar("Checked", GpuCheck, NodeCheck)
# What each NVLink leads to, as the fabric collector serves it (accelmon.collectors.fabric.LINK_REMOTE): read by name,
# because collectors build on health and never the other way round (tests/test_layout.py keeps the two names equal).
NVLINK_REMOTE = "accelmon_gpu_nvlink_remote_info"


@dataclass
class GpuHealth:
    index: str
    uuid: str
    checks: list[Check] = field(default_factory=list)
    serial: str = ""  # the board's serial (NVML, amdsmi): the repair journal's key, "" where not reported
    pci_bus_id: str = ""  # what a GPU reset names it by
    # What decides which GPUs a reset must take together (accelmon.health.reset_scope): "9.0", "" where not reported
    compute_capability: str = ""
    mig_mode: bool = False
    nvlink_remotes: tuple[tuple[str, str], ...] = ()  # (remote type, remote PCI bus id) of each link
    # Whether it answered its driver library (accelmon_gpu_up 1) in this sample: a GPU that did not was judged over
    # no data, and after a repair that is no pass (accelmon.schedulers.slurm.repair.not_back).
    answers: bool = True

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
    # The collectors this node should sample that did not (failed, or past the scan's deadline): set by the scan.
    unsampled: tuple[str, ...] = ()

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
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "serial": g.serial,
                    "verdict": g.verdict,
                    "action": g.action,
                    "checks": checks(g.checks),
                }
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


def evaluate(
    samples: Iterable[Samples],
    now: float,
    registrations: Iterable[Registration],
    drills: Iterable[ActiveDrill] = (),
    resets: Optional[dict[str, float]] = None,
) -> NodeHealth:
    """The checks the `registrations` declare (the collectors running on this node), over their latest `samples`,
    with the `drills` in force written into them first; `resets`: GPU uuid -> the time of its last GPU reset by the
    repair loop."""
    chosen = list(registrations)
    view = View(samples, resets)
    gpu_checks = unique(check for registration in chosen for check in registration.gpu_checks)
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
            view.label(INFO, (index, uuid), "serial"),
            view.label(INFO, (index, uuid), "pci_bus_id"),
            view.label(INFO, (index, uuid), "cuda_compute_capability"),
            any(value == 1 for _, value in view.of(MIG_MODE, (index, uuid))),
            tuple(
                sorted(
                    {
                        (labels["remote_type"], labels["remote_pci_bus_id"])
                        for labels, _ in view.of(NVLINK_REMOTE, (index, uuid))
                    }
                )
            ),
            view.value(UP, (index, uuid)) == 1,
        )
        for index, uuid in listed
    ]
    node = [check.judge(view) for check in unique(c for registration in chosen for c in registration.node_checks)]
    return NodeHealth(gpus, [check for check in node if check is not None])


def unique(checks: Iterable[Checked]) -> list[Checked]:
    """Each check once, where it was first declared: the GPU device checks (accelmon.health.gpu_metrics) are declared by
    every collector that serves the GPU device series (nvml, amd), so they run wherever one of them does."""
    seen: set[int] = set()
    kept = []
    for check in checks:
        if id(check) not in seen:
            seen.add(id(check))
            kept.append(check)
    return kept


def inject_drills(
    view: View, gpus: list[Gpu], registrations: list[Registration], drills: Iterable[ActiveDrill], now: float
) -> dict[tuple[str, str], ActiveDrill]:
    """Writes each drill in force on a GPU of this node into the view; which (GPU index, check) each one drills.
    A drill of a check whose collector does not run here is not judged (there is nothing to judge it with)."""
    declared = {drill.check: drill for registration in registrations for drill in registration.drills}
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


def check_names(registrations: Iterable[Registration]) -> tuple[list[str], list[str]]:
    """(GPU check names, node check names) in the order `evaluate` runs them."""
    chosen = list(registrations)
    return (
        [check.name for check in unique(c for registration in chosen for c in registration.gpu_checks)],
        [check.name for check in unique(c for registration in chosen for c in registration.node_checks)],
    )


def dumps(health: NodeHealth) -> str:
    return json.dumps(health.as_json(), indent=2)
