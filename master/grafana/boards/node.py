"""The Node dashboard: what it shows, as plain data (master/grafana/generate.py builds its JSON)."""

from __future__ import annotations

from panels import Dashboard, N, Panel, node_vars

DASHBOARD = Dashboard(
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
