"""accelmon-report: one batch job's report, from the Prometheus that scrapes its nodes.

    accelmon-report JOB_ID --prometheus http://master:9090 [--out DIR] [--lookback 30d]

Finds the job's window, nodes and GPUs from `accelmon_gpu_job_info` (the jobs collector), queries every metric
over that window (keeping each series under Prometheus's 11,000 points by the step), and writes into DIR:

- `report.html`: a page to read at a glance, opening offline (plots embedded): the job, a jobstats-style summary
  with verdicts, energy, stragglers, and plots per GPU and node over time;
- `report.pdf`: the same, for a ticket;
- `data.csv` and `data.parquet`: the tidy table (time, node, gpu, uuid, metric, value);
- `summary.json`: the summary's figures.

Energy is the increase of each GPU's energy counter over the window (joules and kWh); idle GPU-hours are the
hours a GPU held by the job spent under 5 % utilization. A straggler is a GPU whose utilization, SM activity,
power or SM clock sits below 80 % of the job's median at that moment for at least a quarter of the run; the report
names the likely reason where the metrics show one (clock-event reasons such as thermal or power capping, XID
errors, a lower clock). Needs the `report` extra (matplotlib, pandas, pyarrow, jinja2).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

MAX_POINTS = 11_000  # Prometheus refuses a range query whose series would have more points
IDLE_BELOW = 0.05  # utilization under which a held GPU counts as idle
STRAGGLER_RATIO = 0.8  # below this share of the job's median at the same moment...
STRAGGLER_SHARE = 0.25  # ...for at least this share of the run
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
     ' / sum by (node) (rate(node_cpu_seconds_total{{mode!~"idle|iowait",node=~"{nodes}"}}[{window}]))',
     "ratio", "The job's share of the node's busy CPU time"),
    # The cores of the job's own Neuron runtimes (placed in the job by their cgroup), not the whole node's.
    ("neuroncore_utilization",
     'avg by (node) (accelmon_neuroncore_utilization_ratio{{node=~"{nodes}"}} * on (instance, runtime_tag)'
     ' group_left () max by (instance, runtime_tag) (accelmon_neuron_runtime_info{{job_id="{job}"}}))',
     "ratio", "NeuronCore utilization"),
)  # fmt: skip
PLOTTED = ("utilization", "memory_used_bytes", "power_watts", "temperature_celsius", "sm_active", "sm_clock_hertz")
NODE_PLOTTED = ("cpu_utilization", "job_cpu_cores_used", "host_memory_used_bytes", "job_memory_used_bytes",
                "job_io_bytes_per_second", "infiniband_receive_bytes_per_second",
                "infiniband_transmit_bytes_per_second", "neuroncore_utilization")  # fmt: skip
INPUT_BOUND_GPU = 0.3  # GPUs under this mean utilization...
INPUT_BOUND_CPU = 0.9  # ...while the job's cores are this busy: the CPUs hold the GPUs back
MEMORY_NEAR_LIMIT = 0.95
LOW_IPC = 0.7  # instructions per cycle under this on busy cores: the CPU code waits on memory
CACHE_LINE_BYTES = 64  # the memory traffic estimate: one line per last-level miss (x86; docs/jobs.md)


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


def regex_literal(text: str) -> str:
    """text matched literally by a PromQL regex inside a double-quoted string: metacharacters escaped for RE2,
    the escaping backslash and any quote escaped again for the string."""
    return "".join("\\\\" + c if c in ".^$*+?()[]{}|\\" else '\\"' if c == '"' else c for c in text)


def counter_increase(values: Sequence[float]) -> float:
    """A counter's increase over consecutive samples, a reset counting from 0 (as Prometheus's increase())."""
    total = 0.0
    for before, after in zip(values, values[1:]):
        total += after - before if after >= before else after
    return total


def verdict(value: float | None, low: float, good: float, words: tuple[str, str, str]) -> str:
    if value is None:
        return "no data"
    return words[0] if value < low else words[1] if value < good else words[2]


def summarize(job: Job, frame: Any) -> dict[str, Any]:
    """The summary's figures: per GPU, per node and for the job, energy, idle GPU-hours, stragglers."""

    def series(name: str) -> Any:
        return frame[frame.metric == name]

    # A GPU is (node, uuid): UUIDs are unique on real hardware, but a copied fixture or a cloned VM may repeat one.
    def of_gpu(name: str, node: str, uuid: str) -> Any:
        values = series(name)
        return values[(values.node == node) & (values.uuid == uuid)].sort_values("time").value

    def mean_of(name: str, node: str, uuid: str) -> float | None:
        values = of_gpu(name, node, uuid)
        return float(values.mean()) if len(values) else None

    def max_of(name: str, node: str, uuid: str) -> float | None:
        values = of_gpu(name, node, uuid)
        return float(values.max()) if len(values) else None

    gpus: list[dict[str, Any]] = []
    energy_total = 0.0
    idle_seconds = 0.0
    for node, gpu, uuid in job.gpus:
        energy = of_gpu("energy_joules_total", node, uuid).tolist()
        joules = counter_increase(energy) if len(energy) >= 2 else None
        energy_total += joules or 0.0
        busy = of_gpu("utilization", node, uuid)
        idle = float((busy < IDLE_BELOW).sum()) * job.step
        idle_seconds += idle
        memory_peak = max_of("memory_used_bytes", node, uuid)
        memory_total = max_of("memory_total_bytes", node, uuid)
        gpus.append(
            {
                "node": node,
                "gpu": gpu,
                "uuid": uuid,
                "utilization_mean": mean_of("utilization", node, uuid),
                "sm_active_mean": mean_of("sm_active", node, uuid),
                "memory_peak_bytes": memory_peak,
                "memory_total_bytes": memory_total,
                "memory_peak_ratio": memory_peak / memory_total if memory_peak is not None and memory_total else None,
                "power_mean_watts": mean_of("power_watts", node, uuid),
                "temperature_max_celsius": max_of("temperature_celsius", node, uuid),
                "energy_joules": joules,
                "idle_hours": idle / 3600,
            }
        )
    utilization = [g["utilization_mean"] for g in gpus if g["utilization_mean"] is not None]
    sm_active = [g["sm_active_mean"] for g in gpus if g["sm_active_mean"] is not None]
    memory = [g["memory_peak_ratio"] for g in gpus if g["memory_peak_ratio"] is not None]

    def of_node(name: str, node: str) -> Any:
        values = series(name)
        return values[values.node == node].sort_values("time").value

    def mean(values: Any) -> float | None:
        return float(values.mean()) if len(values) else None

    def peak(values: Any) -> float | None:
        return float(values.max()) if len(values) else None

    nodes = []
    cpu_energy = 0.0
    for node in job.nodes:
        used, given = mean(of_node("job_cpu_cores_used", node)), mean(of_node("job_cpus_allocated", node))
        memory_peak, limit = peak(of_node("job_memory_used_bytes", node)), peak(of_node("job_memory_limit_bytes", node))
        io = of_node("job_io_bytes_per_second", node)
        # Power times the job's share at each step: the job's part of the node's CPU energy.
        power = series("cpu_power_watts")
        share = series("job_cpu_share")
        joined = power[power.node == node].merge(share[share.node == node], on="time", suffixes=("_w", "_s"))
        node_cpu_energy = float((joined.value_w * joined.value_s.clip(0, 1)).sum() * job.step) if len(joined) else None
        cpu_energy += node_cpu_energy or 0.0
        instructions, cycles = of_node("job_instructions_per_second", node), of_node("job_cycles_per_second", node)
        misses = mean(of_node("job_cache_misses_per_second", node))
        nodes.append(
            {
                "node": node,
                "job_instructions_per_cycle": (
                    float(instructions.sum() / cycles.sum()) if len(instructions) and cycles.sum() else None
                ),
                "job_flops_mean": mean(of_node("job_flops", node)),
                "job_double_flops_mean": mean(of_node("job_double_flops", node)),
                "job_cache_miss_bytes_per_second": misses * CACHE_LINE_BYTES if misses is not None else None,
                "job_context_switches_per_second": mean(of_node("job_context_switches_per_second", node)),
                "cpu_utilization_mean": mean(of_node("cpu_utilization", node)),
                "host_memory_peak_bytes": peak(of_node("host_memory_used_bytes", node)),
                "job_cpu_cores_used_mean": used,
                "job_cpus_allocated": given,
                "job_cpu_efficiency": used / given if used is not None and given else None,
                "job_memory_peak_bytes": memory_peak,
                "job_memory_limit_bytes": limit,
                "job_memory_peak_ratio": memory_peak / limit if memory_peak is not None and limit else None,
                "job_swap_peak_bytes": peak(of_node("job_swap_used_bytes", node)),
                "job_io_bytes": float(io.sum() * job.step) if len(io) else None,
                "cpu_energy_joules": node_cpu_energy,
            }
        )
    job_utilization = sum(utilization) / len(utilization) if utilization else None
    job_sm = sum(sm_active) / len(sm_active) if sm_active else None
    job_memory = max(memory) if memory else None
    allocated_hours = len(job.gpus) * job.duration / 3600
    return {
        "job_id": job.job_id,
        "user": job.user,
        "account": job.account,
        "nodes": job.nodes,
        "gpus": gpus,
        "start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(job.start)),
        "end": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(job.end)),
        "duration_seconds": job.duration,
        "step_seconds": job.step,
        "gpu_utilization_mean": job_utilization,
        "sm_active_mean": job_sm,
        "gpu_memory_peak_ratio": job_memory,
        "energy_joules": energy_total,
        "energy_kwh": energy_total / 3.6e6,
        "gpu_hours_allocated": allocated_hours,
        "gpu_hours_idle": idle_seconds / 3600,
        "node_summary": nodes,
        "cpu_efficiency": _ratio_of_sums(nodes, "job_cpu_cores_used_mean", "job_cpus_allocated"),
        "cpu_energy_joules": cpu_energy,
        "total_energy_joules": energy_total + cpu_energy,
        "findings": findings(job_utilization, nodes),
        "verdicts": {
            "gpu_utilization": verdict(job_utilization, 0.2, 0.5, ("very low", "low", "good")),
            "gpu_memory": verdict(job_memory, 0.1, 0.5, ("mostly unused", "under half used", "well used")),
            "sm_active": verdict(job_sm, 0.2, 0.5, ("very low", "low", "good")),
        },
        "stragglers": stragglers(job, frame),
    }


def _ratio_of_sums(rows: list[dict[str, Any]], numerator: str, denominator: str) -> float | None:
    pairs = [(r[numerator], r[denominator]) for r in rows if r[numerator] is not None and r[denominator]]
    return sum(p[0] for p in pairs) / sum(p[1] for p in pairs) if pairs else None


def findings(gpu_utilization: float | None, nodes: list[dict[str, Any]]) -> list[str]:
    """What a user can act on, from the CPU side next to the GPUs."""
    found = []
    for node in nodes:
        efficiency, ratio = node["job_cpu_efficiency"], node["job_memory_peak_ratio"]
        if (
            gpu_utilization is not None
            and gpu_utilization < INPUT_BOUND_GPU
            and efficiency
            and efficiency >= INPUT_BOUND_CPU
        ):
            found.append(
                f"{node['node']}: GPUs mostly idle ({100 * gpu_utilization:.0f} %) while the job's "
                f"{node['job_cpus_allocated']:g} CPUs were saturated ({100 * efficiency:.0f} %): input-bound; "
                "more data-loader workers or CPUs per GPU"
            )
        if ratio is not None and ratio >= MEMORY_NEAR_LIMIT:
            found.append(
                f"{node['node']}: memory peaked at {100 * ratio:.0f} % of the job's limit: close to being killed"
            )
        ipc = node.get("job_instructions_per_cycle")
        if ipc is not None and ipc < LOW_IPC and efficiency and efficiency >= 0.5:
            found.append(
                f"{node['node']}: the job's CPU code retired {ipc:.2f} instructions per cycle on busy cores: "
                "stalled on memory; look at data layout or memory-bound preprocessing"
            )
        if node["job_swap_peak_bytes"]:
            found.append(f"{node['node']}: the job swapped ({node['job_swap_peak_bytes'] / 2**20:.0f} MiB at peak)")
    return found


def stragglers(job: Job, frame: Any) -> list[dict[str, Any]]:
    """GPUs that lag the job's median at the same moment for a sustained part of the run, with a likely reason."""
    found: dict[str, dict[str, Any]] = {}
    if len(job.gpus) < 2:
        return []
    for name in ("utilization", "sm_active", "power_watts", "sm_clock_hertz"):
        values = frame[frame.metric == name]
        if values.empty:
            continue
        keyed = values.assign(key=values.node + "\t" + values.uuid)  # a GPU is (node, uuid)
        wide = keyed.pivot_table(index="time", columns="key", values="value", aggfunc="mean")
        if wide.shape[1] < 2:
            continue
        median = wide.median(axis=1)
        active = median > (0.05 if name in ("utilization", "sm_active") else 0)
        lagging = wide.lt(median * STRAGGLER_RATIO, axis=0) & active.to_numpy()[:, None]
        share = lagging.sum() / max(1, int(active.sum()))
        for key, part in share.items():
            if part >= STRAGGLER_SHARE:
                node, uuid = str(key).split("\t", 1)
                entry = found.setdefault(str(key), {"node": node, "uuid": uuid, "metrics": {}, "reasons": []})
                entry["metrics"][name] = round(float(part), 3)
    index = {(node, uuid): gpu for node, gpu, uuid in job.gpus}
    for entry in found.values():
        node, uuid = entry["node"], entry["uuid"]
        entry["gpu"] = index.get((node, uuid), "")
        this_gpu = (frame.node == node) & (frame.uuid == uuid)
        events = frame[(frame.metric == "clock_events") & this_gpu].value
        if len(events) and events.max() > 0:
            entry["reasons"].append("clock events active (throttling: thermal, power or other capping)")
        xids = frame[(frame.metric == "xid_events_total") & this_gpu].sort_values("time").value.tolist()
        if len(xids) >= 2 and counter_increase(xids) > 0:
            entry["reasons"].append("XID errors during the job")
        if "sm_clock_hertz" in entry["metrics"]:
            entry["reasons"].append("SM clock below its peers'")
        if not entry["reasons"]:
            entry["reasons"].append("no cause in the metrics: less work given to it, or waiting on its peers")
    return sorted(found.values(), key=lambda e: (e["node"], e["gpu"]))


def plots(job: Job, frame: Any) -> list[tuple[str, bytes]]:
    """(title, PNG) of each plotted metric: one line per GPU (or node), over the job's window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {name: (title, unit) for name, _, unit, title in GPU_METRICS}
    titles.update({name: (title, unit) for name, _, unit, title in NODE_METRICS})
    out = []
    for name in (*PLOTTED, *NODE_PLOTTED):
        values = frame[frame.metric == name]
        if values.empty:
            continue
        title, unit = titles[name]
        figure, axes = plt.subplots(figsize=(10, 3.2), dpi=100)
        by = ["node", "gpu"] if name in PLOTTED else ["node"]
        # Bytes in GiB, rates in MiB/s: axes people read without counting digits.
        scale, unit = {"bytes": (2**30, "GiB"), "B/s": (2**20, "MiB/s")}.get(unit, (1, unit))
        for key, group in values.groupby(by):
            label = f"{key[0]} GPU {key[1]}" if name in PLOTTED else str(key[0] if isinstance(key, tuple) else key)
            axes.plot(group.time, group.value / scale, label=label, linewidth=1.2)
        axes.set_title(title)
        axes.set_ylabel(unit)
        axes.grid(alpha=0.3)
        # Beside the plot, never over the lines.
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        figure.autofmt_xdate()
        figure.tight_layout()
        image = io.BytesIO()
        figure.savefig(image, format="png")
        plt.close(figure)
        out.append((title, image.getvalue()))
    return out


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Job {{ s.job_id }}: accelmon report</title>
<style>body{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}
.bad{color:#b00}.ok{color:#070}img{max-width:100%}</style></head><body>
<h1>Job {{ s.job_id }}</h1>
<p>User <b>{{ s.user or "?" }}</b>, account <b>{{ s.account or "?" }}</b>; {{ s.gpus|length }} GPU(s) on
{{ s.nodes|length }} node(s): {{ s.nodes|join(", ") }}. From {{ s.start }} to {{ s.end }}
({{ "%.1f"|format(s.duration_seconds / 60) }} minutes; data every {{ s.step_seconds|int }} s).</p>
<h2>Summary</h2>
<table>
<tr><th class="l">GPU utilization (mean)</th><td>{{ pct(s.gpu_utilization_mean) }}</td>
<td class="l {{ 'ok' if s.verdicts.gpu_utilization == 'good' else 'bad' }}">{{ s.verdicts.gpu_utilization }}</td></tr>
<tr><th class="l">GPU memory (peak of the fullest GPU)</th><td>{{ pct(s.gpu_memory_peak_ratio) }}</td>
<td class="l {{ 'ok' if s.verdicts.gpu_memory == 'well used' else 'bad' }}">{{ s.verdicts.gpu_memory }}</td></tr>
<tr><th class="l">SM active (profiling)</th><td>{{ pct(s.sm_active_mean) }}</td>
<td class="l">{{ s.verdicts.sm_active }}</td></tr>
<tr><th class="l">Energy of the job's GPUs</th><td>{{ "%.0f"|format(s.energy_joules) }} J</td>
<td class="l">{{ "%.4f"|format(s.energy_kwh) }} kWh</td></tr>
<tr><th class="l">CPU efficiency (cores used over given)</th><td>{{ pct(s.cpu_efficiency) }}</td><td></td></tr>
<tr><th class="l">Energy: GPUs + the job's share of CPU (RAPL)</th><td>{{ "%.0f"|format(s.total_energy_joules) }} J</td>
<td class="l">CPU {{ "%.0f"|format(s.cpu_energy_joules) }} J</td></tr>
<tr><th class="l">GPU-hours held / idle (under 5 %)</th><td>{{ "%.3f"|format(s.gpu_hours_allocated) }}</td>
<td class="l">{{ "%.3f"|format(s.gpu_hours_idle) }} idle</td></tr>
</table>
<h2>Findings</h2>
{% if s.findings %}<ul>{% for f in s.findings %}<li class="bad">{{ f }}</li>{% endfor %}</ul>
{% else %}<p>Nothing on the CPU side holds the job back.</p>{% endif %}
<h2>Stragglers</h2>
{% if s.stragglers %}<table><tr><th class="l">node</th><th>GPU</th><th class="l">lags on (share of the run)</th>
<th class="l">likely reason</th></tr>
{% for g in s.stragglers %}<tr><td class="l">{{ g.node }}</td><td>{{ g.gpu }}</td>
<td class="l">{% for m, p in g.metrics.items() %}{{ m }} {{ pct(p) }} {% endfor %}</td>
<td class="l">{{ g.reasons|join("; ") }}</td></tr>{% endfor %}</table>
{% else %}<p>None: every GPU kept up with the job's median.</p>{% endif %}
<h2>GPUs</h2>
<table><tr><th class="l">node</th><th>GPU</th><th class="l">UUID</th><th>utilization</th><th>SM active</th>
<th>memory peak</th><th>power</th><th>max temp.</th><th>energy</th></tr>
{% for g in s.gpus %}<tr><td class="l">{{ g.node }}</td><td>{{ g.gpu }}</td><td class="l">{{ g.uuid }}</td>
<td>{{ pct(g.utilization_mean) }}</td><td>{{ pct(g.sm_active_mean) }}</td><td>{{ pct(g.memory_peak_ratio) }}</td>
<td>{{ num(g.power_mean_watts, " W") }}</td><td>{{ num(g.temperature_max_celsius, " °C") }}</td>
<td>{{ num(g.energy_joules, " J") }}</td></tr>{% endfor %}</table>
<h2>Nodes</h2>
<table><tr><th class="l">node</th><th>host CPU (mean)</th><th>host memory (peak)</th><th>job cores used / given</th>
<th>job CPU efficiency</th><th>job memory peak / limit</th><th>swap (peak)</th><th>job I/O</th><th>CPU energy</th></tr>
{% for n in s.node_summary %}<tr><td class="l">{{ n.node }}</td><td>{{ pct(n.cpu_utilization_mean) }}</td>
<td>{{ num(n.host_memory_peak_bytes and n.host_memory_peak_bytes / 2**30, " GiB") }}</td>
<td>{{ num(n.job_cpu_cores_used_mean) }} / {{ num(n.job_cpus_allocated) }}</td><td>{{ pct(n.job_cpu_efficiency) }}</td>
<td>{{ num(n.job_memory_peak_bytes and n.job_memory_peak_bytes / 2**30, " GiB") }} /
{{ num(n.job_memory_limit_bytes and n.job_memory_limit_bytes / 2**30, " GiB") }}</td>
<td>{{ num(n.job_swap_peak_bytes and n.job_swap_peak_bytes / 2**20, " MiB") }}</td>
<td>{{ num(n.job_io_bytes and n.job_io_bytes / 2**20, " MiB") }}</td>
<td>{{ num(n.cpu_energy_joules, " J") }}</td></tr>{% endfor %}</table>
<h2>CPU counters</h2>
<table><tr><th class="l">node</th><th>instructions per cycle</th><th>GFLOP/s (double)</th>
<th>memory traffic (est.)</th><th>context switches</th></tr>
{% for n in s.node_summary %}<tr><td class="l">{{ n.node }}</td><td>{{ num(n.job_instructions_per_cycle) }}</td>
<td>{{ num(n.job_flops_mean and n.job_flops_mean / 1e9) }}
({{ num(n.job_double_flops_mean and n.job_double_flops_mean / 1e9) }})</td>
<td>{{ num(n.job_cache_miss_bytes_per_second and n.job_cache_miss_bytes_per_second / 2**30, " GiB/s") }}</td>
<td>{{ num(n.job_context_switches_per_second, "/s") }}</td></tr>{% endfor %}</table>
{% for h in s.hosts %}{% if h.counters_unavailable %}
<p><small>{{ h.node }}: not counted: {{ h.counters_unavailable|join(", ") }}</small></p>{% endif %}{% endfor %}
<h2>Hosts</h2>
<table><tr><th class="l">node</th><th class="l">CPU</th><th>sockets</th><th>CPUs</th><th>memory</th>
<th class="l">GPUs</th><th class="l">GPU driver</th><th class="l">kernel</th></tr>
{% for h in s.hosts %}<tr><td class="l">{{ h.node }}</td><td class="l">{{ h.cpu_model or "-" }}</td>
<td>{{ h.sockets or "-" }}</td><td>{{ h.cpus or "-" }}</td>
<td>{{ num(h.memory_bytes and h.memory_bytes / 2**30, " GiB") }}</td><td class="l">{{ h.gpus or "-" }}</td>
<td class="l">{{ h.gpu_driver or "-" }}</td><td class="l">{{ h.kernel or "-" }}</td></tr>{% endfor %}</table>
<h2>Over time</h2>
{% for title, png in images %}<figure><img alt="{{ title }}" src="data:image/png;base64,{{ png }}"></figure>
{% endfor %}
<p><small>accelmon-report; data: {{ prometheus }}</small></p></body></html>
"""


def html(summary: dict[str, Any], images: list[tuple[str, bytes]], prometheus: str) -> str:
    import jinja2

    environment = jinja2.Environment(autoescape=True)  # user and account names come from job records
    template = environment.from_string(PAGE)

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f} %"

    def num(value: float | None, unit: str = "") -> str:
        return "n/a" if value is None else f"{value:,.1f}{unit}"

    encoded = [(title, base64.b64encode(png).decode()) for title, png in images]
    return template.render(s=summary, images=encoded, prometheus=prometheus, pct=pct, num=num)


def pdf(summary: dict[str, Any], images: list[tuple[str, bytes]], path: Path) -> None:
    """The summary on a first page, then the plots, two to a page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f} %"

    lines = [
        f"Job {summary['job_id']}   user {summary['user'] or '?'}   account {summary['account'] or '?'}",
        f"{len(summary['gpus'])} GPU(s) on {', '.join(summary['nodes'])}",
        f"{summary['start']} to {summary['end']} ({summary['duration_seconds'] / 60:.1f} minutes)",
        "",
        f"GPU utilization (mean): {pct(summary['gpu_utilization_mean'])}  ({summary['verdicts']['gpu_utilization']})",
        f"GPU memory peak: {pct(summary['gpu_memory_peak_ratio'])}  ({summary['verdicts']['gpu_memory']})",
        f"SM active: {pct(summary['sm_active_mean'])}  ({summary['verdicts']['sm_active']})",
        f"Energy: {summary['energy_joules']:.0f} J = {summary['energy_kwh']:.4f} kWh (GPUs); "
        f"{summary['total_energy_joules']:.0f} J with the job's CPU share",
        f"CPU efficiency: {pct(summary['cpu_efficiency'])}",
        *(
            f"{n['node']}: IPC {n['job_instructions_per_cycle']:.2f}"
            + (f", {n['job_flops_mean'] / 1e9:.1f} GFLOP/s" if n.get("job_flops_mean") is not None else "")
            for n in summary["node_summary"]
            if n.get("job_instructions_per_cycle") is not None
        ),
        f"GPU-hours held {summary['gpu_hours_allocated']:.3f}, idle {summary['gpu_hours_idle']:.3f}",
        "",
        "Findings: " + ("; ".join(summary["findings"]) or "none on the CPU side"),
        "Stragglers: "
        + (
            ", ".join(f"{g['node']} GPU {g['gpu']} ({'; '.join(g['reasons'])})" for g in summary["stragglers"])
            or "none"
        ),
        "",
        *(
            f"{h['node']}: {h.get('cpu_model', '?')}, {h.get('cpus', '?')} CPUs, "
            f"{h['memory_bytes'] / 2**30:.0f} GiB; {h.get('gpus', 'no GPU')}"
            if "memory_bytes" in h
            else f"{h['node']}: {h.get('gpus', 'no GPU')}"
            for h in summary.get("hosts", [])
        ),
        *(
            f"{h['node']}: CPU counters not counted: {', '.join(h['counters_unavailable'])}"
            for h in summary.get("hosts", [])
            if h.get("counters_unavailable")
        ),
    ]
    with PdfPages(path) as document:
        figure = plt.figure(figsize=(8.27, 11.69))
        figure.text(0.08, 0.95, "\n".join(lines), va="top", family="monospace", fontsize=9, wrap=True)
        document.savefig(figure)
        plt.close(figure)
        for first in range(0, len(images), 2):
            figure, axes = plt.subplots(2, 1, figsize=(8.27, 11.69))
            for axis, (_title, png) in zip(axes, images[first : first + 2]):
                axis.imshow(mpimg.imread(io.BytesIO(png), format="png"))
                axis.set_axis_off()
            for axis in axes[len(images[first : first + 2]) :]:
                axis.set_axis_off()
            figure.tight_layout()
            document.savefig(figure)
            plt.close(figure)


def write_report(prometheus: Prometheus, job_id: str, out: Path, lookback: float, now: float | None = None) -> dict:
    job = find_job(prometheus, job_id, lookback, time.time() if now is None else now)
    frame = collect(prometheus, job)
    summary = summarize(job, frame)
    summary["hosts"] = hardware(prometheus, job)
    images = plots(job, frame)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "data.csv", index=False)
    frame.to_parquet(out / "data.parquet", index=False)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "report.html").write_text(html(summary, images, prometheus.url), encoding="utf-8")
    pdf(summary, images, out / "report.pdf")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="accelmon-report",
        description="A batch job's report (HTML, PDF, CSV, Parquet, JSON) from the Prometheus of an accelmon cluster.",
    )
    parser.add_argument("job_id", help="the scheduler's job id")
    parser.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus's URL, e.g. http://master:9090")
    parser.add_argument("--out", metavar="DIR", help="where to write the report (default ./accelmon-report-JOB_ID)")
    parser.add_argument("--lookback", default="30d", help="how far back to look for the job (default 30d)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each query (default 30)")
    args = parser.parse_args(argv)
    try:
        if not JOB_ID.match(args.job_id):
            raise ReportError(f"job id {args.job_id!r}: expected letters, digits and _.-[] only", 2)
        try:
            import jinja2  # noqa: F401
            import matplotlib  # noqa: F401
            import pandas  # noqa: F401
            import pyarrow  # noqa: F401
        except ImportError as error:
            raise ReportError(f"missing {error.name}: pip install 'accelmon[report]'", 2) from error
        out = Path(args.out or f"accelmon-report-{args.job_id}")
        summary = write_report(
            Prometheus(args.prometheus, args.timeout), args.job_id, out, duration_seconds(args.lookback)
        )
    except ReportError as error:
        print(f"accelmon-report: {error}", file=sys.stderr)
        return error.status
    except OSError as error:
        print(f"accelmon-report: cannot write the report: {error}", file=sys.stderr)
        return 1
    print(
        f"accelmon-report: job {args.job_id}: {len(summary['gpus'])} GPU(s) on {len(summary['nodes'])} node(s), "
        f"{summary['duration_seconds'] / 60:.1f} min, {summary['energy_kwh']:.4f} kWh, "
        f"{len(summary['stragglers'])} straggler(s); written to {out}/"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
