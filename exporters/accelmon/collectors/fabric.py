"""NVLink links, the GPU's NVLink fabric and the Fabric Manager, through NVML (its own session: NVML counts inits).

Example exposition lines::

    accelmon_gpu_nvlink_link_up{gpu="0",link="7",uuid="GPU-…"} 0
    accelmon_gpu_nvlink_errors_total{gpu="0",link="7",type="replay",uuid="GPU-…"} 12
    accelmon_gpu_fabric_state{gpu="0",uuid="GPU-…"} 3

Everything here changes slowly and an H100 has 18 links (5 calls each), so it is read on its own slow schedule, in
a collector of its own: a link call that hangs stops these series only, never the device counters. Which links a
GPU has is learnt once (a link past the last answers InvalidArgument); a GPU without NVLink (NotSupported) or an
older driver without the fabric call (FunctionNotFound) is asked once and then left alone. The Fabric Manager is
looked for (a process named `nv-fabricmanager` in procfs) only where a GPU reports a fabric: only then does the
system need one.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import pynvml

from accelmon.exporter.checks import Check, Drill, GpuCheck, GpuKey, NodeCheck, View
from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import Registration, register, seconds
from accelmon.host.fabric_manager import fabric_manager_running
from accelmon.host.nvidia import NVML_DEVICES, OwnSessionCollector, nvidia_driver_loaded, text
from accelmon.host.topology import NVSWITCH_DEVICES

log = logging.getLogger("accelmon.fabric")

GPU = ("gpu", "uuid")
LINK = (*GPU, "link")
INTERVAL = seconds("interval_seconds", 30, "how often NVLink link states and counters and the fabric are read")
C = Catalogue(
    "fabric",
    "NVLink links, GPU fabric and Fabric Manager (NVML)",
    "Source: NVML through nvidia-ml-py: nvmlDeviceGetNvLinkState and nvmlDeviceGetNvLinkErrorCounter per link, "
    "nvmlDeviceGetGpuFabricInfoV (nvmlDeviceGetGpuFabricInfo on drivers without it). Read every "
    f"`interval_seconds` ({INTERVAL.default:g} s). GPUs without NVLink have no link series; GPUs without a fabric "
    "(state NOT_SUPPORTED: PCIe GPUs, HGX boards without NVSwitch) have no fabric series. On an H100 "
    "(docs/hardware.md) a link call costs 0.014-0.029 ms of CPU and the fabric call 0.02-0.05 ms.",
)
LINK_UP = C.gauge("accelmon_gpu_nvlink_link_up", "1 if the NVLink link is active, 0 if it is down.", LINK)
LINK_ERRORS = C.counter(
    "accelmon_gpu_nvlink_errors_total",
    "NVLink data-link errors since the driver loaded, by type: crc_flit, crc_data, replay, recovery.",
    [*LINK, "type"],
)
LINK_REMOTE = C.gauge(
    "accelmon_gpu_nvlink_remote_info",
    "What the NVLink link leads to: remote_type gpu, switch, ibmnpu or unknown, and that device's PCI bus id as NVML "
    "prints it; value is 1. Which GPUs a reset must take together is read from it (docs/health.md).",
    [*LINK, "remote_type", "remote_pci_bus_id"],
)
LINKS_UNCONNECTED = C.gauge(
    "accelmon_gpu_nvlink_links_unconnected",
    "NVLink links the GPU has that lead nowhere: never up since the exporter started and no device named at the "
    "other end (a PCIe GPU without an NVLink bridge: 12 on an A100 PCIe; never on an NVLink fabric or NVSwitch "
    "board); they have no link series.",
    GPU,
)
FABRIC_STATE = C.gauge(
    "accelmon_gpu_fabric_state",
    "The GPU's registration with its NVLink fabric: 1 not started, 2 in progress, 3 completed.",
    GPU,
)
FABRIC_STATUS = C.gauge(
    "accelmon_gpu_fabric_status",
    "NVML return code of the GPU's fabric registration once completed: 0 success, any other a failure.",
    GPU,
)
FABRIC_INFO = C.gauge(
    "accelmon_gpu_fabric_info", "The GPU's NVLink clique and cluster; value is 1.", [*GPU, "clique_id", "cluster_uuid"]
)
FABRIC_DEGRADED = C.gauge(
    "accelmon_gpu_fabric_bandwidth_degraded",
    "1 if the fabric reports the GPU's NVLink bandwidth degraded, 0 if not (drivers that report it).",
    GPU,
)
FABRIC_MANAGER = C.gauge(
    "accelmon_fabric_manager_running",
    "1 if the NVIDIA Fabric Manager process (nv-fabricmanager) runs, 0 if not; served where a GPU has a fabric.",
)

# nvmlNvLinkErrorCounter_t -> type label (ECC data, 4, is left out: Hopper reports it in the CRC data count).
ERROR_COUNTERS = {
    "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
}
# nvmlNvLinkDeviceType_t -> remote_type label.
REMOTE_TYPES = {
    pynvml.NVML_NVLINK_DEVICE_TYPE_GPU: "gpu",
    pynvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU: "ibmnpu",
    pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH: "switch",
}
FABRIC_STATE_NOT_SUPPORTED = 0
# healthMask bits 0-1: degraded bandwidth, 1 true, 2 false, 0 not reported (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*).
DEGRADED_BW_TRUE, DEGRADED_BW_FALSE = 1, 2


@dataclass
class Gpu:
    index: int
    handle: Any
    uuid: str = ""
    links: Optional[list[int]] = None  # learnt at the first read; [] = no NVLink
    remotes: dict[int, tuple[str, str]] = field(default_factory=dict)  # link -> (remote type, bus id), learnt once
    trained: set[int] = field(default_factory=set)  # links seen up since the exporter started
    unsupported: set[str] = field(default_factory=set)


class FabricCollector(OwnSessionCollector):
    name = "fabric"
    purpose = "no NVLink or fabric metrics"

    def __init__(self, procfs: str = "/proc", nvml: Any = None) -> None:
        super().__init__(nvml)
        self.procfs = procfs
        self._switches = os.path.join(procfs, *NVSWITCH_DEVICES)
        self.gpus: list[Gpu] = []

    def found(self, gpus: list[tuple[int, Any, str]]) -> None:
        self.gpus = [Gpu(index, handle, uuid) for index, handle, uuid in gpus]

    def sample(self) -> Samples:
        self.ensure_open()
        out = Samples()
        any_fabric = False
        # On an NVSwitch board every link of every GPU is wired to a switch (an HGX H100's 18, an A100's 12): one
        # that never trained is lost, whatever NVML names at its other end.
        try:
            switched = bool(os.listdir(self._switches))
        except OSError:
            switched = False  # no nvidia-nvswitch driver: no switch listed
        for gpu in self.gpus:
            if gpu.handle is None or not gpu.uuid:
                self._identify(gpu)
                if not gpu.uuid:
                    continue
            try:
                fabric = Samples()
                on_fabric = self._sample_fabric(gpu, fabric)
                self._sample_links(gpu, out, wired=on_fabric or switched)
                out.extend(fabric)
                any_fabric |= on_fabric
            except (self.nvml.NVMLError_GpuIsLost, self.nvml.NVMLError_Unknown) as error:
                # The device counters report the lost GPU (accelmon_gpu_up 0); its links are simply left out.
                log.debug("GPU %d lost: %s", gpu.index, error)
        if any_fabric:
            out.add(FABRIC_MANAGER, [], 1 if fabric_manager_running(self.procfs) else 0)
        return out

    def _identify(self, gpu: Gpu) -> None:
        try:
            gpu.handle = self.nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            uuid = self.nvml.nvmlDeviceGetUUID(gpu.handle)
            gpu.uuid = text(uuid)
        except self.nvml.NVMLError:
            pass

    def _sample_links(self, gpu: Gpu, out: Samples, wired: bool = False) -> None:
        """Its links' series; `wired`: the GPU is on an NVLink fabric or NVSwitch board, where no link leads nowhere."""
        nvml = self.nvml
        if gpu.links is None:
            gpu.links = self._find_links(gpu)
        unconnected = 0
        for link in gpu.links:
            labels = [str(gpu.index), gpu.uuid, str(link)]
            up = None
            try:
                up = 1 if nvml.nvmlDeviceGetNvLinkState(gpu.handle, link) else 0
            except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_Unknown):
                raise
            except nvml.NVMLError as error:
                log.debug("GPU %d link %d state: %s", gpu.index, link, error)
            if up:
                gpu.trained.add(link)
            remote = self._remote(gpu, link)
            if link not in gpu.trained and not wired and not _leads_somewhere(remote):
                # Never up and wired to nothing NVML names: a PCIe GPU without a bridge (an A100 PCIe answers all 12
                # links down), not a link lost. A link once up, or one NVML names the other end of, stays served;
                # so does every link of a GPU on a fabric or an NVSwitch board (a reboot onto a dead link).
                unconnected += 1
                continue
            if up is not None:
                out.add(LINK_UP, labels, up)
            if remote is not None:
                out.add(LINK_REMOTE, [*labels, *remote], 1)
            if "errors" in gpu.unsupported:
                continue
            for kind, counter in ERROR_COUNTERS.items():
                try:
                    value = nvml.nvmlDeviceGetNvLinkErrorCounter(gpu.handle, link, counter)
                except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
                    # Blackwell's driver dropped the per-link counter call: not asked again on this GPU.
                    gpu.unsupported.add("errors")
                    break
                except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_Unknown):
                    raise
                except nvml.NVMLError as error:
                    log.debug("GPU %d link %d %s: %s", gpu.index, link, kind, error)
                    continue
                out.add(LINK_ERRORS, [*labels, kind], value)
        if gpu.links:
            out.add(LINKS_UNCONNECTED, [str(gpu.index), gpu.uuid], unconnected)

    def _remote(self, gpu: Gpu, link: int) -> Optional[tuple[str, str]]:
        """What the link leads to, asked until it answers and then kept (the wiring of a board does not change while
        the driver runs); None where the driver does not say (a link down, an older driver)."""
        nvml = self.nvml
        if link in gpu.remotes or "remote" in gpu.unsupported:
            return gpu.remotes.get(link)
        try:
            kind = REMOTE_TYPES.get(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(gpu.handle, link), "unknown")
            bus = text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(gpu.handle, link).busId)
        except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_Unknown):
            raise
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            gpu.unsupported.add("remote")
            return None
        except nvml.NVMLError as error:
            log.debug("GPU %d link %d remote: %s", gpu.index, link, error)
            return None
        gpu.remotes[link] = (kind, bus)
        return gpu.remotes[link]

    def _find_links(self, gpu: Gpu) -> list[int]:
        """The GPU's links: NotSupported on the first means no NVLink, InvalidArgument marks the end."""
        nvml = self.nvml
        links = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                nvml.nvmlDeviceGetNvLinkState(gpu.handle, link)
            except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_Unknown):
                raise
            except (nvml.NVMLError_InvalidArgument, nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
                break
            except nvml.NVMLError as error:
                log.info("GPU %d link %d: %s", gpu.index, link, error)
            links.append(link)
        log.info("GPU %d: %d NVLink links", gpu.index, len(links))
        return links

    def _sample_fabric(self, gpu: Gpu, out: Samples) -> bool:
        """The fabric series of a GPU that has a fabric; whether it has one."""
        info = self._fabric_info(gpu)
        if info is None or info.state == FABRIC_STATE_NOT_SUPPORTED:
            return False
        labels = [str(gpu.index), gpu.uuid]
        out.add(FABRIC_STATE, labels, info.state)
        out.add(FABRIC_STATUS, labels, info.status)
        cluster = bytes(info.clusterUuid).hex()
        out.add(FABRIC_INFO, [*labels, str(info.cliqueId), _uuid_text(cluster)], 1)
        degraded = getattr(info, "healthMask", 0) & 0x3
        if degraded in (DEGRADED_BW_TRUE, DEGRADED_BW_FALSE):
            out.add(FABRIC_DEGRADED, labels, 1 if degraded == DEGRADED_BW_TRUE else 0)
        return True

    def _fabric_info(self, gpu: Gpu) -> Any:
        nvml = self.nvml
        calls = (
            (
                "fabric_v",
                getattr(nvml, "nvmlDeviceGetGpuFabricInfoV", None),
                getattr(nvml, "c_nvmlGpuFabricInfoV_t", None),
            ),
            ("fabric", getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None), getattr(nvml, "c_nvmlGpuFabricInfo_t", None)),
        )
        for key, function, structure in calls:
            if key in gpu.unsupported or function is None or structure is None:
                continue
            info = structure()
            try:
                function(gpu.handle, ctypes.byref(info))
                return info
            except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_Unknown):
                raise
            except (
                nvml.NVMLError_NotSupported,
                nvml.NVMLError_FunctionNotFound,
                nvml.NVMLError_ArgumentVersionMismatch,
            ):
                gpu.unsupported.add(key)  # an older driver: the next call, or no fabric at all
            except nvml.NVMLError as error:
                log.debug("GPU %d fabric: %s", gpu.index, error)
                return None
        return None


def _uuid_text(hex32: str) -> str:
    return f"{hex32[:8]}-{hex32[8:12]}-{hex32[12:16]}-{hex32[16:20]}-{hex32[20:]}"


def _leads_somewhere(remote: Optional[tuple[str, str]]) -> bool:
    """Whether NVML names what a link leads to: a GPU, a switch or an NPU at a PCI address other than all zeros."""
    if remote is None or remote[0] == "unknown":
        return False
    return any(digit not in "0:." for digit in remote[1])


# DCGM's hardware limits: one NVLink replay or recovery error is already past the limit; CRC errors matter only at
# 100 per second and more (a rate: the alert AccelmonNvlinkCrcErrors judges it, docs/health.md).
NVLINK_ERROR_LIMIT = 1


def check_nvlink(view: View, gpu: GpuKey, now: float) -> Check:
    """A link down costs the GPU its share of NVLink bandwidth (collectives slow down or fail); replays and
    recoveries since the driver loaded mean a link that retrains."""
    states = view.of(LINK_UP, gpu)
    if not states:
        return Check("nvlink", "ok", "no NVLink reported")
    down = sorted((int(labels["link"]) for labels, value in states if value == 0))
    if down:
        links = ", ".join(str(link) for link in down)
        return Check(
            "nvlink",
            "failure",
            f"NVLink down: link {links} ({len(states) - len(down)} of {len(states)} up)",
            "check_fabric",
        )
    erring: dict[int, list[str]] = {}
    for labels, count in view.of(LINK_ERRORS, gpu):
        if labels.get("type") in ("replay", "recovery") and count >= NVLINK_ERROR_LIMIT:
            erring.setdefault(int(labels["link"]), []).append(f"{count:g} {labels['type']}")
    if erring:
        detail = "; ".join(f"link {link}: {', '.join(kinds)}" for link, kinds in sorted(erring.items()))
        return Check("nvlink", "warning", f"NVLink errors since the driver loaded: {detail}", "check_fabric")
    return Check("nvlink", "ok", f"{len(states)} links up, no replay or recovery error")


def drill_nvlink(view: View, gpu: GpuKey, xid: int, started: float) -> None:
    """Its first link down (link 0 where the GPU reports none)."""
    links = sorted(int(labels["link"]) for labels, _ in view.of(LINK_UP, gpu))
    view.put(LINK_UP, gpu, 0, link=str(links[0] if links else 0))


FABRIC_STATES = {1: "not started", 2: "in progress", 3: "completed"}


def check_fabric(view: View, gpu: GpuKey, now: float) -> Check:
    """On an NVSwitch system a GPU joins the NVLink fabric once the Fabric Manager configured it; until then
    CUDA programs on it fail to start (docs/health.md)."""
    state = view.value(FABRIC_STATE, gpu)
    if state is None:
        return Check("fabric", "ok", "no NVLink fabric")
    manager = next((value for _, value in view.of(FABRIC_MANAGER)), None)
    without_manager = "; the Fabric Manager is not running" if manager == 0 else ""
    if state == 2:
        return Check("fabric", "warning", "fabric registration in progress" + without_manager, "check_fabric")
    if state != 3:
        named = FABRIC_STATES.get(int(state), f"state {state:g}")
        return Check("fabric", "failure", f"fabric registration {named}{without_manager}", "check_fabric")
    status = view.value(FABRIC_STATUS, gpu)
    if status:
        return Check("fabric", "failure", f"fabric registration failed (NVML error {status:g})", "check_fabric")
    if view.value(FABRIC_DEGRADED, gpu) == 1:
        return Check("fabric", "warning", "the fabric reports this GPU's NVLink bandwidth degraded", "check_fabric")
    return Check("fabric", "ok", "fabric registration completed")


def check_fabric_manager(view: View) -> Optional[Check]:
    manager = view.of(FABRIC_MANAGER)  # served only where a GPU has a fabric
    if not manager:
        return None
    if manager[0][1] == 0:
        return Check(
            "fabric_manager",
            "failure",
            "the NVIDIA Fabric Manager is not running on an NVSwitch system",
            "check_fabric",
        )
    return Check("fabric_manager", "ok", "running")


REGISTRATION = register(
    Registration(
        name="fabric",
        help="NVLink link states and error counters, GPU fabric and Fabric Manager (NVML)",
        build=lambda options, paths: FabricCollector(procfs=paths.procfs),
        catalogue=C,
        options=(INTERVAL,),
        # Where the NVIDIA driver is loaded; a GPU without NVLink or fabric costs one call each, once.
        enabled_by_default=nvidia_driver_loaded,
        hardware_present=nvidia_driver_loaded,
        devices=NVML_DEVICES,
        gpu_checks=(
            GpuCheck(
                "nvlink",
                check_nvlink,
                source="`accelmon_gpu_nvlink_link_up`, `accelmon_gpu_nvlink_errors_total`",
                failure="a link of the GPU is down (`check_fabric`)",
                warning=(
                    "a link counted a replay or recovery error since the driver loaded (DCGM's limit is 1) "
                    "(`check_fabric`)"
                ),
            ),
            GpuCheck(
                "fabric",
                check_fabric,
                source="`accelmon_gpu_fabric_{state,status,bandwidth_degraded}`, `accelmon_fabric_manager_running`",
                failure="fabric registration not started, or completed with an error (`check_fabric`)",
                warning="registration in progress, or the fabric reports degraded bandwidth (`check_fabric`)",
            ),
        ),
        drills=(Drill("nvlink", drill_nvlink),),
        node_checks=(
            NodeCheck(
                "fabric_manager",
                check_fabric_manager,
                source="`accelmon_fabric_manager_running` (served only where a GPU has a fabric)",
                failure="the Fabric Manager is not running on an NVSwitch system (`check_fabric`)",
            ),
        ),
        scan=True,
    )
)
