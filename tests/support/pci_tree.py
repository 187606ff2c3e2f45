"""Fixture sysfs and procfs trees of real node layouts, for accelmon.topology: the PCI hierarchy under
`devices/pciDDDD:BB/...` with `bus/pci/devices/<function>` links and `numa_node` files, the RDMA devices in
`class/infiniband/<name>/device`, and the GPUs in the NVIDIA driver's procfs. Each layout's expected matrix is written
beside it, by the levels NVML defines (nvml.h, nvmlGpuTopologyLevel_t: SINGLE a single PCIe switch, MULTIPLE several
switches without the host bridge, HOSTBRIDGE the same host bridge, NODE one NUMA node across host bridges, SYSTEM the
rest), which nvidia-smi topo -m prints as PIX, PXB, PHB, NODE and SYS. No real host's `nvidia-smi topo -m` was read
beside these trees in this round (no GPU machine was lent)."""

from __future__ import annotations

from pathlib import Path

from tests.support.jobs_tree import uuid


def function(sysfs: Path, chain: list[str], numa: int) -> str:
    """A PCI function at the end of `chain` (the root complex, then each function down to it); its name."""
    directory = sysfs / "devices" / Path(*chain)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "numa_node").write_text(f"{numa}\n")
    name = chain[-1]
    link = sysfs / "bus" / "pci" / "devices" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(directory)
    return name


def gpu(sysfs: Path, procfs: Path, chain: list[str], numa: int) -> None:
    """A GPU at the end of `chain`, listed by the driver (its UUID given once every GPU is known: number_gpus)."""
    name = function(sysfs, chain, numa)
    folder = procfs / "driver" / "nvidia" / "gpus" / name
    folder.mkdir(parents=True)
    (folder / "information").write_text(f"GPU UUID: \t -\nBus Location: \t {name}\n")


def nic(sysfs: Path, name: str, chain: list[str], numa: int) -> None:
    found = function(sysfs, chain, numa)
    device = sysfs / "class" / "infiniband" / name
    device.mkdir(parents=True)
    (device / "device").symlink_to(sysfs / "devices" / Path(*chain))
    assert found


def number_gpus(procfs: Path) -> None:
    """The UUIDs in bus order, as NVML numbers the GPUs (accelmon.nvidia.driver_gpu_entries)."""
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
