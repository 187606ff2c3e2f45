"""The GPU device counters dashboard: what it shows, as plain data (master/grafana/generate.py builds its JSON)."""

from __future__ import annotations

from panels import Dashboard, G, Panel, gpu_vars

DASHBOARD = Dashboard(
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
