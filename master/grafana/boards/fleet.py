"""The Fleet overview dashboard: what it shows, as plain data (master/grafana/generate.py builds its JSON)."""

from __future__ import annotations

from panels import Dashboard, Panel

DASHBOARD = Dashboard(
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
            # The node's GPUs' counters summed by a rule (accelmon-recording.yml), which says why that gives each
            # GPU's increase summed: one series a node at each point, not one a GPU.
            [("sum by (node) (increase(node:accelmon_gpu_xid_events_total:sum[$__rate_interval]))", "{{node}}")],
            width=8,
        ),
        Panel(
            "Uncorrected ECC errors",
            "short",
            [
                (
                    # The node's GPUs' counters summed by a rule (accelmon-recording.yml, which says when that gives
                    # each GPU's increase summed): one series a node at each point, not one a GPU.
                    "sum by (node) (increase("
                    'node:accelmon_gpu_ecc_errors_total:sum{type="uncorrected",scope="volatile"}[$__rate_interval]))',
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
