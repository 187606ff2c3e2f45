"""Which path joins each GPU to each RDMA NIC (accelmon.topology), on fixture trees of real node layouts
(tests/support/pci_tree.py, each with its expected matrix), and as the infiniband collector serves it (issue 59)."""

from __future__ import annotations

from accelmon import topology
from accelmon.collectors.infiniband import InfinibandCollector
from tests.support.exposition import promtool_check, series, text_of
from tests.support.jobs_tree import uuid
from tests.support.pci_tree import PCIE_EXPECTED, hgx_expected, hgx_h100, pcie_server


def test_an_hgx_board_pairs_each_gpu_with_its_own_nic(tmp_path):
    """8 GPUs, 8 NICs, two sockets: each GPU's own NIC behind its switch (PIX), the socket's others across host
    bridges (NODE), the other socket's across the CPUs' interconnect (SYS); each GPU's nearest is its own NIC."""
    sysfs, procfs = hgx_h100(tmp_path)
    pairs = topology.gpu_nic_pairs(str(sysfs), str(procfs))
    assert len(pairs) == 64
    assert {(p.gpu, p.device): p.link for p in pairs} == {
        (str(g), f"mlx5_{n}"): hgx_expected(g, n) for g in range(8) for n in range(8)
    }
    assert [(p.gpu, p.uuid, p.device) for p in topology.nearest(pairs)] == [
        (str(g), uuid(g), f"mlx5_{g}") for g in range(8)
    ]


def test_a_pcie_server_tells_one_switch_from_several_and_the_far_socket(tmp_path):
    sysfs, procfs = pcie_server(tmp_path)
    pairs = topology.gpu_nic_pairs(str(sysfs), str(procfs))
    assert {(p.gpu, p.device): p.link for p in pairs} == PCIE_EXPECTED
    assert {(p.gpu, p.device) for p in topology.nearest(pairs)} == {("0", "mlx5_1"), ("1", "mlx5_1"), ("2", "mlx5_1")}


def test_the_infiniband_collector_serves_the_pairs_and_follows_a_device_that_goes(tmp_path):
    sysfs, procfs = pcie_server(tmp_path)
    collector = InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs))
    text = text_of(collector)
    promtool_check(text)
    served = {(labels["gpu"], labels["device"]): labels["link"] for labels, _ in series(text, "accelmon_gpu_nic_info")}
    assert served == PCIE_EXPECTED
    nearest = series(text, "accelmon_gpu_nic_nearest_info")
    assert [(labels["gpu"], labels["uuid"], labels["device"]) for labels, _ in nearest] == [
        ("0", uuid(0), "mlx5_1"), ("1", uuid(1), "mlx5_1"), ("2", uuid(2), "mlx5_1"),
    ]  # fmt: skip
    (sysfs / "class" / "infiniband" / "mlx5_1" / "device").unlink()  # hot-removed: the next sample follows
    (sysfs / "class" / "infiniband" / "mlx5_1").rmdir()
    again = {
        (labels["gpu"], labels["device"]) for labels, _ in series(text_of(collector), "accelmon_gpu_nic_nearest_info")
    }
    assert again == {("0", "mlx5_0"), ("1", "mlx5_0"), ("2", "mlx5_0")}


def test_a_node_without_gpus_or_with_an_unknown_place_serves_no_pair(tmp_path):
    sysfs, procfs = pcie_server(tmp_path)
    assert topology.gpu_nic_pairs(str(sysfs), str(tmp_path / "no-proc")) == []
    (sysfs / "bus" / "pci" / "devices" / "0000:81:00.0").unlink()  # the far NIC's function not in sysfs
    assert {p.device for p in topology.gpu_nic_pairs(str(sysfs), str(procfs))} == {"mlx5_1"}
