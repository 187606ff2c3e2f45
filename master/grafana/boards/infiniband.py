"""The InfiniBand dashboard: what it shows, as plain data (master/grafana/generate.py builds its JSON)."""

from __future__ import annotations

from panels import Dashboard, Panel, node_vars

P = 'node=~"$node",device=~"$device"'
DASHBOARD = Dashboard(
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
