"""Which path joins each GPU to each RDMA NIC (accelmon.host.topology), on fixture trees of real node layouts
(tests/support/pci_tree.py, each with its expected matrix), and as the infiniband collector serves it (issue 59);
which NIC NCCL uses for each GPU, as NCCL v2.28.7-1 chooses it (issue 68)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pynvml
import pytest

from accelmon.collectors.infiniband import InfinibandCollector
from accelmon.host import topology
from accelmon.host.nvidia import NvmlSession
from tests.support.exposition import promtool_check, series, text_of
from tests.support.jobs_tree import uuid
from tests.support.path_rules import path_faults_test
from tests.support.pci_tree import (
    DGX_H100_COMPUTE,
    DOWN,
    GEN4,
    GEN5,
    PCIE_EXPECTED,
    azure_nd_h100_v5,
    azure_topo_file,
    bridged_pcie_pair,
    cpuinfo,
    dgx_a100,
    dgx_h100,
    dual_port_card_with_vfs,
    far_compute_hca,
    gpu,
    gpus_without_nics_on_one_socket,
    healthy_idle_node,
    hgx_expected,
    hgx_h100,
    nic,
    number_gpus,
    nvswitches,
    pcie_server,
    two_nics_under_one_switch,
)
from tests.support.pci_tree import (
    function as pci_function,
)
from tests.support.waiting import returns_while_blocked

# promtool over the master's rules, the live job rules rendered by the role through Ansible (tests/support/rules.py):
# the e2e tier, where Ansible is installed (the Python 3.9 tier has only the exporter's dependencies).
ROLE_RULES = pytest.mark.e2e


def nccl_choice(sysfs, procfs, ib_hca: str = "") -> list[tuple[str, str, str, str]]:
    locals_ = topology.nccl_local(str(sysfs), str(procfs), topology.active_ports(str(sysfs)), ib_hca)
    return [(local.gpu, local.device, local.port, local.path) for local in locals_]


def test_an_hgx_board_pairs_each_gpu_with_its_own_nic(tmp_path):
    """8 GPUs, 8 NICs, two sockets: each GPU's own NIC behind its switch (PIX), the socket's others across host
    bridges (NODE), the other socket's across the CPUs' interconnect (SYS); each GPU's nearest is its own NIC."""
    sysfs, procfs = hgx_h100(tmp_path)
    pairs = topology.gpu_nic_pairs(str(sysfs), str(procfs))
    assert len(pairs) == 64
    assert {(p.gpu, p.device): p.link for p in pairs} == {
        (str(g), f"mlx5_{n}"): hgx_expected(g, n) for g in range(8) for n in range(8)
    }
    assert nccl_choice(sysfs, procfs) == [(str(g), f"mlx5_{g}", "1", "PIX") for g in range(8)]


def test_a_pcie_server_tells_one_switch_from_several_and_the_far_socket(tmp_path):
    sysfs, procfs = pcie_server(tmp_path)
    pairs = topology.gpu_nic_pairs(str(sysfs), str(procfs))
    assert {(p.gpu, p.device): p.link for p in pairs} == PCIE_EXPECTED
    assert nccl_choice(sysfs, procfs) == [("0", "mlx5_1", "1", "PIX"), ("1", "mlx5_1", "1", "PXB"),
                                          ("2", "mlx5_1", "1", "PHB")]  # fmt: skip


def test_the_infiniband_collector_serves_the_pairs_and_follows_a_device_that_goes(tmp_path):
    sysfs, procfs = pcie_server(tmp_path)
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs))
    text = text_of(collector)
    promtool_check(text)
    served = {(labels["gpu"], labels["device"]): labels["link"] for labels, _ in series(text, "accelmon_gpu_nic_info")}
    assert served == PCIE_EXPECTED
    nearest = series(text, "accelmon_gpu_nic_nearest_info")
    assert [(labels["gpu"], labels["uuid"], labels["device"], labels["port"]) for labels, _ in nearest] == [
        ("0", uuid(0), "mlx5_1", "1"), ("1", uuid(1), "mlx5_1", "1"), ("2", uuid(2), "mlx5_1", "1"),
    ]  # fmt: skip
    shutil.rmtree(sysfs / "class" / "infiniband" / "mlx5_1")  # hot-removed: the next sample follows
    again = {
        (labels["gpu"], labels["device"]) for labels, _ in series(text_of(collector), "accelmon_gpu_nic_nearest_info")
    }
    assert again == {("0", "mlx5_0"), ("1", "mlx5_0"), ("2", "mlx5_0")}


def test_a_node_without_gpus_or_with_an_unknown_place_serves_no_pair(tmp_path):
    sysfs, procfs = pcie_server(tmp_path)
    assert topology.gpu_nic_pairs(str(sysfs), str(tmp_path / "no-proc")) == []
    (sysfs / "bus" / "pci" / "devices" / "0000:81:00.0").unlink()  # the far NIC's function not in sysfs
    assert {p.device for p in topology.gpu_nic_pairs(str(sysfs), str(procfs))} == {"mlx5_1"}


def test_nccl_takes_a_400g_hca_behind_two_switches_over_a_200g_port_behind_one(tmp_path):
    """nvidia-smi: the RoCE port is PIX, the HCA PXB; NCCL ranks bandwidth first (ncclTopoGetLocal): 48 GB/s to
    the HCA (the GPU's Gen5 link), 24 GB/s to the RoCE card (its Gen4 link)."""
    sysfs, procfs = two_nics_under_one_switch(tmp_path)
    links = {(p.gpu, p.device): p.link for p in topology.gpu_nic_pairs(str(sysfs), str(procfs))}
    assert links == {("0", "mlx5_0"): "PIX", ("0", "mlx5_1"): "PXB"}
    assert nccl_choice(sysfs, procfs) == [("0", "mlx5_1", "1", "PXB")]


def test_nccl_takes_the_far_sockets_compute_hca_over_a_25g_front_end_nic(tmp_path):
    """The front-end NIC is NODE to nvidia-smi (PHB to NCCL) at 3.1 GB/s; the compute HCA SYS at the UPI's 22."""
    sysfs, procfs = far_compute_hca(tmp_path)
    links = {(p.gpu, p.device): p.link for p in topology.gpu_nic_pairs(str(sysfs), str(procfs))}
    assert links == {("0", "mlx5_0"): "NODE", ("0", "mlx5_1"): "SYS"}
    assert nccl_choice(sysfs, procfs) == [("0", "mlx5_1", "1", "SYS")]


def test_only_active_ports_count_and_a_cards_ports_and_vfs_are_one_device(tmp_path):
    """A dual-port card, port 2 uncabled, 4 VFs down: port 1 alone. Both ports up: one device of both ports (NCCL
    merges them, net_ib.cc ncclIbGetPciPath), not one of them beside the other."""
    sysfs, procfs = dual_port_card_with_vfs(tmp_path / "idle")
    assert nccl_choice(sysfs, procfs) == [("0", "mlx5_0", "1", "PIX")]
    sysfs, procfs = dual_port_card_with_vfs(tmp_path / "both", second={"state": "4: ACTIVE", "rate": "400 Gb/sec"})
    assert nccl_choice(sysfs, procfs) == [("0", "mlx5_0", "1", "PIX"), ("0", "mlx5_1", "1", "PIX")]


def test_nccl_ib_hca_as_nccl_reads_it(tmp_path):
    sysfs, procfs = far_compute_hca(tmp_path)
    assert nccl_choice(sysfs, procfs, "^mlx5_1") == [("0", "mlx5_0", "1", "PHB")]
    assert nccl_choice(sysfs, procfs, "mlx5_0:1") == [("0", "mlx5_0", "1", "PHB")]
    assert nccl_choice(sysfs, procfs, "mlx5_0:2") == []
    assert nccl_choice(sysfs, procfs, "=mlx5") == []  # exact names: no device is called mlx5
    assert nccl_choice(sysfs, procfs, "mlx5") == [("0", "mlx5_1", "1", "SYS")]  # a prefix of both
    conf = tmp_path / "nccl.conf"
    conf.write_text("# a site's defaults\nNCCL_IB_HCA=^mlx5_1\nNCCL_DEBUG=WARN\n")
    assert topology.nccl_conf_value(str(conf)) == "^mlx5_1"
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(conf))
    served = series(text_of(collector), "accelmon_gpu_nic_nearest_info")
    assert [(labels["device"], labels["path"]) for labels, _ in served] == [("mlx5_0", "PHB")]


def test_nccl_ib_hca_ports_are_read_as_atoi_reads_them(tmp_path):
    """misc/utils.cc parseStringList (v2.28.7-1) reads a port with atoi: leading blanks and a sign are taken, so
    `mlx5_0: 1` is port 1 and `:-1` any port (matchPort); no number is port 0, which no port is. Before, the blank
    and the sign read as no number: port 0, and NCCL's NIC was dropped."""
    sysfs, procfs = far_compute_hca(tmp_path)
    assert nccl_choice(sysfs, procfs, "mlx5_0: 1") == [("0", "mlx5_0", "1", "PHB")]
    assert nccl_choice(sysfs, procfs, "mlx5_0:-1") == [("0", "mlx5_0", "1", "PHB")]
    assert nccl_choice(sysfs, procfs, "mlx5_0:+1x") == [("0", "mlx5_0", "1", "PHB")]
    assert nccl_choice(sysfs, procfs, "mlx5_0:") == []
    assert nccl_choice(sysfs, procfs, "mlx5_0:" + "9" * 5000) == []  # no port, and no ValueError from int()


def test_nccl_merges_at_most_four_devices_into_one_nic(tmp_path):
    """A card's PF and 5 VFs, all ACTIVE, merged at its function 0 (NCCL_IB_MERGE_VFS): NCCL stops a virtual NIC
    at NCCL_NET_MAX_DEVS_PER_NIC (4, nccl_net.h; topo.cc ncclTopoAutoMerge) and starts another. Before: one NIC of 6
    ports, its bandwidth 6 ports' where NCCL counts 4."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    top = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]
    gpu(sysfs, procfs, [*top, "0000:02:00.0", "0000:03:00.0"], 0, GEN5)
    for function in range(6):
        nic(sysfs, f"mlx5_{function}", [*top, "0000:02:01.0", f"0000:04:00.{function}"], 0, None, GEN5)
    number_gpus(procfs)
    cpuinfo(procfs)
    nets = topology._nets(str(sysfs), topology.active_ports(str(sysfs)), "")
    assert [sorted(port.device for port in net.ports) for net in nets] == [
        ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"], ["mlx5_4", "mlx5_5"]]  # fmt: skip


def test_a_port_in_use_that_goes_down_stays_the_gpus_and_one_never_up_is_never_used(tmp_path):
    """The collector keeps a port seen ACTIVE as the GPU's when it goes down (its fault is then the GPU's: the
    rules record not_active); an uncabled port and VFs never up are used by no GPU."""
    sysfs, procfs = dual_port_card_with_vfs(tmp_path)
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"))

    def used() -> list[tuple[str, str]]:
        served = series(text_of(collector), "accelmon_gpu_nic_nearest_info")
        return [(labels["device"], labels["port"]) for labels, _ in served]

    assert used() == [("mlx5_0", "1")]
    for file, text in DOWN.items():
        (sysfs / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / file).write_text(text + "\n")
    assert used() == [("mlx5_0", "1")]


def test_a_card_that_takes_a_used_ports_name_does_not_inherit_it(tmp_path):
    """mlx5 names follow probe order: a driver reload that loses a card shifts them, a re-plugged card may take
    another's. Here mlx5_0 becomes another PCI function with its port uncabled: the port in service was the other
    card's, so the new one's is nobody's and both GPUs leave by mlx5_6 (before: kept as the GPUs' port gone down,
    a not_active fault of both on a healthy card)."""
    sysfs, procfs = healthy_idle_node(tmp_path)
    now = [0.0]
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"),
                                    clock=lambda: now[0])  # fmt: skip
    assert {row[1] for row in served(collector, "accelmon_gpu_nic_nearest_info")} == {"mlx5_0"}
    card = sysfs / "class" / "infiniband" / "mlx5_0"
    chain = ["pci0000:00", "0000:00:03.0", "0000:09:00.0"]
    pci_function(sysfs, chain, 0, GEN5)
    (card / "device").unlink()
    (card / "device").symlink_to(sysfs / "devices" / Path(*chain))
    for file, text in DOWN.items():
        (card / "ports" / "1" / file).write_text(text + "\n")
    now[0] = 301.0  # the device's files listed again (at once on a real kernel: its class link changes)
    assert {row[1] for row in served(collector, "accelmon_gpu_nic_nearest_info")} == {"mlx5_6"}


# Issue 68, point 3: PXN, NCCL's one NIC a GPU of a pair, both the PHB and the NODE NIC, rails.
def served(collector: InfinibandCollector, name: str) -> list[tuple[str, ...]]:
    return [tuple(labels[key] for key in ("gpu", "device", "path") if key in labels)
            for labels, _ in series(text_of(collector), name)]  # fmt: skip


def test_a_gpu_without_a_nic_of_its_own_sends_by_its_nvlink_peers_nics(tmp_path):
    """GPUs 2 and 3 have no NIC on their socket: NCCL sends through GPU 0 or 1 over NVLink and out of their HCA (PXN
    at their 48 GB/s against the UPI's 22; paths.cc ncclTopoComputePaths), never by mlx5_2, which no GPU is near to
    relay for (before: all three HCAs, SYS). Without NVLink (no NVSwitch) or with NCCL_PXN_DISABLE=1: all three."""
    sysfs, procfs = gpus_without_nics_on_one_socket(tmp_path / "switched")
    assert nccl_choice(sysfs, procfs) == [
        ("0", "mlx5_0", "1", "PIX"), ("1", "mlx5_1", "1", "PIX"), ("2", "mlx5_0", "1", "PXN"),
        ("2", "mlx5_1", "1", "PXN"), ("3", "mlx5_0", "1", "PXN"), ("3", "mlx5_1", "1", "PXN"),
    ]  # fmt: skip
    far = [(str(g), f"mlx5_{n}", "1", "SYS") for g in (2, 3) for n in range(3)]
    assert nccl_choice(*gpus_without_nics_on_one_socket(tmp_path / "unswitched", switches=False))[2:] == far
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_PXN_DISABLE=1\n")
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(conf))
    assert [row for row in served(collector, "accelmon_gpu_nic_nearest_info") if row[0] in "23"] == [
        (gpu, device, path) for gpu, device, _, path in far
    ]


def test_a_dgx_a100_gives_each_gpu_of_a_pair_one_of_its_two_hcas(tmp_path):
    """Two GPUs and two HCAs behind one two-level switch complex: nvidia-smi's GPU0 row (NVIDIA/DCGM#149) is PXB for
    both, SYS for the rest. NCCL flattens the Broadcom switch's two levels (topo.cc ncclTopoFlattenBcmSwitches: PIX
    to it; before: PXB), its local nets are both HCAs, and each GPU leaves by one, from its mirrored index (topo.cc
    ncclTopoGetLocalNet: netsPerGpu = 2 nets / 2 GPUs); before, both GPUs used both, so one HCA's fault was blamed
    on two GPUs."""
    sysfs, procfs = dgx_a100(tmp_path)
    links = {(p.gpu, p.device): p.link for p in topology.gpu_nic_pairs(str(sysfs), str(procfs))}
    assert [links[("0", f"mlx5_{n}")] for n in range(8)] == ["PXB", "PXB"] + ["SYS"] * 6
    assert nccl_choice(sysfs, procfs) == [(str(g), f"mlx5_{g}", "1", "PIX") for g in range(8)]


def test_an_nvlink_bridged_pair_without_nvswitch_relays_by_pxn_as_nccl_does(tmp_path, fake_nvml):
    """Two PCIe GPUs joined by NVLink bridges, no NVSwitch: NCCL reads the links from NVML (xml.cc
    ncclTopoGetXmlFromGpu), so the pair is PATH_NVL and GPU 1, whose own path to GPU 0's HCA crosses the CPU (PHB),
    sends through GPU 0 (paths.cc ncclTopoComputePaths: the peer PIX to it), PXN (before: PHB, bridges unknown, as
    NVLink was known only from the NVSwitch driver's procfs). Links wired to NVSwitches or to nothing join no pair."""
    sysfs, procfs = bridged_pcie_pair(tmp_path)
    bridges = [f"nvlink_peer {g} {link} {1 - g}" for g in (0, 1) for link in range(12)]
    fake_nvml.configure("\n".join(["gpus 2", "nvlink_unbridged 0 12", "nvlink_unbridged 1 12", *bridges]) + "\n")
    assert topology.nvlink_pairs(NvmlSession("test", pynvml)) == [frozenset({"0000:18:00.0", "0000:28:00.0"})]
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"), nvml=pynvml)
    assert served(collector, "accelmon_gpu_nic_nearest_info") == [("0", "mlx5_0", "PIX"), ("1", "mlx5_0", "PXN")]
    assert served(collector, "accelmon_gpu_nic_rail_info") == []  # GPU 1's own NIC is GPU 0's: no other rail
    fake_nvml.configure("gpus 2\nnvlink_unbridged 0 12\nnvlink_unbridged 1 12\n")  # no bridge: links inactive
    unbridged = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"), nvml=pynvml)
    assert served(unbridged, "accelmon_gpu_nic_nearest_info") == [("0", "mlx5_0", "PIX"), ("1", "mlx5_0", "PHB")]
    fake_nvml.configure("gpus 2\nnvlink 0 18\nnvlink 1 18\n")  # every link to an NVSwitch (an HGX board's)
    assert topology.nvlink_pairs(NvmlSession("test", pynvml), str(sysfs)) == [
        frozenset({"0000:18:00.0", "0000:28:00.0"})
    ]


def test_gpus_on_nvswitches_no_driver_lists_relay_by_pxn_as_nccl_does(tmp_path, fake_nvml):
    """In a VM (Azure ND: the host runs the NVSwitches) the nvidia-nvswitch driver lists none, but NVML shows each
    GPU's links up to a far end the guest cannot see, which NCCL takes for an NVSwitch (xml.cc
    ncclTopoGetXmlFromGpu: "Assume NVSwitch"), so the GPUs are one NVLink hop apart and each one's point-to-point
    sends to the other rail leave by that rail's NIC through its GPU (PXN; search.cc ncclTopoGetNetDev). Before:
    no NVLink known, no rail port, and a fault of the NIC those sends use recorded for none of them. A far end
    sysfs shows of class 0x068000 is an NVSwitch too; a GPU NVML does not list (another container's) is none."""
    sysfs, procfs = bridged_pcie_pair(tmp_path)
    nic(sysfs, "mlx5_1", ["pci0000:25", "0000:25:01.0", "0000:26:00.0", "0000:27:01.0", "0000:29:00.0"], 0,
        {1: {"rate": "200 Gb/sec (4X HDR)"}}, GEN4)  # fmt: skip
    fake_nvml.configure("gpus 2\nnvlink 0 12\nnvlink 1 12\n")  # links up to 0000:c0:00.0-c3:00.0, not in sysfs
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"), nvml=pynvml)
    assert served(collector, "accelmon_gpu_nic_nearest_info") == [("0", "mlx5_0", "PIX"), ("1", "mlx5_1", "PIX")]
    assert served(collector, "accelmon_gpu_nic_rail_info") == [("0", "mlx5_1"), ("1", "mlx5_0")]
    for bus, kind in (("c0", "0x068000"), ("c1", "0x068000"), ("c2", "0x030200"), ("c3", "0x068000")):
        (sysfs / "devices" / f"0000:{bus}:00.0").mkdir(parents=True)
        (sysfs / "devices" / f"0000:{bus}:00.0" / "class").write_text(kind + "\n")
        (sysfs / "bus" / "pci" / "devices" / f"0000:{bus}:00.0").symlink_to(sysfs / "devices" / f"0000:{bus}:00.0")
    joined = [frozenset({"0000:18:00.0", "0000:28:00.0"})]
    assert topology.nvlink_pairs(NvmlSession("test", pynvml), str(sysfs)) == joined
    fake_nvml.configure("gpus 2\nnvlink 0 3\nnvlink 1 3\n")  # links 0-2 only: to c0, c1 (NVSwitches) and c2 (a GPU)
    assert topology.nvlink_pairs(NvmlSession("test", pynvml), str(sysfs)) == joined
    fake_nvml.configure("gpus 2\nnvlink 0 3\nnvlink 1 3\nnvlink_down 0 0\nnvlink_down 0 1\n")  # GPU 0: to c2 only
    assert topology.nvlink_pairs(NvmlSession("test", pynvml), str(sysfs)) == []


def test_a_gpu_gone_from_sysfs_leaves_its_neighbours_nics_where_they_were(tmp_path):
    """A DGX A100 whose GPU 0 fell off the bus (Xid 79: the kernel removed its PCI function, the driver's procfs
    keeps it): NCCL spreads channels by each GPU's device index (topo.cc `ncclTopoGetLocalNet`, `gpu.dev`
    mirrored), which does not move; GPUs 2 and 3 keep mlx5_2 and mlx5_3 and GPU 1, alone beside its pair's HCAs,
    takes both. Before, each GPU was mirrored by its place among those found, and GPUs 2 and 3 swapped NICs."""
    import os

    sysfs, procfs = dgx_a100(tmp_path)
    os.unlink(sysfs / "bus/pci/devices" / sorted((procfs / "driver/nvidia/gpus").iterdir())[0].name)
    chosen = {(g, device) for g, device, _, _ in nccl_choice(sysfs, procfs) if g in "0123"}
    assert chosen == {("1", "mlx5_0"), ("1", "mlx5_1"), ("2", "mlx5_2"), ("3", "mlx5_3")}


def test_nccl_uses_both_the_phb_and_the_node_nic_of_one_bandwidth(tmp_path):
    """nvidia-smi: one HCA PHB (the GPU's root complex), the other NODE (another root complex of its NUMA node);
    NCCL has one CPU node per NUMA node, so both are PHB and, at one bandwidth, both are the GPU's."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    gpu(sysfs, procfs, ["pci0000:00", "0000:00:01.0", "0000:01:00.0"], 0, GEN5)
    nic(sysfs, "mlx5_0", ["pci0000:00", "0000:00:02.0", "0000:02:00.0"], 0, None, GEN5)
    nic(sysfs, "mlx5_1", ["pci0000:20", "0000:20:01.0", "0000:21:00.0"], 0, None, GEN5)
    number_gpus(procfs)
    cpuinfo(procfs)
    links = {p.device: p.link for p in topology.gpu_nic_pairs(str(sysfs), str(procfs))}
    assert links == {"mlx5_0": "PHB", "mlx5_1": "NODE"}
    assert nccl_choice(sysfs, procfs) == [("0", "mlx5_0", "1", "PHB"), ("0", "mlx5_1", "1", "PHB")]


def test_point_to_point_sends_may_leave_by_every_rails_nic_on_an_nvswitch_node(tmp_path):
    """A DGX H100 (12 RDMA devices, each GPU PXB to its compute HCA): NCCL's own choice is that HCA; a send to GPU d
    of another node goes by GPU d's HCA through GPU d (NCCL_P2P_PXN_LEVEL=2, search.cc ncclTopoGetNetDev), so every
    compute HCA is on every GPU's point-to-point path: served apart (accelmon_gpu_nic_rail_info). None without
    NVLink or with NCCL_P2P_PXN_LEVEL=0."""
    sysfs, procfs = dgx_h100(tmp_path)
    assert len(topology.nics(str(sysfs))) == 12
    assert nccl_choice(sysfs, procfs) == [(str(g), name, "1", "PXB") for g, name in enumerate(DGX_H100_COMPUTE)]
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"))
    rails = served(collector, "accelmon_gpu_nic_rail_info")
    assert sorted(device for gpu_, device in rails if gpu_ == "0") == sorted(DGX_H100_COMPUTE[1:])
    assert len(rails) == 8 * 7
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_P2P_PXN_LEVEL=0\n")
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(conf))
    assert served(collector, "accelmon_gpu_nic_rail_info") == []
    sysfs, procfs = hgx_h100(tmp_path / "no-switch")
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"))
    assert served(collector, "accelmon_gpu_nic_rail_info") == []
    nvswitches(procfs)  # the NVSwitch driver loaded later: worked out again
    assert len(served(collector, "accelmon_gpu_nic_rail_info")) == 8 * 7


def test_nccl_p2p_pxn_level_1_sends_by_a_rail_within_pxn(tmp_path):
    """NCCL_P2P_PXN_LEVEL=1, "use PXN if needed" (search.cc ncclTopoGetNetDev): a send to GPU d of another node
    leaves by d's HCA where the sender's own path to it is PXN or nearer: on a DGX H100 every other compute HCA,
    through its GPU, as at 2; on a board without NVLink none (every other HCA PHB or SYS). Before: none at 1, and
    a rail HCA's fault was recorded for no sending GPU."""
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_P2P_PXN_LEVEL=1\n")
    sysfs, procfs = dgx_h100(tmp_path)
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(conf))
    rails = served(collector, "accelmon_gpu_nic_rail_info")
    assert sorted(device for gpu_, device in rails if gpu_ == "0") == sorted(DGX_H100_COMPUTE[1:])
    assert len(rails) == 8 * 7
    sysfs, procfs = hgx_h100(tmp_path / "no-switch")
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(conf))
    assert served(collector, "accelmon_gpu_nic_rail_info") == []


def test_nccl_conf_lines_end_where_nccls_getline_ends_them(tmp_path):
    """NCCL splits /etc/nccl.conf at "\\n" only (param.cc setEnvFile): a file saved with CRLF gives NCCL_IB_HCA the
    value "mlx5_6\\r", which names no device, so NCCL opens no HCA at all and no port is any GPU's (before: read as
    mlx5_6, as if NCCL used it); a form feed does not end a line either, and a NUL ends the C string."""
    sysfs, procfs = healthy_idle_node(tmp_path)
    conf = tmp_path / "nccl.conf"
    conf.write_bytes(b"NCCL_IB_HCA=mlx5_6\r\n")
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(conf))
    assert served(collector, "accelmon_gpu_nic_nearest_info") == []
    conf.write_bytes(b"NCCL_IB_HCA=mlx5_6\n")
    assert served(collector, "accelmon_gpu_nic_nearest_info") == [("0", "mlx5_6", "PHB"), ("1", "mlx5_6", "PIX")]
    conf.write_bytes(b"NCCL_DEBUG=INFO\x0cNCCL_IB_HCA=mlx5_0\nNCCL_P2P_PXN_LEVEL=1\x00\n")
    assert topology.nccl_conf_values(str(conf), ("NCCL_DEBUG", "NCCL_IB_HCA", "NCCL_P2P_PXN_LEVEL")) == (
        "INFO\x0cNCCL_IB_HCA=mlx5_0",
        "",
        "1",
    )


@ROLE_RULES
def test_a_healthy_idle_node_records_no_path_fault(tmp_path):
    """promtool over the collector's own scrapes (issue 68, point 2): a second port uncabled, VFs down and a slower
    storage HCA of the same model are on no GPU's path, so none is a fault (before: not_active and slow_rate)."""
    sysfs, procfs = healthy_idle_node(tmp_path)
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"))
    scrapes = [text_of(collector) for _ in range(12)]
    used = {(labels["gpu"], labels["device"], labels["port"]) for labels, _ in
            series(scrapes[-1], "accelmon_gpu_nic_nearest_info")}  # fmt: skip
    assert used == {("0", "mlx5_0", "1"), ("1", "mlx5_0", "1")}
    assert path_faults_test(scrapes, [], tmp_path) == ""


@ROLE_RULES
@pytest.mark.parametrize("layout", [dgx_h100, dgx_a100, azure_nd_h100_v5, gpus_without_nics_on_one_socket])
def test_a_real_layout_at_rest_records_no_path_fault(tmp_path, layout):
    """promtool over the collector's own scrapes of each real layout, healthy and idle: no part at fault (its
    storage ports, rails, PXN paths and PCIe links included)."""
    sysfs, procfs = layout(tmp_path)
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"))
    scrapes = [text_of(collector) for _ in range(3)]
    assert series(scrapes[-1], "accelmon_gpu_nic_nearest_info")
    assert path_faults_test(scrapes, [], tmp_path) == ""


def a100_pcie_beside_a_storage_hca(root):
    """A PCIe server's two A100 PCIe (Gen4 x16: 24 GB/s to NCCL), one per socket, each under a switch: GPU 0 beside a
    200G storage HCA of the compute HCAs' model (ConnectX-7), with a 400G compute HCA across its host bridge; GPU 1
    beside a 400G compute HCA. NCCL rates GPU 0's paths to both HCAs 24 GB/s (its own link) and takes the nearer,
    the storage HCA (topo.cc ncclTopoGetLocal)."""
    sysfs, procfs = root / "sys", root / "proc"
    for socket, (bus, storage) in enumerate(((0x00, True), (0x80, False))):
        top = [f"pci0000:{bus:02x}", f"0000:{bus:02x}:01.0", f"0000:{bus + 1:02x}:00.0"]
        gpu(sysfs, procfs, [*top, f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 3:02x}:00.0"], socket, GEN4)
        rate = {1: {"rate": "200 Gb/sec (4X HDR)"}} if storage else None
        nic(sysfs, f"mlx5_{2 * socket}", [*top, f"0000:{bus + 2:02x}:01.0", f"0000:{bus + 4:02x}:00.0"], socket,
            rate, GEN5, "MT4129")  # fmt: skip
    nic(sysfs, "mlx5_1", ["pci0000:00", "0000:00:02.0", "0000:05:00.0"], 0, None, GEN5, "MT4129")
    number_gpus(procfs)
    cpuinfo(procfs)
    return sysfs, procfs


@ROLE_RULES
def test_a_port_as_fast_as_nccls_path_to_it_is_no_slow_port(tmp_path):
    """promtool over the collector's own scrapes: GPU 0 leaves by the 200G storage HCA, as NCCL chooses, slower than
    the 400G compute HCA GPU 1 uses, of one kind, but no slower than NCCL's path to it (24 GB/s,
    accelmon_infiniband_port_path_bandwidth_bytes_per_second): no fault (before: slow_rate for good on a healthy
    node). On Gen5 (H100 PCIe, 48 GB/s) GPU 0 takes the compute HCA, and GPU 1's compute HCA trained at 200G is
    its path's bottleneck: slow_rate."""
    sysfs, procfs = a100_pcie_beside_a_storage_hca(tmp_path)
    assert nccl_choice(sysfs, procfs) == [("0", "mlx5_0", "1", "PIX"), ("1", "mlx5_2", "1", "PIX")]
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"))
    scrapes = [text_of(collector) for _ in range(3)]
    served = {labels["device"]: value for labels, value in
              series(scrapes[-1], "accelmon_infiniband_port_path_bandwidth_bytes_per_second")}  # fmt: skip
    assert served == {"mlx5_0": 24e9, "mlx5_2": 24e9}
    assert path_faults_test(scrapes, [], tmp_path) == ""
    sysfs, procfs = a100_pcie_beside_a_storage_hca(tmp_path / "gen5")
    for name in ("max_link_speed", "current_link_speed"):  # H100 PCIe: every link Gen5
        for found in (sysfs / "devices").rglob(name):
            found.write_text(GEN5[0] + "\n")
    (sysfs / "class/infiniband/mlx5_2/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n")
    assert nccl_choice(sysfs, procfs) == [("0", "mlx5_1", "1", "PHB"), ("1", "mlx5_2", "1", "PIX")]
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"))
    scrapes = [text_of(collector) for _ in range(3)]
    fault = [{"labels": f'accelmon:gpu_path_fault{{device="mlx5_2",gpu="1",instance="n1:19470",node="n1",'
                        f'part="nic_port",reason="slow_rate",uuid="{uuid(1)}"}}', "value": 1}]  # fmt: skip
    assert path_faults_test(scrapes, fault, tmp_path) == ""


# Issue 68, point 6: the error, saturation and congestion reasons, by promtool over the collector's own scrapes of the
# healthy idle node (both GPUs leave by mlx5_0 port 1) as its port's counters move, one scrape a minute.
def scrapes_as_counters_move(tmp_path, move, gone: tuple[str, ...] = ()) -> list[str]:
    """12 scrapes a minute apart; before scrape `minute`, move(minute) gives mlx5_0 port 1's counters/ files that
    change (name -> value); the files in `gone` are removed first (a driver that has not got them)."""
    sysfs, procfs = healthy_idle_node(tmp_path)
    counters = sysfs / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    for name in gone:
        (counters / name).unlink()
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"))
    scrapes = []
    for minute in range(12):
        for name, value in move(minute).items():
            (counters / name).write_text(f"{value}\n")
        scrapes.append(text_of(collector))
    return scrapes


def nic_fault(reason: str) -> list[dict[str, object]]:
    """accelmon:gpu_path_fault for both GPUs of the healthy idle node, their port mlx5_0 at fault for `reason`."""
    return [
        {"labels": f'accelmon:gpu_path_fault{{device="mlx5_0",gpu="{gpu}",instance="n1:19470",node="n1",'
                   f'part="nic_port",reason="{reason}",uuid="{uuid(gpu)}"}}', "value": 1}
        for gpu in (0, 1)
    ]  # fmt: skip


@ROLE_RULES
def test_a_saturated_symbol_counter_is_seen_as_saturated(tmp_path):
    """symbol_error is 16 bits (Linux sysfs.c PORT_PMA_ATTR(symbol_error, 0, 16, 32)) and stops at 65535: once there
    its rate reads 0, which must not pass for a sound port (before: no fault at all)."""
    scrapes = scrapes_as_counters_move(tmp_path, lambda minute: {"symbol_error": min(65_000 + 300 * minute, 65_535)})
    served = series(scrapes[-1], "accelmon_infiniband_port_saturated")
    assert served == [({"device": "mlx5_0", "port": "1", "counter": "symbol_error"}, 1.0)]
    assert series(scrapes[0], "accelmon_infiniband_port_saturated") == []
    assert path_faults_test(scrapes, nic_fault("counters_saturated"), tmp_path) == ""


@ROLE_RULES
def test_a_missing_counter_does_not_hide_another_counters_errors(tmp_path):
    """A driver without link_downed (before: the sum of the four rates was empty, so no error was ever seen)."""
    scrapes = scrapes_as_counters_move(tmp_path, lambda minute: {"symbol_error": 100 * minute}, gone=("link_downed",))
    assert path_faults_test(scrapes, nic_fault("errors"), tmp_path) == ""


@ROLE_RULES
def test_one_symbol_error_does_not_fire(tmp_path):
    """One symbol error in 10 minutes is no fault (before: errors for 10 minutes); a link gone down once is."""
    one = scrapes_as_counters_move(tmp_path / "one", lambda minute: {"symbol_error": int(minute >= 8)})
    assert path_faults_test(one, [], tmp_path) == ""
    downed = scrapes_as_counters_move(tmp_path / "downed", lambda minute: {"link_downed": int(minute >= 8)})
    assert path_faults_test(downed, nic_fault("errors"), tmp_path) == ""


@ROLE_RULES
def test_heavy_xmit_wait_without_errors_is_congested(tmp_path):
    """No error counted, but the port waits to send (port_xmit_wait, ticks of 8 bytes) for 12 % of what it sends and
    0.08 % of its 400 Gb/s: congested (before: no fault). The same data sent without waiting is none."""

    def busy(wait: int):
        return lambda minute: {"port_xmit_data": 5_000_000_000 * minute, "port_xmit_wait": wait * minute}

    congested = scrapes_as_counters_move(tmp_path / "congested", busy(300_000_000))
    assert path_faults_test(congested, nic_fault("congested"), tmp_path) == ""
    clean = scrapes_as_counters_move(tmp_path / "clean", busy(1_000_000))
    assert path_faults_test(clean, [], tmp_path) == ""


# Issue 68, point 4: VMs: Hyper-V's devices under VMBus, and NCCL_TOPO_FILE.
def test_a_hyper_v_vm_gives_every_gpu_nic_pair_its_link(tmp_path):
    """Azure ND H100 v5: each GPU and NIC in a PCI domain of its own under a VMBus device; nvidia-smi prints NODE
    within a NUMA node, SYS across (before: no pair at all, the root complex was looked for under devices/ only)."""
    sysfs, procfs = azure_nd_h100_v5(tmp_path)
    links = {(p.gpu, p.device): p.link for p in topology.gpu_nic_pairs(str(sysfs), str(procfs))}
    assert links == {
        (str(g), f"mlx5_ib{n}"): "NODE" if (g < 4) == (n < 4) else "SYS" for g in range(8) for n in range(8)
    }
    # Without a topology file NCCL sees four PHB NICs per GPU and gives each GPU one by its mirrored index.
    assert [device for _, device, _, _ in nccl_choice(sysfs, procfs)] == [
        f"mlx5_ib{n}" for n in (0, 2, 1, 3, 4, 6, 5, 7)
    ]


def test_nccl_topo_file_places_the_vms_devices_as_nccl_reads_it(tmp_path):
    """Azure's /etc/nccl.conf sets NCCL_TOPO_FILE: GPU i and NIC i under one virtual switch, so NCCL pairs them
    (PIX, one each of the two under a switch); the exporter's option wins over the file named there; a malformed
    file is NCCL's failure, not a layout: the sysfs choice stands."""
    sysfs, procfs = azure_nd_h100_v5(tmp_path)
    topo = azure_topo_file(tmp_path / "topo.xml")
    conf = tmp_path / "nccl.conf"
    conf.write_text(f"NCCL_IB_PCI_RELAXED_ORDERING=1\nNCCL_TOPO_FILE={topo}\n")
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(conf))
    assert served(collector, "accelmon_gpu_nic_nearest_info") == [(str(g), f"mlx5_ib{g}", "PIX") for g in range(8)]
    broken = tmp_path / "broken.xml"
    broken.write_text("<system><cpu numaid='0'><pci busid=")
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(conf),
                                    nccl_topo_file=str(broken))  # fmt: skip
    assert [row[1] for row in served(collector, "accelmon_gpu_nic_nearest_info")][:4] == [
        "mlx5_ib0", "mlx5_ib2", "mlx5_ib1", "mlx5_ib3",
    ]  # fmt: skip
    switch = 'busid="ffff:ff:01.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16"'
    topo.write_text(topo.read_text().replace(switch, switch.replace('"16"', '"8"')))
    assert topology.topo_file_places(str(topo))["0001:00:00.0"].links == (24.0, 48.0)  # x8 of Gen5, then x16


# Issue 68, point 7: the HCA's own PCIe link and GPUDirect RDMA's peer-memory module.
def test_the_hcas_own_pcie_link_is_served_against_what_it_and_its_slot_allow(tmp_path):
    """mlx5_0 (Gen5 x16, its port above Gen5 x16) trained at Gen4 x8: served now and at best; a Gen5 HCA in a Gen4
    slot is at its best at Gen4 (the lower max_link_speed of the function and the port above it)."""
    sysfs, procfs = healthy_idle_node(tmp_path)
    pci = (sysfs / "class" / "infiniband" / "mlx5_0" / "device").resolve()
    (pci / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    (pci / "current_link_width").write_text("8\n")
    (pci.parent / "max_link_speed").write_text("32.0 GT/s PCIe\n")
    storage = (sysfs / "class" / "infiniband" / "mlx5_6" / "device").resolve()
    (storage.parent / "max_link_speed").write_text("16.0 GT/s PCIe\n")  # a Gen4 slot
    (storage / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    text = text_of(InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none")))
    promtool_check(text)

    def link(name: str, device: str) -> float | None:
        found = [value for labels, value in series(text, name) if labels["device"] == device]
        return found[0] if found else None

    assert [link("accelmon_infiniband_pcie_link_" + name, "mlx5_0") for name in (
        "transfers_per_second", "transfers_per_second_max", "width", "width_max")] == [16e9, 32e9, 8, 16]  # fmt: skip
    assert link("accelmon_infiniband_pcie_link_transfers_per_second_max", "mlx5_6") == 16e9
    assert link("accelmon_infiniband_pcie_link_transfers_per_second", "mlx5_6") == 16e9


def test_gpudirect_rdmas_peer_memory_module_as_nccl_looks_for_it(tmp_path):
    """NCCL's files (net_ib.cc ibGdrSupportInitOnce): /sys/module/nvidia_peermem/version or nv_peer_mem's
    /sys/kernel/mm/memory_peers/nv_mem[_nc]/version. Served only where the node has GPUs and RDMA devices."""
    sysfs, procfs = healthy_idle_node(tmp_path)
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"))
    assert series(text_of(collector), "accelmon_gpudirect_rdma_peer_memory_loaded") == [({}, 0.0)]
    (sysfs / "module" / "nvidia_peermem").mkdir(parents=True)
    (sysfs / "module" / "nvidia_peermem" / "version").write_text("580.95.05\n")
    assert series(text_of(collector), "accelmon_gpudirect_rdma_peer_memory_loaded") == [({}, 1.0)]
    no_gpus = InfinibandCollector(sysfs=str(sysfs), procfs=str(tmp_path / "none"), nccl_conf=str(tmp_path / "none"))
    assert series(text_of(no_gpus), "accelmon_gpudirect_rdma_peer_memory_loaded") == []


@ROLE_RULES
def test_an_hca_trained_below_its_pcie_link_is_a_fault_of_the_gpus_that_use_it(tmp_path):
    """promtool over the collector's own scrapes: mlx5_0, which both GPUs leave by, at x8 of x16 is nic_pcie narrow
    for both (before: no fault); the healthy idle node's HCAs at their best are none (the test above this block)."""
    sysfs, procfs = healthy_idle_node(tmp_path)
    (sysfs / "class" / "infiniband" / "mlx5_0" / "device" / "current_link_width").write_text("8\n")
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"))
    expected = [
        {"labels": f'accelmon:gpu_path_fault{{device="mlx5_0",gpu="{gpu}",instance="n1:19470",node="n1",'
                   f'part="nic_pcie",reason="narrow",uuid="{uuid(gpu)}"}}', "value": 1}
        for gpu in (0, 1)
    ]  # fmt: skip
    assert path_faults_test([text_of(collector) for _ in range(3)], expected, tmp_path) == ""


# The attack on issue 68's topology: files NCCL reads that a bad producer or a careless site makes hostile.
def sample_within(collector: InfinibandCollector) -> list[tuple[str, ...]]:
    return returns_while_blocked(lambda: served(collector, "accelmon_gpu_nic_nearest_info"))


def release(fifo) -> None:
    """Open the FIFO's writing end without waiting, so that a reader left blocked on it (before the fix) ends."""
    import os

    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def hostile_topology_file(path, kind: str) -> None:
    import os

    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    elif kind == "deep-nesting":  # NCCL stops at 256 nodes (topo.h NCCL_TOPO_XML_MAX_NODES); Python's stack at 1000
        path.write_text('<system version="1"><cpu numaid="0">' + '<pci busid="0000:00:00.0">' * 3000
                        + "</pci>" * 3000 + "</cpu></system>")  # fmt: skip
    elif kind == "too-many-nodes":  # 300 sibling devices: NCCL's parser refuses past 256 nodes
        devices = "".join(f'<pci busid="0000:{n // 32:02x}:{n % 32:02x}.0"/>' for n in range(300))
        path.write_text(f'<system version="1"><cpu numaid="0">{devices}</cpu></system>')
    elif kind == "billion-laughs":  # entities: NCCL's parser (xml.cc) knows none and fails on a DOCTYPE
        entities = '<!ENTITY a0 "lol">' + "".join(f'<!ENTITY a{n} "{f"&a{n - 1};" * 10}">' for n in range(1, 7))
        path.write_text(f'<!DOCTYPE system [{entities}]><system version="1"><cpu numaid="0">'
                        '<pci busid="0001:00:00.0" class="&a6;"/></cpu></system>')  # fmt: skip


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "deep-nesting", "too-many-nodes", "billion-laughs"])
def test_a_hostile_topology_file_is_refused_and_sysfs_kept(tmp_path, kind):
    """NCCL_TOPO_FILE a FIFO (opening one waited for a writer for good: the collector's sample hung, every port's
    counters with it), a link to /dev/zero, nesting past Python's recursion limit (RecursionError out of the
    sample), more elements than NCCL's parser takes (256: NCCL fails on it, the file placed 300 devices), entities
    (a billion laughs; NCCL's parser fails on a DOCTYPE): each is not read, logged, and sysfs's places stand."""
    sysfs, procfs = azure_nd_h100_v5(tmp_path)
    hostile = tmp_path / "topo.xml"
    hostile_topology_file(hostile, kind)
    try:
        assert returns_while_blocked(lambda: topology.topo_file_places(str(hostile))) == {}
        collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"),
                                        nccl_topo_file=str(hostile))  # fmt: skip
        assert [row[1] for row in sample_within(collector)][:4] == ["mlx5_ib0", "mlx5_ib2", "mlx5_ib1", "mlx5_ib3"]
    finally:
        if kind == "fifo":
            release(hostile)


@pytest.mark.parametrize(
    "text",
    [
        '<system version="1"><cpu numaid="0"><pci busid="0001:00:00.0">',
        '<system version="1"><cpu numaid="0"></pci></system>',
    ],
)
def test_a_malformed_topology_file_is_skipped_and_counted(tmp_path, text):
    """An unterminated or mismatched topology file fails NCCL's parser (xml.cc xmlLoadSub: "unterminated", "XML
    Mismatch"), and with it the topology detection of every job on the node (topo.cc ncclTopoGetSystem): sysfs's
    places stand and accelmon_nccl_topology_file_refused says so (before: a log line only), 0 once it is mended."""
    sysfs, procfs = azure_nd_h100_v5(tmp_path)
    topo = tmp_path / "topo.xml"
    topo.write_text(text)
    conf = tmp_path / "nccl.conf"
    conf.write_text(f"NCCL_TOPO_FILE={topo}\n")
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(conf))
    assert series(text_of(collector), "accelmon_nccl_topology_file_refused") == [({}, 1.0)]
    azure_topo_file(topo)
    assert series(text_of(collector), "accelmon_nccl_topology_file_refused") == [({}, 0.0)]
    topo.unlink()  # absent: NCCL reads sysfs, as it may
    assert series(text_of(collector), "accelmon_nccl_topology_file_refused") == [({}, 0.0)]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_an_nccl_conf_that_is_no_regular_file_is_not_read(tmp_path, kind):
    """/etc/nccl.conf a FIFO (the sample waited for a writer for good) or a link to /dev/zero (one endless line
    read into memory every sample): not read, as if absent; a real one is read, to its first 64 KiB."""
    sysfs, procfs = healthy_idle_node(tmp_path)
    conf = tmp_path / "nccl.conf"
    hostile_topology_file(conf, kind)
    try:
        collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(conf))
        assert {row[1] for row in sample_within(collector)} == {"mlx5_0"}
        assert returns_while_blocked(lambda: topology.nccl_conf_value(str(conf))) == ""
    finally:
        if kind == "fifo":
            release(conf)
    big = tmp_path / "big.conf"
    big.write_text("NCCL_DEBUG=INFO\n" + "#" * (1 << 20) + "\nNCCL_IB_HCA=mlx5_9\n")
    assert topology.nccl_conf_value(str(big), "NCCL_DEBUG") == "INFO"
    assert topology.nccl_conf_value(str(big)) == ""  # past the first 64 KiB: no conf file is that long


@pytest.mark.parametrize("digits", [20, 5000])
def test_an_nccl_conf_number_past_strtolls_range_takes_nccls_default(tmp_path, digits):
    """NCCL_P2P_PXN_LEVEL past int64 in /etc/nccl.conf: NCCL's strtoll fails with ERANGE and the default (2) stands
    (param.cc `ncclLoadParam`), so point-to-point rails are served; before, 20 digits read as a level of their own
    (no rails) and 5,000 raised ValueError (Python's int() digit limit) out of the sample: no port served at all."""
    sysfs, procfs = hgx_h100(tmp_path)
    nvswitches(procfs)
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_P2P_PXN_LEVEL=" + "9" * digits + "\n")
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(conf))
    assert len(served(collector, "accelmon_gpu_nic_rail_info")) == 8 * 7


def test_a_pcie_gen6_link_is_rated_as_nccl_rates_it(tmp_path):
    """An HGX B300-like tree: GPU and ConnectX-8 (800G) on PCIe Gen6, which sysfs prints `64.0 GT/s PCIe` and NCCL
    rates 480 per lane (topo.cc `kvDictPciGen`), a BlueField-3 front-end port (400G RoCE, Gen5) on the GPU's own
    leaf switch. NCCL: 96 GB/s to the ConnectX-8, 48 to the BlueField: the ConnectX-8. Before, the speed was
    rewritten `64 GT/s`, which no entry starts, and rated as Gen3 (12 GB/s): a tie, won by the nearer BlueField."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    gen6, top = ("64.0 GT/s PCIe", 16), ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]
    gpu(sysfs, procfs, [*top, "0000:02:00.0", "0000:03:00.0", "0000:04:00.0", "0000:05:00.0"], 0, gen6)
    nic(sysfs, "mlx5_0", [*top, "0000:02:00.0", "0000:03:00.0", "0000:04:01.0", "0000:06:00.0"], 0,
        {1: {"rate": "400 Gb/sec (4X NDR)", "link_layer": "Ethernet"}}, GEN5, "MT41692")  # fmt: skip
    nic(sysfs, "mlx5_1", [*top, "0000:02:01.0", "0000:07:00.0", "0000:08:00.0", "0000:09:00.0"], 0,
        {1: {"rate": "800 Gb/sec (4X XDR)"}}, gen6, "MT4131")  # fmt: skip
    number_gpus(procfs)
    cpuinfo(procfs)
    assert nccl_choice(sysfs, procfs) == [("0", "mlx5_1", "1", "PXB")]


def test_the_bridge_readings_session_closing_leaves_the_nvml_collectors_open(fake_nvml):
    """NVML counts initializations and shuts down when the count reaches zero (nvmlShutdown in NVML's API reference):
    the infiniband collector's NVLink bridge reading opens and closes a session of its own beside the nvml
    collector's. The fake shut down at any nvmlShutdown, so a worker of the Molecule cluster lost its NVLink and
    power series once the bridge reading ran (its first session's every call then UNINITIALIZED)."""
    fake_nvml.configure("gpus 2\n")
    collectors = NvmlSession("the nvml collector's", pynvml)
    assert collectors.gpus()
    bridges = NvmlSession("NVLink bridges", pynvml)
    assert bridges.gpus()
    bridges.close()
    assert pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(1)) >= 0
    collectors.close()
