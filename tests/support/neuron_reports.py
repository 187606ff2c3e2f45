"""neuron-monitor reports in the format of the user guide (shared/seeds/neuron-monitor-user-guide.rst)."""

from __future__ import annotations

import json
from typing import Any


def runtime(tag: str, pid: int, capture: int, errors: int = 0, idle: bool = False) -> dict[str, Any]:
    latency = (
        None
        if idle
        else {"p0": 0.011, "p1": 0.0111, "p25": 0.0112, "p50": 0.0113, "p75": 0.0114, "p99": 0.0115, "p100": 0.0116}
    )
    device_latency = None if idle else {k: v - 0.001 for k, v in latency.items()}  # type: ignore[union-attr]
    core_memory = {
        "constants": 193986816,
        "model_code": 176285056,
        "model_shared_scratchpad": 0,
        "runtime_memory": 0,
        "tensors": 20971520,
    }
    return {
        "pid": pid,
        "address": "",
        "neuron_runtime_tag": tag,
        "error": "",
        "report": {
            "neuroncore_counters": {
                "period": 1.0 + capture / 1000,
                "neuroncores_in_use": {
                    "0": {"neuroncore_utilization": 42.01, "flops": 1234567891011},
                    "1": {"neuroncore_utilization": 0.0 if idle else 87.5, "flops": 0 if idle else 2000000000000},
                },
                "error": "",
            },
            "execution_stats": {
                "period": 1.03 + capture / 1000,
                "error_summary": {
                    "generic": errors,
                    "numerical": 0,
                    "transient": 0,
                    "model": 0,
                    "runtime": 0,
                    "hardware": 0,
                },
                "execution_summary": {
                    "completed": 0 if idle else 100,
                    "completed_with_err": errors,
                    "completed_with_num_err": 0,
                    "timed_out": 0,
                    "incorrect_input": 0,
                    "failed_to_queue": 0,
                },
                "latency_stats": {"total_latency": latency, "device_latency": device_latency},
                "error": "",
            },
            "memory_used": {
                "period": 1.00001,
                "neuron_runtime_used_bytes": {
                    "host": 6997643264,
                    "neuron_device": 12519788544,
                    "usage_breakdown": {
                        "host": {
                            "application_memory": 6996594688,
                            "constants": 0,
                            "dma_buffers": 1048576,
                            "tensors": 0,
                        },
                        "neuroncore_memory_usage": {"0": core_memory, "1": core_memory},
                    },
                },
                "loaded_models": [
                    {
                        "name": "neff",
                        "uuid": "91f2f66e83ea419dace1da07617ad39f",
                        "model_id": 10005,
                        "is_running": not idle,
                        "subgraphs": {},
                    }
                ],
                "error": "",
            },
            "neuron_runtime_vcpu_usage": {"period": 1.03, "vcpu_usage": {"user": 42.01, "system": 12.34}, "error": ""},
        },
    }


def report(capture: int, runtimes: list[dict[str, Any]] | None = None, ecc_uncorrected: int = 0) -> dict[str, Any]:
    if runtimes is None:
        runtimes = [runtime("llama-serve", 3101, capture, errors=capture), runtime("", 4242, capture, idle=True)]
    return {
        "neuron_runtime_data": runtimes,
        "system_data": {
            "neuron_hw_counters": {
                "period": 1.030359284 + capture / 1000,
                "neuron_devices": [
                    {
                        "neuron_device_index": 0,
                        "mem_ecc_corrected": 1,
                        "mem_ecc_uncorrected": ecc_uncorrected,
                        "sram_ecc_uncorrected": 0,
                        "sram_ecc_corrected": 0,
                    },
                    {
                        "neuron_device_index": 1,
                        "mem_ecc_corrected": 0,
                        "mem_ecc_uncorrected": 0,
                        "sram_ecc_uncorrected": 0,
                        "sram_ecc_corrected": 2,
                    },
                ],
                "error": "",
            },
            "vcpu_usage": {
                "period": 0.999974868 + capture / 1000,
                "average_usage": {
                    "user": 32.77,
                    "nice": 0,
                    "system": 22.87,
                    "idle": 39.36,
                    "io_wait": 0,
                    "irq": 0,
                    "soft_irq": 0,
                },
                "usage_data": {
                    str(i): {"user": 30, "nice": 0, "system": 20, "idle": 50, "io_wait": 0, "irq": 0, "soft_irq": 0}
                    for i in range(4)
                },
                "context_switch_count": 1000,
                "error": "",
            },
            "memory_info": {
                "period": 5.346411129,
                "memory_total_bytes": 49345835008,
                "memory_used_bytes": 16042344448,
                "swap_total_bytes": 0,
                "swap_used_bytes": 0,
                "error": "",
            },
        },
        "instance_info": {
            "instance_name": "trn-node-1",
            "instance_id": "i-0011223344556677a",
            "instance_type": "trn1.32xlarge",
            "instance_availability_zone": "us-west-2b",
            "instance_availability_zone_id": "usw2-az2",
            "instance_region": "us-west-2",
            "ami_id": "ami-0011223344556677b",
            "subnet_id": "subnet-112233ee",
            "error": "",
        },
        "neuron_hardware_info": {
            "neuron_device_type": "trainium",
            "neuroncore_version": "v2",
            "neuron_device_count": 16,
            "neuron_device_memory_size": 34359738368,
            "neuroncore_per_device_count": 2,
            "error": "",
        },
    }


def line(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"))
