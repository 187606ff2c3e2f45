"""Is each GPU healthy, and if not, what to do: checks over what the collectors already sampled (no second path to
the hardware), one verdict type shared by the served metrics (the `health` collector), `accelmon-exporter --scan`
and the Slurm health check that drains a node.

A check looks at one GPU's series and answers ok, warning or failure with a detail for people and an action from
the XID catalogue's list (`accelmon.xid.ACTIONS`). A GPU's verdict is its worst check; the node's is its worst GPU
or node check. docs/health.md lists the checks, their thresholds and what each action means.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Callable, Optional

from accelmon import xid as catalogue
from accelmon.core import Samples

VERDICTS = ("ok", "warning", "failure")
# Clock-event reasons that mean the hardware slowed the GPU down (not the idle or application-clock ones).
# NVIDIA's, then AMD's (accelmon.collectors.amd.THROTTLE_BITS).
SLOWDOWN_REASONS = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "thermal_limit",
    "prochot",
)
XID_WARNING_WINDOW_SECONDS = 3600.0  # an application-class XID warns for an hour after it was logged

Labels = dict[str, str]
Gpu = tuple[str, str]  # (gpu index, uuid): the labels every GPU series carries


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # one of VERDICTS
    detail: str  # for people: never a label
    action: str = "none"  # one of accelmon.xid.ACTIONS


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

        def checks(items: list[Check]) -> list[dict[str, str]]:
            return [{"name": c.name, "verdict": c.verdict, "detail": c.detail, "action": c.action} for c in items]

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
        return "accelmon: " + "; ".join(failing)[:200]


def worst(verdicts: Iterable[str]) -> str:
    return max(verdicts, key=VERDICTS.index, default="ok")


class View:
    """The latest samples of every collector, read by metric name."""

    def __init__(self, samples: Iterable[Samples]) -> None:
        self.rows: dict[str, list[tuple[Labels, float]]] = {}
        for sample in samples:
            for spec, rows in sample.rows.items():
                self.rows.setdefault(spec.name, []).extend(
                    (dict(zip(spec.labels, values)), value) for values, value in rows
                )

    def of(self, metric: str, gpu: Optional[Gpu] = None) -> list[tuple[Labels, float]]:
        rows = self.rows.get(metric, [])
        if gpu is None:
            return rows
        return [(labels, value) for labels, value in rows if _same_gpu((labels.get("gpu"), labels.get("uuid")), gpu)]

    def value(self, metric: str, gpu: Gpu, **match: str) -> Optional[float]:
        for labels, value in self.of(metric, gpu):
            if all(labels.get(k) == v for k, v in match.items()):
                return value
        return None

    def gpus(self) -> list[Gpu]:
        """Every GPU some collector names: NVML's, and the kernel log's (a GPU that fell off the bus before the
        exporter started is only there). One GPU is one index: NVML names a GPU lost at its start without a
        UUID, the driver's procfs files still give it."""
        uuids: dict[str, str] = {}
        for metric in ("accelmon_gpu_up", "accelmon_gpu_kernel_xid_events_total"):
            for labels, _ in self.of(metric):
                index = labels.get("gpu", "")
                if index:
                    uuids[index] = uuids.get(index) or labels.get("uuid", "")
        return sorted(uuids.items(), key=lambda gpu: (int(gpu[0]) if gpu[0].isdigit() else 1 << 30, gpu[1]))


def _same_gpu(labels: tuple[Optional[str], Optional[str]], gpu: Gpu) -> bool:
    """Whether a series' (gpu, uuid) names `gpu`: the same index, and the same UUID where both have one."""
    index, uuid = labels
    return index == gpu[0] and (not uuid or not gpu[1] or uuid == gpu[1])


def _when(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def check_lost(view: View, gpu: Gpu, now: float) -> Check:
    up = view.value("accelmon_gpu_up", gpu)
    if up == 0:
        return Check(
            "gpu_lost", "failure", "the GPU stopped answering its driver library (NVML, amdsmi)", "reboot_node"
        )
    if up is None and view.of("accelmon_gpu_up"):
        return Check("gpu_lost", "failure", "the driver lists the GPU, its library (NVML) does not", "reboot_node")
    return Check("gpu_lost", "ok", "answers its driver library")


def check_xid(view: View, gpu: Gpu, now: float) -> Check:
    """Critical XIDs fail until the node reboots (the kernel log holds them since boot); the others warn for an
    hour. From the kernel log where it is read, else from NVML's events since the exporter started: each XID is
    counted from one source only."""
    findings: list[tuple[str, str, str]] = []  # (verdict, detail, action)
    if _kernel_log_readable(view):
        for labels, last in view.of("accelmon_gpu_kernel_xid_last_timestamp_seconds", gpu):
            info = catalogue.xid(int(labels["xid"]))
            if info.severity == "critical":
                findings.append(("failure", f"XID {info.code} {info.name} at {_when(last)}", info.action))
            elif info.severity == "warning" and now - last < XID_WARNING_WINDOW_SECONDS:
                findings.append(("warning", f"XID {info.code} {info.name} at {_when(last)}", info.action))
        for labels, _ in view.of("accelmon_gpu_recovery_action_state", gpu):
            if labels["action"] != "none":
                findings.append(("failure", f"the driver asks for {labels['action']} (XID 154)", labels["action"]))
    else:
        for labels, count in view.of("accelmon_gpu_xid_errors_total", gpu):
            info = catalogue.xid(int(labels["xid"]))
            if count > 0 and info.severity != "info":
                verdict = "failure" if info.severity == "critical" else "warning"
                findings.append((verdict, f"XID {info.code} {info.name} x{count:g} (NVML events)", info.action))
    if not findings:
        return Check("xid", "ok", "no XID that needs action")
    verdict = worst(f[0] for f in findings)
    chosen = [f for f in findings if f[0] == verdict]
    action = catalogue.most_disruptive([f[2] for f in chosen])
    return Check("xid", verdict, "; ".join(f[1] for f in chosen), action)


def _kernel_log_readable(view: View) -> bool:
    return any(value == 1 for _, value in view.of("accelmon_kernel_log_readable"))


def check_ecc(view: View, gpu: Gpu, now: float) -> Check:
    uncorrected = view.value("accelmon_gpu_ecc_errors_total", gpu, type="uncorrected", scope="volatile")
    if uncorrected:
        return Check("ecc", "failure", f"{uncorrected:g} uncorrectable ECC errors since the driver loaded", "reset_gpu")
    return Check("ecc", "ok", "no uncorrectable ECC error" if uncorrected is not None else "ECC not reported")


def check_memory_repair(view: View, gpu: Gpu, now: float) -> Check:
    if view.value("accelmon_gpu_remapped_rows_failure", gpu) == 1:
        return Check("memory_repair", "failure", "a row remapping failed", "hardware_service")
    if view.value("accelmon_gpu_remapped_rows_pending", gpu) == 1:
        return Check("memory_repair", "warning", "a row remapping waits for a GPU reset", "reset_gpu")
    if view.value("accelmon_gpu_retired_pages_pending", gpu) == 1:
        return Check("memory_repair", "warning", "a page retirement waits for a GPU reset", "reset_gpu")
    return Check("memory_repair", "ok", "no remapping or retirement pending or failed")


def check_slowdown(view: View, gpu: Gpu, now: float) -> Check:
    """Now, as sampled: the alert on the served state asks for it to last (`for:`)."""
    active = [
        labels["reason"]
        for labels, value in view.of("accelmon_gpu_clock_event_active", gpu)
        if value == 1 and labels.get("reason") in SLOWDOWN_REASONS
    ]
    if active:
        return Check("slowdown", "warning", "clocks held down: " + ", ".join(sorted(active)), "hardware_service")
    return Check("slowdown", "ok", "no thermal or power slowdown")


def check_pcie(view: View, gpu: Gpu, now: float) -> Check:
    """A link trained below what the GPU and its slot allow halves its bandwidth per step. Fewer lanes is a
    fault (a badly seated GPU or riser); a lower generation is one only while the GPU works: GPUs drop their link
    speed when idle, to save power."""
    width, width_max = (
        view.value("accelmon_gpu_pcie_link_width", gpu),
        view.value("accelmon_gpu_pcie_link_width_max", gpu),
    )
    generation = view.value("accelmon_gpu_pcie_link_generation", gpu)
    generation_max = view.value("accelmon_gpu_pcie_link_generation_max", gpu)
    idle = view.value("accelmon_gpu_clock_event_active", gpu, reason="gpu_idle") == 1
    degraded = []
    if width is not None and width_max and width < width_max:
        degraded.append(f"x{width:g} of x{width_max:g}")
    if generation is not None and generation_max and generation < generation_max and not idle:
        degraded.append(f"Gen{generation:g} of Gen{generation_max:g} while busy")
    if degraded:
        return Check("pcie", "warning", "PCIe link degraded: " + ", ".join(degraded), "hardware_service")
    if width is None and generation is None:
        return Check("pcie", "ok", "PCIe link not reported")
    return Check("pcie", "ok", "PCIe link at its full width" + (" (idle: lower generation is normal)" if idle else ""))


# DCGM's hardware limits: one NVLink replay or recovery error is already past the limit; CRC errors matter only at
# 100 per second and more (a rate: the alert AccelmonNvlinkCrcErrors judges it, docs/health.md).
NVLINK_ERROR_LIMIT = 1


def check_nvlink(view: View, gpu: Gpu, now: float) -> Check:
    """A link down costs the GPU its share of NVLink bandwidth (collectives slow down or fail); replays and
    recoveries since the driver loaded mean a link that retrains."""
    states = view.of("accelmon_gpu_nvlink_link_up", gpu)
    if not states:
        return Check("nvlink", "ok", "no NVLink reported")
    down = sorted((int(labels["link"]) for labels, value in states if value == 0))
    if down:
        links = ", ".join(str(link) for link in down)
        return Check(
            "nvlink",
            "failure",
            f"NVLink down: link {links} ({len(states) - len(down)} of {len(states)} up)",
            "check_fabric",
        )
    erring: dict[int, list[str]] = {}
    for labels, count in view.of("accelmon_gpu_nvlink_errors_total", gpu):
        if labels.get("type") in ("replay", "recovery") and count >= NVLINK_ERROR_LIMIT:
            erring.setdefault(int(labels["link"]), []).append(f"{count:g} {labels['type']}")
    if erring:
        detail = "; ".join(f"link {link}: {', '.join(kinds)}" for link, kinds in sorted(erring.items()))
        return Check("nvlink", "warning", f"NVLink errors since the driver loaded: {detail}", "check_fabric")
    return Check("nvlink", "ok", f"{len(states)} links up, no replay or recovery error")


def check_xgmi(view: View, gpu: Gpu, now: float) -> Check:
    """AMD's GPU-to-GPU links (collector amd): a link down to a peer costs that pair its bandwidth (RCCL falls back
    to PCIe or fails); XGMI errors since they were last reset mean a link that retrains. A GPU reset retrains the
    links; one that stays down needs service (docs/amd.md)."""
    states = view.of("accelmon_amd_gpu_xgmi_link_up", gpu)
    if not states:
        return Check("xgmi", "ok", "no XGMI reported")
    down = sorted(int(labels["link"]) for labels, value in states if value == 0)
    if down:
        links = ", ".join(str(link) for link in down)
        return Check(
            "xgmi", "failure", f"XGMI down: link {links} ({len(states) - len(down)} of {len(states)} up)", "reset_gpu"
        )
    errors = view.value("accelmon_amd_gpu_xgmi_error_state", gpu)
    if errors:
        return Check("xgmi", "warning", "XGMI errors: " + ("several" if errors >= 2 else "one"), "reset_gpu")
    return Check("xgmi", "ok", f"{len(states)} links up, no XGMI error")


FABRIC_STATES = {1: "not started", 2: "in progress", 3: "completed"}


def check_fabric(view: View, gpu: Gpu, now: float) -> Check:
    """On an NVSwitch system a GPU joins the NVLink fabric once the Fabric Manager configured it; until then
    CUDA programs on it fail to start (docs/health.md)."""
    state = view.value("accelmon_gpu_fabric_state", gpu)
    if state is None:
        return Check("fabric", "ok", "no NVLink fabric")
    manager = next((value for _, value in view.of("accelmon_fabric_manager_running")), None)
    without_manager = "; the Fabric Manager is not running" if manager == 0 else ""
    if state == 2:
        return Check("fabric", "warning", "fabric registration in progress" + without_manager, "check_fabric")
    if state != 3:
        named = FABRIC_STATES.get(int(state), f"state {state:g}")
        return Check("fabric", "failure", f"fabric registration {named}{without_manager}", "check_fabric")
    status = view.value("accelmon_gpu_fabric_status", gpu)
    if status:
        return Check("fabric", "failure", f"fabric registration failed (NVML error {status:g})", "check_fabric")
    if view.value("accelmon_gpu_fabric_bandwidth_degraded", gpu) == 1:
        return Check("fabric", "warning", "the fabric reports this GPU's NVLink bandwidth degraded", "check_fabric")
    return Check("fabric", "ok", "fabric registration completed")


# What a failing or warning DCGM health system asks for: link faults are the fabric's, memory and engine faults want
# a reset, the board's sensors and firmware a service case, the driver a reboot.
DCGM_SYSTEM_ACTIONS = {
    "pcie": "hardware_service",
    "nvlink": "check_fabric",
    "pmu": "reset_gpu",
    "mcu": "reset_gpu",
    "mem": "reset_gpu",
    "sm": "reset_gpu",
    "inforom": "hardware_service",
    "thermal": "hardware_service",
    "power": "hardware_service",
    "driver": "reboot_node",
    "nvswitch_nonfatal": "check_fabric",
    "nvswitch_fatal": "check_fabric",
}


def check_dcgm(view: View, gpu: Gpu, now: float) -> Check:
    """DCGM's own health watches, where its host engine runs: their worst system decides (messages are in the
    exporter's log; docs/health.md)."""
    states = [(labels["system"], value) for labels, value in view.of("accelmon_gpu_dcgm_health_state", gpu)]
    if not states:
        return Check("dcgm", "ok", "DCGM health watches not running")
    worst_state = max(value for _, value in states)
    if worst_state == 0:
        return Check("dcgm", "ok", f"DCGM: {len(states)} systems pass")
    verdict = VERDICTS[int(worst_state)]
    systems = sorted(system for system, value in states if value == worst_state)
    action = catalogue.most_disruptive([DCGM_SYSTEM_ACTIONS.get(system, "hardware_service") for system in systems])
    return Check("dcgm", verdict, f"DCGM health {verdict}: {', '.join(systems)}", action)


GPU_CHECKS: tuple[Callable[[View, Gpu, float], Check], ...] = (
    check_lost,
    check_xid,
    check_ecc,
    check_memory_repair,
    check_slowdown,
    check_pcie,
    check_nvlink,
    check_fabric,
    check_xgmi,
    check_dcgm,
)
CHECK_NAMES = ("gpu_lost", "xid", "ecc", "memory_repair", "slowdown", "pcie", "nvlink", "fabric", "xgmi", "dcgm")


def node_checks(view: View) -> list[Check]:
    checks = []
    readable = view.of("accelmon_kernel_log_readable")
    if readable and not _kernel_log_readable(view):
        checks.append(
            Check("kernel_log", "warning", "the kernel log is unreadable: XIDs only from NVML's events", "none")
        )
    elif readable:
        checks.append(Check("kernel_log", "ok", "read"))
    manager = view.of("accelmon_fabric_manager_running")  # served only where a GPU has a fabric
    if manager and manager[0][1] == 0:
        checks.append(
            Check(
                "fabric_manager",
                "failure",
                "the NVIDIA Fabric Manager is not running on an NVSwitch system",
                "check_fabric",
            )
        )
    elif manager:
        checks.append(Check("fabric_manager", "ok", "running"))
    return checks


def evaluate(samples: Iterable[Samples], now: float) -> NodeHealth:
    view = View(samples)
    gpus = [GpuHealth(i, uuid, [check(view, (i, uuid), now) for check in GPU_CHECKS]) for i, uuid in view.gpus()]
    return NodeHealth(gpus, node_checks(view))


def dumps(health: NodeHealth) -> str:
    return json.dumps(health.as_json(), indent=2)
