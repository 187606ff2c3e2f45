"""PCIe Access Control Services (ACS) on the bridges NCCL's traffic crosses: between each GPU and the NICs NCCL uses
for it (through an NVLink peer's PCIe path where it is PXN), and between two GPUs NVLink does not join that NCCL
joins by PCIe P2P. A root pass reads them and leaves a small state file, the exporter (its own unprivileged user)
reads that file.

Why a root pass: the ACS capability is an extended capability (PCIe configuration space past its first 256 bytes),
and Linux gives a process without CAP_SYS_ADMIN only the first 64 bytes of `<sysfs>/bus/pci/devices/<bdf>/config`
(drivers/pci/pci-sysfs.c `pci_read_config`). So the Slurm and OAR health checks, which run as root, call `refresh`
after their scan (accelmon.scan.hook_scan); the pcie_acs collector serves what the file says.

Parsing (PCIe Base Spec 7.7.11; Linux include/uapi/linux/pci_regs.h): extended capabilities are chained from offset
0x100, each header a little-endian dword with the capability id (bits 0-15, PCI_EXT_CAP_ID), its version (16-19)
and the next capability's offset (20-31, PCI_EXT_CAP_NEXT, low two bits masked); ACS is id 0x000D
(PCI_EXT_CAP_ID_ACS), its control register the word at +6 (PCI_ACS_CTRL). NCCL's troubleshooting guide ("PCI Access
Control Services (ACS)"): with P2P redirect on, a bridge sends peer-to-peer traffic (GPU to NIC, GPU to GPU) up to
the root complex, which slows GPUDirect or breaks it.

The state file is trusted only when it is a regular file owned by root and writable by nobody else; anything else is
refused (and counted by the reader), never served as healthy.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from accelmon.host import nccl_nics, topology
from accelmon.host.nvidia import NvmlSession, driver_gpu_entries
from accelmon.host.topology_files import nccl_int

STATE_PATH = "/run/accelmon/pcie-acs.json"  # where the root pass leaves it by default (the pcie_acs collector's option)
EXT_CAP_START = 0x100  # PCI_CFG_SPACE_SIZE: extended capabilities start here
CONFIG_SPACE = 4096  # PCI_CFG_SPACE_EXP_SIZE
EXT_CAP_ID_ACS = 0x000D  # PCI_EXT_CAP_ID_ACS
ACS_CTRL = 6  # PCI_ACS_CTRL: the control register's offset in the capability
# The control bits (PCI_ACS_SV, _TB, _RR, _CR, _UF, _EC, _DT), as served in `controls`.
CONTROLS = (
    ("source_validation", 0x01), ("translation_blocking", 0x02), ("request_redirect", 0x04),
    ("completion_redirect", 0x08), ("upstream_forwarding", 0x10), ("egress_control", 0x20),
    ("direct_translated", 0x40),
)  # fmt: skip
REDIRECT = 0x04 | 0x08  # P2P Request or Completion Redirect: peer-to-peer goes up to the root complex
# The most capabilities a chain may hold (Linux pci_find_next_ext_capability's ttl): a loop in a hostile or broken
# chain ends there.
MAX_EXT_CAPS = (CONFIG_SPACE - EXT_CAP_START) // 8
STATE_VERSION = 1
MAX_STATE_BYTES = 256 * 1024  # a DGX H100's file is about 4 KiB
BUS_ID = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
GPU = re.compile(r"[0-9]{1,4}")  # NVML's index


def acs_control(config: bytes) -> Optional[int]:
    """The ACS Control register from a function's configuration space; 0 where it has no ACS capability (nothing
    redirects); None where the extended space is not there to read (64 or 256 bytes: no privilege, or no PCIe)."""
    if len(config) < EXT_CAP_START + 4:
        return None
    offset, seen = EXT_CAP_START, 0
    while offset and seen < MAX_EXT_CAPS and offset + 8 <= len(config):
        (header,) = struct.unpack_from("<I", config, offset)
        if header in (0, 0xFFFFFFFF):  # no capability at all; a function gone (reads all ones)
            return 0 if header == 0 else None
        if header & 0xFFFF == EXT_CAP_ID_ACS:
            return int(struct.unpack_from("<H", config, offset + ACS_CTRL)[0])
        offset = (header >> 20) & 0xFFC
        if offset < EXT_CAP_START:
            break
        seen += 1
    return 0


def read_control(sysfs: str, bridge: str) -> Optional[int]:
    """A bridge's ACS Control register from `<sysfs>/bus/pci/devices/<bridge>/config`; None if it cannot be read."""
    try:
        with open(os.path.join(sysfs, "bus", "pci", "devices", bridge, "config"), "rb") as handle:
            return acs_control(handle.read(CONFIG_SPACE))
    except OSError:
        return None


def path_bridges(gpu: topology.Place, nic: topology.Place) -> list[str]:
    """The bridges peer-to-peer traffic between two functions crosses where NCCL sends it peer to peer: a PIX or PXB
    path (nccl_path), below their lowest common bridge (a switch's upstream port, kept: its downstream ports route
    between them) each side's ports; the endpoints left out. None on a PHB or SYS path: NCCL turns GPUDirect RDMA
    off beyond PXB (paths.cc `ncclTopoCheckGdr`, NCCL_NET_GDR_LEVEL's default) and P2P too (`ncclTopoCheckP2p`,
    PXB but on a 2-GPU AMD host), its traffic goes through host memory, which a root port's ACS redirect does not
    slow; and Linux sets those bits on every root port with ACS when the IOMMU is on (pci_std_enable_acs), so a
    healthy node would record a fault there for good."""
    if gpu.root != nic.root or topology.nccl_path(gpu, nic)[0] not in topology.PXN_SOURCES:
        return []
    shared = next((i for i, (a, b) in enumerate(zip(gpu.chain, nic.chain)) if a != b),
                  min(len(gpu.chain), len(nic.chain)))  # fmt: skip
    start = max(shared - 1, 1)  # never the root port (chain[0]): the path turns below it
    found: list[str] = []
    for chain in (gpu.chain, nic.chain):
        found.extend(b for b in chain[start:-1] if b not in found)
    return found


# NCCL's path types in its order (graph/topo.h PATH_*, topo.cc `topoPathTypeStr`), and the old numeric
# NCCL_P2P_LEVEL values mapped to them (paths.cc `levelsOldToNew`).
NCCL_PATHS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
OLD_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")


def p2p_level(level: str, disable: str, amd: bool, gpus: int) -> str:
    """The farthest path NCCL takes GPU-to-GPU P2P over (paths.cc `ncclTopoCheckP2p`, v2.28.7-1): PXB by default
    ("don't use P2P across CPU Host Bridges"), SYS on an AMD x86 CPU with at most 2 GPUs; NCCL_P2P_DISABLE=1 makes
    it LOC (none), else NCCL_P2P_LEVEL by name or old number (`ncclGetLevel`)."""
    chosen = "SYS" if amd and gpus <= 2 else "PXB"
    if nccl_int(disable, 0) == 1:
        return "LOC"
    if level in NCCL_PATHS:
        return level
    if level[:1].isdigit():
        return OLD_LEVELS[min(nccl_int(level, 0), len(OLD_LEVELS) - 1)]
    return chosen


def _amd_cpu(procfs: str) -> bool:
    """Whether the CPU is AMD's (NCCL's NCCL_TOPO_CPU_VENDOR_AMD, from cpuid; here the first vendor_id line)."""
    try:
        with open(os.path.join(procfs, "cpuinfo"), encoding="utf-8", errors="replace") as stream:
            for line in stream:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip() == "AuthenticAMD"
    except OSError:
        pass
    return False


def _relay(gpu: str, device: str, direct: dict[str, list[tuple[int, int]]], joined: Callable[[str, str], bool]) -> str:
    """The NVLink peer through which `gpu` reaches `device` by PXN: of the GPUs joined to it whose own path to the
    device is PIX or PXB, the nearest, then the first (topo.cc `ncclTopoGetLocalGpu` takes the first of the NIC's
    local GPUs, nearest first, in index order, that leaves by it); '' if none."""
    found = sorted((order, index) for order, index in direct.get(device, []) if joined(gpu, str(index)))
    return str(found[0][1]) if found else ""


def survey(
    sysfs: str, procfs: str, conf: Optional[nccl_nics.Settings] = None, p2p: str = "PXB", nvml: object = None,
) -> dict[str, Any]:  # fmt: skip
    """The root pass: for each GPU, the bridges on its PCIe path to each NIC NCCL uses for it (accelmon.host
    .nccl_nics, as the infiniband collector chooses them: the node's NCCL settings `conf`, NCCL_TOPO_FILE, NVLink
    bridges asked of NVML through `nvml`, over the ACTIVE ports); a GPU that reaches its NIC through an NVLink peer
    (PXN: paths.cc `ncclTopoComputePaths` adds the peer as an inter step, GPU -> peer over NVLink -> NIC over PCIe)
    crosses the peer's bridges to it, listed for it with `via` the peer. And for each pair of GPUs NVLink does not
    join whose path is within `p2p` (`p2p_level`), the bridges their GPU-to-GPU P2P crosses (`p2p`). Each bridge's
    ACS Control register beside them (null where it could not be read)."""
    functions = topology.nics(sysfs)
    bridges: dict[str, Optional[int]] = {}
    entries = driver_gpu_entries(procfs)
    places = {gpu.index: topology.place(sysfs, bus) for bus, gpu, _ in entries}
    uuids = {gpu.index: gpu.uuid for _, gpu, _ in entries}
    conf = conf or nccl_nics.Settings()
    session = NvmlSession("NVLink bridges are not known (PXN, P2P)", nvml)
    bridged = nccl_nics.bridged_pairs(procfs, session, sysfs) or []
    groups = nccl_nics.nvlink_groups(procfs, bridged)  # a bridged pair's P2P goes by NVLink too
    buses = {gpu.index: bus.lower() for bus, gpu, _ in entries}

    def joined(a: str, b: str) -> bool:
        return any(buses.get(a) in group and buses.get(b) in group for group in groups)

    chosen = nccl_nics.chosen(sysfs, procfs, topology.active_ports(sysfs), conf, bridged)
    direct: dict[str, list[tuple[int, int]]] = {}
    for local in chosen:
        if local.path in topology.PXN_SOURCES:
            direct.setdefault(local.device, []).append((NCCL_PATHS.index(local.path), int(local.gpu)))
    paths: list[dict[str, Any]] = []
    for local in chosen:
        source = _relay(local.gpu, local.device, direct, joined) if local.path == "PXN" else local.gpu
        mine, theirs = places.get(source), None
        if local.device in functions:
            theirs = topology.place(sysfs, functions[local.device])
        if mine is None or theirs is None:
            continue
        entry = {"gpu": local.gpu, "uuid": local.uuid, "device": local.device, "bridges": path_bridges(mine, theirs)}
        if source != local.gpu:
            entry["via"] = source
        if entry not in paths:
            paths.append(entry)
    pairs: list[dict[str, Any]] = []
    farthest = NCCL_PATHS.index(p2p) if p2p in NCCL_PATHS else 0
    for a, mine in places.items():
        for b, theirs in places.items():
            if a == b or mine is None or theirs is None or joined(a, b):
                continue
            if NCCL_PATHS.index(topology.nccl_path(mine, theirs)[0]) <= farthest:
                pairs.append({"gpu": a, "uuid": uuids[a], "peer": b, "bridges": path_bridges(mine, theirs)})
    for entry in (*paths, *pairs):
        for bridge in entry["bridges"]:
            if bridge not in bridges:
                bridges[bridge] = read_control(sysfs, bridge)
    return {"version": STATE_VERSION, "bridges": bridges, "paths": paths, "p2p": pairs}


def refresh(
    sysfs: str, procfs: str, nccl_conf: str, path: str, now: float, topo_file: str = "", nvml: object = None,
) -> dict[str, Any]:  # fmt: skip
    """The root pass as the health hooks run it: the survey under the node's NCCL settings (those that choose the
    NICs, nccl_nics.settings, with `topo_file` the infiniband collector's nccl_topo_file; NCCL_P2P_LEVEL and
    NCCL_P2P_DISABLE of /etc/nccl.conf, as NCCL reads them), written to `path`. Run as root only: anyone else reads
    64 bytes of each bridge, and would write a survey of unknowns."""
    level, disable = topology.nccl_conf_values(nccl_conf, ("NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE"))
    gpus = len(driver_gpu_entries(procfs))
    state = survey(sysfs, procfs, nccl_nics.settings(nccl_conf, topo_file),
                   p2p_level(level, disable, _amd_cpu(procfs), gpus), nvml)  # fmt: skip
    write_state(path, state, now)
    return state


def write_state(path: str, state: dict[str, Any], now: float) -> None:
    """Writes the state atomically (a reader never sees half a file), root's and 0644, stamped with `now`."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".pcie-acs-")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump({**state, "time": now}, out)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


@dataclass
class State:
    """What the exporter serves of the state file: `problem` is why nothing is (missing, stale, untrusted,
    malformed), None when it was read; `skipped` the entries refused within a read file."""

    problem: Optional[str] = "missing"
    written: float = 0.0
    bridges: dict[str, Optional[int]] = field(default_factory=dict)
    paths: list[tuple[str, str, str, tuple[str, ...]]] = field(default_factory=list)  # gpu, uuid, device, bridges
    p2p: list[tuple[str, str, str, tuple[str, ...]]] = field(default_factory=list)  # gpu, uuid, peer GPU, bridges
    skipped: int = 0


def read_state(path: str, owner: int = 0) -> State:
    """The state file as the exporter trusts it: a regular file (no link followed) owned by `owner` (root) and not
    writable by its group or others; any entry whose names are not bus ids or device names is skipped and counted."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return State("missing")
    except OSError:
        return State("untrusted")  # a link (ELOOP), or not ours to read
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != owner or status.st_mode & 0o022:
            return State("untrusted")
        with os.fdopen(os.dup(descriptor), "rb") as handle:
            data = handle.read(MAX_STATE_BYTES + 1)
    finally:
        os.close(descriptor)
    try:
        if len(data) > MAX_STATE_BYTES:
            raise ValueError("too large")
        record = json.loads(data)
        state = State(None, float(record["time"]))
        if record["version"] != STATE_VERSION or not isinstance(record["bridges"], dict):
            raise ValueError
        entries = list(record["paths"])
        pairs = list(record.get("p2p", []))  # absent from the files of a root pass before GPU-to-GPU paths
    except (ValueError, KeyError, TypeError):
        return State("malformed")
    for bridge, control in record["bridges"].items():
        if BUS_ID.fullmatch(bridge) and (control is None or (type(control) is int and 0 <= control <= 0xFFFF)):
            state.bridges[bridge] = control
        else:
            state.skipped += 1
    for found, listed, other, pattern in ((state.paths, entries, "device", NAME), (state.p2p, pairs, "peer", GPU)):
        for entry in listed:
            try:
                labels = (str(entry["gpu"]), str(entry["uuid"]), str(entry[other]))
                crossed = tuple(str(b) for b in entry["bridges"])
            except (KeyError, TypeError):
                state.skipped += 1
                continue
            if (
                GPU.fullmatch(labels[0])
                and NAME.fullmatch(labels[1])
                and pattern.fullmatch(labels[2])
                and all(b in state.bridges for b in crossed)
            ):
                found.append((*labels, crossed))
            else:
                state.skipped += 1
    return state


class StateReader:
    """The state file for the collector: read again only when it changed (an lstat a sample), `refused` counting
    the versions of it refused (untrusted or malformed); a state older than `max_age` seconds, or written after
    now (a clock stepped back: nothing says when it was read), is stale."""

    def __init__(self, path: str, max_age: float, owner: int = 0) -> None:
        self.path, self.max_age, self.owner = path, max_age, owner
        self.refused = 0
        self._seen: tuple[tuple[int, ...], State] = ((), State())

    def current(self, now: float) -> State:
        try:
            status = os.lstat(self.path)
            key: tuple[int, ...] = (status.st_ino, status.st_mtime_ns, status.st_size, status.st_uid, status.st_mode)
        except OSError:
            key = ()
        if key != self._seen[0]:
            self._seen = (key, read_state(self.path, self.owner))
            self.refused += 1 if self._seen[1].problem in ("untrusted", "malformed") else 0
        state = self._seen[1]
        if state.problem is None and not 0 <= now - state.written <= self.max_age:
            return State("stale", state.written)
        return state
