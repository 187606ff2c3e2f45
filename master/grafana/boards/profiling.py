"""The GPU profiling counters dashboard: what it shows, as plain data (master/grafana/generate.py builds its JSON)."""

from __future__ import annotations

from panels import Dashboard, G, N, Panel, gpu_vars

DASHBOARD = Dashboard(
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
