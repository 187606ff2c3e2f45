"""AWS Neuron devices through the `neuron-monitor` JSON stream, which this collector runs and supervises.

Example exposition line::

    accelmon_neuroncore_utilization_ratio{runtime_tag="llama-serve",neuroncore="0"} 0.4201

The collector writes a neuron-monitor config with every metric group, starts `neuron-monitor -c CONFIG`
and reads one JSON report per line. A malformed or truncated line is skipped and counted; if neuron-monitor
exits, or prints nothing for `stall_seconds`, it is restarted with exponential backoff (counted), never in a
busy loop. Counts that neuron-monitor reports per period (execution errors and outcomes, ECC events, context
switches) are accumulated into `_total` counters; a metric group's counts are added once per capture (a
report that repeats a group with the same `period` is the same capture). Per-runtime series carry the
runtime tag (NEURON_PROCESS_TAG, else the pid) and vanish with the runtime. A runtime inside a batch job (its pid in
the job's cgroup, `job_sources.cgroups.JobOfProcess`) carries the job id on its info series, for joins at query time.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import Option, Paths, Registration, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.host.neuron_monitor import MonitorSupervisor, NeuronState, find_monitor, number, runtime_tag
from accelmon.job_sources.cgroups import JobOfProcess

log = logging.getLogger("accelmon.neuron")

INTERVAL = seconds("interval_seconds", 5, "how often the latest neuron-monitor report is turned into metrics")
PERIOD = seconds("period_seconds", 5, "the report period asked of neuron-monitor")
MONITOR_PATH = Option(
    "monitor_path",
    "neuron-monitor",
    "neuron-monitor's path, or a name looked up on PATH and then in /opt/aws/neuron/bin",
)

# AWS's neuron-monitor-prometheus.py names, and ours: for users moving their dashboards.
AWS_NAMES = [
    ("neuroncore_utilization_ratio{neuroncore}", "accelmon_neuroncore_utilization_ratio{runtime_tag,neuroncore}"),
    ("(flops not exported)", "accelmon_neuroncore_flops{runtime_tag,neuroncore}"),
    (
        "neuron_runtime_memory_used_bytes{memory_location}",
        "accelmon_neuron_runtime_memory_used_bytes{runtime_tag,memory_location}",
    ),
    (
        "neuroncore_memory_usage_{constants,model_code,...}{neuroncore}",
        "accelmon_neuroncore_memory_used_bytes{runtime_tag,neuroncore,category}",
    ),
    ("(host breakdown not exported)", "accelmon_neuron_runtime_host_memory_used_bytes{runtime_tag,category}"),
    ("neuron_runtime_vcpu_usage_ratio{usage_type}", "accelmon_neuron_runtime_vcpu_usage_ratio{runtime_tag,usage_type}"),
    ("execution_errors_total{error_type}", "accelmon_neuron_execution_errors_total{runtime_tag,error_type}"),
    ("execution_status_total{status_type}", "accelmon_neuron_execution_status_total{runtime_tag,status_type}"),
    (
        "execution_latency_seconds{percentile} (total only)",
        "accelmon_neuron_execution_latency_seconds{runtime_tag,latency=total or device,percentile}",
    ),
    (
        "hardware_ecc_events_total{event_type,neuron_device_index}",
        "accelmon_neuron_hw_ecc_events_total{neuron_device,event_type}",
    ),
    ("system_vcpu_count", "accelmon_neuron_system_vcpus"),
    (
        "system_vcpu_usage_ratio{usage_type=user or system} (modes summed)",
        "accelmon_neuron_system_vcpu_usage_ratio{usage_type} (each mode)",
    ),
    (
        "system_memory_{total,used}_bytes, system_swap_{total,used}_bytes",
        "accelmon_neuron_system_memory_{total,used}_bytes, accelmon_neuron_system_swap_{total,used}_bytes",
    ),
    ("instance_info{...}", "accelmon_neuron_instance_info{...}"),
    (
        "neuron_hardware_info{neuron_device_count,neuroncore_per_device_count}",
        "accelmon_neuron_hardware_info{neuron_device_type,neuroncore_version}, accelmon_neuron_devices, "
        "accelmon_neuroncores_per_device, accelmon_neuron_device_memory_total_bytes",
    ),
]
NOTE = "\n".join(
    [
        "Source: the JSON reports of `neuron-monitor`, which the collector runs itself. Per-period counts (execution "
        "`error_summary` and `execution_summary`, `neuron_hw_counters` ECC events, `context_switch_count`) are "
        "accumulated into `_total` counters, once per capture (a group repeated with the same `period` is not added "
        "again); everything else is the latest value. Percentages become ratios (/100). AWS's script puts the "
        "instance labels on every series; accelmon keeps them in `accelmon_neuron_instance_info` and labels "
        "per-runtime series with `runtime_tag` (NEURON_PROCESS_TAG, else the pid).",
        "",
        "| AWS `neuron-monitor-prometheus.py` | accelmon |",
        "| --- | --- |",
        *(f"| `{theirs}` | `{mine}` |" for theirs, mine in AWS_NAMES),
    ]
)

CATALOGUE = Catalogue("neuron", "AWS Neuron devices (neuron-monitor)", NOTE)
C = CATALOGUE
RT = ("runtime_tag",)
# Supervision of neuron-monitor itself.
MONITOR_UP = C.gauge(
    "accelmon_neuron_monitor_up", "1 if neuron-monitor runs and its latest report is fresh, else 0.", ()
)
RESTARTS = C.counter(
    "accelmon_neuron_monitor_restarts_total", "Times neuron-monitor was (re)started after exiting or stalling.", ()
)
MALFORMED = C.counter(
    "accelmon_neuron_monitor_malformed_lines_total",
    "Lines from neuron-monitor that were not a valid report (skipped).",
    (),
)
REPORTS = C.counter("accelmon_neuron_monitor_reports_total", "Valid reports read from neuron-monitor.", ())
LAST_REPORT = C.gauge(
    "accelmon_neuron_monitor_last_report_timestamp_seconds", "Unix time of the latest valid report (0 if none).", ()
)
GROUP_ERRORS = C.counter(
    "accelmon_neuron_monitor_group_errors_total",
    "Reports in which a metric group carried an error string, by group.",
    ["group"],
)
# instance_info and neuron_hardware_info.
INSTANCE_INFO = C.gauge(
    "accelmon_neuron_instance_info",
    "The EC2 instance neuron-monitor runs on; value is 1.",
    [
        "instance_name",
        "instance_id",
        "instance_type",
        "availability_zone",
        "availability_zone_id",
        "region",
        "ami_id",
        "subnet_id",
    ],
)
HARDWARE_INFO = C.gauge(
    "accelmon_neuron_hardware_info",
    "Type of the Neuron devices and cores; value is 1.",
    ["neuron_device_type", "neuroncore_version"],
)
DEVICES = C.gauge("accelmon_neuron_devices", "Neuron devices on the instance.", ())
CORES_PER_DEVICE = C.gauge("accelmon_neuroncores_per_device", "NeuronCores on each Neuron device.", ())
DEVICE_MEMORY = C.gauge("accelmon_neuron_device_memory_total_bytes", "Memory of each Neuron device.", ())
# Runtime-level groups.
RUNTIME_INFO = C.gauge(
    "accelmon_neuron_runtime_info",
    "A Neuron runtime being monitored; value is 1. job_id: the batch job whose cgroup holds its pid, if any.",
    [*RT, "pid", "job_id"],
)
UTILIZATION = C.gauge(
    "accelmon_neuroncore_utilization_ratio",
    "NeuronCore utilization over the captured period (0..1).",
    [*RT, "neuroncore"],
)
FLOPS = C.gauge(
    "accelmon_neuroncore_flops", "Floating point operations per second over the captured period.", [*RT, "neuroncore"]
)
EXEC_ERRORS = C.counter(
    "accelmon_neuron_execution_errors_total",
    "Execution errors by type (generic, numerical, transient, model, runtime, hardware), accumulated from the "
    "per-period counts.",
    [*RT, "error_type"],
)
EXEC_STATUS = C.counter(
    "accelmon_neuron_execution_status_total",
    "Execution outcomes (completed, completed_with_err, completed_with_num_err, timed_out, incorrect_input, "
    "failed_to_queue), accumulated from the per-period counts.",
    [*RT, "status_type"],
)
LATENCY = C.gauge(
    "accelmon_neuron_execution_latency_seconds",
    "Execution latency percentile over the captured period; latency total (runtime) or device; absent when idle.",
    [*RT, "latency", "percentile"],
)
RUNTIME_MEMORY = C.gauge(
    "accelmon_neuron_runtime_memory_used_bytes",
    "Memory used by the runtime, by location (host or neuron_device).",
    [*RT, "memory_location"],
)
HOST_MEMORY = C.gauge(
    "accelmon_neuron_runtime_host_memory_used_bytes",
    "Host memory used by the runtime, by category (application_memory, constants, dma_buffers, tensors).",
    [*RT, "category"],
)
CORE_MEMORY = C.gauge(
    "accelmon_neuroncore_memory_used_bytes",
    "Device memory used on a NeuronCore, by category (constants, model_code, model_shared_scratchpad, "
    "runtime_memory, tensors).",
    [*RT, "neuroncore", "category"],
)
LOADED_MODELS = C.gauge("accelmon_neuron_runtime_loaded_models", "Models loaded by the runtime.", RT)
RUNTIME_VCPU = C.gauge(
    "accelmon_neuron_runtime_vcpu_usage_ratio",
    "vCPU time of the runtime over the captured period (user, system).",
    [*RT, "usage_type"],
)
# System-level groups.
ECC = C.counter(
    "accelmon_neuron_hw_ecc_events_total",
    "ECC events on a Neuron device (mem/sram, corrected/uncorrected), accumulated from the per-period counts.",
    ["neuron_device", "event_type"],
)
SYSTEM_VCPU = C.gauge(
    "accelmon_neuron_system_vcpu_usage_ratio",
    "Average vCPU usage of the instance over the captured period, by mode.",
    ["usage_type"],
)
SYSTEM_VCPUS = C.gauge("accelmon_neuron_system_vcpus", "vCPUs of the instance.", ())
CONTEXT_SWITCHES = C.counter(
    "accelmon_neuron_system_context_switches_total", "vCPU context switches, accumulated from per-period counts.", ()
)
SYSTEM_MEMORY = {
    "memory_total_bytes": C.gauge("accelmon_neuron_system_memory_total_bytes", "Host memory size.", ()),
    "memory_used_bytes": C.gauge("accelmon_neuron_system_memory_used_bytes", "Host memory in use.", ()),
    "swap_total_bytes": C.gauge("accelmon_neuron_system_swap_total_bytes", "Swap size.", ()),
    "swap_used_bytes": C.gauge("accelmon_neuron_system_swap_used_bytes", "Swap in use.", ()),
}


class NeuronCollector(Collector):
    name = "neuron"

    def __init__(
        self,
        monitor: str = str(MONITOR_PATH.default),
        period_seconds: float = float(PERIOD.default),
        stall_seconds: float | None = None,
        max_backoff_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        job_of: Callable[[int], str] = lambda pid: "",
    ) -> None:
        self.job_of = job_of  # pid -> batch job id ("" for none)
        self.stall_seconds = stall_seconds if stall_seconds is not None else max(30.0, 3 * period_seconds)
        self._clock = clock
        self.state = NeuronState()
        # neuron-monitor, run and kept running by a supervisor of its own (accelmon.host.neuron_monitor)
        self.supervisor = MonitorSupervisor(
            monitor, period_seconds, self.stall_seconds, max_backoff_seconds, self.state, clock
        )

    def start(self) -> None:
        self.supervisor.start()

    def stop(self) -> None:
        self.supervisor.stop()

    # ---- sample ----
    def hardware_answering(self) -> bool:
        return self.supervisor.running and self.fresh()

    def fresh(self) -> bool:
        with self.state.lock:
            return self.state.report is not None and self._clock() - self.state.report_time <= self.stall_seconds

    def sample(self) -> Samples:
        out = Samples()
        fresh = self.fresh()
        state = self.state
        with state.lock:
            out.add(MONITOR_UP, (), 1 if self.supervisor.running and fresh else 0)
            out.add(RESTARTS, (), state.restarts)
            out.add(MALFORMED, (), state.malformed)
            out.add(REPORTS, (), state.reports)
            out.add(LAST_REPORT, (), state.report_wall_time)
            for group, count in sorted(state.group_errors.items()):
                out.add(GROUP_ERRORS, (group,), count)
            report = state.report if fresh else None
            exec_errors = dict(state.exec_errors)
            exec_status = dict(state.exec_status)
            ecc = dict(state.ecc)
            switches = state.context_switches
        if report is None:
            return out  # nothing current to say: a stalled monitor's data is not served as if it were
        self._add_info(report, out)
        for runtime in report.get("neuron_runtime_data") or []:
            self._add_runtime(runtime, out)
        for (tag, kind), value in sorted(exec_errors.items()):
            out.add(EXEC_ERRORS, (tag, kind), value)
        for (tag, kind), value in sorted(exec_status.items()):
            out.add(EXEC_STATUS, (tag, kind), value)
        for (device, event), value in sorted(ecc.items()):
            out.add(ECC, (device, event), value)
        system = report.get("system_data") or {}
        vcpu = system.get("vcpu_usage") or {}
        if not vcpu.get("error") and vcpu:
            out.add(CONTEXT_SWITCHES, (), switches)
            for mode, percent in (vcpu.get("average_usage") or {}).items():
                if number(percent) is not None:
                    out.add(SYSTEM_VCPU, (mode,), percent / 100)
            if isinstance(vcpu.get("usage_data"), dict):
                out.add(SYSTEM_VCPUS, (), len(vcpu["usage_data"]))
        memory = system.get("memory_info") or {}
        if not memory.get("error"):
            for field, spec in SYSTEM_MEMORY.items():
                size = number(memory.get(field))
                if size is not None:
                    out.add(spec, (), size)
        return out

    @staticmethod
    def _add_info(report: dict[str, Any], out: Samples) -> None:
        instance = report.get("instance_info") or {}
        if instance:
            fields = (
                "instance_name",
                "instance_id",
                "instance_type",
                "instance_availability_zone",
                "instance_availability_zone_id",
                "instance_region",
                "ami_id",
                "subnet_id",
            )
            out.add(INSTANCE_INFO, [str(instance.get(f) or "") for f in fields], 1)
        hardware = report.get("neuron_hardware_info") or {}
        if hardware and not hardware.get("error"):
            out.add(
                HARDWARE_INFO,
                [str(hardware.get("neuron_device_type", "")), str(hardware.get("neuroncore_version", ""))],
                1,
            )
            for field, spec in (
                ("neuron_device_count", DEVICES),
                ("neuroncore_per_device_count", CORES_PER_DEVICE),
                ("neuron_device_memory_size", DEVICE_MEMORY),
            ):
                value = number(hardware.get(field))
                if value is not None:
                    out.add(spec, (), value)

    def _add_runtime(self, runtime: dict[str, Any], out: Samples) -> None:
        tag = runtime_tag(runtime)
        pid = runtime.get("pid")
        job = self.job_of(pid) if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else ""
        out.add(RUNTIME_INFO, (tag, "" if pid is None else str(pid), job), 1)
        if runtime.get("error"):
            return
        groups = runtime.get("report") or {}
        counters = groups.get("neuroncore_counters") or {}
        if not counters.get("error"):
            for core, data in sorted((counters.get("neuroncores_in_use") or {}).items()):
                if number(data.get("neuroncore_utilization")) is not None:
                    out.add(UTILIZATION, (tag, core), data["neuroncore_utilization"] / 100)
                if number(data.get("flops")) is not None:
                    out.add(FLOPS, (tag, core), data["flops"])
        stats = groups.get("execution_stats") or {}
        if not stats.get("error"):
            for latency, name in (("total_latency", "total"), ("device_latency", "device")):
                for percentile, seconds in ((stats.get("latency_stats") or {}).get(latency) or {}).items():
                    if number(seconds) is not None:
                        out.add(LATENCY, (tag, name, percentile), seconds)
        memory = groups.get("memory_used") or {}
        used = memory.get("neuron_runtime_used_bytes") or {}
        if not memory.get("error") and used:
            for location in ("host", "neuron_device"):
                if number(used.get(location)) is not None:
                    out.add(RUNTIME_MEMORY, (tag, location), used[location])
            breakdown = used.get("usage_breakdown") or {}
            for category, value in sorted((breakdown.get("host") or {}).items()):
                if number(value) is not None:
                    out.add(HOST_MEMORY, (tag, category), value)
            for core, categories in sorted((breakdown.get("neuroncore_memory_usage") or {}).items()):
                for category, value in sorted(categories.items()):
                    if number(value) is not None:
                        out.add(CORE_MEMORY, (tag, core, category), value)
            if isinstance(memory.get("loaded_models"), list):
                out.add(LOADED_MODELS, (tag,), len(memory["loaded_models"]))
        vcpu = groups.get("neuron_runtime_vcpu_usage") or {}
        if not vcpu.get("error"):
            for mode, percent in sorted((vcpu.get("vcpu_usage") or {}).items()):
                if number(percent) is not None:
                    out.add(RUNTIME_VCPU, (tag, mode), percent / 100)


def _has_devices(paths: Paths, options: dict[str, Any]) -> bool:
    try:
        return any(name.startswith("neuron") for name in os.listdir(paths.devfs))
    except OSError:
        return False


REGISTRATION = register(
    Registration(
        name="neuron",
        help="AWS Neuron devices through neuron-monitor, run and supervised by the exporter (default: on where "
        "/dev/neuron* or neuron-monitor exists)",
        build=lambda options, paths: NeuronCollector(
            monitor=options["monitor_path"],
            period_seconds=options["period_seconds"],
            job_of=JobOfProcess(os.path.join(paths.sysfs, "fs", "cgroup")),
        ),
        catalogue=CATALOGUE,
        options=(INTERVAL, PERIOD, MONITOR_PATH),
        enabled_by_default=lambda paths, options: (
            _has_devices(paths, options) or find_monitor(options["monitor_path"]) is not None
        ),
        hardware_present=_has_devices,
        # neuron-monitor, our child, opens /dev/neuron<N>: the driver's "neuron" character device major.
        devices=("char-neuron rw",),
    )
)
