"""Every NVML call the exporter makes, asked once of each GPU (and of each MIG device where the call is MIG's), with
what it answered and what it cost: the CPU and wall time of the call itself. Run on a GPU host by `bench.real_gpu`
(or alone) so that one session with a real GPU records every answer the fakes must give (docs/hardware.md):

    PYTHONPATH=exporters:. python3 -m bench.nvml_calls [--json FILE]

`CALLS` names each call the exporter's modules make; tests/test_bench_calls.py fails when the exporter makes a call
this list does not probe, and runs the probe against the fake driver.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from typing import Any, Callable

import pynvml

Probe = Callable[[Any, Any], Any]  # (pynvml, device handle) -> the answer


def _gpm(nvml: Any, handle: Any, mig_instance: int | None = None) -> dict[str, float]:
    """Two GPM samples 1 s apart and the metrics the profiling collector reads, graphics activity included."""
    wanted = {
        "graphics": nvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
        "sm": nvml.NVML_GPM_METRIC_SM_UTIL,
        "sm_occupancy": nvml.NVML_GPM_METRIC_SM_OCCUPANCY,
        "tensor": nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        "dram": nvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
        "fp64": nvml.NVML_GPM_METRIC_FP64_UTIL,
        "fp32": nvml.NVML_GPM_METRIC_FP32_UTIL,
        "fp16": nvml.NVML_GPM_METRIC_FP16_UTIL,
        "pcie_tx_mib_s": nvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
        "pcie_rx_mib_s": nvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
        "nvlink_tx_mib_s": nvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
        "nvlink_rx_mib_s": nvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
    }
    samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
    try:
        for sample in samples:
            if mig_instance is None:
                nvml.nvmlGpmSampleGet(handle, sample)
            else:
                nvml.nvmlGpmMigSampleGet(handle, mig_instance, sample)
            time.sleep(1.0)
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1, request.sample2 = samples
        for slot, metric in enumerate(wanted.values()):
            request.metrics[slot].metricId = metric
        nvml.nvmlGpmMetricsGet(request)
        return {name: request.metrics[slot].value for slot, name in enumerate(wanted)}
    finally:
        for sample in samples:
            nvml.nvmlGpmSampleFree(sample)


def _links(nvml: Any, handle: Any, read: Callable[[int], Any]) -> dict[int, Any]:
    """`read(link)` of each NVLink link the GPU answers for (NVML_NVLINK_MAX_LINKS of them at most)."""
    answers: dict[int, Any] = {}
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            answers[link] = read(link)
        except nvml.NVMLError as error:
            answers[link] = str(error)
    return answers


def _field_values(nvml: Any, handle: Any) -> dict[int, Any]:
    ids = [
        nvml.NVML_FI_DEV_MEMORY_TEMP, nvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, nvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        nvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, nvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, nvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        nvml.NVML_FI_DEV_RETIRED_SBE, nvml.NVML_FI_DEV_RETIRED_DBE, nvml.NVML_FI_DEV_RETIRED_PENDING,
        nvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, nvml.NVML_FI_DEV_REMAPPED_COR, nvml.NVML_FI_DEV_REMAPPED_UNC,
        nvml.NVML_FI_DEV_REMAPPED_PENDING, nvml.NVML_FI_DEV_REMAPPED_FAILURE,
    ]  # fmt: skip
    return {v.fieldId: (v.nvmlReturn, v.valueType, v.value.ullVal) for v in nvml.nvmlDeviceGetFieldValues(handle, ids)}


def _events(nvml: Any, handle: Any) -> str:
    """The XID watch as the exporter sets it up: register, one wait of 10 ms (a timeout on a healthy GPU), free."""
    event_set = nvml.nvmlEventSetCreate()
    try:
        nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
        try:
            event = nvml.nvmlEventSetWait(event_set, 10)
            return f"XID {event.eventData}"
        except nvml.NVMLError_Timeout:
            return "timeout (no XID)"
    finally:
        nvml.nvmlEventSetFree(event_set)


def _profiles(nvml: Any, handle: Any) -> dict[int, Any]:
    """The GPU's GPU instance profiles (its MIG profile table), by profile index."""
    found: dict[int, Any] = {}
    for index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index, 2)
            found[index] = {"id": info.id, "slices": info.sliceCount, "memory_mb": info.memorySizeMB, "name": info.name}
        except nvml.NVMLError as error:
            found[index] = str(error)
    return found


def _fabric(nvml: Any, handle: Any, function: str, structure: str) -> Any:
    """The fabric structure filled in as the fabric collector asks for it (by reference)."""
    info = getattr(nvml, structure)()
    getattr(nvml, function)(handle, ctypes.byref(info))
    return vars_of(info)


def _mig_devices(nvml: Any, handle: Any) -> list[tuple[int, Any]]:
    """(GPU instance id, MIG device handle) of each MIG device of the GPU; [] outside MIG."""
    try:
        if not nvml.nvmlDeviceGetMigMode(handle)[0]:
            return []
    except nvml.NVMLError:
        return []
    found = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError:
            continue
        found.append((nvml.nvmlDeviceGetGpuInstanceId(mig), mig))
    return found


CALLS: dict[str, Probe] = {
    "nvmlDeviceGetUUID": lambda n, h: n.nvmlDeviceGetUUID(h),
    "nvmlDeviceGetIndex": lambda n, h: n.nvmlDeviceGetIndex(h),
    "nvmlDeviceGetName": lambda n, h: n.nvmlDeviceGetName(h),
    "nvmlDeviceGetSerial": lambda n, h: n.nvmlDeviceGetSerial(h),
    "nvmlDeviceGetVbiosVersion": lambda n, h: n.nvmlDeviceGetVbiosVersion(h),
    "nvmlDeviceGetPciInfo": lambda n, h: n.nvmlDeviceGetPciInfo(h).busId,
    "nvmlDeviceGetCudaComputeCapability": lambda n, h: n.nvmlDeviceGetCudaComputeCapability(h),
    "nvmlSystemGetDriverVersion": lambda n, h: n.nvmlSystemGetDriverVersion(),
    "nvmlDeviceGetUtilizationRates": lambda n, h: vars_of(n.nvmlDeviceGetUtilizationRates(h)),
    "nvmlDeviceGetMemoryInfo": lambda n, h: vars_of(n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)),
    "nvmlDeviceGetBAR1MemoryInfo": lambda n, h: vars_of(n.nvmlDeviceGetBAR1MemoryInfo(h)),
    "nvmlDeviceGetTemperature": lambda n, h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
    "nvmlDeviceGetTemperatureV": lambda n, h: n.nvmlDeviceGetTemperatureV(h, n.NVML_TEMPERATURE_GPU),
    "nvmlDeviceGetPowerUsage": lambda n, h: n.nvmlDeviceGetPowerUsage(h),
    "nvmlDeviceGetEnforcedPowerLimit": lambda n, h: n.nvmlDeviceGetEnforcedPowerLimit(h),
    "nvmlDeviceGetClockInfo": lambda n, h: [
        n.nvmlDeviceGetClockInfo(h, c) for c in (n.NVML_CLOCK_SM, n.NVML_CLOCK_MEM)
    ],
    "nvmlDeviceGetMaxClockInfo": lambda n, h: [
        n.nvmlDeviceGetMaxClockInfo(h, c) for c in (n.NVML_CLOCK_SM, n.NVML_CLOCK_MEM)
    ],
    "nvmlDeviceGetPerformanceState": lambda n, h: n.nvmlDeviceGetPerformanceState(h),
    "nvmlDeviceGetFanSpeed": lambda n, h: n.nvmlDeviceGetFanSpeed(h),
    "nvmlDeviceGetEncoderUtilization": lambda n, h: n.nvmlDeviceGetEncoderUtilization(h),
    "nvmlDeviceGetDecoderUtilization": lambda n, h: n.nvmlDeviceGetDecoderUtilization(h),
    "nvmlDeviceGetComputeRunningProcesses": lambda n, h: [
        vars_of(p) for p in n.nvmlDeviceGetComputeRunningProcesses(h)
    ],
    "nvmlDeviceGetFieldValues": _field_values,
    "nvmlDeviceGetViolationStatus": lambda n, h: [
        vars_of(n.nvmlDeviceGetViolationStatus(h, p)) for p in (n.NVML_PERF_POLICY_POWER, n.NVML_PERF_POLICY_THERMAL)
    ],
    "nvmlDeviceGetCurrentClocksEventReasons": lambda n, h: hex(n.nvmlDeviceGetCurrentClocksEventReasons(h)),
    "nvmlDeviceGetCurrentClocksThrottleReasons": lambda n, h: hex(n.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
    "nvmlDeviceGetCurrPcieLinkGeneration": lambda n, h: n.nvmlDeviceGetCurrPcieLinkGeneration(h),
    "nvmlDeviceGetCurrPcieLinkWidth": lambda n, h: n.nvmlDeviceGetCurrPcieLinkWidth(h),
    "nvmlDeviceGetMaxPcieLinkGeneration": lambda n, h: n.nvmlDeviceGetMaxPcieLinkGeneration(h),
    "nvmlDeviceGetGpuMaxPcieLinkGeneration": lambda n, h: n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h),
    "nvmlDeviceGetMaxPcieLinkWidth": lambda n, h: n.nvmlDeviceGetMaxPcieLinkWidth(h),
    "nvmlDeviceGetPcieThroughput": lambda n, h: [
        n.nvmlDeviceGetPcieThroughput(h, c) for c in (n.NVML_PCIE_UTIL_TX_BYTES, n.NVML_PCIE_UTIL_RX_BYTES)
    ],
    "nvmlDeviceGetMigMode": lambda n, h: n.nvmlDeviceGetMigMode(h),
    "nvmlDeviceGetMaxMigDeviceCount": lambda n, h: n.nvmlDeviceGetMaxMigDeviceCount(h),
    "nvmlDeviceGetMigDeviceHandleByIndex": lambda n, h: len(_mig_devices(n, h)),
    "nvmlDeviceGetGpuInstanceId": lambda n, h: [instance for instance, _ in _mig_devices(n, h)],
    "nvmlDeviceGetGpuInstanceProfileInfo": lambda n, h: _profiles(n, h),
    "nvmlDeviceGetAttributes_v2": lambda n, h: {
        "gpu": vars_of(n.nvmlDeviceGetAttributes_v2(h)),
        **{f"mig {i}": vars_of(n.nvmlDeviceGetAttributes_v2(mig)) for i, mig in _mig_devices(n, h)},
    },
    "nvmlDeviceGetNvLinkState": lambda n, h: _links(n, h, lambda link: n.nvmlDeviceGetNvLinkState(h, link)),
    "nvmlDeviceGetNvLinkErrorCounter": lambda n, h: _links(
        n, h, lambda link: [n.nvmlDeviceGetNvLinkErrorCounter(h, link, c) for c in range(4)]
    ),
    "nvmlDeviceGetNvLinkRemoteDeviceType": lambda n, h: _links(
        n, h, lambda link: n.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
    ),
    "nvmlDeviceGetNvLinkRemotePciInfo": lambda n, h: _links(
        n, h, lambda link: n.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId
    ),
    "nvmlDeviceGetGpuFabricInfo": lambda n, h: _fabric(n, h, "nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
    "nvmlDeviceGetGpuFabricInfoV": lambda n, h: _fabric(n, h, "nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
    "nvmlDeviceGetProcessUtilization": lambda n, h: [
        vars_of(s) for s in n.nvmlDeviceGetProcessUtilization(h, int(time.time() * 1e6) - 10_000_000)
    ],
    "nvmlDeviceRegisterEvents": _events,
    "nvmlGpmQueryDeviceSupport": lambda n, h: vars_of(n.nvmlGpmQueryDeviceSupport(h)),
    "nvmlGpmSampleGet": _gpm,
    "nvmlGpmMigSampleGet": lambda n, h: {instance: _gpm(n, h, instance) for instance, _ in _mig_devices(n, h)},
}
# Calls a probe above makes on the way (allocations, session, handles, event plumbing), named so that the coverage
# test knows them.
MADE_ON_THE_WAY = {
    "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree", "nvmlGpmMetricsGet", "nvmlEventSetCreate", "nvmlEventSetWait", "nvmlEventSetFree",
    "nvmlEventTypeXidCriticalError",
}  # fmt: skip


def vars_of(value: Any) -> Any:
    """A ctypes structure as a dict of its fields (nested ones too), for printing and JSON."""
    if isinstance(value, ctypes.Array):
        return [vars_of(item) for item in value]
    fields = getattr(value, "_fields_", None)
    if fields is None:
        return value.decode() if isinstance(value, bytes) else value
    return {name: vars_of(getattr(value, name)) for name, *_ in fields}


def probe(nvml: Any, handle: Any, call: Probe, repeat: int = 1) -> tuple[str, float, float]:
    """(answer or "error: ...", CPU seconds, wall seconds) of a probe: the first answer, the median cost of
    `repeat` calls (one call's CPU time is noisy at a tenth of a millisecond)."""
    answers, cpus, walls = [], [], []
    for _ in range(repeat):
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            answers.append(json.dumps(call(nvml, handle), default=str))
        except nvml.NVMLError as error:
            answers.append(f"error: {error}")
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return answers[0], statistics.median(cpus), statistics.median(walls)


def run(nvml: Any = pynvml, repeat: int = 1) -> list[dict[str, Any]]:
    nvml.nvmlInit()
    try:
        rows = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            for name, call in CALLS.items():
                answer, cpu, wall = probe(nvml, handle, call, repeat)
                rows.append({"gpu": index, "call": name, "answer": answer, "cpu_seconds": cpu, "wall_seconds": wall})
        return rows
    finally:
        nvml.nvmlShutdown()


def print_rows(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        cost = f"{row['cpu_seconds'] * 1e3:8.3f} ms CPU {row['wall_seconds'] * 1e3:9.3f} ms wall"
        print(f"  GPU {row['gpu']} {row['call']:42} {cost}  {row['answer'][:160]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="also write every answer and cost as JSON")
    parser.add_argument("--repeat", type=int, default=5, help="calls per probe: the median cost is kept")
    args = parser.parse_args()
    rows = run(repeat=args.repeat)
    print_rows(rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump(rows, stream, indent=1)


if __name__ == "__main__":
    main()
