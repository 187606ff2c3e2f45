"""XIDs and SXids from the kernel log: the NVIDIA driver writes every XID there, including those NVML never
delivers as events (79, fallen off the bus; the GSP's 119 and 120 often arrive only here), and NVSwitch SXids.

Example exposition lines::

    accelmon_gpu_kernel_xid_errors_total{gpu="2",pci_bus_id="0000:38:00.0",uuid="GPU-...",xid="79"} 1.0
    accelmon_gpu_kernel_xid_last_timestamp_seconds{gpu="2",pci_bus_id="0000:38:00.0",uuid="GPU-...",xid="79"} 1.76e9
    accelmon_xid_catalogue_info{action="reboot_node",name="fallen_off_the_bus",severity="critical",xid="79"} 1.0

Reading: `/dev/kmsg` (`--path.kmsg`), non-blocking, one record per read(2) (the kernel's dev-kmsg ABI: a record is
`PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;MESSAGE` and continuation lines start with a space). A read that fails with
EPIPE means records were overwritten before they were read: the sequence numbers say how many, counted as lost,
and reading goes on. A regular file in the same format (tests, or a saved log) is followed as it grows.

Trust: an XID makes a GPU fail its health check and the node drained, so only the driver's own lines count: a
record of the kernel's facility (userspace cannot write one, accelmon.host.kmsg) whose message starts with the driver's
prefix (`NVRM: Xid (`, `nvidia-nvswitchN: SXid (`) and is in the driver's form. Other kernel messages print text
users give them (`tmpfs: Unknown parameter 'NVRM: Xid (...'` from an unprivileged mount in a user namespace);
those, records written from userspace and lines in no form the driver prints are skipped and counted in
`accelmon_kernel_log_skipped_xid_records_total{reason}`.

A GPU is named by the PCI bus id in the line, through the driver's procfs files
(`/proc/driver/nvidia/gpus/<bus id>/information`), which still list a GPU that NVML no longer reaches; `gpu` is
its place in bus order, NVML's index, as the jobs collector names GPUs.

History: what the log already holds when the exporter starts (since boot) goes into `..._errors_total` and
`..._last_timestamp_seconds`, so an XID 79 logged before the start still makes the GPU fail its health check. A
series that appears with its value is not an increase to Prometheus (`increase()` needs a sample before the
step), so old events never show as new; `accelmon_gpu_kernel_xid_events_total` counts only what is logged after
the start, present from 0 for every GPU, so the first new XID shows in `increase()`.

The kernel log and NVML's events are two views of the same XIDs (the driver logs every XID it reports): they are
never added. The health checks and rules read the kernel log's where this collector reads it
(`accelmon_collector_hardware_answering{collector="kernel_log"}`), NVML's counts otherwise: each XID counted once.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from accelmon.exporter.checks import Check, Drill, GpuCheck, GpuKey, NodeCheck, View, when, worst
from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import Paths, Registration, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.health import xid as catalogue
from accelmon.health.gpu_metrics import XID_ERRORS as NVML_XID_ERRORS
from accelmon.host.kmsg import KERNEL_FACILITY, KernelLog
from accelmon.host.nvidia import driver_gpus_by_bus, nvidia_driver_loaded

log = logging.getLogger("accelmon.kernel_log")

C = Catalogue(
    "kernel_log",
    "Kernel log: XIDs and SXids",
    "Source: the kernel log (`--path.kmsg`, default /dev/kmsg), history since boot included. XID codes are named "
    "by the catalogue in `accelmon/health/xid.py` (docs/health.md). The service reads it with CAP_SYSLOG only "
    "(ProtectKernelLogs off where this collector is on).",
)
XID_GPU = ["gpu", "uuid", "pci_bus_id"]
XID_ERRORS = C.counter(
    "accelmon_gpu_kernel_xid_errors_total",
    "XIDs in the kernel log since boot, by GPU and code (history included: a series appears with its count).",
    [*XID_GPU, "xid"],
)
XID_LAST = C.gauge(
    "accelmon_gpu_kernel_xid_last_timestamp_seconds",
    "Unix time the kernel logged the latest XID of this code for this GPU.",
    [*XID_GPU, "xid"],
)
XID_EVENTS = C.counter(
    "accelmon_gpu_kernel_xid_events_total",
    "XIDs of any code logged since the exporter started (present from 0 for every GPU, so increase() sees the first).",
    XID_GPU,
)
RECOVERY = C.gauge(
    "accelmon_gpu_recovery_action_state",
    "1 for the recovery action the driver asks of this GPU in its latest XID 154 (values: the catalogue's actions).",
    [*XID_GPU, "action"],
)
CATALOGUE_INFO = C.gauge(
    "accelmon_xid_catalogue_info",
    "The catalogue's name, severity and action of each XID code seen on this host; value is 1.",
    ["xid", "name", "severity", "action"],
)
SXID_ERRORS = C.counter(
    "accelmon_nvswitch_sxid_errors_total",
    "NVSwitch SXids in the kernel log since boot, by switch, code and the driver's Fatal/Non-fatal word.",
    ["nvswitch", "pci_bus_id", "sxid", "fatal"],
)
SXID_LAST = C.gauge(
    "accelmon_nvswitch_sxid_last_timestamp_seconds",
    "Unix time the kernel logged the latest SXid of this code for this switch.",
    ["nvswitch", "pci_bus_id", "sxid", "fatal"],
)
RECORDS = C.counter("accelmon_kernel_log_records_total", "Kernel log records read since the exporter started.")
MALFORMED = C.counter(
    "accelmon_kernel_log_malformed_records_total",
    "Records that were not in the kernel's format, or longer than the reader takes, skipped.",
)
SKIP_REASONS = ("not_kernel", "not_driver", "unparsed")
SKIPPED = C.counter(
    "accelmon_kernel_log_skipped_xid_records_total",
    "Records naming an XID or SXid that are not the NVIDIA driver's, skipped, by reason: not_kernel (not of the "
    "kernel's facility: written from userspace), not_driver (the driver's prefix not at the message's start: another "
    "message quoting it), unparsed (the prefix, not in the driver's form).",
    ["reason"],
)
LOST = C.counter(
    "accelmon_kernel_log_lost_records_total",
    "Records overwritten in the kernel's buffer before they were read (gaps in sequence numbers).",
)
READABLE = C.gauge(
    "accelmon_kernel_log_readable",
    "1 if the kernel log could be opened and read at the latest sample, else 0 (the log says why, once).",
)

INTERVAL = seconds("interval_seconds", 5.0, "how often new kernel log records are read")
XID_WARNING_WINDOW_SECONDS = 3600.0  # an application-class XID warns for an hour after it was logged

# The driver's lines, matched from the message's start only (re.match): the same text further on is a quotation.
DRIVER_PREFIX = re.compile(r"NVRM: Xid \(|nvidia-nvswitch[0-9]+: SXid \(")
# `NVRM: Xid (PCI:0000:12:00): 79, pid=..., name=..., GPU has fallen off the bus.` as open-gpu-kernel-modules'
# kernel_rc.c prints it (`PCI:%04x:%02x:%02x`, then ` GPU-I:%02u` and ` GPU-CI:%02u` on a MIG GPU; `%d, `);
# older drivers leave out `PCI:`.
XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?"
    r"(?: GPU-I:[0-9]+(?: GPU-CI:[0-9]+)?)?\): ([0-9]+), "
)
# `nvidia-nvswitch3: SXid (PCI:0000:c3:00.0): 12028, Non-fatal, Link 36 egress non-posted PRIV error (First)`, the
# NVSwitch driver's NVSWITCH_PRINT_SXID (`PCI:%04x:%02x:%02x.%x): %05d, `). Its lines without Fatal or Non-fatal
# (Correctable, the details that follow an error) are the driver's, not counted.
SXID_LINE = re.compile(
    r"nvidia-nvswitch([0-9]+): SXid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\): "
    r"([0-9]+), (?:(Non-fatal|Fatal),)?"
)
RECOVERY_LINE = re.compile(r"to 0x[0-9A-Fa-f]+ \(([^)]+)\)")


def bus_id(text: str) -> str:
    """`0000:12:00` or `00000000:12:00.0` as procfs names it: `0000:12:00.0`, lower case."""
    domain, bus, device = text.lower().split(".")[0].split(":")
    return f"{domain[-4:]}:{bus}:{device}.0"


@dataclass
class Seen:
    """One code on one device: how often since boot, the latest time, and how many since the exporter started."""

    count: int = 0
    last: float = 0.0


@dataclass
class GpuLog:
    bus: str
    xids: dict[int, Seen] = field(default_factory=dict)
    events_since_start: int = 0
    recovery: Optional[str] = None  # the action of the latest XID 154


class KernelLogCollector(Collector):
    name = "kernel_log"

    def __init__(
        self,
        kmsg: str = "/dev/kmsg",
        procfs: str = "/proc",
        wall_clock: Callable[[], float] = time.time,
        reader: Optional[KernelLog] = None,
    ) -> None:
        self.kmsg = kmsg
        self.procfs = procfs
        self._wall_clock = wall_clock
        self._log = reader if reader is not None else KernelLog(kmsg)
        self._gpus: dict[str, GpuLog] = {}
        self._switches: dict[tuple[str, str, int, bool], Seen] = {}
        self._codes: set[int] = set()
        self._names: dict[str, Any] = {}  # bus id -> the driver's GPU (index, uuid), from procfs
        self._records = 0
        self._skipped = dict.fromkeys(SKIP_REASONS, 0)
        self._history_read = False
        self._readable = False
        self._told: Optional[str] = None  # the last failure logged, so each is logged once

    def hardware_answering(self) -> bool:
        return self._readable

    def _boot_time(self) -> float:
        """Unix time of boot (`btime` of procfs's stat); a record's microseconds count from it."""
        try:
            with open(os.path.join(self.procfs, "stat"), encoding="ascii", errors="replace") as stream:
                for line in stream:
                    if line.startswith("btime "):
                        return float(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
        with open("/proc/uptime", encoding="ascii") as stream:  # this host's own, as a last resort
            return self._wall_clock() - float(stream.read().split()[0])

    def start(self) -> None:
        self._names = driver_gpus_by_bus(self.procfs)
        for bus in self._names:
            self._gpus.setdefault(bus, GpuLog(bus))

    def stop(self) -> None:
        self._log.close()

    def _read(self) -> None:
        try:
            records = self._log.records()
        except OSError as error:
            self._readable = False
            self._log.close()
            reason = f"{self.kmsg}: {error.strerror or error}"
            if reason != self._told:
                denied = error.errno in (errno.EACCES, errno.EPERM)  # EPERM: no CAP_SYSLOG under dmesg_restrict
                hint = " (the service needs CAP_SYSLOG and ProtectKernelLogs=no)" if denied else ""
                log.warning("kernel log unreadable: %s%s; XIDs come from NVML's events only", reason, hint)
                self._told = reason
            return
        if not self._readable and self._told is not None:
            log.info("kernel log readable again: %s", self.kmsg)
            self._told = None
        self._readable = True
        boot = self._boot_time() if records else 0.0
        for record in records:
            self._records += 1
            if "Xid (" in record.message:
                self._driver_line(record.facility, record.message, boot + record.microseconds / 1e6)
        # Everything up to the first time the log ran dry was there before the start: history, not events.
        self._history_read = True

    def _driver_line(self, facility: int, message: str, when: float) -> None:
        """Counts an XID or SXid if the driver logged it, else the reason it was skipped."""
        if facility != KERNEL_FACILITY:
            self._skipped["not_kernel"] += 1
            return
        if not DRIVER_PREFIX.match(message):
            self._skipped["not_driver"] += 1
            return
        match = XID_LINE.match(message)
        if match:
            bus, code = bus_id(match.group(1)), int(match.group(2))
            if bus not in self._names:
                self._names = driver_gpus_by_bus(self.procfs)  # a GPU the driver added since: named if it can be
            gpu = self._gpus.setdefault(bus, GpuLog(bus))
            seen = gpu.xids.setdefault(code, Seen())
            seen.count += 1
            seen.last = max(seen.last, when)
            self._codes.add(code)
            if self._history_read:
                gpu.events_since_start += 1
            if code == 154:
                recovery = RECOVERY_LINE.search(message)
                if recovery:
                    gpu.recovery = catalogue.RECOVERY_ACTIONS.get(recovery.group(1).strip().lower(), "none")
            return
        match = SXID_LINE.match(message)
        if match is None:
            self._skipped["unparsed"] += 1
        elif match.group(4):
            key = (match.group(1), bus_id(match.group(2)), int(match.group(3)), match.group(4) == "Fatal")
            seen = self._switches.setdefault(key, Seen())
            seen.count += 1
            seen.last = max(seen.last, when)

    def _labels(self, bus: str) -> list[str]:
        name = self._names.get(bus)
        return [name.index, name.uuid, bus] if name is not None else ["", "", bus]

    def sample(self) -> Samples:
        self._read()
        out = Samples()
        for bus, gpu in sorted(self._gpus.items()):
            labels = self._labels(bus)
            out.add(XID_EVENTS, labels, gpu.events_since_start)
            for code, seen in sorted(gpu.xids.items()):
                out.add(XID_ERRORS, [*labels, str(code)], seen.count)
                out.add(XID_LAST, [*labels, str(code)], seen.last)
            if gpu.recovery is not None:
                out.add(RECOVERY, [*labels, gpu.recovery], 1)
        for code in sorted(self._codes):
            info = catalogue.xid(code)
            out.add(CATALOGUE_INFO, [str(code), info.name, info.severity, info.action], 1)
        for (switch, bus, code, fatal), seen in sorted(self._switches.items()):
            labels = [switch, bus, str(code), "true" if fatal else "false"]
            out.add(SXID_ERRORS, labels, seen.count)
            out.add(SXID_LAST, labels, seen.last)
        out.add(RECORDS, [], self._records)
        out.add(MALFORMED, [], self._log.malformed)
        for reason in SKIP_REASONS:
            out.add(SKIPPED, [reason], self._skipped[reason])
        out.add(LOST, [], self._log.lost)
        out.add(READABLE, [], 1 if self._readable else 0)
        return out


def check_xid(view: View, gpu: GpuKey, now: float) -> Check:
    """Critical XIDs fail until the node reboots (the kernel log holds them since boot), or, for those whose action
    is reset_gpu, until the repair loop resets the GPU (accelmon.health.remediation); the others warn for an hour. From
    the kernel log where it is read, else from NVML's events since the exporter started: each XID is counted from one
    source only."""
    findings: list[tuple[str, str, str]] = []  # (verdict, detail, action)
    if _kernel_log_readable(view):
        reset = view.reset_at(gpu)
        for labels, last in view.of(XID_LAST, gpu):
            info = catalogue.xid(int(labels["xid"]))
            if reset is not None and last <= reset and info.action == "reset_gpu":
                continue  # what a GPU reset clears, logged before the repair loop's reset: acted on
            if info.severity == "critical":
                findings.append(("failure", f"XID {info.code} {info.name} at {when(last)}", info.action))
            elif info.severity == "warning" and now - last < XID_WARNING_WINDOW_SECONDS:
                findings.append(("warning", f"XID {info.code} {info.name} at {when(last)}", info.action))
        for labels, _ in view.of(RECOVERY, gpu):
            if labels["action"] != "none":
                findings.append(("failure", f"the driver asks for {labels['action']} (XID 154)", labels["action"]))
    else:
        for labels, count in view.of(NVML_XID_ERRORS, gpu):
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


def drill_xid(view: View, gpu: GpuKey, xid: int, started: float) -> None:
    """The XID as the check would meet it: in the kernel log where that is read, else among NVML's events."""
    if _kernel_log_readable(view):
        view.put(XID_LAST, gpu, started, xid=str(xid))
    else:
        view.put(NVML_XID_ERRORS, gpu, 1, xid=str(xid))


def _kernel_log_readable(view: View) -> bool:
    return any(value == 1 for _, value in view.of(READABLE))


def check_kernel_log(view: View) -> Optional[Check]:
    readable = view.of(READABLE)
    if not readable:
        return None
    if not _kernel_log_readable(view):
        return Check("kernel_log", "warning", "the kernel log is unreadable: XIDs only from NVML's events", "none")
    return Check("kernel_log", "ok", "read")


def _nvidia_driver_or_log_given(paths: Paths, options: dict[str, Any]) -> bool:
    """On by default where the NVIDIA driver is loaded (it is what writes XIDs), and wherever a kernel log other
    than /dev/kmsg is named (`--path.kmsg`, `paths.kmsg`): a path given on purpose is never silently ignored."""
    return nvidia_driver_loaded(paths, options) or paths.kmsg != Paths.kmsg


REGISTRATION = register(
    Registration(
        name="kernel_log",
        help="XIDs and NVSwitch SXids from the kernel log, named by the XID catalogue",
        build=lambda options, paths: KernelLogCollector(kmsg=paths.kmsg, procfs=paths.procfs),
        catalogue=C,
        options=(INTERVAL,),
        # Not hardware: an unreadable log is reported by accelmon_kernel_log_readable and the node's health check
        # (a permission to grant), not as hardware that does not answer.
        enabled_by_default=_nvidia_driver_or_log_given,
        devices=("/dev/kmsg r",),
        # Reading /dev/kmsg where kernel.dmesg_restrict=1 (Debian's and Ubuntu's default) needs CAP_SYSLOG.
        capabilities=("CAP_SYSLOG",),
        gpu_checks=(
            GpuCheck(
                "xid",
                check_xid,
                source="the kernel log where it is read, else NVML's XID events",
                failure="a critical XID since boot, or XID 154 asking for a recovery (the catalogue's action)",
                warning="a warning-class XID in the last hour (kernel log) or since the exporter started (NVML)",
            ),
        ),
        drills=(Drill("xid", drill_xid, takes_xid=True),),
        node_checks=(
            NodeCheck(
                "kernel_log",
                check_kernel_log,
                source="`accelmon_kernel_log_readable`",
                warning="the kernel log is unreadable: XIDs from NVML only",
            ),
        ),
        # A GPU that fell off the bus before the exporter started is named only here.
        lists_gpus=(XID_EVENTS,),
        scan=True,
    )
)
