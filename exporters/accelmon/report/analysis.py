"""The report's judgement, pure functions of the tidy table (pandas), tested without Prometheus: per GPU, per node
and for the job, the means and peaks, energy, idle GPU-hours, findings a user can act on and stragglers."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from accelmon.report.query import Job
from accelmon.report.thresholds import DEFAULTS, Thresholds

# The live judgements' thresholds (idle, straggler, input-bound, memory) are the deployed rules' own:
# accelmon.report.thresholds reads them, the defaults are the master role's.
LOW_IPC = 0.7  # instructions per cycle under this on busy cores: the CPU code waits on memory
CACHE_LINE_BYTES = 64  # the memory traffic estimate: one line per last-level miss (x86; docs/jobs.md)


def longest_stretch(points: list[tuple[float, bool]], step: float) -> float:
    """The longest run of consecutive true points, in seconds (each point stands for one step)."""
    longest = run = 0.0
    for _, true in points:
        run = run + step if true else 0.0
        longest = max(longest, run)
    return longest


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


def summarize(job: Job, frame: Any, thresholds: Thresholds = DEFAULTS) -> dict[str, Any]:
    """The summary's figures: per GPU, per node and for the job, energy, idle GPU-hours, stragglers, judged at
    `thresholds` (the live rules')."""

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
        idle = float((busy < thresholds.idle_utilization).sum()) * job.step
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

    nodes: list[dict[str, Any]] = []
    for node in job.nodes:
        used, given = mean(of_node("job_cpu_cores_used", node)), mean(of_node("job_cpus_allocated", node))
        memory_peak, limit = peak(of_node("job_memory_used_bytes", node)), peak(of_node("job_memory_limit_bytes", node))
        io = of_node("job_io_bytes_per_second", node)
        # Power times the job's share at each step: the job's part of the node's CPU energy.
        power = series("cpu_power_watts")
        share = series("job_cpu_share")
        joined = power[power.node == node].merge(share[share.node == node], on="time", suffixes=("_w", "_s"))
        node_cpu_energy = float((joined.value_w * joined.value_s.clip(0, 1)).sum() * job.step) if len(joined) else None
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
    # The CPUs' share only where every node of the job measured it (RAPL): a part would read as the whole.
    measured: list[float | None] = [n["cpu_energy_joules"] for n in nodes]
    cpu_energy = sum(m for m in measured if m is not None) if measured and None not in measured else None
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
        "cpu_efficiency": ratio_of_sums(nodes, "job_cpu_cores_used_mean", "job_cpus_allocated"),
        "cpu_energy_joules": cpu_energy,
        "total_energy_joules": energy_total + cpu_energy if cpu_energy is not None else None,
        "findings": findings(job_utilization, nodes, thresholds),
        "verdicts": {
            "gpu_utilization": verdict(job_utilization, 0.2, 0.5, ("very low", "low", "good")),
            "gpu_memory": verdict(job_memory, 0.1, 0.5, ("mostly unused", "under half used", "well used")),
            "sm_active": verdict(job_sm, 0.2, 0.5, ("very low", "low", "good")),
        },
        "stragglers": stragglers(job, frame, thresholds),
        "thresholds": thresholds.as_dict(),
    }


def ratio_of_sums(rows: list[dict[str, Any]], numerator: str, denominator: str) -> float | None:
    pairs = [(r[numerator], r[denominator]) for r in rows if r[numerator] is not None and r[denominator]]
    return sum(p[0] for p in pairs) / sum(p[1] for p in pairs) if pairs else None


def findings(
    gpu_utilization: float | None, nodes: list[dict[str, Any]], thresholds: Thresholds = DEFAULTS
) -> list[str]:
    """What a user can act on, from the CPU side next to the GPUs."""
    found = []
    for node in nodes:
        efficiency, ratio = node["job_cpu_efficiency"], node["job_memory_peak_ratio"]
        if (
            gpu_utilization is not None
            and gpu_utilization < thresholds.input_gpu_utilization
            and efficiency
            and efficiency >= thresholds.input_cpu_ratio
        ):
            found.append(
                f"{node['node']}: GPUs mostly idle ({100 * gpu_utilization:.0f} %) while the job's "
                f"{node['job_cpus_allocated']:g} CPUs were saturated ({100 * efficiency:.0f} %): input-bound; "
                "more data-loader workers or CPUs per GPU"
            )
        if ratio is not None and ratio >= thresholds.memory_ratio:
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


def stragglers(
    job: Job,
    frame: Any,
    thresholds: Thresholds = DEFAULTS,
) -> list[dict[str, Any]]:
    """The live rule AccelmonJobStraggler over the whole run, so the report names the GPUs the rule named while the
    job ran: a GPU of a job of 2+ GPUs under its job's median (SM clock or power, at `thresholds`' ratios) while
    the job is busy and the GPU works, for the rule's `for` without a break. Each entry says what was measured:
    the longest such stretch, and per signal the share of the job's busy time the GPU spent under its ratio."""
    if len(job.gpus) < 2:
        return []

    def wide(name: str) -> Any:
        values = frame[frame.metric == name]
        keyed = values.assign(key=values.node + "\t" + values.uuid)  # a GPU is (node, uuid)
        return keyed.pivot_table(index="time", columns="key", values="value", aggfunc="mean")

    utilization = wide("utilization")
    if utilization.shape[1] < 2:
        return []
    busy = utilization.median(axis=1) >= thresholds.busy_utilization
    judged = (utilization >= thresholds.active_utilization) & busy.to_numpy()[:, None]
    ratios = {"sm_clock_hertz": thresholds.straggler_sm_clock_ratio, "power_watts": thresholds.straggler_power_ratio}
    under: dict[str, Any] = {}
    for name in ("sm_clock_hertz", "power_watts"):
        values = wide(name)
        if values.shape[1] >= 2:
            below = values.lt(values.median(axis=1) * ratios[name], axis=0)
            under[name] = below.reindex(index=utilization.index, columns=utilization.columns, fill_value=False)
    if not under:
        return []
    any_under = None
    for below in under.values():
        any_under = below if any_under is None else any_under | below
    lagging = judged & any_under
    busy_samples = max(1, int(busy.sum()))
    found: dict[str, dict[str, Any]] = {}
    for key in utilization.columns:
        longest = longest_stretch(list(lagging[key].items()), job.step)
        if longest < thresholds.straggler_for_seconds:
            continue
        node, uuid = str(key).split("\t", 1)
        found[str(key)] = {
            "node": node,
            "uuid": uuid,
            "longest_seconds": longest,
            "below_median_ratio": {name: ratios[name] for name in under},
            "below_median_share": {
                name: round(float((below[key] & judged[key]).sum()) / busy_samples, 3) for name, below in under.items()
            },
            "reasons": [],
        }
    index = {(node, uuid): gpu for node, gpu, uuid in job.gpus}
    for entry in found.values():
        node, uuid = entry["node"], entry["uuid"]
        entry["gpu"] = index.get((node, uuid), "")
        this_gpu = (frame.node == node) & (frame.uuid == uuid)
        events = frame[(frame.metric == "clock_events") & this_gpu].value
        if len(events) and events.max() > 0:
            entry["reasons"].append("clock events active (throttling: thermal, power or other capping)")
        # What lies beyond the GPU, as the live rule reads it (AccelmonJobStraggler's reasons).
        if frame[(frame.metric == "link_fault") & this_gpu].value.max() > 0:
            entry["reasons"].append("its PCIe link trained narrow, or an NVLink link down or erring")
        if frame[(frame.metric == "nic_fault") & this_gpu].value.max() > 0:
            entry["reasons"].append("the NIC its traffic leaves by down, trained slow or counting errors")
        held = frame[(frame.metric == "job_cpu_throttled") & (frame.node == node)].value
        if len(held) and held.max() > thresholds.straggler_cpu_throttled:
            entry["reasons"].append(f"the job's CPUs on {node} held back by their quota ({held.max():.2f} s a second)")
        xids = frame[(frame.metric == "xid_events_total") & this_gpu].sort_values("time").value.tolist()
        if len(xids) >= 2 and counter_increase(xids) > 0:
            entry["reasons"].append("XID errors during the job")
        if not entry["reasons"]:
            entry["reasons"].append("slower than its peers, cause unknown")
    return sorted(found.values(), key=lambda e: (e["node"], e["gpu"]))
