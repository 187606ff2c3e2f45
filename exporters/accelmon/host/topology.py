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
Which NIC NCCL uses for a GPU is another question, answered by `nccl_local` as NCCL v2.28.7-1 answers it (each
fact below cites the file and function at that tag):
- The devices: every ACTIVE port of an InfiniBand or Ethernet (RoCE) link layer, filtered by NCCL_IB_HCA
  (src/transport/net_ib.cc, `ncclIbInitDevices`: a port whose state is not IBV_PORT_ACTIVE is skipped; the list is
  read by src/misc/utils.cc `parseStringList`/`matchIfList`: prefixes, `=` exact names, `^` excludes, `:port`).
- A card's ports and its virtual functions are one device: each port's PCI path has its function, and (with
  NCCL_IB_MERGE_VFS, on by default) its device number, zeroed (net_ib.cc `ncclIbGetPciPath`), and ports on one PCI
  device are merged into one virtual NIC whose speed is the sum of theirs (src/graph/topo.cc `ncclTopoAutoMerge` at
  NCCL_NET_MERGE_LEVEL's default PORT; net_ib.cc `ncclIbMakeVDeviceInternal`), unless their link layers differ.
  A port's speed is its active speed times width (`ncclIbInitDevices`), what sysfs prints as `rate`.
- The path: NCCL's PCI nodes are a device and each PCIe switch's upstream port, two sysfs levels up each time, and
  a root complex's CPU is its NUMA node (src/graph/xml.cc `ncclTopoGetXmlFromSys`): a path through one switch is
  PIX, through several PXB, through the CPU PHB (nvidia-smi's NODE is PHB to NCCL: one CPU node per NUMA node),
  across CPUs SYS (src/graph/paths.cc `ncclTopoSetPaths`).
- Its bandwidth is the least of its links' (`ncclTopoSetPaths`): a PCI link's is width x per-lane rate / 80 GB/s,
  from the lower of `max_link_speed` and the narrower of `max_link_width` of the function and its parent port
  (`ncclTopoGetXmlFromSys`; topo.cc `ncclTopoAddPci`, `kvDictPciGen`); the CPUs' interconnect's by CPU model
  (topo.cc `ncclTopoGetInterCpuBw`); the NIC's own, its speed in Mb/s / 8000 (topo.cc `ncclTopoAddNet`).
- PXN: a GPU reaches a device through the NVLink peer GPU that uses it, where that peer is PIX or PXB from it and
  has more bandwidth to it than the GPU's own path, or the GPU's own path crosses a CPU (paths.cc
  `ncclTopoComputePaths`, NCCL_PXN_DISABLE); NVLink joins every GPU where NVSwitches are listed (`nvswitch_groups`),
  and the two GPUs of a link without a switch between them, a bridge (`nvlink_pairs`, from NVML).
- For a GPU, NCCL keeps the devices of the highest path bandwidth and, among them, of the nearest path type (PIX,
  PXB, PXN, PHB, SYS; topo.cc `ncclTopoGetLocal`): a 400G HCA behind two switches beats a 200G port behind one, a
  far socket's compute HCA beats a 25G NIC on the GPU's own; and of those, the ones its channels pick from its
  mirrored index (topo.cc `ncclTopoGetLocalNet`): two GPUs sharing two HCAs take one each.
- Point-to-point sends to a GPU of another node leave by the device of that GPU's rail, through the local GPU that
  uses it (search.cc `ncclTopoGetNetDev`, NCCL_P2P_PXN_LEVEL=2): `rail` ports.
- A Broadcom PEX switch's two levels are one (topo.cc `ncclTopoFlattenBcmSwitches`), from the functions' ids.
Left out: C2C (Grace) and NCCL_NETDEVS_POLICY other than AUTO. NCCL_TOPO_FILE is read as NCCL reads it
(`topo_file_places`).

A PCIe switch shows in sysfs as its upstream port with one bridge function a downstream port below it
(`.../0000:01:00.0/0000:02:08.0/0000:05:00.0`): two endpoints whose paths part below a common upstream port, each one
downstream port and the endpoint further, share one switch (PIX); deeper, they cross several (PXB).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Optional
from xml.etree import ElementTree

from accelmon.host.gpu_holders import read as _read
from accelmon.host.nvidia import NvmlSession, driver_gpu_entries, text
from accelmon.host.topology_files import ib_hca_filter, read_regular
from accelmon.host.topology_files import nccl_conf_value as nccl_conf_value  # callers read it here
from accelmon.host.topology_files import nccl_conf_values as nccl_conf_values

log = logging.getLogger("accelmon.topology")
LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first
PCI_ID_FILES = ("vendor", "device", "subsystem_vendor", "subsystem_device")
ROOT_COMPLEX = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")


@dataclass(frozen=True)
class Place:
    """A PCI function's place: its root complex (`pci0000:00`), the functions from its root port down to it, and
    its NUMA node (-1 where the platform does not say)."""

    root: str
    chain: tuple[str, ...]
    numa: int
    path: str = ""  # its directory under <sysfs>/devices
    links: tuple[float, ...] = ()  # from a topology file: GB/s of each chain element's link up (each an NCCL node)


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
    # A root complex's directory (pci0000:00) sits under devices/ on bare metal, under a VMBus device's GUID on
    # Hyper-V (devices/LNXSYSTM:00/.../VMBUS:00/<guid>/pci0001:00: one PCI domain per passed-through device).
    roots = [i for i, part in enumerate(parts) if ROOT_COMPLEX.fullmatch(part)]
    if not roots:
        return None
    start = roots[-1]
    return Place(parts[start], tuple(parts[start + 1 :]), numa_of(link), os.sep.join(parts))


def numa_of(path: str) -> int:
    return _int(_read(os.path.join(path, "numa_node")) or "-1")


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


MAX_DEVS_PER_NIC = 4  # nccl_net.h NCCL_NET_MAX_DEVS_PER_NIC (topo.cc ncclTopoAutoMerge stops a NIC there)
LOC_BW = 5000.0  # GB/s: NCCL's "no limit", its inter-CPU bandwidth for a CPU it does not know (graph/topo.h)


@dataclass(frozen=True)
class Port:
    """An RDMA port as NCCL would see it: ACTIVE (or, for the collector, seen ACTIVE before), at `gbps`."""

    device: str
    port: str
    link_layer: str  # InfiniBand or Ethernet
    gbps: float


@dataclass(frozen=True)
class Local:
    """A port of a device NCCL uses for a GPU by default, and NCCL's path type to it (one of PATH_ORDER)."""

    gpu: str
    uuid: str
    device: str
    port: str
    path: str
    rail: bool = False  # only point-to-point sends to another GPU's rail leave by it (through that GPU, PXN)
    bandwidth: float = 0.0  # GB/s NCCL rates the path at, the NIC's own speed left out (nccl_path; PXN: the peer's)


@dataclass
class _Net:
    """One device as NCCL counts it: the ports merged into one virtual NIC, at their PCI function 0."""

    place: Place
    link_layer: str
    ports: list[Port]

    @property
    def bandwidth(self) -> float:
        """GB/s: the sum of its ports' Mb/s over 8000 (topo.cc `ncclTopoAddNet`)."""
        return sum(port.gbps * 1000 for port in self.ports) / 8000.0


NCCL_TOPO_DEFAULT = "/var/run/nvidia-topologyd/virtualTopology.xml"  # read when NCCL_TOPO_FILE is unset (topo.cc)
TOPO_FILE_LIMIT = 1 << 20  # bytes: a topology file is a few KiB; more is not read
TOPO_FILE_NODES = 256  # elements NCCL's parser takes (topo.h NCCL_TOPO_XML_MAX_NODES); more, it fails


def topo_file_places(path: str) -> dict[str, Place]:
    return read_topo_file(path) or {}  # none where it is absent or refused


def read_topo_file(path: str) -> Optional[dict[str, Place]]:
    """The PCI functions an NCCL topology file (NCCL_TOPO_FILE: `<system><cpu numaid=N><pci busid=...
    link_speed=... link_width=...>` nested as the switches are) places, by lower-case bus id: NCCL takes a device
    found there with the file's parents and links instead of sysfs's (xml.cc `ncclTopoGetXmlFromSys` climbs sysfs
    only for a node without a parent; topo.cc `ncclTopoGetSystem`). {} where no file is there; None (and logged)
    where one is there but unreadable, oversized or malformed, as NCCL would fail on it."""
    if not path:
        return {}
    try:
        data = read_regular(path, TOPO_FILE_LIMIT)
        if len(data) > TOPO_FILE_LIMIT:
            raise ValueError(f"over {TOPO_FILE_LIMIT} bytes")
        # NCCL's parser (xml.cc `xmlGetNode`) knows no declaration or entity: a DOCTYPE fails there. Refused before
        # parsing, so no entity is expanded (a billion laughs; expat limits amplification only from 2.4).
        if re.search(rb"<![^-]", data):
            raise ValueError("a declaration or entity, which NCCL's parser does not read")
        system = ElementTree.fromstring(data)
        # NCCL's parser stops at NCCL_TOPO_XML_MAX_NODES elements (topo.h, xml.cc `xmlLoadSub`), which also bounds
        # the nesting walked below (Python's recursion limit is 1000).
        if sum(1 for _ in system.iter()) > TOPO_FILE_NODES:
            raise ValueError(f"over {TOPO_FILE_NODES} elements")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, ElementTree.ParseError) as error:
        log.warning("NCCL topology file %s not read: %s", path, error)
        return None
    places: dict[str, Place] = {}

    def walk(node: ElementTree.Element, numa: int, chain: tuple[str, ...], links: tuple[float, ...]) -> None:
        for child in node.findall("pci"):
            busid = (child.get("busid") or "").lower()
            if busid.count(":") != 2:
                continue
            bandwidth = link_bandwidth(child.get("link_speed") or "", _int(child.get("link_width") or "0"))
            places[busid] = Place(f"topo:cpu{numa}", (*chain, busid), numa, "", (*links, bandwidth))
            walk(child, numa, (*chain, busid), (*links, bandwidth))

    for cpu in system.iter("cpu"):
        walk(cpu, _int(cpu.get("numaid") or "-1"), (), ())
    return places


def inter_cpu_bandwidth(procfs: str) -> float:
    """GB/s of the CPUs' interconnect as NCCL rates it (topo.cc `ncclTopoGetInterCpuBw` and the CPU model table in
    `ncclTopoAddCpu`; graph/topo.h's *_BW), from /proc/cpuinfo."""
    fields: dict[str, str] = {}
    try:
        with open(os.path.join(procfs, "cpuinfo"), encoding="utf-8", errors="replace") as stream:
            for line in stream:
                key, sep, value = line.partition(":")
                if not sep:
                    if fields:
                        break  # the first processor's block is enough
                    continue
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return LOC_BW
    vendor = fields.get("vendor_id", "")
    family, model = (_int(fields.get(key, "")) for key in ("cpu family", "model"))
    if vendor == "GenuineIntel":
        return 40.0 if family == 6 and model >= 0xCF else 22.0 if family == 6 and model >= 0x8F else (
            10.0 if family == 6 and model >= 0x55 else 6.0)  # fmt: skip
    if vendor == "AuthenticAMD":
        return 16.0
    if vendor in ("CentaurHauls", "  Shanghai  ", "Shanghai"):
        return 9.0 if family == 7 and model == 0x5B else 6.0
    if "CPU implementer" in fields:
        return 6.0  # ARM_BW
    if fields.get("cpu", "").startswith("POWER"):
        return 32.0  # P9_BW
    return LOC_BW


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        return -1


def _pci_bandwidth(directory: str) -> float:
    """GB/s of the PCIe link above the function at `directory`, as NCCL rates it: the text of the lower
    max_link_speed of the function and its parent port and the narrower max_link_width (a width NCCL cannot read
    counts 0, then 16; a speed it cannot read, Gen3's), width x per-lane rate / 80 (xml.cc `ncclTopoGetXmlFromSys`
    keeps the lower speed's own text, topo.cc `ncclTopoAddPci` rates it: `64.0 GT/s PCIe` is Gen6's, `64 GT/s`
    no entry's)."""
    parent = os.path.dirname(directory)
    speeds = []
    for where in (directory, parent):
        text = _read(os.path.join(where, "max_link_speed"))
        try:
            speeds.append((float(text.split()[0]), text))
        except (ValueError, IndexError):
            pass
    widths = [max(_int(_read(os.path.join(where, "max_link_width"))), 0) for where in (directory, parent)]
    return link_bandwidth(min(speeds)[1] if speeds else "", min(widths))


# topo.cc `kvDictPciGen`, matched as xml.h `kvConvertToInt` matches: the first entry the text starts with, in this
# order (100 Mb/s per lane); none: 60.
PCI_GEN_TEXT = (
    ("2.5 GT/s", 15), ("5 GT/s", 30), ("8 GT/s", 60), ("16 GT/s", 120), ("32 GT/s", 240), ("2.5 GT/s PCIe", 15),
    ("5.0 GT/s PCIe", 30), ("8.0 GT/s PCIe", 60), ("16.0 GT/s PCIe", 120), ("32.0 GT/s PCIe", 240),
    ("64.0 GT/s PCIe", 480),
)  # fmt: skip


def link_bandwidth(speed: str, width: int) -> float:
    """GB/s of a PCI link as NCCL rates its `link_speed` text and `link_width` (0 or unreadable: 16; topo.cc
    `ncclTopoAddPci`): width x per-lane rate / 80."""
    lane = next((rate for text, rate in PCI_GEN_TEXT if speed.startswith(text)), 60)
    return (width if width > 0 else 16) * lane / 80.0


def _nccl_nodes(place: Place) -> list[tuple[int, float]]:
    """NCCL's PCI nodes from a function up to its CPU, each as (its index in the chain, the bandwidth of its link
    up): the function, then every second level above it (a switch's upstream port; xml.cc
    `ncclTopoGetXmlFromSys` climbs two directories a step)."""
    if place.links:  # from a topology file: every <pci> element is a node of NCCL's
        return [(index, place.links[index]) for index in range(len(place.chain) - 1, -1, -1)]
    nodes, directories = [], []
    index = len(place.chain) - 1
    directory = place.path
    while index >= 0:
        nodes.append((index, _pci_bandwidth(directory)))
        directories.append(directory)
        index -= 2
        directory = os.path.dirname(os.path.dirname(directory))
    # A Broadcom PEX switch shows as two levels and NCCL makes one of them (topo.cc `ncclTopoFlattenBcmSwitches`):
    # a switch below one of the same generation is merged into it, its devices linked to the upper one.
    for k in range(len(nodes) - 2, 0, -1):
        gen = _bcm_generation(directories[k + 1], 0)
        if gen and _bcm_generation(directories[k], 1) == gen:
            del nodes[k], directories[k]
    return nodes


def _bcm_generation(directory: str, level: int) -> int:
    """topo.cc `getBcmGen` over the function's vendor, device, subsystem vendor and device (NCCL's 64-bit id): 4 for
    a PEX88000 (1000:c010, 1000:a0xx), 5 for a PEX89000 at `level` (1000:c030, 1000:0xxx at 0, 1xxx at 1), else 0."""
    parts = [_int(_read(os.path.join(directory, name)) or "") for name in PCI_ID_FILES]
    if min(parts) < 0:
        return 0
    ident = (parts[0] << 48) | (parts[1] << 32) | (parts[2] << 16) | parts[3]
    if ident & ~0xFFF == 0x1000C0101000A000:
        return 4
    return 5 if ident & ~0xFFF == 0x1000C03010000000 | level * 0x1000 else 0


def nccl_path(gpu: Place, nic: Place, inter_cpu: float = LOC_BW) -> tuple[str, float]:
    """NCCL's path type and bandwidth (GB/s, the least of its PCI links and the CPUs' interconnect; the NIC's own
    speed left out) between two functions (paths.cc `ncclTopoSetPaths`)."""
    mine, theirs = _nccl_nodes(gpu), _nccl_nodes(nic)
    if gpu.root == nic.root:
        for up, (index, _) in enumerate(mine[1:], start=1):
            key = gpu.chain[: index + 1]
            down = next((n for n, (i, _) in enumerate(theirs) if nic.chain[: i + 1] == key), 0)
            if down > 0:  # a common switch (NCCL's PCI node): each side's links below it
                links = [bw for _, bw in mine[:up]] + [bw for _, bw in theirs[:down]]
                return ("PIX" if up == 1 and down == 1 else "PXB"), min(links)
    links = [bw for _, bw in mine] + [bw for _, bw in theirs]
    if gpu.numa == nic.numa:
        return "PHB", min(links)
    return "SYS", min([*links, inter_cpu])


def active_ports(sysfs: str) -> list[Port]:
    """The ACTIVE ports of the node's RDMA devices, from `class/infiniband/<device>/ports/<n>/{state,rate,
    link_layer}` (the collector keeps, beyond these, the ports it saw ACTIVE before)."""
    root = os.path.join(sysfs, "class", "infiniband")
    found = []
    for device in sorted(nics(sysfs)):
        ports = os.path.join(root, device, "ports")
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
            folder = os.path.join(ports, port)
            state, rate = _read(os.path.join(folder, "state")), _read(os.path.join(folder, "rate")).split()
            if state.partition(":")[0].strip() == "4" and rate and port.isdigit():
                try:
                    gbps = float(rate[0])
                except ValueError:
                    continue
                found.append(Port(device, port, _read(os.path.join(folder, "link_layer")), gbps))
    return found


def _nets(sysfs: str, ports: list[Port], ib_hca: str) -> list[_Net]:
    """The devices NCCL makes of `ports`: filtered by NCCL_IB_HCA, merged per PCI device and link layer, each at
    its PCI function 0 (net_ib.cc `ncclIbGetPciPath`: the function and, NCCL_IB_MERGE_VFS, the device zeroed)."""
    allowed = ib_hca_filter(ib_hca)
    functions = nics(sysfs)
    nets: dict[tuple[str, str, int], _Net] = {}
    for port in ports:
        function = functions.get(port.device)
        if function is None or not allowed(port.device, port.port) or port.link_layer not in ("InfiniBand", "Ethernet"):
            continue
        own = place(sysfs, function)
        if own is None:
            continue
        first = place(sysfs, f"{function[:-4]}00.0")  # 0000:17:01.3 -> 0000:17:00.0, beside it
        where = first if first is not None and first.chain[:-1] == own.chain[:-1] else own
        group = 0  # NCCL merges at most NCCL_NET_MAX_DEVS_PER_NIC (4) devices; the next start a NIC of their own
        while len(nets.get((where.path, port.link_layer, group), _Net(where, "", [])).ports) >= MAX_DEVS_PER_NIC:
            group += 1
        nets.setdefault((where.path, port.link_layer, group), _Net(where, port.link_layer, [])).ports.append(port)
    return list(nets.values())


NVSWITCH_DEVICES = ("driver", "nvidia-nvswitch", "devices")
MAXCHANNELS = 64  # src/include/device.h
PXN_SOURCES = ("PIX", "PXB")  # a peer GPU relays for a NIC at most PXB away (paths.cc: pxnType, P2C only on C2C)
PATH_ORDER = ("PIX", "PXB", "PXN", "PHB", "SYS")  # NCCL's types between a GPU and a NIC, nearest first (topo.h)


def nvswitch_groups(procfs: str) -> list[frozenset[str]]:
    """The GPUs NVLink joins, as one group of every GPU the driver lists where the nvidia-nvswitch driver lists an
    NVSwitch (`<procfs>/driver/nvidia-nvswitch/devices/<function>`, made per switch by open-gpu-kernel-modules'
    procfs_nvswitch.c `nvswitch_procfs_device_add`): through the switches each GPU is one NVLink hop from every
    other (NCCL's PATH_NVL, paths.cc). None listed (no switch, or its driver not loaded): no group."""
    if not _listdir(os.path.join(procfs, *NVSWITCH_DEVICES)):
        return []
    return [frozenset(bus.lower() for bus, _, _ in driver_gpu_entries(procfs))]


def nvlink_pairs(session: NvmlSession, sysfs: str = "/sys") -> Optional[list[frozenset[str]]]:
    """The GPUs NVLink joins as NCCL reads NVML (xml.cc `ncclTopoGetXmlFromGpu`: each link up, its far end by bus
    id; topo.cc `ncclTopoAddNvLinks`: one hop, PATH_NVL, from which PXN relays), as groups of PCI functions: each
    pair a link joins straight (a bridge), and every GPU with a link to an NVSwitch the nvidia-nvswitch driver does
    not list (`nvswitch_groups`; a VM's, whose host runs the switches). None where NVML does not open."""
    gpus = session.gpus()
    if gpus is None:
        return None
    nvml, listed, ends = session.nvml, set(), set()
    for index, handle, _ in gpus:
        if handle is None:  # a GPU that does not answer (yet)
            continue
        try:  # a link past the GPU's last answers InvalidArgument, a GPU without NVLink NotSupported: done with it
            mine = _nvml_bus(nvml.nvmlDeviceGetPciInfo(handle).busId)
            listed.add(mine)
            for link in range(nvml.NVML_NVLINK_MAX_LINKS):
                if nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED:
                    ends.add((mine, _nvml_bus(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)))
        except (nvml.NVMLError, ValueError) as error:  # as said above, or a bus id that is none
            log.debug("GPU %d's NVLink links: %s", index, error)
    switched = frozenset(mine for mine, far in ends if far not in listed and _nvswitch(sysfs, far))
    groups = {frozenset(end) for end in ends if end[1] in listed and end[0] != end[1]}
    return sorted(groups | ({switched} if len(switched) > 1 else set()), key=sorted)


def _nvswitch(sysfs: str, bus: str) -> bool:
    """Whether NCCL takes an NVLink's far end at `bus` for an NVSwitch (xml.cc `ncclTopoGetXmlFromGpu`): a function
    sysfs does not show ("not visible inside this VM. Assume NVSwitch") or of class 0x068000 (topo.cc
    `kvDictPciClass`); a GPU NVML does not list (another container's) is none."""
    function = os.path.join(sysfs, "bus", "pci", "devices", bus)
    return not os.path.exists(function) or _read(os.path.join(function, "class")).startswith("0x068000")


def _nvml_bus(bus_id: object) -> str:
    """NVML's bus id (00000000:18:00.0) as sysfs and the driver's procfs name the function (0000:18:00.0)."""
    domain, _, rest = text(bus_id).lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _natural(name: str) -> tuple[str, int]:
    """mlx5_2 before mlx5_10: the order ibv_get_device_list gives on the usual naming (NCCL's device numbers)."""
    stem = name.rstrip("0123456789")
    return stem, int(name[len(stem) :] or -1)


def _mirror(value: int, pow2: int) -> int:
    """topo.h `mirrorBits`: the bits of `value` reversed over log2(pow2) bits."""
    mirror, bit, mirrored = 0, 1, pow2 >> 1
    while bit < pow2:
        if value & bit:
            mirror |= mirrored
        bit, mirrored = bit << 1, mirrored >> 1
    return mirror


@dataclass(frozen=True)
class Choice:
    """Per GPU (NVML index order), the nets NCCL leaves by: `own` for its collectives and point-to-point by default
    (topo.cc `ncclTopoGetLocalNet` over every channel), `rails` the others its point-to-point sends may leave by
    through the NVLink peer beside them (search.cc `ncclTopoGetNetDev`, NCCL_P2P_PXN_LEVEL=2); each with its path."""

    own: dict[int, list[tuple[int, str]]]
    rails: dict[int, list[tuple[int, str]]]
    links: list[list[float]]  # [gpu][net]: GB/s of the path without the NIC's own speed (nccl_path; PXN, the peer's)


def nccl_choice(
    gpus: list[Place], nets: list[tuple[Place, float]], inter_cpu: float, nvlink: list[frozenset[str]],
    pxn: bool = True, p2p_pxn_level: int = 2, devs: Optional[list[int]] = None,
) -> Choice:  # fmt: skip
    """NCCL's choice for GPUs at `gpus` (their index is NVML's) among `nets` (each its place and GB/s), in its steps:
    the direct paths (`ncclTopoSetPaths`); PXN (paths.cc `ncclTopoComputePaths`): GPU g reaches net n through the
    GPU p that uses n (`ncclTopoGetLocalGpu`) where p is NVLink-joined to g, p's path to n is PIX or PXB, and p has
    more bandwidth to n or g's own path crosses a CPU (PHB, SYS); the path is then PXN, at p's bandwidth (NVLink's,
    12 or more links of 20 GB/s and up, is never the narrower); the local nets by bandwidth, then type
    (`ncclTopoGetLocal`); of those, one per channel from the GPU's mirrored index, netsPerGpu of them
    (`ncclTopoGetLocalNet`, NCCL_NETDEVS_POLICY AUTO)."""

    def joined(a: int, b: int) -> bool:
        return any(gpus[a].path.rsplit(os.sep, 1)[-1] in group and gpus[b].path.rsplit(os.sep, 1)[-1] in group
                   for group in nvlink)  # fmt: skip

    paths: list[list[tuple[float, str]]] = []
    links: list[list[float]] = []
    for gpu in gpus:
        found = [nccl_path(gpu, where, inter_cpu) for where, _ in nets]
        links.append([bw for _, bw in found])
        paths.append([(min(bw, speed), kind) for (kind, bw), (_, speed) in zip(found, nets)])
    direct = [list(row) for row in paths]

    def local(rows: list[list[tuple[float, str]]], of: list[int], column: Optional[int] = None) -> list[int]:
        """ncclTopoGetLocal: the highest bandwidth, then the nearest type (over a GPU's row, or a net's column)."""
        entries = [rows[of[0]][i] for i in range(len(nets))] if column is None else [rows[g][column] for g in of]
        best = max(bw for bw, _ in entries)
        nearest = min(PATH_ORDER.index(kind) for bw, kind in entries if bw == best)
        return [i for i, (bw, kind) in enumerate(entries) if bw == best and PATH_ORDER.index(kind) == nearest]

    every = list(range(len(gpus)))
    net_gpus = [local(direct, every, n) for n in range(len(nets))]  # net-to-GPU paths: PXN never changes them

    def local_net(rows: list[list[tuple[float, str]]], g: int, channel: int) -> int:
        mine = local(rows, [g])
        per_gpu = -(-len(mine) // len(net_gpus[mine[0]]))
        dev = devs[g] if devs else g  # topo.cc `gpu.dev`: the GPU's CUDA (NVML) index, not its place in `gpus`
        start = _mirror(dev, len(mine)) if len(mine) & (len(mine) - 1) == 0 else dev
        return mine[(start + channel % per_gpu) % len(mine)]

    def user(n: int) -> int:
        """ncclTopoGetLocalGpu: the first of the net's local GPUs, channel by channel, that leaves by it."""
        return next((g for c in range(MAXCHANNELS) for g in net_gpus[n] if local_net(direct, g, c) == n), -1)

    users = [user(n) for n in range(len(nets))]
    for n, peer in enumerate(users):
        for g in every:
            if pxn and peer not in (g, -1) and joined(g, peer) and direct[peer][n][1] in PXN_SOURCES and (
                    direct[peer][n][0] > direct[g][n][0] or direct[g][n][1] in ("PHB", "SYS")):  # fmt: skip
                paths[g][n], links[g][n] = (direct[peer][n][0], "PXN"), links[peer][n]
    own: dict[int, list[tuple[int, str]]] = {}
    rails: dict[int, list[tuple[int, str]]] = {}
    for g in every:
        chosen = sorted({local_net(paths, g, c) for c in range(MAXCHANNELS)})
        own[g] = [(n, paths[g][n][1]) for n in chosen]
        rail, kinds = set(), {}
        if pxn and p2p_pxn_level in (1, 2):  # a send to GPU d of another node goes by d's rail: the net our d uses
            for d in every:
                for n in {local_net(paths, d, c) for c in range(MAXCHANNELS)} - set(chosen):
                    peer = users[n]
                    if p2p_pxn_level == 1:  # "use PXN if needed": where our own path to it is PXN or nearer
                        if PATH_ORDER.index(paths[g][n][1]) <= PATH_ORDER.index("PXN"):
                            rail.add(n)
                            kinds[n] = paths[g][n][1]
                    elif peer != -1 and (peer == g or joined(g, peer)) and direct[peer][n][1] in PXN_SOURCES:
                        rail.add(n)
        rails[g] = [(n, kinds.get(n) or ("PXN" if users[n] != g else direct[g][n][1])) for n in sorted(rail)]
    return Choice(own, rails, links)


def nccl_local(
    sysfs: str, procfs: str, ports: list[Port], ib_hca: str = "", nvlink: Optional[list[frozenset[str]]] = None,
    pxn: bool = True, p2p_pxn_level: int = 2, rails: bool = False, topo_file: str = "",
) -> list[Local]:  # fmt: skip
    """For each GPU the driver lists, the ports NCCL leaves by (`nccl_choice`); with `rails`, also those only its
    point-to-point sends to another GPU's rail use (`rail` set). `nvlink`: the groups of GPU functions NVLink joins
    (default: the NVSwitch group, `nvswitch_groups`; a bridged pair's from NVML, `nvlink_pairs`, the caller's).
    `topo_file`: an NCCL topology file, whose places win."""
    nets = sorted(_nets(sysfs, ports, ib_hca), key=lambda net: min(_natural(p.device) for p in net.ports))
    given = topo_file_places(topo_file)
    for net in nets:
        net.place = given.get(os.path.basename(net.place.path), net.place)
    gpus = [(gpu, given.get(bus.lower()) or place(sysfs, bus)) for bus, gpu, _ in driver_gpu_entries(procfs)]
    known = [(gpu, where) for gpu, where in gpus if where is not None]
    if not nets or not known:
        return []
    groups = nvswitch_groups(procfs) if nvlink is None else nvlink
    devs = [int(gpu.index) for gpu, _ in known]
    choice = nccl_choice([where for _, where in known], [(net.place, net.bandwidth) for net in nets],
                         inter_cpu_bandwidth(procfs), groups, pxn, p2p_pxn_level, devs)  # fmt: skip
    out: list[Local] = []
    for g, (gpu, _) in enumerate(known):
        for rail, picked in ((False, choice.own[g]), (True, choice.rails[g] if rails else [])):
            for n, kind in picked:
                out.extend(Local(gpu.index, gpu.uuid, p.device, p.port, kind, rail, choice.links[g][n])
                           for p in nets[n].ports)  # fmt: skip
    return out
