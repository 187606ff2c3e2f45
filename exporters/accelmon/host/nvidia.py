"""The NVIDIA host: what every NVIDIA collector, the job sources and the health hooks share about the driver and
NVML, so that no collector imports another.

- `nvidia_driver_loaded`: the one predicate for "the NVIDIA kernel module is loaded" (its procfs version file).
- `driver_gpus`, `driver_gpus_by_bus`: the GPUs as the driver lists them in `<procfs>/driver/nvidia/gpus/<bus
  id>/information` (minor number, UUID, bus location), which still lists a GPU NVML no longer reaches.
- `NvmlSession`: an NVML session of a collector's own (NVML counts its inits), tried again while NVML does not
  answer; every NVML reader opens and closes NVML through one (nvml, profiling's GPM, fabric, gpu_processes,
  jobs). `OwnSessionCollector`: the base of collectors that read a few things on their own session and schedule
  (fabric, gpu_processes).
- `XidEvents`: NVML's critical XID events, waited for on a thread of their own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pynvml

from accelmon.exporter.runtime import Collector

log = logging.getLogger("accelmon.nvidia")

# systemd DeviceAllow= entries of a collector that opens NVML: /dev/nvidiactl and /dev/nvidia<N> (the
# nvidia-frontend major); with MIG, NVML also reads the MIG capabilities (/dev/nvidia-caps), read-only.
NVML_DEVICES = ("char-nvidia-frontend rw",)
NVML_MIG_DEVICES = (*NVML_DEVICES, "char-nvidia-caps r")


def nvidia_driver_loaded(paths: Any, options: dict[str, Any]) -> bool:
    """The kernel module is loaded: NVML should answer (a broken library or driver otherwise), and the driver
    writes XIDs to the kernel log. `paths` is an `accelmon.exporter.registry.Paths`."""
    return os.path.exists(os.path.join(paths.procfs, "driver", "nvidia", "version"))


@dataclass(frozen=True)
class DriverGpu:
    index: str  # NVML's index: the GPU's place in PCI bus order
    uuid: str


def driver_gpu_entries(procfs: str) -> list[tuple[str, DriverGpu, dict[str, str]]]:
    """(bus id, GPU, fields of its information file) for each GPU the NVIDIA driver lists in procfs."""
    root = os.path.join(procfs, "driver", "nvidia", "gpus")
    try:
        buses = sorted(os.listdir(root), key=str.lower)
    except OSError:
        return []
    out = []
    for position, bus in enumerate(buses):
        fields: dict[str, str] = {}
        try:
            with open(os.path.join(root, bus, "information"), encoding="utf-8", errors="replace") as stream:
                for line in stream:
                    key, sep, value = line.partition(":")
                    if sep:
                        fields[key.strip()] = value.strip()
        except OSError:
            continue
        out.append((bus.lower(), DriverGpu(str(position), fields.get("GPU UUID", "")), fields))
    return out


def driver_gpus(procfs: str) -> tuple[dict[str, DriverGpu], dict[str, DriverGpu]]:
    """This host's GPUs as the NVIDIA driver lists them in procfs: by device minor number, and by UUID."""
    by_minor: dict[str, DriverGpu] = {}
    by_uuid: dict[str, DriverGpu] = {}
    for _, gpu, fields in driver_gpu_entries(procfs):
        if fields.get("Device Minor", "").isdigit():
            by_minor[fields["Device Minor"]] = gpu
        if gpu.uuid:
            by_uuid[gpu.uuid] = gpu
    return by_minor, by_uuid


def driver_gpus_by_bus(procfs: str) -> dict[str, DriverGpu]:
    """This host's GPUs by PCI bus id (`0000:18:00.0`, lower case), as the driver lists them: a GPU that fell off
    the bus keeps its entry, so it can still be named."""
    return {bus: gpu for bus, gpu, _ in driver_gpu_entries(procfs)}


def text(value: Any) -> str:
    """NVML's strings: bytes from older bindings, str from newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSession:
    """An NVML session of a collector's own (NVML counts its inits: each collector opens and closes its own). A
    session that cannot be opened (no driver, no library: a host without NVIDIA GPUs, or not yet) is tried again at
    most every `retry_seconds`."""

    def __init__(
        self,
        purpose: str,
        nvml: Any = None,
        retry_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.purpose = purpose  # what is missing without NVML, for the log
        self.nvml: Any = nvml if nvml is not None else pynvml
        self.retry_seconds = retry_seconds
        self._clock = clock
        self._tried_at: float | None = None
        self.open = False

    def try_open(self) -> bool:
        """Open the session unless it is open or was tried less than `retry_seconds` ago; whether it is open."""
        if self.open:
            return True
        now = self._clock()
        if self._tried_at is not None and now - self._tried_at < self.retry_seconds:
            return False
        self._tried_at = now
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as error:
            again = f", tried again every {self.retry_seconds:g} s" if self.retry_seconds else ""
            log.info("NVML not available (%s): %s%s", error, self.purpose, again)
            return False
        self.open = True
        return True

    def gpus(self) -> list[tuple[int, Any, str]] | None:
        """(index, handle, UUID) of every GPU, None for the handle of one that does not answer (yet); None if NVML
        cannot be opened (no driver: retried at the next call)."""
        nvml = self.nvml
        if not self.try_open():
            return None
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as error:
            log.info("NVML not available (%s): %s", error, self.purpose)
            return None
        found: list[tuple[int, Any, str]] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                found.append((index, handle, text(nvml.nvmlDeviceGetUUID(handle))))
            except nvml.NVMLError as error:
                log.info("GPU %d: %s (left out until it answers)", index, error)
                found.append((index, None, ""))
        return found

    def close(self) -> None:
        if self.open:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass
            self.open = False


# One XID wait costs the same CPU whatever its length (0.12 ms on an H100, docs/hardware.md): 2 s waits cost 0.06 ms a
# second, 0.5 s ones 0.25 (a quarter of the nvml collector on a one-GPU host). An event ends a wait; stop() does not.
XID_WAIT_MS = 2000


class XidEvents:
    """NVML's critical XID events of a session's GPUs, waited for on a thread of their own (`nvml-xid`) and counted
    by GPU index and XID, so that a wait never holds up a sample."""

    def __init__(self, nvml: Any, wait_ms: int = XID_WAIT_MS) -> None:
        self.nvml = nvml
        self.wait_ms = wait_ms
        self._counts: Counter[tuple[int, int]] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, gpus: list[tuple[int, Any]]) -> None:
        """Wait for the events of these GPUs, (index, handle), on a thread started here."""
        self._thread = threading.Thread(target=self._run, args=(gpus,), name="nvml-xid", daemon=True)
        self._thread.start()

    def of_gpu(self, index: int) -> list[tuple[int, int]]:
        """(XID, events) of one GPU since the start, by XID."""
        with self._lock:
            return sorted((xid, n) for (gpu, xid), n in self._counts.items() if gpu == index)

    def stop(self) -> bool:
        """Ask the thread to leave at the end of its wait, and wait for it to (one wait at most, wait_ms); whether it
        has left. NVML can be shut down only once it has: a process that goes on to reset a GPU (the Slurm health
        check's repair) must not hold it, and the driver refuses a reset while any process does."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(self.wait_ms / 1000 + 0.5)
        return not self._thread.is_alive()

    def _run(self, gpus: list[tuple[int, Any]]) -> None:
        nvml = self.nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as error:
            log.info("XID events unavailable: %s", error)
            return
        registered = 0
        for index, handle in gpus:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
            except nvml.NVMLError as error:
                log.info("GPU %d: XID events unavailable: %s", index, error)
        while registered and not self._stop.is_set():
            try:
                event = nvml.nvmlEventSetWait(event_set, self.wait_ms)
                index = nvml.nvmlDeviceGetIndex(event.device)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError as error:
                log.debug("XID wait: %s", error)
                self._stop.wait(1.0)  # never spin on a persistent error
                continue
            log.warning("GPU %d: XID %d", index, event.eventData)
            with self._lock:
                self._counts[(index, int(event.eventData))] += 1
        try:
            nvml.nvmlEventSetFree(event_set)
        except nvml.NVMLError:
            pass


class OwnSessionCollector(Collector):
    """A collector sampling on an NVML session of its own: opened at start, tried again at each sample until NVML
    answers (a driver loaded after the exporter started), closed at stop. Subclasses name what is missing without
    NVML (`purpose`) and take the GPUs found in `found`."""

    purpose = "a collector's NVML reads"

    def __init__(self, nvml: Any = None) -> None:
        self.session = NvmlSession(self.purpose, nvml)
        self.nvml: Any = self.session.nvml

    def found(self, gpus: list[tuple[int, Any, str]]) -> None:
        raise NotImplementedError

    def hardware_answering(self) -> bool:
        return self.session.open

    def start(self) -> None:
        self._open()

    def stop(self) -> None:
        self.session.close()

    def ensure_open(self) -> None:
        """At each sample: open the session if it is not (yet)."""
        if not self.session.open:
            self._open()

    def _open(self) -> None:
        gpus = self.session.gpus()
        if gpus is not None:
            self.found(gpus)


class MigProfiles:
    """The GPU instance profile (as NVIDIA names it: 1g.10gb) of each MIG device of one GPU, read once per device.
    Without privilege (the exporter is no root): the device's slices and memory (nvmlDeviceGetAttributes_v2) matched
    to the GPU's profile table (nvmlDeviceGetGpuInstanceProfileInfoV per profile index, read once); the GPU instance
    handle that names its profile directly (nvmlDeviceGetGpuInstanceById) needs root. A `+me` variant has its base
    profile's slices and memory: the base name is given (the lower profile index)."""

    def __init__(self, nvml: Any, parent: Any) -> None:
        self.nvml = nvml
        self.parent = parent
        self.table: Optional[list[tuple[int, int, str]]] = None  # (slices, memory MB, name) of each profile
        self.of_mig: dict[str, str] = {}  # MIG UUID -> its profile's name ("" where it cannot be told)

    def name(self, mig: Any, mig_uuid: str) -> str:
        if mig_uuid not in self.of_mig:
            self.of_mig[mig_uuid] = self._match(mig)
        return self.of_mig[mig_uuid]

    def _profiles(self) -> list[tuple[int, int, str]]:
        if self.table is None:
            nvml, self.table = self.nvml, []
            for index in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
                try:
                    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(self.parent, index, 2)
                except nvml.NVMLError:
                    continue  # a profile this GPU does not have
                self.table.append((int(info.sliceCount), int(info.memorySizeMB), text(info.name)))
        return self.table

    def _match(self, mig: Any) -> str:
        try:
            attributes = self.nvml.nvmlDeviceGetAttributes_v2(mig)
        except self.nvml.NVMLError as error:
            log.debug("MIG device attributes: %s", error)
            return ""
        slices, memory = int(attributes.gpuInstanceSliceCount), int(attributes.memorySizeMB)
        alike = [profile for profile in self._profiles() if profile[0] == slices]
        best = min(alike, key=lambda profile: abs(profile[1] - memory), default=None)
        return best[2].removeprefix("MIG ") if best else ""
