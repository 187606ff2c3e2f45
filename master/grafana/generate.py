"""Generates accelmon's Grafana dashboards (master/grafana/dashboards/*.json) from this file.

    python master/grafana/generate.py          # rewrite the JSON files
    python master/grafana/generate.py --check  # exit 1 if the committed JSON differs (CI)

What each dashboard shows is declared here as plain data, every panel a (title, unit, queries) triple that the
tests run against a real Prometheus; the Grafana JSON is built from it with Grafana's own SDK
(grafana-foundation-sdk, pinned to the build for the Grafana image we deploy, so the schema version is that
Grafana's). Fixed uids, a datasource variable used by every panel, and a unit on every panel.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, heatmap, prometheus, stat, statushistory, table, timeseries
from grafana_foundation_sdk.builders import dashboard as sdk_dashboard
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prometheus_model

OUT = Path(__file__).resolve().parent / "dashboards"
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")


@dataclass
class Panel:
    title: str
    unit: str
    queries: list[tuple[str, str]]  # (PromQL, legend)
    kind: str = "timeseries"  # timeseries, stat, heatmap, table, bargauge, statushistory
    width: int = 12
    height: int = 8
    description: str = ""
    max: float | None = None
    expect_data: bool = True  # the contract test expects data on the simulated fleet


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    panels: list[Panel]
    variables: list[tuple[str, str]] = field(default_factory=list)  # (name, label_values query)
    tags: list[str] = field(default_factory=lambda: ["accelmon"])


def node_vars() -> list[tuple[str, str]]:
    return [("node", "label_values(accelmon_exporter_build_info, node)")]


def gpu_vars() -> list[tuple[str, str]]:
    return [*node_vars(), ("gpu", 'label_values(accelmon_gpu_up{node=~"$node"}, gpu)')]


G = 'node=~"$node",gpu=~"$gpu"'
N = 'node=~"$node"'

FLEET = Dashboard(
    "accelmon-fleet",
    "accelmon / Fleet overview",
    "Every node and accelerator at a glance: what is up, lost, hot, busy and failing.",
    [
        Panel("Nodes exporting", "none", [('count(up{job="accelmon"} == 1)', "up")], "stat", 4, 4),
        Panel("GPUs up", "none", [("cluster:accelmon_gpus_up:sum", "up")], "stat", 4, 4),
        Panel("GPUs lost", "none", [("cluster:accelmon_gpus_lost:sum", "lost")], "stat", 4, 4),
        Panel("GPU power", "watt", [("cluster:accelmon_gpu_power_watts:sum", "total")], "stat", 4, 4),
        Panel(
            "IB ports not active",
            "none",
            [("cluster:accelmon_infiniband_ports_not_active:count", "ports")],
            "stat",
            4,
            4,
        ),
        Panel(
            "NeuronCores busy",
            "percentunit",
            [("cluster:accelmon_neuroncore_utilization_ratio:avg", "avg")],
            "stat",
            4,
            4,
        ),
        Panel(
            "GPU utilization (heatmap over GPUs)",
            "percentunit",
            [("cluster:accelmon_gpus_by_utilization:count", "{{le}}")],
            "heatmap",
            12,
            9,
        ),
        Panel("Power per node", "watt", [("node:accelmon_gpu_power_watts:sum", "{{node}}")], width=12, height=9),
        Panel(
            "Hottest GPUs",
            "celsius",
            [("topk(10, accelmon_gpu_temperature_celsius)", "{{node}} GPU {{gpu}}")],
            "bargauge",
            8,
        ),
        Panel(
            "GPU memory pressure (fullest GPU per node)",
            "percentunit",
            [("node:accelmon_gpu_memory_used_ratio:max", "{{node}}")],
            width=8,
        ),
        Panel(
            "Mean GPU utilization per node",
            "percentunit",
            [("node:accelmon_gpu_utilization_ratio:avg", "{{node}}")],
            width=8,
        ),
        Panel(
            "XID events",
            "short",
            [("sum by (node) (increase(accelmon_gpu_xid_events_total[$__rate_interval]))", "{{node}}")],
            width=8,
        ),
        Panel(
            "Uncorrected ECC errors",
            "short",
            [
                (
                    "sum by (node) (increase("
                    'accelmon_gpu_ecc_errors_total{type="uncorrected",scope="volatile"}[$__rate_interval]))',
                    "{{node}}",
                )
            ],
            width=8,
        ),
        Panel(
            "Row remapping (pending or failed GPUs)",
            "short",
            [("node:accelmon_gpus_remapped_rows_pending_or_failed:sum", "{{node}}")],
            width=8,
        ),
        Panel("Lost GPUs", "short", [("accelmon_gpu_up == 0", "{{node}} GPU {{gpu}} {{uuid}}")], "table", 12),
        Panel(
            "Failing collectors",
            "short",
            [("accelmon_collector_success == 0", "{{node}} {{collector}}")],
            "table",
            12,
            expect_data=False,
        ),
    ],
)

GPU = Dashboard(
    "accelmon-gpu",
    "accelmon / GPU device counters",
    "NVML device counters per node and GPU: the equivalent of Moneo's device-counter view, and more.",
    [
        Panel(
            "GPU utilization",
            "percentunit",
            [(f"accelmon_gpu_utilization_ratio{{{G}}}", "{{node}} GPU {{gpu}}")],
            max=1,
        ),
        Panel(
            "Memory controller utilization",
            "percentunit",
            [(f"accelmon_gpu_memory_utilization_ratio{{{G}}}", "{{node}} GPU {{gpu}}")],
            max=1,
        ),
        Panel("Memory used", "bytes", [(f"accelmon_gpu_memory_used_bytes{{{G}}}", "{{node}} GPU {{gpu}}")]),
        Panel(
            "Memory used (fraction)",
            "percentunit",
            [
                (
                    f"accelmon_gpu_memory_used_bytes{{{G}}} / accelmon_gpu_memory_total_bytes{{{G}}}",
                    "{{node}} GPU {{gpu}}",
                )
            ],
            max=1,
        ),
        Panel(
            "SM clock",
            "hertz",
            [
                (f"accelmon_gpu_sm_clock_hertz{{{G}}}", "{{node}} GPU {{gpu}}"),
                (f"max(accelmon_gpu_sm_clock_max_hertz{{{G}}})", "max"),
            ],
        ),
        Panel("Memory clock", "hertz", [(f"accelmon_gpu_memory_clock_hertz{{{G}}}", "{{node}} GPU {{gpu}}")]),
        Panel("GPU temperature", "celsius", [(f"accelmon_gpu_temperature_celsius{{{G}}}", "{{node}} GPU {{gpu}}")]),
        Panel(
            "Memory temperature",
            "celsius",
            [(f"accelmon_gpu_memory_temperature_celsius{{{G}}}", "{{node}} GPU {{gpu}}")],
        ),
        Panel(
            "Power",
            "watt",
            [
                (f"accelmon_gpu_power_watts{{{G}}}", "{{node}} GPU {{gpu}}"),
                (f"max(accelmon_gpu_power_limit_watts{{{G}}})", "limit"),
            ],
        ),
        Panel(
            "Energy rate",
            "watt",
            [(f"rate(accelmon_gpu_energy_joules_total{{{G}}}[$__rate_interval])", "{{node}} GPU {{gpu}}")],
        ),
        Panel(
            "ECC errors",
            "short",
            [
                (
                    f'increase(accelmon_gpu_ecc_errors_total{{{G},scope="volatile"}}[$__rate_interval])',
                    "{{node}} GPU {{gpu}} {{type}}",
                )
            ],
        ),
        Panel(
            "XID errors by code",
            "short",
            [(f"increase(accelmon_gpu_xid_errors_total{{{G}}}[$__rate_interval])", "{{node}} GPU {{gpu}} XID {{xid}}")],
        ),
        Panel(
            "Clock event reasons active",
            "short",
            [(f"accelmon_gpu_clock_event_active{{{G}}} == 1", "{{node}} GPU {{gpu}} {{reason}}")],
        ),
        Panel(
            "Power / thermal violation time",
            "percentunit",
            [
                (
                    f"rate(accelmon_gpu_power_violation_seconds_total{{{G}}}[$__rate_interval])",
                    "{{node}} GPU {{gpu}} power",
                ),
                (
                    f"rate(accelmon_gpu_thermal_violation_seconds_total{{{G}}}[$__rate_interval])",
                    "{{node}} GPU {{gpu}} thermal",
                ),
            ],
        ),
        Panel(
            "PCIe throughput (NVML)",
            "Bps",
            [
                (f"accelmon_gpu_pcie_transmit_bytes_per_second{{{G}}}", "{{node}} GPU {{gpu}} tx"),
                (f"accelmon_gpu_pcie_receive_bytes_per_second{{{G}}}", "{{node}} GPU {{gpu}} rx"),
            ],
        ),
        Panel(
            "PCIe replays",
            "short",
            [(f"increase(accelmon_gpu_pcie_replays_total{{{G}}}[$__rate_interval])", "{{node}} GPU {{gpu}}")],
        ),
        Panel(
            "Remapped rows", "short", [(f"accelmon_gpu_remapped_rows_total{{{G}}}", "{{node}} GPU {{gpu}} {{cause}}")]
        ),
        Panel("Compute processes", "short", [(f"accelmon_gpu_compute_processes{{{G}}}", "{{node}} GPU {{gpu}}")]),
        Panel(
            "GPU inventory",
            "short",
            [(f"accelmon_gpu_info{{{G}}}", "{{node}} {{gpu}} {{vendor}} {{name}} {{pci_bus_id}}")],
            "table",
            24,
        ),
    ],
    gpu_vars(),
)

PROFILING = Dashboard(
    "accelmon-profiling",
    "accelmon / GPU profiling counters",
    "DCGM or NVML GPM profiling counters (collector 'profiling', opt-in per host group).",
    [
        Panel("SM active", "percentunit", [(f"accelmon_gpu_sm_active_ratio{{{G}}}", "{{node}} GPU {{gpu}}")], max=1),
        Panel(
            "SM occupancy", "percentunit", [(f"accelmon_gpu_sm_occupancy_ratio{{{G}}}", "{{node}} GPU {{gpu}}")], max=1
        ),
        Panel(
            "Tensor pipes active",
            "percentunit",
            [(f"accelmon_gpu_tensor_active_ratio{{{G}}}", "{{node}} GPU {{gpu}}")],
            max=1,
        ),
        Panel(
            "FP64 / FP32 / FP16 pipes active",
            "percentunit",
            [
                (f"accelmon_gpu_fp64_active_ratio{{{G}}}", "{{node}} GPU {{gpu}} fp64"),
                (f"accelmon_gpu_fp32_active_ratio{{{G}}}", "{{node}} GPU {{gpu}} fp32"),
                (f"accelmon_gpu_fp16_active_ratio{{{G}}}", "{{node}} GPU {{gpu}} fp16"),
            ],
            max=1,
        ),
        Panel(
            "DRAM active", "percentunit", [(f"accelmon_gpu_dram_active_ratio{{{G}}}", "{{node}} GPU {{gpu}}")], max=1
        ),
        Panel(
            "NVLink bandwidth",
            "Bps",
            [
                (f"accelmon_gpu_profiling_nvlink_transmit_bytes_per_second{{{G}}}", "{{node}} GPU {{gpu}} tx"),
                (f"accelmon_gpu_profiling_nvlink_receive_bytes_per_second{{{G}}}", "{{node}} GPU {{gpu}} rx"),
            ],
        ),
        Panel(
            "PCIe bandwidth",
            "Bps",
            [
                (f"accelmon_gpu_profiling_pcie_transmit_bytes_per_second{{{G}}}", "{{node}} GPU {{gpu}} tx"),
                (f"accelmon_gpu_profiling_pcie_receive_bytes_per_second{{{G}}}", "{{node}} GPU {{gpu}} rx"),
            ],
        ),
        Panel(
            "Profiling backend per node",
            "short",
            [(f"accelmon_gpu_profiling_backend_info{{{N}}}", "{{node}} {{backend}}")],
            "table",
        ),
    ],
    gpu_vars(),
)

P = 'node=~"$node",device=~"$device"'
INFINIBAND = Dashboard(
    "accelmon-infiniband",
    "accelmon / InfiniBand",
    "Per-port throughput from counters (rate() here, never in the exporter), errors, link state and HCA placement.",
    [
        Panel(
            "Receive throughput",
            "Bps",
            [
                (
                    f"rate(accelmon_infiniband_port_data_received_bytes_total{{{P}}}[$__rate_interval])",
                    "{{node}} {{device}}:{{port}}",
                )
            ],
        ),
        Panel(
            "Transmit throughput",
            "Bps",
            [
                (
                    f"rate(accelmon_infiniband_port_data_transmitted_bytes_total{{{P}}}[$__rate_interval])",
                    "{{node}} {{device}}:{{port}}",
                )
            ],
        ),
        Panel(
            "Packets",
            "pps",
            [
                (
                    f"rate(accelmon_infiniband_port_packets_received_total{{{P}}}[$__rate_interval])",
                    "{{node}} {{device}}:{{port}} rx",
                ),
                (
                    f"rate(accelmon_infiniband_port_packets_transmitted_total{{{P}}}[$__rate_interval])",
                    "{{node}} {{device}}:{{port}} tx",
                ),
            ],
        ),
        Panel(
            "Errors and discards",
            "short",
            [
                (
                    f"increase(accelmon_infiniband_port_errors_received_total{{{P}}}[$__rate_interval])",
                    "{{node}} {{device}}:{{port}} rcv errors",
                ),
                (
                    f"increase(accelmon_infiniband_port_discards_transmitted_total{{{P}}}[$__rate_interval])",
                    "{{node}} {{device}}:{{port}} xmit discards",
                ),
                (
                    f"increase(accelmon_infiniband_symbol_error_total{{{P}}}[$__rate_interval])",
                    "{{node}} {{device}}:{{port}} symbol errors",
                ),
            ],
        ),
        Panel(
            "Link downed events",
            "short",
            [
                (
                    f"increase(accelmon_infiniband_link_downed_total{{{P}}}[$__rate_interval])",
                    "{{node}} {{device}}:{{port}}",
                )
            ],
        ),
        Panel(
            "Transmit wait (congestion)",
            "short",
            [
                (
                    f"rate(accelmon_infiniband_port_transmit_wait_total{{{P}}}[$__rate_interval])",
                    "{{node}} {{device}}:{{port}}",
                )
            ],
        ),
        Panel(
            "Port state (4 = active)",
            "short",
            [(f"accelmon_infiniband_state_id{{{P}}}", "{{node}} {{device}}:{{port}}")],
        ),
        Panel(
            "Link speed", "Bps", [(f"accelmon_infiniband_rate_bytes_per_second{{{P}}}", "{{node}} {{device}}:{{port}}")]
        ),
        Panel(
            "HCA placement (PCI, NUMA)",
            "short",
            [(f"accelmon_infiniband_placement_info{{{P}}}", "{{node}} {{device}} {{pci_address}} numa {{numa_node}}")],
            "table",
            12,
        ),
        Panel(
            "HCA firmware",
            "short",
            [(f"accelmon_infiniband_info{{{P}}}", "{{node}} {{device}} {{board_id}} {{firmware_version}}")],
            "table",
            12,
        ),
    ],
    [*node_vars(), ("device", 'label_values(accelmon_infiniband_info{node=~"$node"}, device)')],
)

R = 'node=~"$node",runtime_tag=~"$runtime_tag"'
NEURON = Dashboard(
    "accelmon-neuron",
    "accelmon / AWS Neuron",
    "NeuronCore utilization, execution latency and outcomes, memory and ECC, per runtime tag.",
    [
        Panel(
            "NeuronCore utilization",
            "percentunit",
            [(f"accelmon_neuroncore_utilization_ratio{{{R}}}", "{{node}} {{runtime_tag}} core {{neuroncore}}")],
            max=1,
        ),
        Panel(
            "FLOPS",
            "flops",
            [(f"sum by (node, runtime_tag) (accelmon_neuroncore_flops{{{R}}})", "{{node}} {{runtime_tag}}")],
        ),
        Panel(
            "Execution latency",
            "s",
            [
                (
                    f'accelmon_neuron_execution_latency_seconds{{{R},percentile=~"p50|p99"}}',
                    "{{node}} {{runtime_tag}} {{latency}} {{percentile}}",
                )
            ],
        ),
        Panel(
            "Executions",
            "ops",
            [
                (
                    f"rate(accelmon_neuron_execution_status_total{{{R}}}[$__rate_interval])",
                    "{{node}} {{runtime_tag}} {{status_type}}",
                )
            ],
        ),
        Panel(
            "Execution errors",
            "short",
            [
                (
                    f"increase(accelmon_neuron_execution_errors_total{{{R}}}[$__rate_interval])",
                    "{{node}} {{runtime_tag}} {{error_type}}",
                )
            ],
        ),
        Panel(
            "Device memory by category",
            "bytes",
            [
                (
                    f"sum by (node, runtime_tag, category) (accelmon_neuroncore_memory_used_bytes{{{R}}})",
                    "{{node}} {{runtime_tag}} {{category}}",
                )
            ],
        ),
        Panel(
            "Host memory by category",
            "bytes",
            [(f"accelmon_neuron_runtime_host_memory_used_bytes{{{R}}}", "{{node}} {{runtime_tag}} {{category}}")],
        ),
        Panel(
            "Runtime vCPU",
            "percentunit",
            [(f"accelmon_neuron_runtime_vcpu_usage_ratio{{{R}}}", "{{node}} {{runtime_tag}} {{usage_type}}")],
        ),
        Panel(
            "ECC events",
            "short",
            [
                (
                    f"increase(accelmon_neuron_hw_ecc_events_total{{{N}}}[$__rate_interval])",
                    "{{node}} device {{neuron_device}} {{event_type}}",
                )
            ],
        ),
        Panel(
            "neuron-monitor health",
            "short",
            [
                (f"accelmon_neuron_monitor_up{{{N}}}", "{{node}} up"),
                (f"increase(accelmon_neuron_monitor_restarts_total{{{N}}}[$__rate_interval])", "{{node}} restarts"),
                (
                    f"increase(accelmon_neuron_monitor_malformed_lines_total{{{N}}}[$__rate_interval])",
                    "{{node}} bad lines",
                ),
            ],
        ),
    ],
    [*node_vars(), ("runtime_tag", 'label_values(accelmon_neuron_runtime_info{node=~"$node"}, runtime_tag)')],
)

NODE = Dashboard(
    "accelmon-node",
    "accelmon / Node",
    "CPU, memory, filesystem and network of the workers, from node_exporter.",
    [
        Panel(
            "CPU busy",
            "percentunit",
            [(f'1 - avg by (node) (rate(node_cpu_seconds_total{{{N},mode="idle"}}[$__rate_interval]))', "{{node}}")],
            max=1,
        ),
        Panel("Load (1 min)", "short", [(f"node_load1{{{N}}}", "{{node}}")]),
        Panel("Memory available", "bytes", [(f"node_memory_MemAvailable_bytes{{{N}}}", "{{node}}")]),
        Panel(
            "Filesystem free",
            "percentunit",
            [
                (
                    f'node_filesystem_avail_bytes{{{N},fstype!~"tmpfs|overlay"}}'
                    f' / node_filesystem_size_bytes{{{N},fstype!~"tmpfs|overlay"}}',
                    "{{node}} {{mountpoint}}",
                )
            ],
            max=1,
        ),
        Panel(
            "Network receive",
            "Bps",
            [(f'rate(node_network_receive_bytes_total{{{N},device!="lo"}}[$__rate_interval])', "{{node}} {{device}}")],
        ),
        Panel(
            "Network transmit",
            "Bps",
            [(f'rate(node_network_transmit_bytes_total{{{N},device!="lo"}}[$__rate_interval])', "{{node}} {{device}}")],
        ),
    ],
    node_vars(),
)

# A device series joined to the jobs holding its GPU: one series per (GPU, job), with the job's labels.
J = 'job_id=~"$job_id"'


def per_job_gpu(metric: str) -> str:
    return f"{metric} * on (instance, uuid) group_right accelmon_gpu_job_info{{{J}}}"


JOB_LEGEND = "job {{job_id}} {{node}} GPU {{gpu}}"
JOB = Dashboard(
    "accelmon-job",
    "accelmon / Job",
    "One batch job's GPUs over time (collector 'jobs', with the role's accelmon_exporter_jobs: slurm or oar): "
    "which GPUs it holds, how busy, how full and how hot they are. Device series are joined to the job on uuid.",
    [
        Panel("GPUs held", "none", [(f"job_id:accelmon_gpus:count{{{J}}}", "job {{job_id}}")], "stat", 6, 4),
        Panel(
            "GPU utilization (job average)",
            "percentunit",
            [(f"job_id:accelmon_gpu_utilization_ratio:avg{{{J}}}", "job {{job_id}}")],
            "stat",
            6,
            4,
            max=1,
        ),
        Panel(
            "GPU memory (fullest GPU)",
            "percentunit",
            [(f"job_id:accelmon_gpu_memory_used_ratio:max{{{J}}}", "job {{job_id}}")],
            "stat",
            6,
            4,
            max=1,
        ),
        Panel(
            "GPU power (sum)", "watt", [(f"job_id:accelmon_gpu_power_watts:sum{{{J}}}", "job {{job_id}}")], "stat", 6, 4
        ),
        Panel(
            "The job's GPUs",
            "short",
            [(f"accelmon_gpu_job_info{{{J}}}", "{{node}} {{gpu}}")],
            "table",
            24,
            6,
            description="Node, NVML index and UUID of every GPU the job holds, with its user and account.",
        ),
        Panel("GPU utilization", "percentunit", [(per_job_gpu("accelmon_gpu_utilization_ratio"), JOB_LEGEND)], max=1),
        Panel("GPU memory used", "bytes", [(per_job_gpu("accelmon_gpu_memory_used_bytes"), JOB_LEGEND)]),
        Panel("GPU power", "watt", [(per_job_gpu("accelmon_gpu_power_watts"), JOB_LEGEND)]),
        Panel("GPU temperature", "celsius", [(per_job_gpu("accelmon_gpu_temperature_celsius"), JOB_LEGEND)]),
        Panel(
            "SM active (profiling)",
            "percentunit",
            [(per_job_gpu("accelmon_gpu_sm_active_ratio"), JOB_LEGEND)],
            max=1,
            description="Where the profiling collector is on for the job's nodes.",
        ),
        Panel(
            "SM clock",
            "hertz",
            [(per_job_gpu("accelmon_gpu_sm_clock_hertz"), JOB_LEGEND)],
            description="A GPU clocked below its peers holds back a synchronous job.",
        ),
        Panel(
            "The job's share of each GPU (SM time of its processes)",
            "percentunit",
            [(f"accelmon_gpu_job_sm_utilization_ratio{{{J}}}", "job {{job_id}} {{node}} GPU {{gpu}}")],
            max=1,
            description="From NVML's per-process samples (collector gpu_processes): on a GPU shared by several "
            "jobs, each job's own part.",
        ),
        Panel(
            "GPU memory of the job's processes",
            "bytes",
            [(f"accelmon_gpu_job_memory_used_bytes{{{J}}}", "job {{job_id}} {{node}} GPU {{gpu}} {{gpu_instance_id}}")],
        ),
        Panel(
            "CPU cores used and given, per node",
            "short",
            [
                (
                    f"sum by (job_id, node) (rate(accelmon_job_cpu_seconds_total{{{J}}}[$__rate_interval]))",
                    "used {{node}}",
                ),
                (f"sum by (job_id, node) (accelmon_job_cpus_allocated{{{J}}})", "given {{node}}"),
            ],
            description="From the job's cgroup (collector job_resources). GPUs idle while these meet: input-bound.",
        ),
        Panel(
            "CPU efficiency (cores used over given)",
            "percentunit",
            [(f"job_id:accelmon_job_cpu_efficiency:ratio{{{J}}}", "job {{job_id}}")],
            max=1,
        ),
        Panel(
            "Memory: used, peak and limit, per node",
            "bytes",
            [
                (f"accelmon_job_memory_used_bytes{{{J}}}", "used {{node}}"),
                (f"accelmon_job_memory_peak_bytes{{{J}}}", "peak {{node}}"),
                (f"accelmon_job_memory_limit_bytes{{{J}}}", "limit {{node}}"),
                (f"accelmon_job_swap_used_bytes{{{J}}}", "swap {{node}}"),
            ],
            description="Peak near the limit: the job is about to be killed for memory; swap: it pages.",
        ),
        Panel(
            "I/O per node",
            "Bps",
            [
                (
                    f"sum by (job_id, node, direction) (rate(accelmon_job_io_bytes_total{{{J}}}[$__rate_interval]))",
                    "{{direction}} {{node}}",
                )
            ],
        ),
    ],
    [("job_id", "label_values(accelmon_gpu_job_info, job_id)")],
)

VERDICT = "0 ok, 1 warning, 2 failure."
HEALTH = Dashboard(
    "accelmon-health",
    "accelmon / Health",
    "Which GPU is broken and what to do: the health checks' verdicts (docs/health.md), fleet first, then per GPU its "
    "checks, the XIDs of its kernel log by name, and its NVLink links.",
    [
        Panel(
            "Nodes failing",
            "none",
            [("count(node:accelmon_health_verdict:max == 2) or vector(0)", "nodes")],
            "stat",
            6,
            4,
        ),
        Panel(
            "Nodes warning",
            "none",
            [("count(node:accelmon_health_verdict:max == 1) or vector(0)", "nodes")],
            "stat",
            6,
            4,
        ),
        Panel("GPUs failing", "none", [("sum(node:accelmon_gpus_failing:count)", "GPUs")], "stat", 6, 4),
        Panel(
            "Nodes healthy",
            "none",
            [("count(node:accelmon_health_verdict:max == 0) or vector(0)", "nodes")],
            "stat",
            6,
            4,
        ),
        Panel(
            "Fleet by verdict",
            "short",
            [(f"node:accelmon_health_verdict:max{{{N}}}", "{{node}}")],
            "statushistory",
            24,
            6,
            description="Each node's worst verdict over time: " + VERDICT,
        ),
        Panel(
            "What to do: checks that are not ok",
            "short",
            [(f"accelmon_gpu_health_check_state{{{G}}} > 0", "{{node}} GPU {{gpu}} {{check}} {{action}}")],
            "table",
            12,
            8,
            description="Each failing (2) or warning (1) check of a GPU with its action; `accelmon-exporter --scan` on "
            "the node gives the detail.",
        ),
        Panel(
            "Node checks that are not ok",
            "short",
            [(f"accelmon_node_health_check_state{{{N}}} > 0", "{{node}} {{check}} {{action}}")],
            "table",
            12,
            8,
            description="Checks of the node itself: the kernel log unreadable, the Fabric Manager not running.",
            expect_data=False,
        ),
        Panel(
            "Verdict per GPU",
            "short",
            [(f"accelmon_gpu_health_verdict{{{G}}}", "{{node}} GPU {{gpu}}")],
            "statushistory",
            24,
            8,
            description=VERDICT,
        ),
        Panel(
            "XIDs in the kernel log since boot, by name (last seen)",
            "dateTimeAsIso",
            [
                (
                    f"accelmon_gpu_kernel_xid_last_timestamp_seconds{{{G}}} * 1000"
                    " * on (instance, xid) group_left (name, severity, action) accelmon_xid_catalogue_info",
                    "{{node}} GPU {{gpu}} XID {{xid}} {{name}}",
                )
            ],
            "table",
            24,
            7,
            description="Named by the XID catalogue (exporters/accelmon/xid.py) with its severity and action.",
        ),
        Panel(
            "NVLink link map (1 up, 0 down)",
            "short",
            [(f"accelmon_gpu_nvlink_link_up{{{G}}}", "{{node}} GPU {{gpu}} link {{link}}")],
            "statushistory",
            24,
            10,
            description="Every NVLink link of the selected GPUs over time; a link down fails its GPU's nvlink check.",
        ),
        Panel(
            "NVLink errors per second",
            "short",
            [
                (
                    f"sum by (node, gpu, link, type) (rate(accelmon_gpu_nvlink_errors_total{{{G}}}[$__rate_interval]))",
                    "{{node}} GPU {{gpu}} link {{link}} {{type}}",
                )
            ],
            width=12,
            description="CRC errors matter from about 100/s (alert AccelmonNvlinkCrcErrors); any replay or recovery "
            "error warns the nvlink check.",
        ),
        Panel(
            "Fabric registration (3 completed)",
            "short",
            [(f"accelmon_gpu_fabric_state{{{G}}}", "{{node}} GPU {{gpu}}")],
            width=12,
            description="1 not started, 2 in progress, 3 completed; NVSwitch systems only.",
        ),
    ],
    gpu_vars(),
)

DASHBOARDS = [FLEET, GPU, PROFILING, INFINIBAND, NEURON, NODE, JOB, HEALTH]


# The panel kinds used here and their SDK builders.
KINDS = {
    "timeseries": timeseries.Panel,
    "stat": stat.Panel,
    "heatmap": heatmap.Panel,
    "table": table.Panel,
    "bargauge": bargauge.Panel,
    "statushistory": statushistory.Panel,
}


def build_panel(panel: Panel, panel_id: int, x: int, y: int) -> Builder:
    built = (
        KINDS[panel.kind]()
        .id(panel_id)
        .title(panel.title)
        .description(panel.description)
        .datasource(DATASOURCE)
        .grid_pos(model.GridPos(h=panel.height, w=panel.width, x=x, y=y))
        .unit(panel.unit)
    )
    if panel.max is not None:
        built = built.min(0).max(panel.max)
    for number, (expr, legend) in enumerate(panel.queries):
        query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + number))
        if panel.kind == "table":
            query = query.format(prometheus_model.PromQueryFormat.TABLE).instant()
        elif panel.kind == "bargauge":  # bars show the present: one instant query, not a range of top-k's
            query = query.instant()
        elif panel.kind == "heatmap":  # cumulative `le` buckets from a recording rule, as Grafana reads histograms
            query = query.format(prometheus_model.PromQueryFormat.HEATMAP)
        built = built.with_target(query.datasource(DATASOURCE))
    if panel.kind == "heatmap":
        # How many GPUs sit at each utilization, from buckets the fleet rules count: Grafana draws them as they are.
        built = built.calculate(False).y_axis(heatmap.YAxisConfig().unit(panel.unit))
    return built


def build_dashboard(dashboard: Dashboard) -> Builder:
    built = (
        sdk_dashboard.Dashboard(dashboard.title)
        .uid(dashboard.uid)
        .description(dashboard.description)
        .tags(dashboard.tags)
        .timezone("browser")
        .readonly()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("30s")
        .link(
            sdk_dashboard.DashboardLink("accelmon")
            .type(model.DashboardLinkType.DASHBOARDS)
            .tags(["accelmon"])
            .as_dropdown(True)
        )
        .with_variable(sdk_dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    for name, query in dashboard.variables:
        built = built.with_variable(
            sdk_dashboard.QueryVariable(name)
            .label(name)
            .datasource(DATASOURCE)
            .query({"query": query, "refId": f"{name}-var"})
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .include_all(True)
            .multi(True)
            .all_value(".*")
            .sort(model.VariableSort.NUMERICAL_ASC)
        )
    x, y, row_height = 0, 0, 0
    for number, panel in enumerate(dashboard.panels, start=1):
        if x + panel.width > 24:
            x, y, row_height = 0, y + row_height, 0
        built = built.with_panel(build_panel(panel, number, x, y))
        x += panel.width
        row_height = max(row_height, panel.height)
    return built


# The interval variable's fields, which the SDK writes on every variable; Grafana 11.6's dashboard model (the
# @grafana/schema 11.6.0 types that tests/test_master.py checks each dashboard against) has none of them.
INTERVAL_ONLY = ("auto", "auto_count", "auto_min")


def to_grafana_model(built: Any) -> Any:
    """The SDK's dashboard as Grafana 11.6's model has it: no interval fields on a variable (we use none)."""
    document = json.loads(JSONEncoder(sort_keys=True).encode(built))
    for variable in document.get("templating", {}).get("list", []):
        if variable.get("type") == "interval":
            raise ValueError(f"{variable['name']}: an interval variable needs its auto fields; keep them for it")
        for key in INTERVAL_ONLY:
            variable.pop(key, None)
    return document


def render_all() -> dict[str, str]:
    return {
        f"{d.uid}.json": json.dumps(to_grafana_model(build_dashboard(d).build()), sort_keys=True, indent=2) + "\n"
        for d in DASHBOARDS
    }


def main(argv: list[str]) -> int:
    rendered = render_all()
    if "--check" in argv:
        stale = [
            name for name, text in rendered.items() if not (OUT / name).exists() or (OUT / name).read_text() != text
        ]
        extra = [p.name for p in OUT.glob("*.json") if p.name not in rendered]
        if stale or extra:
            print(f"dashboards out of date: {', '.join(stale + extra)}; run python master/grafana/generate.py")
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (OUT / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
