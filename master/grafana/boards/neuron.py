"""The AWS Neuron dashboard: what it shows, as plain data (master/grafana/generate.py builds its JSON)."""

from __future__ import annotations

from panels import Dashboard, N, Panel, node_vars

R = 'node=~"$node",runtime_tag=~"$runtime_tag"'
DASHBOARD = Dashboard(
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
