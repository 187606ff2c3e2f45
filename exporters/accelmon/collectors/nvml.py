"""NVIDIA GPU device counters through NVML (nvidia-ml-py, imported as `pynvml`).

Example exposition line::

    accelmon_gpu_power_watts{gpu="0",uuid="GPU-5e1d…"} 312.5

Per-GPU series carry only `gpu` (index) and `uuid`; strings are in `accelmon_gpu_info`. A field that NVML
answers `NotSupported`, `FunctionNotFound` (older driver) or `NoPermission` for is remembered per GPU and
never asked again. A GPU that answers `GpuIsLost`/`Unknown` is reported with `accelmon_gpu_up 0` while the
others keep reporting. PCIe throughput (about 20 ms per direction per GPU) is read on its own thread at a
slower interval and XID events are waited for on another (`accelmon.host.nvidia.XidEvents`), so neither slows the main
sample. The NVML session is `accelmon.host.nvidia.NvmlSession`'s, tried again every minute while NVML does not
answer."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Optional

import pynvml

from accelmon.exporter.metrics import Samples, scaled
from accelmon.exporter.registry import Registration, register
from accelmon.exporter.runtime import Collector
from accelmon.health.gpu_metrics import (
    BAR1_TOTAL,
    BAR1_USED,
    CATALOGUE,
    CLOCK_EVENT,
    DECODER,
    DEVICE_CHECKS,
    DEVICE_DRILLS,
    ECC,
    ENCODER,
    ENERGY,
    FAN,
    INFO,
    INTERVAL,
    MEMORY_CLOCK,
    MEMORY_CLOCK_MAX,
    MEMORY_FREE,
    MEMORY_RESERVED,
    MEMORY_TEMPERATURE,
    MEMORY_TOTAL,
    MEMORY_USED,
    MEMORY_UTILIZATION,
    MIG_INFO,
    MIG_MEMORY_TOTAL,
    MIG_MEMORY_USED,
    MIG_MODE,
    PCIE_GENERATION,
    PCIE_GENERATION_MAX,
    PCIE_INTERVAL,
    PCIE_REPLAYS,
    PCIE_RX,
    PCIE_TX,
    PCIE_WIDTH,
    PCIE_WIDTH_MAX,
    POWER,
    POWER_LIMIT,
    POWER_VIOLATION,
    PROCESSES,
    PSTATE,
    REMAP_FAILURE,
    REMAP_PENDING,
    REMAPPED_ROWS,
    RETIRED_PAGES,
    RETIRED_PENDING,
    SLOW_INTERVAL,
    SM_CLOCK,
    SM_CLOCK_MAX,
    TEMPERATURE,
    THERMAL_VIOLATION,
    UP,
    UTILIZATION,
    WATCH_XIDS,
    XID_ERRORS,
    XID_EVENTS,
)
from accelmon.host.nvidia import NVML_MIG_DEVICES, MigProfiles, NvmlSession, XidEvents, nvidia_driver_loaded, text

log = logging.getLogger("accelmon.nvml")

CLOCK_EVENT_REASONS = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clock_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}

# Read with nvmlDeviceGetFieldValues on the slow schedule, in one call: (field id, spec, extra label values, scale).
# Field 83 (energy) costs 4 ms of CPU on an H100, the memory temperature 0.08 ms plus the call's 0.05 ms: as a
# call of its own every interval it cost more than any other read (docs/hardware.md).
Field = tuple[int, Any, tuple[str, ...], float]
SLOW_FIELDS: list[Field] = [
    (pynvml.NVML_FI_DEV_MEMORY_TEMP, MEMORY_TEMPERATURE, (), 1.0),
    (pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, ENERGY, (), 1e-3),  # mJ
    (pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, ECC, ("corrected", "volatile"), 1.0),
    (pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, ECC, ("uncorrected", "volatile"), 1.0),
    (pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, ECC, ("corrected", "aggregate"), 1.0),
    (pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, ECC, ("uncorrected", "aggregate"), 1.0),
    (pynvml.NVML_FI_DEV_RETIRED_SBE, RETIRED_PAGES, ("single_bit",), 1.0),
    (pynvml.NVML_FI_DEV_RETIRED_DBE, RETIRED_PAGES, ("double_bit",), 1.0),
    (pynvml.NVML_FI_DEV_RETIRED_PENDING, RETIRED_PENDING, (), 1.0),
    (pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, PCIE_REPLAYS, (), 1.0),
    (pynvml.NVML_FI_DEV_REMAPPED_COR, REMAPPED_ROWS, ("correctable",), 1.0),
    (pynvml.NVML_FI_DEV_REMAPPED_UNC, REMAPPED_ROWS, ("uncorrectable",), 1.0),
    (pynvml.NVML_FI_DEV_REMAPPED_PENDING, REMAP_PENDING, (), 1.0),
    (pynvml.NVML_FI_DEV_REMAPPED_FAILURE, REMAP_FAILURE, (), 1.0),
]
# nvmlValueType_t -> member of the c_nvmlValue_t union
VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    6: "usVal",  # NVML_VALUE_TYPE_UNSIGNED_SHORT, by number: a binding without the name still imports
}

MHZ = 1e6
KIB = 1024.0


class GpuLostError(Exception):
    """The GPU stopped answering (GpuIsLost or Unknown)."""


@dataclass
class Gpu:
    index: int
    handle: Any
    uuid: str = ""
    info: dict[str, str] = field(default_factory=dict)
    max_sm_clock: float | None = None
    max_memory_clock: float | None = None
    max_pcie_generation: float | None = None
    max_pcie_width: float | None = None
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    unsupported_fields: set[int] = field(default_factory=set)
    slow: Samples = field(default_factory=Samples)  # the latest slow read and the values read once, replayed
    slow_due: float = 0.0  # monotonic time of the next slow read; 0 = at the next sample
    mig_profiles: Optional[MigProfiles] = None  # made at the first MIG device seen
    _reason_labels: list[tuple[int, tuple[str, ...]]] = field(default_factory=list, repr=False)
    _reason_labels_for: tuple[str, ...] = field(default=(), repr=False)

    @property
    def labels(self) -> tuple[str, str]:
        return (str(self.index), self.uuid)

    @property
    def reason_labels(self) -> list[tuple[int, tuple[str, ...]]]:
        """(bit, labels) of each clock-event reason: nine series a GPU every interval, their labels made once."""
        labels = self.labels
        if self._reason_labels_for != labels:
            self._reason_labels = [(bit, (*labels, reason)) for reason, bit in CLOCK_EVENT_REASONS.items()]
            self._reason_labels_for = labels
        return self._reason_labels


class NvmlCollector(Collector):
    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | None = None,
        slow_interval: float = float(SLOW_INTERVAL.default),
        pcie_interval: float = float(PCIE_INTERVAL.default),
        xid_events: bool = bool(WATCH_XIDS.default),
        retry_init_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = NvmlSession("GPU metrics off", nvml, retry_seconds=retry_init_seconds, clock=clock)
        self.nvml: Any = self.session.nvml
        self.slow_interval = slow_interval
        self.pcie_interval = pcie_interval
        self.xid_events = xid_events
        self._clock = clock
        self.gpus: list[Gpu] = []
        self._driver = ""
        self._xids = XidEvents(self.nvml)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pcie: dict[int, tuple[float | None, float | None]] = {}
        self._pcie_ready = threading.Event()
        self.first_pcie_wait_seconds = 2.0
        # Every GPU's slow and read-once series in one block, made again only when a GPU's slow read or loss changes
        # it: ~30 of the ~55 series a GPU has every sample, added in one list copy a metric, not one call a series.
        self._slow: Samples | None = None
        self._threads: list[threading.Thread] = []
        errors = self.nvml.NVMLError
        self._skip_errors = tuple(
            getattr(self.nvml, n, errors)
            for n in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission")
        )
        self._lost_errors = (self.nvml.NVMLError_GpuIsLost, self.nvml.NVMLError_Unknown)

    def hardware_answering(self) -> bool:
        return self.session.open

    # ---- setup ----
    def start(self) -> None:
        self._try_init()

    def _try_init(self) -> None:
        # No driver or no library: this host simply has no NVIDIA GPU (yet). Not a collector failure.
        if not self.session.try_open():
            return
        nvml = self.nvml
        driver = self._string(nvml.nvmlSystemGetDriverVersion)
        self.gpus = [self._discover(index, driver) for index in range(nvml.nvmlDeviceGetCount())]
        log.info("NVML: %d GPU(s), driver %s", len(self.gpus), driver)
        self._start_thread("nvml-pcie", self._pcie_loop)
        # Give the first PCIe round a moment so the first sample (and --once) has it; never wait long.
        self._pcie_ready.wait(self.first_pcie_wait_seconds)
        if self.xid_events:
            self._xids.start([(gpu.index, gpu.handle) for gpu in self.gpus if not gpu.lost])

    def _start_thread(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _string(self, function: Callable[..., Any], *args: Any) -> str:
        try:
            value = function(*args)
        except self.nvml.NVMLError:
            return ""
        return value.decode() if isinstance(value, bytes) else str(value)

    def _discover(self, index: int, driver: str) -> Gpu:
        nvml = self.nvml
        self._driver = driver
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as error:
            log.warning("GPU %d: no handle (%s); reported as lost", index, error)
            return Gpu(index, None, lost=True)
        gpu = Gpu(index, handle)
        self._read_identity(gpu)
        return gpu

    def _read_identity(self, gpu: Gpu) -> None:
        """What never changes, read once: names, PCI address, maximum clocks. A GPU lost at start has it read
        when it answers again."""
        nvml, driver = self.nvml, self._driver
        try:
            gpu.uuid = self._call(gpu, "uuid", nvml.nvmlDeviceGetUUID) or ""
            pci = self._call(gpu, "pci", nvml.nvmlDeviceGetPciInfo)
            capability = self._call(gpu, "capability", nvml.nvmlDeviceGetCudaComputeCapability)
            gpu.info = {
                "name": str(self._call(gpu, "name", nvml.nvmlDeviceGetName) or ""),
                "pci_bus_id": text(pci.busId) if pci is not None else "",
                "serial": str(self._call(gpu, "serial", nvml.nvmlDeviceGetSerial) or ""),
                "vbios_version": str(self._call(gpu, "vbios", nvml.nvmlDeviceGetVbiosVersion) or ""),
                "driver_version": driver,
                "cuda_compute_capability": "{}.{}".format(*capability) if capability else "",
                "vendor": "nvidia",
            }
            gpu.max_sm_clock = scaled(self._call(gpu, "max_sm_clock", nvml.nvmlDeviceGetMaxClockInfo, 1), MHZ)
            gpu.max_memory_clock = scaled(self._call(gpu, "max_mem_clock", nvml.nvmlDeviceGetMaxClockInfo, 2), MHZ)
            # The GPU's and its slot's limit together (nvmlDeviceGetGpuMaxPcieLinkGeneration is the GPU's alone).
            gpu.max_pcie_generation = self._call(gpu, "pcie_gen_max", nvml.nvmlDeviceGetMaxPcieLinkGeneration)
            gpu.max_pcie_width = self._call(gpu, "pcie_width_max", nvml.nvmlDeviceGetMaxPcieLinkWidth)
        except GpuLostError:
            log.warning("GPU %d is lost", gpu.index)
            gpu.lost = True

    def stop(self) -> None:
        self._stop.set()
        xid_waits_ended = self._xids.stop()  # it leaves when its wait ends (2 s at most): waited for
        deadline = time.monotonic() + 1.0
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in self._threads):
            log.warning("an NVML helper thread is stuck in a call: NVML left initialised")
            return
        # nvmlShutdown under a thread inside a call is a race: NVML is left to the process's exit
        if xid_waits_ended:
            self.session.close()

    # ---- calls ----
    def _call(self, gpu: Gpu, key: str, function: Callable[..., Any], *args: Any) -> Any:
        """Call an NVML device function; None if it is not supported (remembered) or failed this once."""
        if key in gpu.unsupported:
            return None
        try:
            return function(gpu.handle, *args)
        except self._skip_errors as error:
            log.debug("GPU %d: %s not supported (%s); not asked again", gpu.index, key, error)
            gpu.unsupported.add(key)
        except self._lost_errors as error:
            raise GpuLostError(str(error)) from error
        except self.nvml.NVMLError as error:
            log.warning("GPU %d: %s failed: %s", gpu.index, key, error)
        return None

    def _first(self, gpu: Gpu, choices: list[tuple[str, Callable[..., Any], tuple[Any, ...]]]) -> Any:
        """The first supported of several equivalent calls (newer API first, then what older drivers have)."""
        for key, function, args in choices:
            if key not in gpu.unsupported:
                value = self._call(gpu, key, function, *args)
                if value is not None or key not in gpu.unsupported:
                    return value
        return None

    # ---- sample ----
    def sample(self) -> Samples:
        if not self.session.open:
            self._try_init()
        samples = Samples()
        for gpu in self.gpus:
            if gpu.lost:
                gpu.lost = not self._answers_again(gpu)
            samples.add(INFO, [*gpu.labels, *(gpu.info.get(k, "") for k in INFO.labels[2:])], 1)
            if not gpu.lost:
                try:
                    self._sample_gpu(gpu, samples)
                except GpuLostError as error:
                    log.warning("GPU %d lost: %s", gpu.index, error)
                    gpu.lost = True
                    gpu.slow, gpu.slow_due, self._slow = Samples(), 0.0, None  # nothing stale once it answers again
            samples.add(UP, gpu.labels, 0 if gpu.lost else 1)
            self._add_events(gpu, samples)
        if self._slow is None:
            self._slow = Samples()
            for gpu in self.gpus:
                self._slow.extend(gpu.slow)
        samples.extend(self._slow)
        return samples

    def _answers_again(self, gpu: Gpu) -> bool:
        nvml = self.nvml
        try:
            if gpu.handle is None:
                gpu.handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            nvml.nvmlDeviceGetUUID(gpu.handle)
        except nvml.NVMLError:
            return False
        log.info("GPU %d answers again", gpu.index)
        gpu.lost = False
        if not gpu.uuid:  # lost since start: its identity was never read
            self._read_identity(gpu)  # sets lost again if the GPU drops out meanwhile
        return not gpu.lost

    def _sample_gpu(self, gpu: Gpu, out: Samples) -> None:
        nvml = self.nvml
        put = _putter(out, gpu.labels)

        utilization = self._call(gpu, "utilization", nvml.nvmlDeviceGetUtilizationRates)
        if utilization is not None:
            put(UTILIZATION, utilization.gpu, 0.01)
            put(MEMORY_UTILIZATION, utilization.memory, 0.01)
        memory = self._first(
            gpu,
            [
                ("memory_v2", nvml.nvmlDeviceGetMemoryInfo, (nvml.nvmlMemory_v2,)),
                ("memory_v1", nvml.nvmlDeviceGetMemoryInfo, ()),  # drivers before R510: no reserved memory
            ],
        )
        if memory is not None:
            put(MEMORY_USED, memory.used)
            put(MEMORY_FREE, memory.free)
            put(MEMORY_TOTAL, memory.total)
            put(MEMORY_RESERVED, getattr(memory, "reserved", None))
        temperature = self._first(
            gpu,
            [
                ("temperature_v", nvml.nvmlDeviceGetTemperatureV, (nvml.NVML_TEMPERATURE_GPU,)),
                ("temperature", nvml.nvmlDeviceGetTemperature, (nvml.NVML_TEMPERATURE_GPU,)),
            ],
        )
        put(TEMPERATURE, temperature)
        put(POWER, self._call(gpu, "power", nvml.nvmlDeviceGetPowerUsage), 1e-3)
        put(SM_CLOCK, self._call(gpu, "sm_clock", nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM), MHZ)
        put(PSTATE, self._call(gpu, "pstate", nvml.nvmlDeviceGetPerformanceState))
        put(FAN, self._call(gpu, "fan", nvml.nvmlDeviceGetFanSpeed), 0.01)
        reasons = self._first(
            gpu,
            [
                ("clock_events", nvml.nvmlDeviceGetCurrentClocksEventReasons, ()),
                ("clock_throttle", nvml.nvmlDeviceGetCurrentClocksThrottleReasons, ()),
            ],
        )
        if reasons is not None:
            for bit, labels in gpu.reason_labels:
                out.add(CLOCK_EVENT, labels, 1 if reasons & bit else 0)
        with self._lock:
            transmit, receive = self._pcie.get(gpu.index, (None, None))
        put(PCIE_TX, transmit)
        put(PCIE_RX, receive)
        now = self._clock()
        if now >= gpu.slow_due:
            gpu.slow = self._sample_slow(gpu)
            gpu.slow_due, self._slow = now + self.slow_interval, None

    def _sample_slow(self, gpu: Gpu) -> Samples:
        """Counters and rarely changing values, read every slow interval and served from cache in between, and the
        values read once at start."""
        nvml = self.nvml
        out = Samples()
        put = _putter(out, gpu.labels)
        put(SM_CLOCK_MAX, gpu.max_sm_clock)
        put(MEMORY_CLOCK_MAX, gpu.max_memory_clock)
        put(PCIE_GENERATION_MAX, gpu.max_pcie_generation)
        put(PCIE_WIDTH_MAX, gpu.max_pcie_width)
        bar1 = self._call(gpu, "bar1", nvml.nvmlDeviceGetBAR1MemoryInfo)
        if bar1 is not None:
            put(BAR1_USED, bar1.bar1Used)
            put(BAR1_TOTAL, bar1.bar1Total)
        for key, policy, spec in (
            ("power_violation", nvml.NVML_PERF_POLICY_POWER, POWER_VIOLATION),
            ("thermal_violation", nvml.NVML_PERF_POLICY_THERMAL, THERMAL_VIOLATION),
        ):
            violation = self._call(gpu, key, nvml.nvmlDeviceGetViolationStatus, policy)
            put(spec, violation.violationTime if violation is not None else None, 1e-9)
        # Values that move only on an operator's action or a workload's start and end (the limit, the memory clock,
        # the process count), or that video work alone drives: every slow interval, like the counters.
        put(POWER_LIMIT, self._call(gpu, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit), 1e-3)
        put(MEMORY_CLOCK, self._call(gpu, "mem_clock", nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_MEM), MHZ)
        encoder = self._call(gpu, "encoder", nvml.nvmlDeviceGetEncoderUtilization)
        put(ENCODER, encoder[0] if encoder else None, 0.01)
        decoder = self._call(gpu, "decoder", nvml.nvmlDeviceGetDecoderUtilization)
        put(DECODER, decoder[0] if decoder else None, 0.01)
        processes = self._call(gpu, "processes", nvml.nvmlDeviceGetComputeRunningProcesses)
        put(PROCESSES, len(processes) if processes is not None else None)
        put(PCIE_GENERATION, self._call(gpu, "pcie_gen", nvml.nvmlDeviceGetCurrPcieLinkGeneration))
        put(PCIE_WIDTH, self._call(gpu, "pcie_width", nvml.nvmlDeviceGetCurrPcieLinkWidth))
        self._sample_fields(gpu, SLOW_FIELDS, put)
        self._sample_mig(gpu, out)
        return out

    def _sample_fields(self, gpu: Gpu, fields: list[Field], put: Callable[..., None]) -> None:
        wanted = [f for f in fields if f[0] not in gpu.unsupported_fields]
        if not wanted:
            return
        values = self._call(gpu, "fields", self.nvml.nvmlDeviceGetFieldValues, [f[0] for f in wanted])
        if values is None:
            return
        for (field_id, spec, extra, scale), value in zip(wanted, values):
            if value.nvmlReturn != 0:
                # NotSupported and the like: this GPU does not have this field; stop asking for it.
                gpu.unsupported_fields.add(field_id)
                continue
            member = VALUE_MEMBERS.get(value.valueType)
            if member is not None:
                put(spec, getattr(value.value, member), scale, extra)

    def _sample_mig(self, gpu: Gpu, out: Samples) -> None:
        nvml = self.nvml
        mode = self._call(gpu, "mig_mode", nvml.nvmlDeviceGetMigMode)
        if mode is None:
            return
        out.add(MIG_MODE, gpu.labels, 1 if mode[0] else 0)
        if not mode[0]:
            return
        count = self._call(gpu, "mig_count", nvml.nvmlDeviceGetMaxMigDeviceCount) or 0
        for index in range(count):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, index)
                instance = str(nvml.nvmlDeviceGetGpuInstanceId(mig))
                mig_uuid = text(nvml.nvmlDeviceGetUUID(mig))
                memory = nvml.nvmlDeviceGetMemoryInfo(mig, nvml.nvmlMemory_v2)
            except nvml.NVMLError_NotFound:
                continue  # slot without a MIG device
            except nvml.NVMLError as error:
                log.debug("GPU %d MIG %d: %s", gpu.index, index, error)
                continue
            if gpu.mig_profiles is None:
                gpu.mig_profiles = MigProfiles(nvml, gpu.handle)
            out.add(MIG_INFO, [*gpu.labels, instance, mig_uuid, gpu.mig_profiles.name(mig, mig_uuid)], 1)
            out.add(MIG_MEMORY_USED, [*gpu.labels, instance], memory.used)
            out.add(MIG_MEMORY_TOTAL, [*gpu.labels, instance], memory.total)

    def _add_events(self, gpu: Gpu, out: Samples) -> None:
        if not self.xid_events:
            return
        xids = self._xids.of_gpu(gpu.index)
        for xid, count in xids:
            out.add(XID_ERRORS, [*gpu.labels, str(xid)], count)
        out.add(XID_EVENTS, gpu.labels, sum(count for _, count in xids))

    # ---- helper threads ----
    def _pcie_loop(self) -> None:
        nvml = self.nvml
        while not self._stop.is_set():
            for gpu in self.gpus:
                if gpu.lost or self._stop.is_set():
                    continue
                try:
                    transmit = self._call(
                        gpu, "pcie_tx", nvml.nvmlDeviceGetPcieThroughput, nvml.NVML_PCIE_UTIL_TX_BYTES
                    )
                    receive = self._call(gpu, "pcie_rx", nvml.nvmlDeviceGetPcieThroughput, nvml.NVML_PCIE_UTIL_RX_BYTES)
                except GpuLostError:
                    transmit = receive = None
                with self._lock:
                    self._pcie[gpu.index] = (scaled(transmit, KIB), scaled(receive, KIB))
            self._pcie_ready.set()
            self._stop.wait(self.pcie_interval)


def _putter(out: Samples, labels: tuple[str, ...]) -> Callable[..., None]:
    """put(spec, value, scale=1, extra=()): value * scale under the GPU's labels (and extra), unless None."""

    def put(spec: Any, value: float | None, scale: float = 1.0, extra: tuple[str, ...] = ()) -> None:
        if value is not None:
            out.add(spec, labels + extra if extra else labels, scaled(value, scale))  # type: ignore[arg-type]

    return put


REGISTRATION = register(
    Registration(
        name="nvml",
        help="NVIDIA GPU device counters through NVML (default: on; no driver, no data)",
        build=lambda options, paths: NvmlCollector(
            slow_interval=options["slow_interval_seconds"],
            pcie_interval=options["pcie_interval_seconds"],
            xid_events=options["xid_events"],
        ),
        catalogue=CATALOGUE,
        options=(INTERVAL, SLOW_INTERVAL, PCIE_INTERVAL, WATCH_XIDS),
        # On by default: without an NVIDIA driver it exports nothing and costs nothing, and a driver installed
        # later is picked up (NVML init is retried) without a new config.
        enabled_by_default=lambda paths, options: True,
        hardware_present=nvidia_driver_loaded,
        # /dev/nvidiactl and /dev/nvidia<N> (the nvidia-frontend major), MIG capabilities read-only.
        devices=NVML_MIG_DEVICES,
        gpu_checks=DEVICE_CHECKS,
        drills=DEVICE_DRILLS,
        lists_gpus=(UP,),
        scan=True,
    )
)
