"""Fixture sysfs and procfs trees of real node layouts, for accelmon.host.topology: the PCI hierarchy under
`devices/pciDDDD:BB/...` with `bus/pci/devices/<function>` links and `numa_node` files, the RDMA devices in
`class/infiniband/<name>/device`, and the GPUs in the NVIDIA driver's procfs. Each layout's expected matrix is written
beside it, by the levels NVML defines (nvml.h, nvmlGpuTopologyLevel_t: SINGLE a single PCIe switch, MULTIPLE several
switches without the host bridge, HOSTBRIDGE the same host bridge, NODE one NUMA node across host bridges, SYSTEM the
rest), which nvidia-smi topo -m prints as PIX, PXB, PHB, NODE and SYS. No real host's `nvidia-smi topo -m` was read
beside these trees in this round (no GPU machine was lent).

Each RDMA device has its ports as the kernel shows them (`ports/N/{state,phys_state,rate,link_layer}`, ACTIVE at
400 Gb/s InfiniBand unless told) and, where a layout gives them, the PCIe links' `max_link_speed`/`max_link_width`
that NCCL rates paths by (accelmon.host.topology.nccl_local)."""

from __future__ import annotations

import struct
from pathlib import Path

from tests.support.jobs_tree import uuid

ACTIVE = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"}
DOWN = {"state": "1: DOWN", "phys_state": "2: Polling", "rate": "10 Gb/sec (4X SDR)", "link_layer": "InfiniBand"}
# Each port's error, congestion and data counters (`counters/<name>`), 0 unless a port's files say otherwise.
COUNTERS = (
    "symbol_error", "port_rcv_errors", "link_error_recovery", "link_downed", "port_xmit_wait", "port_xmit_discards",
    "port_rcv_discards", "excessive_buffer_overrun_errors", "port_rcv_data", "port_xmit_data",
)  # fmt: skip
GEN5, GEN4 = ("32.0 GT/s PCIe", 16), ("16.0 GT/s PCIe", 16)


def function(sysfs: Path, chain: list[str], numa: int, pcie: tuple[str, int] | None = None) -> str:
    """A PCI function at the end of `chain` (the root complex, then each function down to it); its name. With
    `pcie`, its max_link_speed and max_link_width (current_link_* the same), and those of each bridge above it that
    has none yet."""
    directory = sysfs / "devices" / Path(*chain)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "numa_node").write_text(f"{numa}\n")
    if pcie is not None:
        for depth in range(len(chain), 1, -1):
            level = sysfs / "devices" / Path(*chain[:depth])
            if depth == len(chain) or not (level / "max_link_speed").exists():
                for kind in ("max", "current"):  # trained at its best
                    (level / f"{kind}_link_speed").write_text(f"{pcie[0]}\n")
                    (level / f"{kind}_link_width").write_text(f"{pcie[1]}\n")
    name = chain[-1]
    link = sysfs / "bus" / "pci" / "devices" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(directory)
    return name


def gpu(sysfs: Path, procfs: Path, chain: list[str], numa: int, pcie: tuple[str, int] | None = None) -> None:
    """A GPU at the end of `chain`, listed by the driver (its UUID given once every GPU is known: number_gpus)."""
    name = function(sysfs, chain, numa, pcie)
    folder = procfs / "driver" / "nvidia" / "gpus" / name
    folder.mkdir(parents=True)
    (folder / "information").write_text(f"GPU UUID: \t -\nBus Location: \t {name}\n")


def nic(
    sysfs: Path, name: str, chain: list[str], numa: int, ports: dict[int, dict[str, str]] | None = None,
    pcie: tuple[str, int] | None = None, hca_type: str = "MT4129",
) -> None:  # fmt: skip
    """An RDMA device at the end of `chain` with its ports (each port's files over ACTIVE's), its identity files."""
    function(sysfs, chain, numa, pcie)
    device = sysfs / "class" / "infiniband" / name
    device.mkdir(parents=True)
    (device / "device").symlink_to(sysfs / "devices" / Path(*chain))
    for file, text in (("fw_ver", "28.39.1002"), ("board_id", "MT_0000000838"), ("hca_type", hca_type)):
        (device / file).write_text(text + "\n")
    for number, files in (ports or {1: {}}).items():
        folder = device / "ports" / str(number)
        (folder / "counters").mkdir(parents=True)
        for file, text in {**ACTIVE, **{f"counters/{name}": "0" for name in COUNTERS}, **files}.items():
            (folder / file).write_text(text + "\n")


def number_gpus(procfs: Path) -> None:
    """The UUIDs in bus order, as NVML numbers the GPUs (accelmon.host.nvidia.driver_gpu_entries)."""
    root = procfs / "driver" / "nvidia" / "gpus"
    for index, folder in enumerate(sorted(root.iterdir(), key=lambda p: p.name.lower())):
        text = (folder / "information").read_text().splitlines()
        (folder / "information").write_text("\n".join([f"GPU UUID: \t {uuid(index)}", *text[1:]]) + "\n")


# An 8-GPU HGX H100 board with 8 NICs (a DGX H100's compute NICs): two sockets, four PCIe root complexes each, every
# root complex a PCIe switch with one GPU and one NIC below it.
HGX_ROOTS = (0x15, 0x37, 0x48, 0x59, 0x97, 0xB8, 0xC9, 0xDA)


def hgx_h100(root: Path) -> tuple[Path, Path]:
    sysfs, procfs = root / "sys", root / "proc"
    for index, bus in enumerate(HGX_ROOTS):
        numa = 0 if index < 4 else 1
        upstream = [f"pci0000:{bus:02x}", f"0000:{bus:02x}:01.0", f"0000:{bus + 1:02x}:00.0"]
        gpu(sysfs, procfs, [*upstream, f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 3:02x}:00.0"], numa)
        nic(sysfs, f"mlx5_{index}", [*upstream, f"0000:{bus + 2:02x}:01.0", f"0000:{bus + 4:02x}:00.0"], numa)
    number_gpus(procfs)
    return sysfs, procfs


def hgx_expected(gpu_index: int, nic_index: int) -> str:
    if gpu_index == nic_index:
        return "PIX"
    return "NODE" if (gpu_index < 4) == (nic_index < 4) else "SYS"


# A PCIe server: two GPUs below a two-level switch tree on socket 0 (a common switch above two leaf switches), a third
# GPU on another root port of socket 0's root complex, and the one NIC on socket 1.
def pcie_server(root: Path) -> tuple[Path, Path]:
    sysfs, procfs = root / "sys", root / "proc"
    top = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]
    gpu(sysfs, procfs, [*top, "0000:02:00.0", "0000:03:00.0", "0000:04:00.0", "0000:05:00.0"], 0)
    gpu(sysfs, procfs, [*top, "0000:02:01.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"], 0)
    gpu(sysfs, procfs, ["pci0000:00", "0000:00:03.0", "0000:09:00.0"], 0)
    nic(sysfs, "mlx5_0", ["pci0000:80", "0000:80:01.0", "0000:81:00.0"], 1)
    # A RoCE NIC beside the first GPU's leaf switch: PIX to GPU 0, PXB to GPU 1 (through the common switch).
    nic(sysfs, "mlx5_1", [*top, "0000:02:00.0", "0000:03:00.0", "0000:04:01.0", "0000:0a:00.0"], 0)
    number_gpus(procfs)
    return sysfs, procfs


PCIE_EXPECTED = {
    ("0", "mlx5_0"): "SYS", ("1", "mlx5_0"): "SYS", ("2", "mlx5_0"): "SYS",
    ("0", "mlx5_1"): "PIX", ("1", "mlx5_1"): "PXB", ("2", "mlx5_1"): "PHB",
}  # fmt: skip


def cpuinfo(procfs: Path, vendor: str = "GenuineIntel", family: int = 6, model: int = 0x8F) -> None:
    """/proc/cpuinfo's first block (default: Sapphire Rapids, whose UPI NCCL rates at 22 GB/s)."""
    procfs.mkdir(parents=True, exist_ok=True)
    (procfs / "cpuinfo").write_text(
        f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n\n"
    )


ROCE_200G = {"rate": "200 Gb/sec (4X HDR)", "link_layer": "Ethernet"}


def two_nics_under_one_switch(root: Path) -> tuple[Path, Path]:
    """One GPU (H100, Gen5 x16) below a two-level switch tree: a 200G RoCE port (ConnectX-6, Gen4 x16) on the GPU's
    own leaf switch (PIX), a 400G InfiniBand HCA (ConnectX-7, Gen5 x16) on the other leaf (PXB). NCCL: 24 GB/s
    (the RoCE card's PCIe link) against 48 GB/s (the GPU's own): the 400G HCA."""
    sysfs, procfs = root / "sys", root / "proc"
    top = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]
    gpu(sysfs, procfs, [*top, "0000:02:00.0", "0000:03:00.0", "0000:04:00.0", "0000:05:00.0"], 0, GEN5)
    nic(sysfs, "mlx5_0", [*top, "0000:02:00.0", "0000:03:00.0", "0000:04:01.0", "0000:06:00.0"], 0,
        {1: ROCE_200G}, GEN4, "MT4123")  # fmt: skip
    nic(sysfs, "mlx5_1", [*top, "0000:02:01.0", "0000:07:00.0", "0000:08:00.0", "0000:09:00.0"], 0, None, GEN5)
    number_gpus(procfs)
    cpuinfo(procfs)
    return sysfs, procfs


def far_compute_hca(root: Path) -> tuple[Path, Path]:
    """One GPU on socket 0; a 25G front-end NIC (Ethernet, Gen4 x8) on another root complex of socket 0 (NODE to
    nvidia-smi, PHB to NCCL); the 400G compute HCA on socket 1 (SYS). NCCL: 3.1 GB/s against the UPI's 22: the HCA."""
    sysfs, procfs = root / "sys", root / "proc"
    gpu(sysfs, procfs, ["pci0000:00", "0000:00:01.0", "0000:01:00.0"], 0, GEN5)
    nic(sysfs, "mlx5_0", ["pci0000:20", "0000:20:01.0", "0000:21:00.0"], 0,
        {1: {"rate": "25 Gb/sec (1X EDR)", "link_layer": "Ethernet"}}, ("16.0 GT/s PCIe", 8), "MT4121")  # fmt: skip
    nic(sysfs, "mlx5_1", ["pci0000:80", "0000:80:01.0", "0000:81:00.0"], 1, None, GEN5)
    number_gpus(procfs)
    cpuinfo(procfs)
    return sysfs, procfs


def dual_port_card_with_vfs(root: Path, second: dict[str, str] | None = None) -> tuple[Path, Path]:
    """One GPU beside a dual-port ConnectX-7 behind its switch: port 1 (mlx5_0, function 0) ACTIVE, port 2
    (mlx5_1, function 1) uncabled unless `second` says, 4 virtual functions (mlx5_2..5, functions 2 to 5) DOWN."""
    sysfs, procfs = root / "sys", root / "proc"
    top = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]
    gpu(sysfs, procfs, [*top, "0000:02:00.0", "0000:03:00.0"], 0, GEN5)
    nic(sysfs, "mlx5_0", [*top, "0000:02:01.0", "0000:04:00.0"], 0, None, GEN5)
    nic(sysfs, "mlx5_1", [*top, "0000:02:01.0", "0000:04:00.1"], 0, {1: second or DOWN}, GEN5)
    for vf in range(4):
        nic(sysfs, f"mlx5_{2 + vf}", [*top, "0000:02:01.0", f"0000:04:00.{2 + vf}"], 0, {1: DOWN}, GEN5)
    number_gpus(procfs)
    cpuinfo(procfs)
    return sysfs, procfs


def healthy_idle_node(root: Path) -> tuple[Path, Path]:
    """A sound node at rest. GPU 0 beside a dual-port compute card shown as one device (mlx5_0: port 1 ACTIVE at
    400G, port 2 uncabled, its rate read as 10 Gb/s) with 4 virtual functions DOWN (mlx5_2..5); GPU 1, on another
    root port, with no NIC of its own beside a 200G storage HCA of the same model (mlx5_6). NCCL uses mlx5_0 port 1
    for both (48 GB/s against the storage HCA's 25)."""
    sysfs, procfs = root / "sys", root / "proc"
    left = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]
    gpu(sysfs, procfs, [*left, "0000:02:00.0", "0000:03:00.0"], 0, GEN5)
    nic(sysfs, "mlx5_0", [*left, "0000:02:01.0", "0000:04:00.0"], 0, {1: {}, 2: DOWN}, GEN5)
    for vf in range(4):
        nic(sysfs, f"mlx5_{2 + vf}", [*left, "0000:02:01.0", f"0000:04:00.{2 + vf}"], 0, {1: DOWN}, GEN5)
    right = ["pci0000:00", "0000:00:02.0", "0000:05:00.0"]
    gpu(sysfs, procfs, [*right, "0000:06:00.0", "0000:07:00.0"], 0, GEN5)
    nic(sysfs, "mlx5_6", [*right, "0000:06:01.0", "0000:08:00.0"], 0, {1: {"rate": "200 Gb/sec (4X HDR)"}}, GEN5)
    number_gpus(procfs)
    cpuinfo(procfs)
    return sysfs, procfs


def nvswitches(procfs: Path, functions: tuple[str, ...] = ("0000:05:00.0", "0000:06:00.0")) -> None:
    """The NVSwitches as the nvidia-nvswitch driver lists them (`driver/nvidia-nvswitch/devices/<function>/
    information`, open-gpu-kernel-modules procfs_nvswitch.c): every GPU of the node one NVLink hop from the others."""
    for name in functions:
        folder = procfs / "driver" / "nvidia-nvswitch" / "devices" / name
        folder.mkdir(parents=True)
        (folder / "information").write_text("BIOS Version: 96.10.6d.00.01\n")


def gpus_without_nics_on_one_socket(root: Path, switches: bool = True) -> tuple[Path, Path]:
    """Four GPUs (Gen5) joined by NVSwitches; on socket 0, GPU 0 and GPU 1 each with a 400G HCA behind its switch
    (PIX) and a third 400G HCA (mlx5_2) on a root complex of its own, no GPU near it; on socket 1, GPU 2 and GPU 3
    with no NIC at all (every NIC SYS, 22 GB/s on Sapphire Rapids)."""
    sysfs, procfs = root / "sys", root / "proc"
    for index, bus in enumerate((0x10, 0x20)):
        top = [f"pci0000:{bus:02x}", f"0000:{bus:02x}:01.0", f"0000:{bus + 1:02x}:00.0"]
        gpu(sysfs, procfs, [*top, f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 3:02x}:00.0"], 0, GEN5)
        nic(sysfs, f"mlx5_{index}", [*top, f"0000:{bus + 2:02x}:01.0", f"0000:{bus + 4:02x}:00.0"], 0, None, GEN5)
    nic(sysfs, "mlx5_2", ["pci0000:30", "0000:30:01.0", "0000:31:00.0"], 0, None, GEN5)
    for bus in (0x90, 0xA0):
        top = [f"pci0000:{bus:02x}", f"0000:{bus:02x}:01.0", f"0000:{bus + 1:02x}:00.0"]
        gpu(sysfs, procfs, [*top, f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 3:02x}:00.0"], 1, GEN5)
    number_gpus(procfs)
    cpuinfo(procfs)
    if switches:
        nvswitches(procfs)
    return sysfs, procfs


def bridged_pcie_pair(root: Path) -> tuple[Path, Path]:
    """Two PCIe GPUs (A100 PCIe, Gen4) in two switch complexes of socket 0, joined by NVLink bridges and no NVSwitch
    (the fake NVML's `nvlink_peer`: GPU 0 at bus 0x18, GPU 1 at 0x28); a 200G HCA beside GPU 0 under its switch.
    nvidia-smi topo -m: GPU0 mlx5_0 PIX, GPU1 mlx5_0 NODE (NCCL: PHB), GPU0 GPU1 NV12."""
    sysfs, procfs = root / "sys", root / "proc"
    for bus in (0x15, 0x25):
        top = [f"pci0000:{bus:02x}", f"0000:{bus:02x}:01.0", f"0000:{bus + 1:02x}:00.0"]
        gpu(sysfs, procfs, [*top, f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 3:02x}:00.0"], 0, GEN4)
    top = ["pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:01.0", "0000:19:00.0"]
    nic(sysfs, "mlx5_0", top, 0, {1: {"rate": "200 Gb/sec (4X HDR)"}}, GEN4)
    number_gpus(procfs)
    cpuinfo(procfs)
    return sysfs, procfs


def dgx_a100(root: Path) -> tuple[Path, Path]:
    """A DGX A100's compute side: four PCIe switch complexes, each on a NUMA node of its own (NPS4: GPUs 0-1 on node
    3, 2-3 on 1, 4-5 on 7, 6-7 on 5, as its nvidia-smi topo -m prints them, NVIDIA/DCGM#149), each a Broadcom PEX88000
    (1000:c010, subsystem 1000:a064) top switch above leaf switches of the same kind, with two GPUs (Gen4) and two
    200G HCAs (ConnectX-6, Gen4) each on a leaf of its own: every GPU PXB to both HCAs of its complex, SYS to the
    rest (nvidia-smi's GPU0 row: PXB PXB SYS ...); six NVSwitches. NCCL flattens the PEX switch's two levels (topo.cc
    ncclTopoFlattenBcmSwitches), so to it both HCAs are PIX, and gives each GPU one (ncclTopoGetLocalNet)."""
    sysfs, procfs = root / "sys", root / "proc"
    hdr = {1: {"rate": "200 Gb/sec (4X HDR)"}}
    pex = {"vendor": "0x1000", "device": "0xc010", "subsystem_vendor": "0x1000", "subsystem_device": "0xa064"}
    for complex_, (bus, numa) in enumerate(zip((0x07, 0x47, 0x87, 0xC7), (3, 1, 7, 5))):
        top = [f"pci0000:{bus - 7:02x}", f"0000:{bus - 7:02x}:01.0", f"0000:{bus:02x}:00.0"]
        for leaf in range(4):  # GPU, GPU, HCA, HCA: each below a downstream port of the top switch and a leaf switch
            below = [f"0000:{bus + 2 + 3 * leaf + step:02x}:00.0" for step in range(3)]  # up, down, the endpoint
            chain = [*top, f"0000:{bus + 1:02x}:{leaf:02x}.0", *below]
            if leaf < 2:
                gpu(sysfs, procfs, chain, numa, GEN4)
            else:
                nic(sysfs, f"mlx5_{2 * complex_ + leaf - 2}", chain, numa, hdr, GEN4, "MT4123")
            for upstream in (chain[:3], chain[:5]):  # the top switch's and the leaf's upstream ports
                for name, text in pex.items():
                    (sysfs / "devices" / Path(*upstream) / name).write_text(text + "\n")
    number_gpus(procfs)
    cpuinfo(procfs, "AuthenticAMD", 23, 0x31)
    nvswitches(procfs, tuple(f"0000:{bus:02x}:00.0" for bus in (0xC4, 0xC5, 0xC6, 0xC8, 0xC9, 0xCA)))
    return sysfs, procfs


# A DGX H100's RDMA devices in the order its mlx5 names run: the 8 compute HCAs (ConnectX-7, 400G InfiniBand) and the
# two ports each of two dual-port ConnectX-7 cards (storage and in-band, Ethernet here), 12 in all.
DGX_H100_COMPUTE = ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")
DGX_H100_STORAGE = (("mlx5_1", "mlx5_2"), ("mlx5_7", "mlx5_8"))


def dgx_h100(root: Path, switches: bool = True) -> tuple[Path, Path]:
    """A DGX H100: two sockets, a PCIe switch complex per GPU (a top switch above leaves), the GPU (Gen5) on one leaf
    and its compute HCA on another, so PXB; a dual-port 200G Ethernet card on a root complex of each socket (NODE
    or SYS to every GPU); four NVSwitches."""
    sysfs, procfs = root / "sys", root / "proc"
    for index, bus in enumerate((0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)):
        numa = 0 if index < 4 else 1
        top = [f"pci0000:{bus - 1:02x}", f"0000:{bus - 1:02x}:01.0", f"0000:{bus:02x}:00.0"]
        for leaf in range(2):
            chain = [
                *top,
                f"0000:{bus + 1:02x}:{leaf:02x}.0",
                *(f"0000:{bus + 2 + 3 * leaf + s:02x}:00.0" for s in range(3)),
            ]
            if leaf == 0:
                gpu(sysfs, procfs, chain, numa, GEN5)
            else:
                nic(sysfs, DGX_H100_COMPUTE[index], chain, numa, None, GEN5)
    ethernet = {1: {"rate": "200 Gb/sec (4X HDR)", "link_layer": "Ethernet"}}
    for numa, (bus, names) in enumerate(zip((0x0F, 0x8F), DGX_H100_STORAGE)):
        for function, name in enumerate(names):
            nic(sysfs, name, [f"pci0000:{bus - 1:02x}", f"0000:{bus - 1:02x}:01.0", f"0000:{bus:02x}:00.{function}"],
                numa, ethernet, GEN5)  # fmt: skip
    number_gpus(procfs)
    cpuinfo(procfs)
    if switches:
        nvswitches(procfs, tuple(f"0000:{bus:02x}:00.0" for bus in (0x05, 0x06, 0x07, 0x08)))
    return sysfs, procfs


def azure_nd_h100_v5(root: Path) -> tuple[Path, Path]:
    """An Azure ND H100 v5 VM (Hyper-V): 8 GPUs and 8 400G InfiniBand VFs passed through, each alone in a PCI domain
    of its own under a VMBus device (`devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00/<guid>/pciDDDD:00/
    DDDD:00:00.0`), the first four of each on NUMA node 0; nvidia-smi topo -m prints NODE and SYS for every pair."""
    sysfs, procfs = root / "sys", root / "proc"
    vmbus = ["LNXSYSTM:00", "LNXSYBUS:00", "ACPI0004:00", "VMBUS:00"]
    for index in range(8):
        numa = 0 if index < 4 else 1
        gpu_domain, nic_domain = f"{0x0001 + index:04x}", f"{0x0101 + index:04x}"
        guid = f"00000041-0001-0000-3130-44{index:02x}45343039"
        gpu(sysfs, procfs, [*vmbus, guid, f"pci{gpu_domain}:00", f"{gpu_domain}:00:00.0"], numa, GEN5)
        nic(sysfs, f"mlx5_ib{index}", [*vmbus, guid.replace("-0001-", "-0002-"), f"pci{nic_domain}:00",
            f"{nic_domain}:00:00.0"], numa, None, GEN5)  # fmt: skip
    number_gpus(procfs)
    cpuinfo(procfs)
    return sysfs, procfs


def azure_topo_file(path: Path) -> Path:
    """An NCCL topology file as Azure writes one for its ND VMs (azhpc-images customizations, set as NCCL_TOPO_FILE
    in /etc/nccl.conf): per NUMA node a virtual switch (`ffff:ff:0N.0`) with GPU i (`000i+1:00:00.0`, class
    0x030200) and its InfiniBand VF (`010i+1:00:00.0`, class 0x020700) below it: each GPU PIX to its own NIC."""
    cpus = []
    for numa in range(2):
        link = 'link_speed="32.0 GT/s PCIe" link_width="16"'
        pairs = "".join(
            f'      <pci busid="{0x0001 + i:04x}:00:00.0" class="0x030200" {link}/>\n'
            f'      <pci busid="{0x0101 + i:04x}:00:00.0" class="0x020700" {link}/>\n'
            for i in range(4 * numa, 4 * numa + 4)
        )  # fmt: skip
        switches = "".join(
            f'    <pci busid="ffff:ff:{2 * numa + k + 1:02x}.0" class="0x060400" link_speed="32.0 GT/s PCIe" '
            f'link_width="16">\n'
            + "".join(line + "\n" for line in pairs.splitlines()[4 * k : 4 * k + 4])
            + "    </pci>\n"
            for k in range(2)
        )  # fmt: skip
        cpus.append(f'  <cpu numaid="{numa}" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">\n'
                    f"{switches}  </cpu>\n")  # fmt: skip
    path.write_text('<system version="1">\n' + "".join(cpus) + "</system>\n")
    return path


def bridge_config(sysfs: Path, function: str, acs_control: int | None = 0, size: int = 4096) -> None:
    """A bridge's `config` file as root reads it: an AER extended capability at 0x100 (id 0x0001) chained to ACS at
    0x148 (id 0x000D, its control word at +6, pci_regs.h PCI_ACS_CTRL); `acs_control` None: no ACS capability.
    `size` 64 is what a process without CAP_SYS_ADMIN reads (drivers/pci/pci-sysfs.c pci_read_config)."""
    space = bytearray(4096)
    struct.pack_into("<HH", space, 0, 0x10B5, 0xC010)  # a Broadcom PEX switch's port
    struct.pack_into("<I", space, 0x100, 0x0001 | 2 << 16 | (0x148 if acs_control is not None else 0) << 20)
    if acs_control is not None:
        struct.pack_into("<IHH", space, 0x148, 0x000D | 1 << 16, 0x005F, acs_control)
    link = sysfs / "bus" / "pci" / "devices" / function
    if not link.is_symlink():  # the layouts link their endpoints only; the kernel links every function
        link.symlink_to(next((sysfs / "devices").rglob(function)))
    (link / "config").write_bytes(bytes(space[:size]))
