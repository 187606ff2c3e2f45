"""PCIe Access Control Services (ACS) on the bridges between each GPU and the NICs NCCL uses for it: a root pass
reads them and leaves a small state file, the exporter (its own unprivileged user) reads that file.

Why a root pass: the ACS capability is an extended capability (PCIe configuration space past its first 256 bytes),
and Linux gives a process without CAP_SYS_ADMIN only the first 64 bytes of `<sysfs>/bus/pci/devices/<bdf>/config`
(drivers/pci/pci-sysfs.c `pci_read_config`). So the Slurm and OAR health checks, which run as root, call `refresh`
after their scan (accelmon.scan.hook_scan); the infiniband collector serves what the file says.

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
from typing import Any, Optional

from accelmon.exporter.validation import Option, seconds
from accelmon.host import topology
from accelmon.host.nvidia import driver_gpu_entries

STATE_FILE = Option(
    "pcie_acs_state",
    "/run/accelmon/pcie-acs.json",
    "where the Slurm or OAR health check (root) leaves the ACS control of the PCIe bridges on each GPU's path to its "
    "NCCL NICs; served only if root's and writable by nobody else",
)
MAX_AGE = seconds(
    "pcie_acs_max_age_seconds", 3600, "an ACS state older than this is not served (ACS then reads as not checked)"
)
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
    """The bridges peer-to-peer traffic between two functions crosses: below their lowest common bridge (a switch's
    upstream port, kept: its downstream ports route between them) each side's ports; with none in common (through the
    root complex or across it), every bridge above each (root ports included). The endpoints are left out."""
    if gpu.root != nic.root:
        shared = 0
    else:
        shared = next((i for i, (a, b) in enumerate(zip(gpu.chain, nic.chain)) if a != b),
                      min(len(gpu.chain), len(nic.chain)))  # fmt: skip
    start = max(shared - 1, 0)
    found: list[str] = []
    for chain in (gpu.chain, nic.chain):
        found.extend(b for b in chain[start:-1] if b not in found)
    return found


def survey(sysfs: str, procfs: str, ib_hca: str = "", pxn: bool = True, p2p_pxn_level: int = 2) -> dict[str, Any]:
    """The root pass: for each GPU, the bridges on its PCIe path to each NIC NCCL uses for it (accelmon.host.topology
    `nccl_local` over the ACTIVE ports), and each bridge's ACS Control register (null where it could not be read).
    A GPU that reaches its NIC through an NVLink peer (PXN) crosses that peer's path, which is the peer's entry."""
    functions = topology.nics(sysfs)
    paths: list[dict[str, Any]] = []
    bridges: dict[str, Optional[int]] = {}
    gpus = {gpu.index: bus for bus, gpu, _ in driver_gpu_entries(procfs)}
    ports = topology.active_ports(sysfs)
    for local in topology.nccl_local(sysfs, procfs, ports, ib_hca, None, pxn, p2p_pxn_level):
        mine, theirs = topology.place(sysfs, gpus.get(local.gpu, "")), None
        if local.device in functions:
            theirs = topology.place(sysfs, functions[local.device])
        if local.path == "PXN" or mine is None or theirs is None:
            continue
        entry = {"gpu": local.gpu, "uuid": local.uuid, "device": local.device, "bridges": path_bridges(mine, theirs)}
        if entry not in paths:
            paths.append(entry)
        for bridge in entry["bridges"]:
            if bridge not in bridges:
                bridges[bridge] = read_control(sysfs, bridge)
    return {"version": STATE_VERSION, "bridges": bridges, "paths": paths}


def refresh(sysfs: str, procfs: str, nccl_conf: str, path: str, now: float) -> dict[str, Any]:
    """The root pass as the health hooks run it: the survey under the node's NCCL settings (NCCL_IB_HCA,
    NCCL_PXN_DISABLE, NCCL_P2P_PXN_LEVEL of /etc/nccl.conf, as the infiniband collector reads them), written to
    `path`. Run as root only: anyone else reads 64 bytes of each bridge, and would write a survey of unknowns."""
    ib_hca, pxn_disable, level = topology.nccl_conf_values(
        nccl_conf, ("NCCL_IB_HCA", "NCCL_PXN_DISABLE", "NCCL_P2P_PXN_LEVEL"))  # fmt: skip
    state = survey(sysfs, procfs, ib_hca, pxn_disable.strip() != "1", int(level) if level.strip().isdigit() else 2)
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
    except (ValueError, KeyError, TypeError):
        return State("malformed")
    for bridge, control in record["bridges"].items():
        if BUS_ID.fullmatch(bridge) and (control is None or (type(control) is int and 0 <= control <= 0xFFFF)):
            state.bridges[bridge] = control
        else:
            state.skipped += 1
    for entry in entries:
        try:
            labels = (str(entry["gpu"]), str(entry["uuid"]), str(entry["device"]))
            crossed = tuple(str(b) for b in entry["bridges"])
        except (KeyError, TypeError):
            state.skipped += 1
            continue
        if (
            labels[0].isdigit()
            and all(NAME.fullmatch(x) for x in labels[1:])
            and all(b in state.bridges for b in crossed)
        ):
            state.paths.append((*labels, crossed))
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
