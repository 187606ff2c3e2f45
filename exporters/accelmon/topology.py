"""Which path joins each GPU to each RDMA NIC of the node, named as `nvidia-smi topo -m` names it, read from sysfs:
the PCI hierarchy under `devices/`, each function's `numa_node`, the GPUs the NVIDIA driver lists in procfs and the
NICs in `class/infiniband` (InfiniBand and RoCE alike). The collectors share it (docs/jobs.md, "Which NIC a GPU's
traffic leaves by").

`nvidia-smi topo -m`'s legend, as this module decides it from the two devices' sysfs paths:
- PIX: at most one PCIe switch between them (both below the same switch's downstream ports);
- PXB: several PCIe switches, not through the host bridge (a common switch above two leaf switches);
- PHB: through the PCIe host bridge (the same root complex, `pci0000:00`, different root ports);
- NODE: across the host bridges of one NUMA node (another root complex, the same `numa_node`);
- SYS: across NUMA nodes (the CPUs' interconnect: QPI/UPI, Infinity Fabric).
NCCL takes by default, for a GPU, the NICs of the highest bandwidth and, among those, the closest of these
(`ncclTopoGetLocal`, src/graph/topo.cc:1548-1573 at v2.28.7-1): with NICs of one speed, `nearest`. A job that sets
NCCL_IB_HCA chooses otherwise.

A PCIe switch shows in sysfs as its upstream port with one bridge function a downstream port below it
(`.../0000:01:00.0/0000:02:08.0/0000:05:00.0`): two endpoints whose paths part below a common upstream port, each one
downstream port and the endpoint further, share one switch (PIX); deeper, they cross several (PXB).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from accelmon.nvidia import driver_gpu_entries

LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first


@dataclass(frozen=True)
class Place:
    """A PCI function's place: its root complex (`pci0000:00`), the functions from its root port down to it, and
    its NUMA node (-1 where the platform does not say)."""

    root: str
    chain: tuple[str, ...]
    numa: int


@dataclass(frozen=True)
class Pair:
    gpu: str  # NVML's index: the GPU's place in PCI bus order
    uuid: str
    device: str  # the RDMA device's name (mlx5_0)
    link: str  # one of LINKS


def place(sysfs: str, function: str) -> Optional[Place]:
    """Where PCI function `function` (0000:18:00.0) sits, from `<sysfs>/bus/pci/devices/<function>`; None if absent."""
    link = os.path.join(sysfs, "bus", "pci", "devices", function.lower())
    if not os.path.exists(link):
        return None
    parts = os.path.realpath(link).split(os.sep)
    roots = [i for i, part in enumerate(parts) if part.startswith("pci") and i and parts[i - 1] == "devices"]
    if not roots:
        return None
    start = roots[-1]
    return Place(parts[start], tuple(parts[start + 1 :]), numa_of(link))


def numa_of(path: str) -> int:
    try:
        with open(os.path.join(path, "numa_node"), encoding="ascii") as stream:
            return int(stream.read().strip())
    except (OSError, ValueError):
        return -1


def link(a: Place, b: Place) -> str:
    """The path between two PCI functions, as nvidia-smi topo -m names it."""
    if a.root != b.root:
        return "NODE" if a.numa == b.numa else "SYS"
    shared = 0
    for mine, theirs in zip(a.chain, b.chain):
        if mine != theirs:
            break
        shared += 1
    if shared == 0:
        return "PHB"  # only the root complex in common: through the host bridge
    # Below the last function in common: a downstream port and the endpoint each, one switch; more, several.
    return "PIX" if max(len(a.chain), len(b.chain)) - shared <= 2 else "PXB"


def nics(sysfs: str) -> dict[str, str]:
    """The RDMA devices (class/infiniband: InfiniBand and RoCE) by name, with their PCI function."""
    root = os.path.join(sysfs, "class", "infiniband")
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return {}
    found = {}
    for name in names:
        function = os.path.basename(os.path.realpath(os.path.join(root, name, "device")))
        if function.count(":") == 2:
            found[name] = function
    return found


def gpu_nic_pairs(sysfs: str, procfs: str) -> list[Pair]:
    """Every GPU the driver lists with every RDMA NIC, and the path between them; a device whose place sysfs does
    not show is left out."""
    cards = {name: place(sysfs, function) for name, function in nics(sysfs).items()}
    pairs = []
    for bus, gpu, _ in driver_gpu_entries(procfs):
        mine = place(sysfs, bus)
        if mine is None:
            continue
        for name, theirs in cards.items():
            if theirs is not None:
                pairs.append(Pair(gpu.index, gpu.uuid, name, link(mine, theirs)))
    return pairs


def nearest(pairs: list[Pair]) -> list[Pair]:
    """For each GPU, the NICs of its closest link: those NCCL uses for it by default."""
    best: dict[str, int] = {}
    for pair in pairs:
        best[pair.gpu] = min(best.get(pair.gpu, len(LINKS)), LINKS.index(pair.link))
    return [pair for pair in pairs if LINKS.index(pair.link) == best[pair.gpu]]
