"""AMD Instinct GPUs through amdsmi (AMD's `amdsmi` Python bindings of libamd_smi.so, pinned to 7.0.2).

Example exposition lines::

    accelmon_gpu_power_watts{gpu="0",uuid="00ff74a1-0000-1000-8000-000000001000"} 300
    accelmon_amd_gpu_ras_errors_total{block="umc",gpu="0",type="corrected",uuid="…"} 0

One family for both vendors: where a value means what NVML's does, the series has the NVIDIA collector's name and
labels (`accelmon_gpu_*{gpu, uuid}`), so the Fleet and GPU dashboards, the rules, the alerts and the health checks
cover AMD GPUs unchanged; `accelmon_gpu_info`'s `vendor` label says whose a GPU is. What only AMD reports (GFX/UMC/
multimedia activity, each temperature sensor, RAS errors per block, XGMI links, partitions) is in
`accelmon_amd_gpu_*`. A field amdsmi answers NOT_SUPPORTED for is remembered per GPU and never asked again; a GPU
that answers anything else is reported `accelmon_gpu_up 0` for that sample while the others go on, and asked again
next time (a GPU reset brings it back). The library's facts this relies on are in docs/amd.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from accelmon.exporter.checks import Check, GpuCheck, GpuKey, View
from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import Paths, Registration, markers_present, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.health.gpu_metrics import (
    CLOCK_EVENT,
    DEVICE_CHECKS,
    DEVICE_DRILLS,
    ECC,
    ENERGY,
    INFO,
    MEMORY_CLOCK,
    MEMORY_CLOCK_MAX,
    MEMORY_FREE,
    MEMORY_TEMPERATURE,
    MEMORY_TOTAL,
    MEMORY_USED,
    MEMORY_UTILIZATION,
    PCIE_GENERATION,
    PCIE_GENERATION_MAX,
    PCIE_REPLAYS,
    PCIE_WIDTH,
    PCIE_WIDTH_MAX,
    POWER,
    POWER_LIMIT,
    SM_CLOCK,
    SM_CLOCK_MAX,
    TEMPERATURE,
    UP,
    UTILIZATION,
)
from accelmon.host.amdsmi_library import PINNED_BINDINGS, load_amdsmi
from accelmon.host.nvidia import nvidia_driver_loaded

log = logging.getLogger("accelmon.amd")

GPU = ("gpu", "uuid")
SLOW = "every slow interval"
ONCE = "once per GPU"
INTERVAL = seconds("interval_seconds", 1, "how often activity, memory, power, temperatures and clocks are read")
SLOW_INTERVAL = seconds(
    "slow_interval_seconds", 30, "how often counters (energy, ECC per RAS block, PCIe, XGMI errors) are read"
)
C = Catalogue(
    "amd",
    "AMD Instinct GPUs (amdsmi)",
    "Source: libamd_smi.so through AMD's amdsmi bindings (pinned 7.0.2). The series shared with the NVIDIA collector "
    "(`accelmon_gpu_*`) are served by both; their meaning on AMD: utilization is GFX activity, memory utilization "
    "UMC activity, temperature the hotspot (junction) sensor, memory temperature the VRAM sensor, the SM clock the GFX "
    'clock, power the socket power, ECC errors the sum over RAS blocks since the driver loaded (`scope="volatile"`), '
    "clock events the reasons of gpu_metrics' `indep_throttle_status` (power_limit, current_limit, thermal_limit, "
    "prochot, other_limit) and `gpu_idle` when GFX activity is 0. Percent to ratio, MHz to Hz, microjoules to J, KB "
    "to bytes. Call costs on a real MI300X are unmeasured (docs/amd.md).",
)
# Shared with nvml: the same specs, so the names, types and labels cannot drift apart.
C.share([
    INFO, UP, UTILIZATION, MEMORY_UTILIZATION, MEMORY_USED, MEMORY_FREE, MEMORY_TOTAL, TEMPERATURE, MEMORY_TEMPERATURE,
    POWER, POWER_LIMIT, ENERGY, SM_CLOCK, MEMORY_CLOCK, SM_CLOCK_MAX, MEMORY_CLOCK_MAX, PCIE_REPLAYS, PCIE_GENERATION,
    PCIE_GENERATION_MAX, PCIE_WIDTH, PCIE_WIDTH_MAX, ECC, CLOCK_EVENT,
])  # fmt: skip
MULTIMEDIA = C.gauge("accelmon_amd_gpu_multimedia_utilization_ratio", "Multimedia (VCN) engine activity (0..1).", GPU)
SENSOR_TEMPERATURE = C.gauge(
    "accelmon_amd_gpu_temperature_celsius", "Temperature by sensor (edge, hotspot, vram).", [*GPU, "sensor"]
)
RAS_ERRORS = C.counter(
    "accelmon_amd_gpu_ras_errors_total",
    "Errors a RAS block counted since the driver loaded, by type (corrected, uncorrected, deferred).",
    [*GPU, "block", "type"],
    read=SLOW,
)
DEFERRED = C.counter(
    "accelmon_amd_gpu_ecc_deferred_errors_total",
    "Deferred (poisoned, not yet consumed) errors over all RAS blocks since the driver loaded.",
    GPU,
    read=SLOW,
)
PCIE_RECOVERIES = C.counter(
    "accelmon_amd_gpu_pcie_recoveries_total", "Times the PCIe link went from L0 to recovery.", GPU, read=SLOW
)
XGMI_UP = C.gauge("accelmon_amd_gpu_xgmi_link_up", "1 if the XGMI link to a peer is up, 0 if down.", [*GPU, "link"])
XGMI_READ = C.counter(
    "accelmon_amd_gpu_xgmi_read_bytes_total", "Bytes read over the XGMI link (amdsmi reports KB).", [*GPU, "link"]
)
XGMI_WRITE = C.counter("accelmon_amd_gpu_xgmi_write_bytes_total", "Bytes written over the XGMI link.", [*GPU, "link"])
XGMI_ERROR = C.gauge(
    "accelmon_amd_gpu_xgmi_error_state",
    "XGMI error status: 0 no error, 1 an error, 2 several errors (since it was last reset).",
    GPU,
    read=SLOW,
)
PARTITION = C.gauge(
    "accelmon_amd_gpu_partition_info",
    "The compute (SPX, DPX, QPX, CPX) and memory (NPS1, NPS4) partition mode of the GPU; value is 1.",
    [*GPU, "compute_partition", "memory_partition"],
    read=ONCE,
)

MHZ = 1e6
NOT_SUPPORTED_CODES = {2, 3}  # AMDSMI_STATUS_NOT_SUPPORTED, AMDSMI_STATUS_NOT_YET_IMPLEMENTED
# PCIe transfer rate (MT/s, as amdsmi reports it) -> generation.
PCIE_GENERATIONS = {2500: 1, 5000: 2, 8000: 3, 16000: 4, 32000: 5, 64000: 6}
# gpu_metrics' indep_throttle_status: ASIC-independent bit groups of the amdgpu driver (docs/amd.md).
THROTTLE_BITS = (
    ("power_limit", range(0, 16)),  # PPT0-3, SPL, FPPT, SPPT
    ("current_limit", range(16, 32)),  # TDC, EDC, APCC
    ("thermal_limit", range(32, 46)),  # temperature sensors, VR hot
    ("prochot", range(46, 48)),
    ("other_limit", range(48, 64)),  # PPM, FIT
)
# Clock events that mean the hardware slowed the GPU down (accelmon.health's slowdown check reads them).
SLOWDOWN_REASONS = ("thermal_limit", "prochot")
NOT_AVAILABLE_U16 = 0xFFFF
NOT_AVAILABLE_U64 = 0xFFFFFFFFFFFFFFFF
TEMPERATURE_SENSORS = {"edge": 0, "hotspot": 1, "vram": 2}  # amdsmi_temperature_type_t
RAS_BLOCKS = {  # amdsmi_gpu_block_t
    "umc": 1, "sdma": 2, "gfx": 4, "mmhub": 8, "athub": 16, "pcie_bif": 32, "hdp": 64, "xgmi_wafl": 128, "df": 256,
    "smn": 512, "sem": 1024, "mp0": 2048, "mp1": 4096, "fuse": 8192, "mca": 16384, "vcn": 32768, "jpeg": 65536,
    "ih": 131072, "mpio": 262144,
}  # fmt: skip
RAS_ENABLED = 6  # AMDSMI_RAS_ERR_STATE_ENABLED


class GpuNotAnsweringError(Exception):
    """The GPU answered an error other than NOT_SUPPORTED (lost, reset, driver fault)."""


@dataclass
class AmdGpu:
    index: int
    handle: Any
    uuid: str = ""
    identified: bool = False
    info: dict[str, str] = field(default_factory=dict)  # accelmon_gpu_info's labels
    partition: list[str] = field(default_factory=list)  # compute and memory partition modes
    memory_total: float | None = None
    max_clocks: dict[str, float | None] = field(default_factory=dict)  # by clock: gfx, mem
    unsupported: set[str] = field(default_factory=set)
    ras_blocks: list[str] | None = None  # the blocks with RAS on, learnt once
    slow: Samples = field(default_factory=Samples)  # the latest slow read, served in between


class AmdCollector(Collector):
    name = "amd"

    def __init__(
        self,
        slow_interval: float = SLOW_INTERVAL.default,  # type: ignore[assignment]
        load: Callable[[], tuple[ModuleType | None, str]] = load_amdsmi,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slow_interval = slow_interval
        self._load = load
        self._clock = clock
        self.amdsmi: Any = None
        self.open = False
        self.problem = ""  # why amdsmi does not answer, for the log (once per new reason)
        self._gpus: list[AmdGpu] = []
        self._next_slow = 0.0

    def hardware_answering(self) -> bool:
        return self.open

    def start(self) -> None:
        self._open()

    def _open(self) -> None:
        amdsmi, problem = self._load()
        if amdsmi is not None:
            try:
                amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
                handles = amdsmi.amdsmi_get_processor_handles()
            except amdsmi.AmdSmiException as error:
                problem = f"amdsmi_init failed: {error}".replace("\n", " ")
            else:
                self.amdsmi, self.open, self.problem = amdsmi, True, ""
                self._gpus = [AmdGpu(index, handle) for index, handle in enumerate(handles)]
                self._log_versions()
                return
        if problem != self.problem:
            log.warning("no AMD GPU metrics: %s", problem)
            self.problem = problem

    def _log_versions(self) -> None:
        try:
            version = self.amdsmi.amdsmi_get_lib_version()
            library = f"{version['major']}.{version['minor']}.{version['release']}"
        except self.amdsmi.AmdSmiException:
            library = "unknown"
        log.info("amdsmi: %d GPUs, libamd_smi %s, bindings %s", len(self._gpus), library, PINNED_BINDINGS)

    def stop(self) -> None:
        if self.open:
            with contextlib.suppress(self.amdsmi.AmdSmiException):
                self.amdsmi.amdsmi_shut_down()
            self.open = False

    def sample(self) -> Samples:
        if not self.open:
            self._open()
        out = Samples()
        now = self._clock()
        slow = now >= self._next_slow
        if slow:
            self._next_slow = now + self.slow_interval
        for gpu in self._gpus:
            # A GPU's series are kept only if all its reads answered: one failing half-way serves none but up 0.
            mine = Samples()
            try:
                self._sample_gpu(gpu, mine, slow)
            except GpuNotAnsweringError as error:
                log.debug("GPU %d: %s", gpu.index, error)
                gpu.slow = Samples()  # read again once it answers
                out.add(UP, [str(gpu.index), gpu.uuid], 0)
                continue
            out.extend(mine)
            out.add(UP, [str(gpu.index), gpu.uuid], 1)
        return out

    def _call(self, gpu: AmdGpu, key: str, function: Callable[..., Any], *args: Any) -> Any:
        """function(handle, *args); None if the GPU does not support it (then never asked again)."""
        if key in gpu.unsupported:
            return None
        try:
            return function(gpu.handle, *args)
        except self.amdsmi.AmdSmiLibraryException as error:
            if error.get_error_code() in NOT_SUPPORTED_CODES:
                gpu.unsupported.add(key)
                return None
            raise GpuNotAnsweringError(f"{key}: {error.get_error_info(detailed=False)}") from None

    def _identify(self, gpu: AmdGpu) -> None:
        smi = self.amdsmi
        gpu.uuid = self._call(gpu, "uuid", smi.amdsmi_get_gpu_device_uuid) or ""
        asic = self._call(gpu, "asic", smi.amdsmi_get_gpu_asic_info) or {}
        vbios = self._call(gpu, "vbios", smi.amdsmi_get_gpu_vbios_info) or {}
        driver = self._call(gpu, "driver", smi.amdsmi_get_gpu_driver_info) or {}
        gpu.info = {
            "name": str(asic.get("market_name", "")),
            "pci_bus_id": str(self._call(gpu, "bdf", smi.amdsmi_get_gpu_device_bdf) or ""),
            "serial": str(asic.get("asic_serial", "")),
            "vbios_version": str(vbios.get("version", "")),
            "driver_version": str(driver.get("driver_version", "")),
            "vendor": "amd",
        }
        gpu.partition = [
            str(self._call(gpu, "compute_partition", smi.amdsmi_get_gpu_compute_partition) or ""),
            str(self._call(gpu, "memory_partition", smi.amdsmi_get_gpu_memory_partition) or ""),
        ]
        total = self._call(gpu, "memory_total", smi.amdsmi_get_gpu_memory_total, smi.AmdSmiMemoryType.VRAM)
        gpu.memory_total = float(total) if isinstance(total, int) else None
        gpu.max_clocks = {
            kind: self._number(
                (self._call(gpu, f"clock_{kind}", smi.amdsmi_get_clock_info, clock) or {}).get("max_clk")
            )
            for kind, clock in (("gfx", smi.AmdSmiClkType.GFX), ("mem", smi.AmdSmiClkType.MEM))
        }
        gpu.identified = True

    @staticmethod
    def _number(value: Any) -> float | None:
        """amdsmi's value as a number; None for its "N/A" (a field the GPU does not report)."""
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def _sample_gpu(self, gpu: AmdGpu, out: Samples, slow: bool) -> None:
        smi = self.amdsmi
        if not gpu.identified:
            self._identify(gpu)
        labels = (str(gpu.index), gpu.uuid)
        number = self._number

        def put(spec: Any, value: Any, scale: float = 1.0, extra: tuple[str, ...] = ()) -> None:
            value = number(value)
            if value is not None:
                out.add(spec, [*labels, *extra], value * scale)

        out.add(INFO, [*labels, *(gpu.info.get(k, "") for k in INFO.labels[2:])], 1)
        out.add(PARTITION, [*labels, *gpu.partition], 1)
        activity = self._call(gpu, "activity", smi.amdsmi_get_gpu_activity) or {}
        put(UTILIZATION, activity.get("gfx_activity"), 0.01)
        put(MEMORY_UTILIZATION, activity.get("umc_activity"), 0.01)
        put(MULTIMEDIA, activity.get("mm_activity"), 0.01)
        used = number(self._call(gpu, "memory_usage", smi.amdsmi_get_gpu_memory_usage, smi.AmdSmiMemoryType.VRAM))
        put(MEMORY_USED, used)
        put(MEMORY_TOTAL, gpu.memory_total)
        if used is not None and gpu.memory_total is not None:
            put(MEMORY_FREE, gpu.memory_total - used)
        power = self._call(gpu, "power", smi.amdsmi_get_power_info) or {}
        put(POWER, power.get("socket_power"))
        put(POWER_LIMIT, power.get("power_limit"))
        for sensor, sensor_type in TEMPERATURE_SENSORS.items():
            value = self._call(
                gpu, f"temperature_{sensor}", smi.amdsmi_get_temp_metric, smi.AmdSmiTemperatureType(sensor_type),
                smi.AmdSmiTemperatureMetric.CURRENT,
            )  # fmt: skip
            put(SENSOR_TEMPERATURE, value, extra=(sensor,))
            if sensor == "hotspot":
                put(TEMPERATURE, value)
            elif sensor == "vram":
                put(MEMORY_TEMPERATURE, value)
        for kind, clock, current, maximum in (
            ("gfx", smi.AmdSmiClkType.GFX, SM_CLOCK, SM_CLOCK_MAX),
            ("mem", smi.AmdSmiClkType.MEM, MEMORY_CLOCK, MEMORY_CLOCK_MAX),
        ):
            put(current, (self._call(gpu, f"clock_{kind}", smi.amdsmi_get_clock_info, clock) or {}).get("clk"), MHZ)
            put(maximum, gpu.max_clocks[kind], MHZ)
        self._sample_metrics(gpu, out, labels, activity.get("gfx_activity"))
        if slow or not gpu.slow.rows:  # or the GPU just answered again
            gpu.slow = Samples()
            self._sample_counters(gpu, gpu.slow, labels)
        out.extend(gpu.slow)

    def _sample_metrics(self, gpu: AmdGpu, out: Samples, labels: tuple[str, str], gfx_activity: Any) -> None:
        """gpu_metrics through the bindings' C layer: the Python layer folds the throttle mask into a bool."""
        metrics = self._call(gpu, "gpu_metrics", _gpu_metrics, self.amdsmi)
        if metrics is None:
            return
        mask = metrics.indep_throttle_status
        if mask != NOT_AVAILABLE_U64:
            for reason, bits in THROTTLE_BITS:
                out.add(CLOCK_EVENT, [*labels, reason], float(any(mask >> bit & 1 for bit in bits)))
        if isinstance(gfx_activity, int):
            out.add(CLOCK_EVENT, [*labels, "gpu_idle"], float(gfx_activity == 0))
        for link, status in enumerate(metrics.xgmi_link_status):
            if status == NOT_AVAILABLE_U16:
                continue  # no peer on this link
            out.add(XGMI_UP, [*labels, str(link)], float(status == 1))
            for spec, counters in ((XGMI_READ, metrics.xgmi_read_data_acc), (XGMI_WRITE, metrics.xgmi_write_data_acc)):
                if counters[link] != NOT_AVAILABLE_U64:
                    out.add(spec, [*labels, str(link)], float(counters[link]) * 1000)

    def _sample_counters(self, gpu: AmdGpu, out: Samples, labels: tuple[str, str]) -> None:
        smi, number = self.amdsmi, self._number
        energy = self._call(gpu, "energy", smi.amdsmi_get_energy_count)
        if energy:
            out.add(ENERGY, labels, energy["energy_accumulator"] * energy["counter_resolution"] / 1e6)
        pcie = self._call(gpu, "pcie", smi.amdsmi_get_pcie_info)
        if pcie:
            static, metric = pcie["pcie_static"], pcie["pcie_metric"]
            for spec, value in (
                (PCIE_WIDTH, number(metric["pcie_width"])),
                (PCIE_WIDTH_MAX, number(static["max_pcie_width"])),
                (PCIE_GENERATION, PCIE_GENERATIONS.get(metric["pcie_speed"])),
                (PCIE_GENERATION_MAX, PCIE_GENERATIONS.get(static["max_pcie_speed"])),
                (PCIE_REPLAYS, number(metric["pcie_replay_count"])),
                (PCIE_RECOVERIES, number(metric["pcie_l0_to_recovery_count"])),
            ):
                if value is not None:
                    out.add(spec, labels, float(value))
        total = self._call(gpu, "ecc_total", smi.amdsmi_get_gpu_total_ecc_count)
        if total:
            out.add(ECC, [*labels, "corrected", "volatile"], float(total["correctable_count"]))
            out.add(ECC, [*labels, "uncorrected", "volatile"], float(total["uncorrectable_count"]))
            out.add(DEFERRED, labels, float(total["deferred_count"]))
        if gpu.ras_blocks is None:
            enabled = self._call(gpu, "ras_features", smi.amdsmi_get_gpu_ras_block_features_enabled) or []
            gpu.ras_blocks = [
                s["block"].lower() for s in enabled if s["status"] == "ENABLED" and s["block"].lower() in RAS_BLOCKS
            ]
        for block in gpu.ras_blocks:
            counts = self._call(
                gpu, f"ecc_{block}", smi.amdsmi_get_gpu_ecc_count, smi.AmdSmiGpuBlock(RAS_BLOCKS[block])
            )
            if counts:
                for kind, key in (("corrected", "correctable_count"), ("uncorrected", "uncorrectable_count"),
                                  ("deferred", "deferred_count")):  # fmt: skip
                    out.add(RAS_ERRORS, [*labels, block, kind], float(counts[key]))
        status = self._call(gpu, "xgmi_error", smi.amdsmi_gpu_xgmi_error_status)
        if isinstance(status, int):
            out.add(XGMI_ERROR, labels, float(status))


def _gpu_metrics(handle: Any, amdsmi: Any) -> Any:
    """amdsmi_get_gpu_metrics_info's structure as the library filled it; the bindings' exception on an error."""
    wrapper = amdsmi.amdsmi_wrapper
    metrics = wrapper.amdsmi_gpu_metrics_t()
    status = wrapper.amdsmi_get_gpu_metrics_info(handle, ctypes.byref(metrics))
    if status != 0:
        raise amdsmi.AmdSmiLibraryException(status)
    return metrics


# The amdgpu kernel module is loaded and the compute device (/dev/kfd) is there: an AMD GPU host. The role looks for
# the same paths (--check-config --json's hardware_markers) to decide whether a host gets amdsmi.
HARDWARE_MARKERS = ("{sysfs}/module/amdgpu", "{devfs}/kfd")


def amd_driver_loaded(paths: Paths, options: dict[str, Any]) -> bool:
    return markers_present(HARDWARE_MARKERS, paths)


def amd_only(paths: Paths, options: dict[str, Any]) -> bool:
    """On by default on an AMD GPU host without NVIDIA's driver: both collectors serve `accelmon_gpu_*{gpu="0"}`,
    so a host with both vendors enables one of them explicitly (docs/amd.md)."""
    return amd_driver_loaded(paths, options) and not nvidia_driver_loaded(paths, options)


def check_xgmi(view: View, gpu: GpuKey, now: float) -> Check:
    """AMD's GPU-to-GPU links (collector amd): a link down to a peer costs that pair its bandwidth (RCCL falls back
    to PCIe or fails); XGMI errors since they were last reset mean a link that retrains. A GPU reset retrains the
    links; one that stays down needs service (docs/amd.md)."""
    states = view.of(XGMI_UP, gpu)
    if not states:
        return Check("xgmi", "ok", "no XGMI reported")
    down = sorted(int(labels["link"]) for labels, value in states if value == 0)
    if down:
        links = ", ".join(str(link) for link in down)
        return Check(
            "xgmi", "failure", f"XGMI down: link {links} ({len(states) - len(down)} of {len(states)} up)", "reset_gpu"
        )
    errors = view.value(XGMI_ERROR, gpu)
    if errors:
        return Check("xgmi", "warning", "XGMI errors: " + ("several" if errors >= 2 else "one"), "reset_gpu")
    return Check("xgmi", "ok", f"{len(states)} links up, no XGMI error")


REGISTRATION = register(
    Registration(
        name="amd",
        help="AMD Instinct GPUs through amdsmi (default: on where the amdgpu driver and /dev/kfd are)",
        build=lambda options, paths: AmdCollector(slow_interval=options["slow_interval_seconds"]),
        catalogue=C,
        options=(INTERVAL, SLOW_INTERVAL),
        enabled_by_default=amd_only,
        hardware_present=amd_driver_loaded,
        hardware_markers=HARDWARE_MARKERS,
        # /dev/kfd (compute) and /dev/dri/* (the render nodes amdsmi opens); the user needs the render and video
        # groups (the role adds them where they exist).
        devices=("char-kfd rw", "char-drm rw"),
        # The GPU device checks over the series it shares with nvml (gpu_metrics), then its own.
        gpu_checks=(
            *DEVICE_CHECKS,
            GpuCheck(
                "xgmi",
                check_xgmi,
                source=(
                    "`accelmon_amd_gpu_xgmi_link_up`, `accelmon_amd_gpu_xgmi_error_state` (AMD GPUs, [amd.md](amd.md))"
                ),
                failure="an XGMI link to a peer is down (`reset_gpu`)",
                warning="XGMI errors since they were last reset (`reset_gpu`)",
            ),
        ),
        drills=DEVICE_DRILLS,
        lists_gpus=(UP,),
        scan=True,
    )
)
