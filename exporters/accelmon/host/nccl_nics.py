"""The NICs NCCL uses for each GPU of the node, worked out once for everyone who asks: the infiniband collector (the
nearest and rail series, the path rules), `accelmon-drill nic` (which GPUs use the drilled port) and the ACS root pass
(whose bridges to read). Each reads the same inputs NCCL does, here and only here:

- /etc/nccl.conf's NCCL_IB_HCA, NCCL_PXN_DISABLE, NCCL_P2P_PXN_LEVEL and NCCL_TOPO_FILE (param.cc `setEnvFile`);
- the topology file (the collector's `nccl_topo_file` option, else the conf's, else NCCL's default path, read
  where it is there: topo.cc `ncclTopoGetSystem`), whose places win over sysfs's (a Hyper-V VM's);
- the GPUs NVLink joins: every GPU where NVSwitches are listed, else the pairs NVML says a bridge joins
  (xml.cc `ncclTopoGetXmlFromGpu`), from which PXN relays.

Two callers that read any of these apart would name different NICs for one GPU: a drill refused on the port the
rules show in use, an ACS fault on a path NCCL does not take.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from accelmon.host import topology
from accelmon.host.nvidia import NvmlSession
from accelmon.host.topology_files import nccl_int

NCCL_CONF = "/etc/nccl.conf"  # where a site sets NCCL's variables for every job of the node (param.cc)
SETTINGS = ("NCCL_IB_HCA", "NCCL_PXN_DISABLE", "NCCL_P2P_PXN_LEVEL", "NCCL_TOPO_FILE")


@dataclass(frozen=True)
class Settings:
    """What of the node's NCCL settings decides the NICs; `topo_file` is '' where no file is there to read, and
    `topo_seen` its (mtime, size), so a cache is worked out again when it changes."""

    ib_hca: str = ""
    pxn: bool = True
    p2p_pxn_level: int = 2
    topo_file: str = ""
    topo_seen: Optional[tuple[float, int]] = None


def settings(nccl_conf: str = NCCL_CONF, topo_file: str = "") -> Settings:
    """The settings from `nccl_conf`; `topo_file` (the collector's option, where jobs set NCCL_TOPO_FILE themselves)
    wins over the conf's, which wins over NCCL's default path."""
    ib_hca, pxn_disable, pxn_level, conf_topo = topology.nccl_conf_values(nccl_conf, SETTINGS)
    path = topo_file or conf_topo or topology.NCCL_TOPO_DEFAULT
    try:
        status = os.stat(path)
        seen: Optional[tuple[float, int]] = (status.st_mtime, status.st_size)
    except OSError:
        path, seen = "", None
    return Settings(ib_hca, nccl_int(pxn_disable, 0) != 1, nccl_int(pxn_level, 2), path, seen)


def bridged_pairs(procfs: str, session: NvmlSession, sysfs: str = "/sys") -> Optional[list[frozenset[str]]]:
    """The GPUs NVLink joins as NVML shows them (topology.nvlink_pairs: bridged pairs, and the GPUs on NVSwitches
    the nvidia-nvswitch driver does not list, a VM's); none asked where that driver's NVSwitches join every GPU
    anyway, or with fewer than two GPUs. None where NVML does not open (the caller may ask again later)."""
    try:
        gpus = os.listdir(os.path.join(procfs, "driver", "nvidia", "gpus"))
    except OSError:
        gpus = []
    if topology.nvswitch_groups(procfs) or len(gpus) < 2:
        return []
    try:
        return topology.nvlink_pairs(session, sysfs)
    finally:
        session.close()


def chosen(
    sysfs: str, procfs: str, ports: list[topology.Port], conf: Settings, bridged: list[frozenset[str]],
    rails: bool = False,
) -> list[topology.Local]:  # fmt: skip
    """The ports NCCL leaves by for each GPU (topology.nccl_local) under `conf`, with the NVSwitch group and the
    `bridged` pairs as the GPUs NVLink joins; with `rails`, the rail ports too."""
    return topology.nccl_local(sysfs, procfs, ports, conf.ib_hca, nvlink_groups(procfs, bridged), conf.pxn,
                               conf.p2p_pxn_level, rails, conf.topo_file)  # fmt: skip


def nvlink_groups(procfs: str, bridged: list[frozenset[str]]) -> list[frozenset[str]]:
    """The groups of GPU functions NVLink joins: the NVSwitch group, and each bridged pair."""
    return topology.nvswitch_groups(procfs) + list(bridged)


def node_choice(
    sysfs: str, procfs: str, conf: Settings, nvml: object = None, rails: bool = False,
) -> list[topology.Local]:  # fmt: skip
    """`chosen` once, for a command (the drill, the ACS root pass): over the ports ACTIVE now, with the bridged pairs
    asked of an NVML session of its own (`nvml`: a binding other than pynvml, for tests)."""
    bridged = bridged_pairs(procfs, NvmlSession("NVLink bridges are not known (PXN)", nvml), sysfs) or []
    return chosen(sysfs, procfs, topology.active_ports(sysfs), conf, bridged, rails)
