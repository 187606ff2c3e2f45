"""The report's queries: the job found in Prometheus from `accelmon_gpu_job_info`, and every metric of its GPUs
and nodes over its window as a tidy table (time, node, gpu, uuid, metric, value), each series kept under
Prometheus's 11,000 points by the step."""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

MAX_POINTS = 11_000  # Prometheus refuses a range query whose series would have more points
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}  # Prometheus's duration units
JOB_ID = re.compile(r"^[A-Za-z0-9_.\[\]-]{1,64}$")

# (name in the table, PromQL per GPU joined to the job, unit, title). `{job}` is the job's info selector.
GPU_METRICS = (
    ("utilization", "accelmon_gpu_utilization_ratio", "ratio", "GPU utilization"),
    ("memory_used_bytes", "accelmon_gpu_memory_used_bytes", "bytes", "GPU memory used"),
    ("memory_total_bytes", "accelmon_gpu_memory_total_bytes", "bytes", "GPU memory installed"),
    ("power_watts", "accelmon_gpu_power_watts", "W", "GPU power"),
    ("temperature_celsius", "accelmon_gpu_temperature_celsius", "°C", "GPU temperature"),
    ("sm_clock_hertz", "accelmon_gpu_sm_clock_hertz", "Hz", "SM clock"),
    ("sm_active", "accelmon_gpu_sm_active_ratio", "ratio", "SM active (profiling)"),
    ("tensor_active", "accelmon_gpu_tensor_active_ratio", "ratio", "Tensor pipes active (profiling)"),
    ("energy_joules_total", "accelmon_gpu_energy_joules_total", "J", "GPU energy counter"),
    ("xid_events_total", "accelmon_gpu_xid_events_total", "", "XID events"),
    ("clock_events", "max by (instance, uuid) (accelmon_gpu_clock_event_active)", "", "Clock events active"),
    # A part at fault on the GPU's path (the recording rule accelmon:gpu_path_fault): the straggler's reasons.
    (
        "link_fault",
        'max by (instance, uuid) (accelmon:gpu_path_fault{part=~"pcie_link|nvlink"})',
        "",
        "PCIe or NVLink link at fault",
    ),
    (
        "nic_fault",
        'max by (instance, uuid) (accelmon:gpu_path_fault{part="nic_port",via=""})',
        "",
        "The NIC the GPU's traffic leaves by at fault",
    ),
)
# Per node: (name, PromQL with {nodes}, {window} and {job}, unit, title).
NODE_METRICS = (
    ("cpu_utilization", '1 - avg by (node) (rate(node_cpu_seconds_total{{mode="idle",node=~"{nodes}"}}[{window}]))',
     "ratio", "Host CPU utilization"),
    ("host_memory_used_bytes",
     'sum by (node) (node_memory_MemTotal_bytes{{node=~"{nodes}"}}'
     ' - node_memory_MemAvailable_bytes{{node=~"{nodes}"}})',
     "bytes", "Host memory used"),
    ("infiniband_receive_bytes_per_second",
     'sum by (node) (rate(accelmon_infiniband_port_data_received_bytes_total{{node=~"{nodes}"}}[{window}]))',
     "B/s", "InfiniBand received"),
    ("infiniband_transmit_bytes_per_second",
     'sum by (node) (rate(accelmon_infiniband_port_data_transmitted_bytes_total{{node=~"{nodes}"}}[{window}]))',
     "B/s", "InfiniBand transmitted"),
    # The job's own cgroup on each node (collector job_resources): CPU cores used and given, memory, swap, I/O.
    ("job_cpu_cores_used",
     'sum by (node) (rate(accelmon_job_cpu_seconds_total{{job_id="{job}",node=~"{nodes}"}}[{window}]))',
     "cores", "The job's CPU cores in use"),
    ("job_cpu_throttled",
     'sum by (node) (rate(accelmon_job_cpu_throttled_seconds_total{{job_id="{job}",node=~"{nodes}"}}[{window}]))',
     "s/s", "The job's CPU time held back by its quota"),
    ("job_cpus_allocated", 'sum by (node) (accelmon_job_cpus_allocated{{job_id="{job}",node=~"{nodes}"}})',
     "cores", "The job's CPUs"),
    ("job_memory_used_bytes", 'sum by (node) (accelmon_job_memory_used_bytes{{job_id="{job}",node=~"{nodes}"}})',
     "bytes", "The job's memory"),
    ("job_memory_limit_bytes", 'sum by (node) (accelmon_job_memory_limit_bytes{{job_id="{job}",node=~"{nodes}"}})',
     "bytes", "The job's memory limit"),
    ("job_swap_used_bytes", 'sum by (node) (accelmon_job_swap_used_bytes{{job_id="{job}",node=~"{nodes}"}})',
     "bytes", "The job's swap"),
    ("job_io_bytes_per_second",
     'sum by (node) (rate(accelmon_job_io_bytes_total{{job_id="{job}",node=~"{nodes}"}}[{window}]))',
     "B/s", "The job's block I/O"),
    # The job's perf counters (collector job_perf, where enabled): IPC, FLOPS, cache misses, context switches.
    ("job_instructions_per_second",
     'sum by (node) (rate(accelmon_job_instructions_total{{job_id="{job}",node=~"{nodes}"}}[{window}]))',
     "1/s", "The job's instructions retired"),
    ("job_cycles_per_second",
     'sum by (node) (rate(accelmon_job_cpu_cycles_total{{job_id="{job}",node=~"{nodes}"}}[{window}]))',
     "1/s", "The job's CPU cycles"),
    ("job_flops",
     'sum by (node) (rate(accelmon_job_floating_point_operations_total{{job_id="{job}",node=~"{nodes}"}}[{window}]))',
     "FLOP/s", "The job's floating-point operations"),
    ("job_double_flops",
     'sum by (node) (rate(accelmon_job_floating_point_operations_total{{job_id="{job}",precision="double",'
     'node=~"{nodes}"}}[{window}]))',
     "FLOP/s", "The job's double-precision operations"),
    ("job_cache_misses_per_second",
     'sum by (node) (rate(accelmon_job_cache_misses_total{{job_id="{job}",node=~"{nodes}"}}[{window}]))',
     "1/s", "The job's cache misses"),
    ("job_context_switches_per_second",
     'sum by (node) (rate(accelmon_job_context_switches_total{{job_id="{job}",node=~"{nodes}"}}[{window}]))',
     "1/s", "The job's context switches"),
    # CPU power (RAPL through node_exporter), and the job's share of the node's busy CPU time: the job's CPU energy
    # is the node's times that share (an estimate: RAPL measures packages, not processes; docs/jobs.md).
    ("cpu_power_watts",
     'sum by (node) (rate({{__name__=~"node_rapl_(package|dram)_joules_total",node=~"{nodes}"}}[{window}]))',
     "W", "CPU power (RAPL)"),
    ("job_cpu_share",
     'sum by (node) (rate(accelmon_job_cpu_seconds_total{{job_id="{job}",node=~"{nodes}"}}[{window}]))'
     # The node's busy CPU seconds a second: its CPUs less their idle and iowait time (the modes the master keeps
     # of node_exporter's per-CPU series, accelmon_master_node_exporter_series).
     ' / (count by (node) (node_cpu_seconds_total{{mode="idle",node=~"{nodes}"}})'
     ' - sum by (node) (rate(node_cpu_seconds_total{{mode=~"idle|iowait",node=~"{nodes}"}}[{window}])))',
     "ratio", "The job's share of the node's busy CPU time"),
    # The cores of the job's own Neuron runtimes (placed in the job by their cgroup), not the whole node's.
    ("neuroncore_utilization",
     'avg by (node) (accelmon_neuroncore_utilization_ratio{{node=~"{nodes}"}} * on (instance, runtime_tag)'
     ' group_left () max by (instance, runtime_tag) (accelmon_neuron_runtime_info{{job_id="{job}"}}))',
     "ratio", "NeuronCore utilization"),
)  # fmt: skip


class ReportError(Exception):
    """What went wrong, said to the user; `status` is the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


class Prometheus:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ReportError(f"--prometheus {url!r}: expected an http:// or https:// URL", 2)
        self.url = url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str, **params: Any) -> Any:
        address = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(address, timeout=self.timeout) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as error:
            try:
                detail = json.load(error).get("error", "")
            except (ValueError, OSError):
                detail = ""
            raise ReportError(
                f"Prometheus at {self.url} refused {path}: HTTP {error.code} {detail}".rstrip()
            ) from error
        except (OSError, ValueError) as error:
            raise ReportError(f"Prometheus at {self.url} does not answer: {error}") from error
        if answer.get("status") != "success":
            raise ReportError(f"Prometheus at {self.url}: {answer.get('error', answer)}")
        return answer["data"]

    def range(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query whose last point is `end` itself (Prometheus counts its points from `start`: a window
        that is not a whole number of steps would stop short of `end` and miss what happened there)."""
        start = end - math.ceil((end - start) / step) * step
        return self.get("/api/v1/query_range", query=query, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")[
            "result"
        ]

    def instant(self, query: str, at: float) -> list[dict[str, Any]]:
        return self.get("/api/v1/query", query=query, time=f"{at:.3f}")["result"]

    def retention_seconds(self) -> float | None:
        try:
            text = self.get("/api/v1/status/runtimeinfo").get("storageRetention", "")
        except ReportError:
            return None
        match = re.match(r"^(\d+)([smhdwy])", text)  # "15d", "15d or 512MiB"
        if not match:
            return None
        return (
            int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}[match.group(2)]
        )


def duration_seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)([smhdw])", text)
    if not match:
        raise ReportError(f"--lookback {text!r}: expected a number and a unit, e.g. 30d, 12h", 2)
    return int(match.group(1)) * UNIT_SECONDS[match.group(2)]


def step_for(seconds: float, floor: float = 1.0) -> float:
    """A step that keeps `seconds` under Prometheus's 11,000 points, and never under `floor`."""
    return max(floor, math.ceil(seconds / (MAX_POINTS - 100)))


@dataclass
class Job:
    job_id: str
    user: str
    account: str
    start: float
    end: float
    step: float
    gpus: list[tuple[str, str, str]]  # (node, gpu, uuid)

    @property
    def nodes(self) -> list[str]:
        return sorted({node for node, _, _ in self.gpus})

    @property
    def duration(self) -> float:
        return self.end - self.start


def find_job(prometheus: Prometheus, job_id: str, lookback: float, now: float) -> Job:
    """The job's window (first and last time its info series were seen), its GPUs, user and account."""
    selector = f'accelmon_gpu_job_info{{job_id="{job_id}"}}'

    def held(step: float) -> str:
        # max_over_time over each step's whole span: a job shorter than the step is still seen (a plain selector
        # is evaluated at the step's instant only, and a 45 s job falls between two points 4 minutes apart).
        return f"max by (node, gpu, uuid, user, account) (max_over_time({selector}[{int(step)}s]))"

    coarse = step_for(lookback, 15)
    series = prometheus.range(held(coarse), now - lookback, now, coarse)
    if not series:
        raise ReportError(
            f"job {job_id}: no GPU was attributed to it in the last {lookback / 86400:g} days: an unknown job id, a "
            "job that held no GPU, or one older than that (--lookback, and Prometheus's retention)",
            3,
        )
    seen = [float(t) for s in series for t, _ in s["values"]]
    first, last = min(seen) - coarse, max(seen)  # a coarse point covers the step before it
    # The coarse pass finds the job to within a step; a second pass over that neighbourhood finds its edges.
    start, end = max(now - lookback, first - coarse), min(now, last + coarse)
    step = step_for(end - start)
    series = prometheus.range(held(step), start, end, step)
    seen = [float(t) for s in series for t, _ in s["values"]] or [first, last]
    first, last = min(seen), max(seen)
    retention = prometheus.retention_seconds()
    if first <= now - lookback + coarse:
        raise ReportError(
            f"job {job_id} was already running {lookback / 86400:g} days ago: widen --lookback to see its start", 3
        )
    if retention is not None and first <= now - retention + 2 * coarse:
        raise ReportError(
            f"job {job_id} started before the oldest data Prometheus keeps (retention {retention / 86400:g} days): "
            "a report would miss its beginning",
            3,
        )
    labels = series[0]["metric"] if series else {}
    gpus = sorted(
        {(s["metric"].get("node", ""), s["metric"].get("gpu", ""), s["metric"].get("uuid", "")) for s in series}
    )
    step = step_for(last - first)
    return Job(job_id, labels.get("user", ""), labels.get("account", ""), first, last, step, gpus)


@dataclass
class Rows:
    """The tidy table being built: (time, node, gpu, uuid, metric, value)."""

    time: list[float] = field(default_factory=list)
    node: list[str] = field(default_factory=list)
    gpu: list[str] = field(default_factory=list)
    uuid: list[str] = field(default_factory=list)
    metric: list[str] = field(default_factory=list)
    value: list[float] = field(default_factory=list)

    def add(self, series: list[dict[str, Any]], name: str) -> None:
        for one in series:
            labels = one["metric"]
            for stamp, text in one["values"]:
                number = float(text)
                if math.isfinite(number):
                    self.time.append(float(stamp))
                    self.node.append(labels.get("node", ""))
                    self.gpu.append(labels.get("gpu", ""))
                    self.uuid.append(labels.get("uuid", ""))
                    self.metric.append(name)
                    self.value.append(number)


def collect(prometheus: Prometheus, job: Job) -> Any:
    """Every metric of the job's GPUs and nodes over its window, as a pandas DataFrame."""
    import pandas as pd

    rows = Rows()
    info = f'accelmon_gpu_job_info{{job_id="{job.job_id}"}}'
    for name, metric, _, _ in GPU_METRICS:
        query = f"({metric}) * on (instance, uuid) group_right {info}"
        rows.add(prometheus.range(query, job.start, job.end, job.step), name)
    nodes = "|".join(regex_literal(node) for node in job.nodes)
    window = f"{int(max(60, 4 * job.step))}s"
    for name, template, _, _ in NODE_METRICS:
        query = template.format(nodes=nodes, window=window, job=job.job_id)
        rows.add(prometheus.range(query, job.start, job.end, job.step), name)
    frame = pd.DataFrame(vars(rows))
    frame["time"] = pd.to_datetime(frame["time"], unit="s", utc=True)
    return frame


def hardware(prometheus: Prometheus, job: Job) -> list[dict[str, Any]]:
    """Each node's hardware as the job ended: CPU model and sockets (node_exporter's cpu collector with
    --collector.cpu.info, as the node_exporter role runs it), logical CPUs, memory, GPUs by model, the GPU driver
    and the kernel. What a node's exporters do not say is left out of its entry."""
    nodes = "|".join(regex_literal(node) for node in job.nodes)
    selector = f'node=~"{nodes}"'

    def by_node(query: str) -> dict[str, list[dict[str, str]]]:
        found: dict[str, list[dict[str, str]]] = {}
        for one in prometheus.instant(query, job.end):
            labels = dict(one["metric"])
            labels["value"] = one["value"][1]
            found.setdefault(labels.get("node", ""), []).append(labels)
        return found

    cpus = by_node(f'count by (node) (node_cpu_seconds_total{{mode="idle",{selector}}})')
    memory = by_node(f"max by (node) (node_memory_MemTotal_bytes{{{selector}}})")
    packages = by_node(f"count by (node, model_name, package) (node_cpu_info{{{selector}}})")
    gpus = by_node(f"count by (node, name, vendor, driver_version) (accelmon_gpu_info{{{selector}}})")
    kernel = by_node(f"max by (node, release, machine) (node_uname_info{{{selector}}})")
    counters = by_node(f"accelmon_job_perf_event_available{{{selector}}}")
    hosts = []
    for node in job.nodes:
        entry: dict[str, Any] = {"node": node}
        if node in packages:
            entry["cpu_model"] = ", ".join(sorted({p.get("model_name", "") for p in packages[node]}))
            entry["sockets"] = len({p.get("package", "") for p in packages[node]})
        if node in cpus:
            entry["cpus"] = int(float(cpus[node][0]["value"]))
        if node in memory:
            entry["memory_bytes"] = float(memory[node][0]["value"])
        if node in gpus:
            models = sorted(gpus[node], key=lambda g: g.get("name", ""))
            entry["gpus"] = ", ".join(f"{int(float(g['value']))} x {g.get('name', '')}" for g in models)
            entry["gpu_driver"] = ", ".join(sorted({g.get("driver_version", "") for g in models}))
        if node in kernel:
            entry["kernel"] = f"{kernel[node][0].get('release', '')} {kernel[node][0].get('machine', '')}".strip()
        # Which per-job counters the node could not count, and why (collector job_perf; "off" where not enabled).
        entry["counters_unavailable"] = (
            sorted(f"{c.get('event', '')} ({c.get('reason', '')})" for c in counters[node] if float(c["value"]) == 0)
            if node in counters
            else ["all (collector job_perf off)"]
        )
        hosts.append(entry)
    return hosts


def live_alerts(prometheus: Prometheus, job: Job) -> list[dict[str, Any]]:
    """The live judgements that fired on the job while it ran (the master role's accelmon-live-jobs.yml, at
    whatever thresholds the master role set) and what NCCL's RAS said of its ranks (AccelmonNccl*): each alert's
    name, its reason or signals (or the rank RAS named), the node and GPU it named, and when it first and last
    fired. Empty where the Prometheus asked evaluates no alerts."""
    query = (
        "max by (alertname, reason, signals, node, gpu, rank) "
        f'(ALERTS{{alertstate="firing", alertname=~"AccelmonJob.+|AccelmonNccl.+", job_id="{job.job_id}"}})'
    )
    found = []
    for one in prometheus.range(query, job.start, job.end + job.step, job.step):
        labels, stamps = one["metric"], [float(stamp) for stamp, _ in one["values"]]
        found.append(
            {
                "alert": labels.get("alertname", ""),
                "reason": labels.get("reason")
                or labels.get("signals")
                or (f"rank {labels['rank']}" if labels.get("rank") else ""),
                "node": labels.get("node", ""),
                "gpu": labels.get("gpu", ""),
                "first_firing": min(stamps),
                "last_firing": max(stamps),
            }
        )
    return sorted(found, key=lambda a: (a["first_firing"], a["alert"], a["node"], a["gpu"]))


def regex_literal(text: str) -> str:
    """text matched literally by a PromQL regex inside a double-quoted string: metacharacters escaped for RE2,
    the escaping backslash and any quote escaped again for the string."""
    return "".join("\\\\" + c if c in ".^$*+?()[]{}|\\" else '\\"' if c == '"' else c for c in text)
