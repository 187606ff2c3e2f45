"""GPU profiling counters (SM activity, tensor/FP pipes, DRAM, PCIe and NVLink bytes) from DCGM or NVML GPM.

Example exposition line::

    accelmon_gpu_sm_active_ratio{gpu="0",uuid="GPU-5e1d…"} 0.51

One set of names whichever backend feeds them:
- `dcgm`: the standalone host engine (`nv-hostengine`, never an embedded one, which would break `dcgmi`), through
  the DCGM Python bindings that ship with DCGM (not on PyPI) from a configurable directory. Fields are watched by
  numeric id (1001-1012; DCGM 4.6 renamed the symbols). A blank value is no value.
- `gpm`: NVML GPM on Hopper and newer, from two samples taken one interval apart. Only a full window is
  published: samples closer than 100 ms make a real H100 answer SUCCESS with zeros and a NaN (nvml.h wants more
  than 100 ms), so a shorter window is never used, and a window much longer than the interval (the sampler was
  held up) is dropped and started again. One read of one GPU costs ~2.5 ms of CPU on an H100 (0.35 ms for the
  sample, 0.18 ms per metric computed), hence the 10 s default interval: 0.25 ms of CPU per GPU per second.
- `auto`: DCGM if its host engine answers, else GPM on the GPUs that support it, else nothing; while not on
  DCGM it tries the host engine again every `dcgm_retry_seconds`, and falls back when it dies.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Protocol

import pynvml

from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import Option, Registration, never, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.host.dcgm import DCGM_BINDINGS_PATH, DCGM_HOST, dcgm_connect
from accelmon.host.nvidia import NVML_MIG_DEVICES, NvmlSession

log = logging.getLogger("accelmon.profiling")

# One GPM read of one GPU costs ~2.5 ms of CPU on an H100 (12 metrics): 10 s keeps it near 0.25 ms per GPU per
# second. A scrape every 15 s (Prometheus's default) then sees the average of 10 of its 15 seconds, where a 5 s
# window (0.5 ms per GPU-second) showed 5 of them: the longer window costs half and represents more.
INTERVAL = seconds("interval_seconds", 10, "the profiling window: how often counters are read (GPM: sample spacing)")
BACKENDS = ("auto", "dcgm", "gpm")
BACKEND_OPTION = Option("backend", "auto", "where the counters come from: DCGM if it answers, else GPM", BACKENDS)

GPU = ("gpu", "uuid")
CATALOGUE = Catalogue(
    "profiling",
    "GPU profiling counters (DCGM or NVML GPM)",
    "GPM values are computed by the driver over a window between two samples, published only for a full window "
    "(at least 90 % of `interval_seconds`, never under 100 ms; a window after a gap of over 3 intervals is "
    "dropped). One GPM read of one GPU costs ~2.5 ms of CPU on an H100 (0.35 ms per sample, 0.18 ms per metric), "
    f"so the default interval is {INTERVAL.default:g} s: about 0.25 ms of CPU per GPU per second, and each 15 s "
    "scrape sees a window of 10 of its 15 seconds. `--once` waits one interval.",
)
C = CATALOGUE
BACKEND = C.gauge(
    "accelmon_gpu_profiling_backend_info",
    "The backend feeding the profiling metrics (dcgm, gpm or none); value is 1.",
    ["backend"],
)


@dataclass(frozen=True)
class ProfilingMetric:
    """One profiling metric: its spec, DCGM field id and unit scale, GPM metric id and unit scale."""

    spec: Any
    dcgm_field: int
    dcgm_scale: float
    gpm_metric: int | None
    gpm_scale: float


MIB = 1024.0 * 1024.0
MIN_GPM_WINDOW_SECONDS = 0.1  # nvml.h: the two samples must be more than 100 ms apart
COUNTERS = [
    ProfilingMetric(
        C.gauge(
            "accelmon_gpu_graphics_engine_active_ratio",
            "Fraction of time the graphics or compute engine was active: any kernel resident, however few SMs it "
            "fills (DCGM 1001 ratio, dcgm-exporter's DCGM_FI_PROF_GR_ENGINE_ACTIVE; GPM GRAPHICS_UTIL %).",
            GPU,
        ),
        1001,
        1.0,
        pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
        0.01,
    ),
    ProfilingMetric(
        C.gauge(
            "accelmon_gpu_sm_active_ratio",
            "Fraction of time at least one warp was active on an SM, "
            "averaged over SMs (DCGM 1002 ratio; GPM SM_UTIL %).",
            GPU,
        ),
        1002,
        1.0,
        pynvml.NVML_GPM_METRIC_SM_UTIL,
        0.01,
    ),
    ProfilingMetric(
        C.gauge(
            "accelmon_gpu_sm_occupancy_ratio",
            "Resident warps over the SMs' maximum (DCGM 1003 ratio; GPM SM_OCCUPANCY %).",
            GPU,
        ),
        1003,
        1.0,
        pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
        0.01,
    ),
    ProfilingMetric(
        C.gauge(
            "accelmon_gpu_tensor_active_ratio",
            "Fraction of cycles the tensor pipes were active (DCGM 1004 ratio; GPM ANY_TENSOR_UTIL %).",
            GPU,
        ),
        1004,
        1.0,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        0.01,
    ),
    ProfilingMetric(
        C.gauge(
            "accelmon_gpu_dram_active_ratio",
            "Fraction of cycles device memory was sending or receiving (DCGM 1005 ratio; GPM DRAM_BW_UTIL %).",
            GPU,
        ),
        1005,
        1.0,
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
        0.01,
    ),
    ProfilingMetric(
        C.gauge(
            "accelmon_gpu_fp64_active_ratio",
            "Fraction of cycles the FP64 pipe was active (DCGM 1006; GPM FP64_UTIL %).",
            GPU,
        ),
        1006,
        1.0,
        pynvml.NVML_GPM_METRIC_FP64_UTIL,
        0.01,
    ),
    ProfilingMetric(
        C.gauge(
            "accelmon_gpu_fp32_active_ratio",
            "Fraction of cycles the FP32 pipe was active (DCGM 1007; GPM FP32_UTIL %).",
            GPU,
        ),
        1007,
        1.0,
        pynvml.NVML_GPM_METRIC_FP32_UTIL,
        0.01,
    ),
    ProfilingMetric(
        C.gauge(
            "accelmon_gpu_fp16_active_ratio",
            "Fraction of cycles the FP16 pipe was active (DCGM 1008; GPM FP16_UTIL %).",
            GPU,
        ),
        1008,
        1.0,
        pynvml.NVML_GPM_METRIC_FP16_UTIL,
        0.01,
    ),
    ProfilingMetric(
        C.gauge(
            "accelmon_gpu_profiling_pcie_transmit_bytes_per_second",
            "PCIe bytes sent, headers included "
            "(DCGM 1009 B/s; GPM PCIE_TX_PER_SEC MiB/s). Unlike accelmon_gpu_pcie_transmit_bytes_per_second "
            "(NVML, a 20 ms window), averaged over the whole interval.",
            GPU,
        ),
        1009,
        1.0,
        pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
        MIB,
    ),
    ProfilingMetric(
        C.gauge(
            "accelmon_gpu_profiling_pcie_receive_bytes_per_second",
            "PCIe bytes received, headers included (DCGM 1010 B/s; GPM PCIE_RX_PER_SEC MiB/s).",
            GPU,
        ),
        1010,
        1.0,
        pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
        MIB,
    ),
    ProfilingMetric(
        C.gauge(
            "accelmon_gpu_profiling_nvlink_transmit_bytes_per_second",
            "NVLink bytes sent over all links (DCGM 1011 B/s; GPM NVLINK_TOTAL_TX_PER_SEC MiB/s).",
            GPU,
        ),
        1011,
        1.0,
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
        MIB,
    ),
    ProfilingMetric(
        C.gauge(
            "accelmon_gpu_profiling_nvlink_receive_bytes_per_second",
            "NVLink bytes received over all links (DCGM 1012 B/s; GPM NVLINK_TOTAL_RX_PER_SEC MiB/s).",
            GPU,
        ),
        1012,
        1.0,
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
        MIB,
    ),
]
# Per MIG instance, through GPM only (nvmlGpmMigSampleGet: Hopper and later; DCGM's per-instance fields are not
# read): the share of the instance's own SMs and memory, what a job given the instance used of it.
MIG = (*GPU, "gpu_instance_id")
BY_NAME = {counter.spec.name: counter.spec for counter in COUNTERS}
MIG_COUNTERS = {
    BY_NAME["accelmon_gpu_graphics_engine_active_ratio"]: C.gauge(
        "accelmon_gpu_mig_graphics_engine_active_ratio",
        "Graphics or compute engine active in the MIG instance (GPM).",
        MIG,
    ),
    BY_NAME["accelmon_gpu_sm_active_ratio"]: C.gauge(
        "accelmon_gpu_mig_sm_active_ratio", "SM active, over the MIG instance's SMs (GPM).", MIG
    ),
    BY_NAME["accelmon_gpu_tensor_active_ratio"]: C.gauge(
        "accelmon_gpu_mig_tensor_active_ratio", "Tensor pipes active in the MIG instance (GPM).", MIG
    ),
    BY_NAME["accelmon_gpu_dram_active_ratio"]: C.gauge(
        "accelmon_gpu_mig_dram_active_ratio", "Device memory busy for the MIG instance (GPM).", MIG
    ),
}
DCGM_FIELDS = [c.dcgm_field for c in COUNTERS]
# DCGM's blank sentinels start here (DCGM_FT_FP64_BLANK 140737488355328.0, DCGM_FT_INT64_BLANK 0x7ffffffffffffff0).
FP64_BLANK = 140737488355328.0
INT64_BLANK = 0x7FFFFFFFFFFFFFF0

Readings = dict[int, tuple[str, dict[Any, float]]]  # gpu index -> (uuid, {spec: value})
MigReadings = dict[tuple[int, int], tuple[str, dict[Any, float]]]  # (gpu index, GPU instance id) -> the same


class ProfilingBackend(Protocol):
    """Where the profiling counters come from (as dcgm-exporter's provider interface): DCGM's host engine or NVML's
    GPM. `open` says whether it answers on this host (never raises); `read` gives each GPU's values, and
    `mig_readings` each MIG instance's where the backend measures them (GPM); `close` lets go of it."""

    name: str
    mig_readings: MigReadings

    def open(self) -> bool: ...

    def read(self) -> Readings: ...

    def close(self) -> None: ...


class DcgmBackend:
    """The standalone host engine through DCGM's own Python bindings."""

    name = "dcgm"

    def __init__(self, host: str, bindings_paths: tuple[str, ...], interval: float) -> None:
        self.mig_readings: MigReadings = {}  # DCGM's profiling fields are read per GPU here
        self.host = host
        self.bindings_paths = bindings_paths
        self.interval = interval
        self._handle: Any = None
        self._group: Any = None
        self._fields: Any = None
        self._uuids: dict[int, str] = {}

    def open(self) -> bool:
        try:
            pydcgm, self._handle, self._group, self._uuids = dcgm_connect(self.bindings_paths, self.host, "accelmon")
            self._fields = pydcgm.DcgmFieldGroup(self._handle, name="accelmon-profiling", fieldIds=DCGM_FIELDS)
            usec = int(self.interval * 1_000_000)
            self._group.samples.WatchFields(self._fields, usec, max(30.0, 3 * self.interval), 0)
        except Exception as error:  # noqa: BLE001 - the bindings raise their own exception classes
            log.info("DCGM host engine at %s not usable: %s", self.host, error)
            self.close()
            return False
        log.info("profiling through DCGM at %s, %d GPU(s)", self.host, len(self._uuids))
        return True

    def read(self) -> Readings:
        latest = self._group.samples.GetLatest(self._fields).values
        readings: Readings = {}
        for gpu, uuid in self._uuids.items():
            fields = latest.get(gpu, {})
            values: dict[Any, float] = {}
            for counter in COUNTERS:
                series = fields.get(counter.dcgm_field)
                if not series:
                    continue
                value = series[-1]
                if getattr(value, "isBlank", False) or not isinstance(value.value, (int, float)):
                    continue
                if value.value >= FP64_BLANK or (isinstance(value.value, int) and value.value >= INT64_BLANK):
                    continue
                values[counter.spec] = float(value.value) * counter.dcgm_scale
            readings[gpu] = (uuid, values)
        return readings

    def close(self) -> None:
        for thing, method in ((self._fields, "Delete"), (self._group, "Delete"), (self._handle, "Shutdown")):
            if thing is not None:
                try:
                    getattr(thing, method)()
                except Exception:  # noqa: BLE001 - best effort on a connection that may be gone
                    log.debug("DCGM %s failed", method)
        self._handle = self._group = self._fields = None


class GpmBackend:
    """NVML GPM: metrics computed by the driver from two samples of the same GPU."""

    name = "gpm"

    def __init__(
        self,
        nvml: ModuleType | None = None,
        interval: float = float(INTERVAL.default),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = NvmlSession("no GPM profiling", nvml)
        self.nvml: Any = self.session.nvml
        # A window is the time between the two samples a value is computed from. Shorter than 90 % of the
        # interval (sampler jitter aside) or than NVML's 100 ms: not a full window, wait for a longer one. Longer
        # than 3 intervals: the sampler was held up; an average over that gap is not this interval's value.
        self.min_window = max(MIN_GPM_WINDOW_SECONDS, 0.9 * interval)
        self.max_window = 3.0 * interval + 1.0
        self._clock = clock
        self._gpus: dict[int, tuple[Any, str]] = {}
        # Sample pairs and window starts per (GPU index, GPU instance id): instance 0 is the whole GPU.
        self._samples: dict[tuple[int, int], list[Any]] = {}
        self._window_start: dict[tuple[int, int], float] = {}
        self.mig_readings: MigReadings = {}  # the latest read's MIG instances

    def open(self) -> bool:
        nvml = self.nvml
        for index, handle, uuid in self.session.gpus() or []:
            if handle is None:
                continue
            try:
                if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                    continue
                self._gpus[index] = (handle, uuid)
                self._start_window((index, 0))
                for instance in self._mig_instances(handle):
                    self._start_window((index, instance))
            except nvml.NVMLError as error:
                log.info("GPU %d: no GPM (%s)", index, error)
                self._gpus.pop(index, None)
        if not self._gpus:
            self.close()
            return False
        log.info("profiling through NVML GPM on GPU(s) %s", ", ".join(map(str, sorted(self._gpus))))
        return True

    def _mig_instances(self, handle: Any) -> list[int]:
        """The GPU instance ids of a GPU in MIG mode (none otherwise), as the GPU had them when profiling started."""
        nvml = self.nvml
        try:
            if nvml.nvmlDeviceGetMigMode(handle)[0] != 1:
                return []
            count = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        except nvml.NVMLError:
            return []
        instances = []
        for slot in range(count):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                instances.append(int(nvml.nvmlDeviceGetGpuInstanceId(mig)))
            except nvml.NVMLError:
                continue  # an empty slot
        return instances

    def _take(self, key: tuple[int, int], sample: Any) -> None:
        handle = self._gpus[key[0]][0]
        if key[1]:
            self.nvml.nvmlGpmMigSampleGet(handle, key[1], sample)
        else:
            self.nvml.nvmlGpmSampleGet(handle, sample)

    def _start_window(self, key: tuple[int, int]) -> None:
        samples = [self.nvml.nvmlGpmSampleAlloc(), self.nvml.nvmlGpmSampleAlloc()]
        self._samples[key] = samples
        try:
            self._take(key, samples[0])
        except self.nvml.NVMLError as error:
            log.info("GPU %d instance %d: no GPM sample (%s)", key[0], key[1], error)
            for sample in self._samples.pop(key):
                self.nvml.nvmlGpmSampleFree(sample)
            if key[1] == 0:
                raise
            return
        self._window_start[key] = self._clock()

    def read(self) -> Readings:
        nvml = self.nvml
        readings: Readings = {}
        mig_readings: MigReadings = {}
        wanted = [c for c in COUNTERS if c.gpm_metric is not None]
        for key in list(self._samples):
            index, instance = key
            uuid = self._gpus[index][1]
            previous, current = self._samples[key]
            try:
                self._take(key, current)
            except nvml.NVMLError as error:
                log.debug("GPU %d instance %d: GPM sample failed: %s", index, instance, error)
                continue
            now = self._clock()
            window = now - self._window_start[key]
            if window < self.min_window:
                continue  # keep the older first sample: the window grows until it is full
            self._samples[key] = [current, previous]  # this sample starts the next window
            self._window_start[key] = now
            if window > self.max_window:
                log.debug("GPU %d: GPM window of %.1f s after a gap dropped", index, window)
                continue
            try:
                request = nvml.c_nvmlGpmMetricsGet_t()
                request.version = nvml.NVML_GPM_METRICS_GET_VERSION
                request.numMetrics = len(wanted)
                request.sample1, request.sample2 = previous, current
                for slot, counter in enumerate(wanted):
                    request.metrics[slot].metricId = counter.gpm_metric
                nvml.nvmlGpmMetricsGet(request)
            except nvml.NVMLError as error:
                log.debug("GPU %d: GPM read failed: %s", index, error)
                continue
            values = {
                counter.spec: request.metrics[slot].value * counter.gpm_scale
                for slot, counter in enumerate(wanted)
                if request.metrics[slot].nvmlReturn == 0
            }
            if instance:
                mig_readings[key] = (uuid, {MIG_COUNTERS[k]: v for k, v in values.items() if k in MIG_COUNTERS})
            else:
                readings[index] = (uuid, values)
        self.mig_readings = mig_readings
        return readings

    def close(self) -> None:
        for samples in self._samples.values():
            for sample in samples:
                try:
                    self.nvml.nvmlGpmSampleFree(sample)
                except self.nvml.NVMLError:
                    pass
        self._samples.clear()
        self._gpus.clear()
        self.session.close()


class ProfilingCollector(Collector):
    name = "profiling"

    def __init__(
        self,
        backend: str = str(BACKEND_OPTION.default),
        dcgm_host: str = str(DCGM_HOST.default),
        dcgm_bindings_paths: tuple[str, ...] = tuple(str(DCGM_BINDINGS_PATH.default).split(":")),
        interval: float = float(INTERVAL.default),
        dcgm_retry_seconds: float = 30.0,
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"profiling backend {backend!r}: expected one of {', '.join(BACKENDS)}")
        self.mode = backend
        self.interval = interval
        self.first_sample_delay = interval if backend in ("auto", "gpm") else 0.0  # GPM needs one full window
        self.dcgm = DcgmBackend(dcgm_host, dcgm_bindings_paths, interval)
        self._nvml = nvml
        self.dcgm_retry_seconds = dcgm_retry_seconds
        self._clock = clock
        self.active: ProfilingBackend | None = None
        self._last_dcgm_try: float | None = None
        self._last_gpm_try: float | None = None

    def _try_dcgm(self) -> bool:
        now = self._clock()
        if self._last_dcgm_try is not None and now - self._last_dcgm_try < self.dcgm_retry_seconds:
            return False
        self._last_dcgm_try = now
        return self.dcgm.open()

    def _gpm_due(self) -> bool:
        now = self._clock()
        if self._last_gpm_try is not None and now - self._last_gpm_try < self.dcgm_retry_seconds:
            return False
        self._last_gpm_try = now
        return True

    def _choose(self) -> None:
        if self.mode in ("auto", "dcgm") and self.active is not self.dcgm and self._try_dcgm():
            if self.active is not None:
                self.active.close()
            self.active = self.dcgm
            return
        if self.mode in ("auto", "gpm") and self.active is None and self._gpm_due():
            gpm = GpmBackend(self._nvml, self.interval, self._clock)
            if gpm.open():
                self.active = gpm
            elif self._last_dcgm_try is None or self.mode == "gpm":
                log.info("no profiling backend on this host (mode %s)", self.mode)

    def start(self) -> None:
        self._choose()

    def sample(self) -> Samples:
        self._choose()
        out = Samples()
        readings: Readings = {}
        if self.active is not None:
            try:
                readings = self.active.read()
            except Exception as error:  # noqa: BLE001 - e.g. the host engine died; fall back, retry later
                log.warning("profiling backend %s failed: %s", self.active.name, error)
                self.active.close()
                self.active = None
                self._choose()
        out.add(BACKEND, (self.active.name if self.active else "none",), 1)
        for gpu, (uuid, values) in sorted(readings.items()):
            for counter in COUNTERS:
                if counter.spec in values:
                    out.add(counter.spec, (str(gpu), uuid), values[counter.spec])
        for (gpu, instance), (uuid, values) in sorted((self.active.mig_readings if self.active else {}).items()):
            for spec, value in values.items():
                out.add(spec, (str(gpu), uuid, str(instance)), value)
        return out

    def stop(self) -> None:
        if self.active is not None:
            self.active.close()
            self.active = None


REGISTRATION = register(
    Registration(
        name="profiling",
        help="GPU profiling counters from DCGM or NVML GPM (default: off: profiling has a cost)",
        build=lambda options, paths: ProfilingCollector(
            backend=options["backend"],
            dcgm_host=options["dcgm_host"],
            dcgm_bindings_paths=tuple(p for p in options["dcgm_bindings_path"].split(":") if p),
            interval=options["interval_seconds"],
        ),
        catalogue=CATALOGUE,
        options=(INTERVAL, BACKEND_OPTION, DCGM_HOST, DCGM_BINDINGS_PATH),
        enabled_by_default=never,
        # No backend is a choice, not a fault: accelmon_profiling_backend_info says which one answers.
        hardware_present=never,
        # GPM goes through NVML's device nodes; DCGM is a TCP connection.
        devices=NVML_MIG_DEVICES,
    )
)
