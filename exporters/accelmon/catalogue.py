"""Writes docs/metrics.md from the metric specs declared in the collector modules.

Run `python -m accelmon.catalogue > docs/metrics.md`; a test fails when the committed file drifts.
"""

from __future__ import annotations

from accelmon.collectors import REGISTRY
from accelmon.core import SELF, Catalogue

# AWS's neuron-monitor-prometheus.py names, and ours: for users moving their dashboards.
NEURON_MAPPING = [
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
NEURON_NOTE = "\n".join(
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
        *(f"| `{theirs}` | `{mine}` |" for theirs, mine in NEURON_MAPPING),
    ]
)

NOTES = {
    "neuron": NEURON_NOTE,
    "infiniband": (
        "Source: sysfs `class/infiniband`. Names are node_exporter's infiniband collector with `accelmon_` for "
        "`node_`, values equal on the same tree (tested against Debian's node_exporter 1.5); the data counters "
        "count 4-octet words and are multiplied by 4. Beyond node_exporter: placement (PCI address, NUMA node), "
        "link layer and every hw_counters file."
    ),
    "nvml": (
        "Source: NVML through nvidia-ml-py. Conversions: percent to ratio (/100), mW to W, mJ to J, MHz to Hz, "
        "KiB/s to bytes/s (PCIe throughput), ns to s (violation time). A field NVML does not support on a GPU "
        "(NotSupported, FunctionNotFound, NoPermission) has no series for that GPU. XID counts start at 0 when "
        "the exporter starts. Read schedule (column *read*; CPU per call measured on an H100, driver 580): cheap, "
        "fast-moving values every `interval_seconds` (1 s); counters and rarely changing values every "
        "`slow_interval_seconds` (30 s, as dcgm-exporter collects: the energy counter alone costs 4 ms of CPU per "
        "read, the two violation counters 0.8 ms each; a counter read less often stays exact, only `rate()` gets "
        "coarser) and served from that read in between; identity and maximum clocks once per GPU; PCIe throughput "
        "every `pcie_interval_seconds` (30 s, 0.7 ms of CPU and 20 ms of waiting per direction) on its own thread."
    ),
    "profiling": (
        "GPM values are computed by the driver over a window between two samples, published only for a full window "
        "(at least 90 % of `interval_seconds`, never under 100 ms; a window after a gap of over 3 intervals is "
        "dropped). One GPM read of one GPU costs ~2.3 ms of CPU on an H100 (0.35 ms per sample, 0.18 ms per metric), "
        "so the default interval is 5 s: about 0.5 ms of CPU per GPU per second. `--once` waits one interval."
    ),
}


def catalogues() -> list[Catalogue]:
    return [SELF, *(registration.catalogue() for registration in REGISTRY.values())]


def markdown() -> str:
    lines = [
        "# accelmon metrics",
        "",
        "Generated by `python -m accelmon.catalogue` from the collectors' code; do not edit by hand.",
        "",
    ]
    for catalogue in catalogues():
        lines += [f"## {catalogue.title} (`{catalogue.collector}`)", ""]
        if catalogue.collector in NOTES:
            lines += [NOTES[catalogue.collector], ""]
        lines += ["| metric | type | labels | read | meaning |", "| --- | --- | --- | --- | --- |"]
        for spec in catalogue.specs:
            labels = ", ".join(spec.labels)
            lines.append(f"| `{spec.name}` | {spec.kind} | {labels} | {spec.read} | {spec.help} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
