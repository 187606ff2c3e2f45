"""accelmon-drill nic (issue 59): a NIC port rehearsed as at fault is served as a drill by the infiniband collector
(the master's rules then treat it as a NIC at fault, saying DRILL: master/prometheus/tests/alerts-test.yml), while the
port's real counters and state are served as they are; it ends by itself or at `stop`; bad arguments change nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from accelmon.collectors.infiniband import InfinibandCollector
from accelmon.health import drill_store
from tests.support.exposition import sample_value, series, text_of
from tests.support.infiniband_tree import standard_tree

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(os.geteuid() != 0, reason="accelmon-drill nic and stop need root"),
]


@pytest.fixture
def node(tmp_path):
    sysfs = standard_tree(tmp_path / "sys")
    config = tmp_path / "exporter.yml"
    config.write_text(f"paths: {{sysfs: {sysfs}}}\ncollectors: {{health: {{drill_dir: {tmp_path / 'drills'}}}}}\n")
    return config, sysfs, tmp_path / "drills"


def drill(config, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "accelmon.drills.drill", "--config", str(config), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_drilled_port_is_served_as_a_drill_and_its_counters_as_they_are(node):
    config, sysfs, drills = node
    collector = InfinibandCollector(sysfs=str(sysfs), drill_dir=str(drills))
    before = text_of(collector)
    started = drill(config, "nic", "--device", "mlx5_0", "--minutes", "5")
    assert started.returncode == 0, started.stderr
    assert "drill started: mlx5_0 port 1 at fault" in started.stdout
    during = text_of(collector)
    assert series(during, "accelmon_infiniband_drill_active") == [({"device": "mlx5_0", "port": "1"}, 1.0)]
    drilled_out = "\n".join(line for line in during.splitlines() if "drill_active" not in line)
    assert drilled_out == "\n".join(line for line in before.splitlines() if "drill_active" not in line)
    assert "NIC mlx5_0 port 1: at fault" in drill(config, "status").stdout
    assert drill(config, "stop", "--device", "mlx5_0").stdout.strip() == "1 drill(s) ended."
    assert series(text_of(collector), "accelmon_infiniband_drill_active") == []
    # A stop narrowed to GPU drills leaves a NIC drill; a plain stop ends it.
    assert drill(config, "nic", "--device", "mlx5_0").returncode == 0
    assert drill(config, "stop", "--check", "ecc").stdout.startswith("0 drill(s) ended.")
    assert drill(config, "stop").stdout.startswith("1 drill(s) ended.")
    assert not drill_store.nic_drills(str(drills))


def test_a_drill_ends_by_itself(node):
    config, sysfs, drills = node
    now = time.time()
    drill_store.write_record(str(drills), drill_store.nic_file_name("mlx5_0", "1"),
                             {"device": "mlx5_0", "port": "1", "started": now - 600, "expires": now - 1})  # fmt: skip
    collector = InfinibandCollector(sysfs=str(sysfs), drill_dir=str(drills))
    assert sample_value(text_of(collector), "accelmon_infiniband_drill_active", device="mlx5_0", port="1") is None
    assert "ended by itself" in drill(config, "status").stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--device", "mlx5_9"), "this node's RDMA devices are mlx4_0, mlx5_0, mlx5_1"),
        (("--device", "../etc"), "this node's RDMA devices are"),
        (("--device", "mlx5_0", "--port", "3"), "mlx5_0 has no such port"),
        (("--device", "mlx5_0", "--minutes", "0"), "--minutes 0: from more than 0"),
    ],
)
def test_bad_arguments_change_nothing(node, args, says):
    config, _, drills = node
    refused = drill(config, "nic", *args)
    assert refused.returncode == 2 and says in refused.stderr and "nothing changed" in refused.stderr
    assert not drills.exists() or not os.listdir(drills)


def test_a_drill_names_the_gpus_that_use_the_port_and_refuses_one_no_gpu_uses(tmp_path):
    """Issue 68, point 9: `accelmon-drill nic` accepted any device and never said which GPUs use it. On a node where
    NCCL sends both GPUs' traffic by mlx5_0 port 1, the storage HCA (mlx5_6) and the uncabled second port are
    refused (a drill of them rehearses nothing the rules show), and the compute port's drill names GPU 0 and 1."""
    from tests.support.pci_tree import healthy_idle_node

    sysfs, procfs = healthy_idle_node(tmp_path)
    config = tmp_path / "exporter.yml"
    config.write_text(f"paths: {{sysfs: {sysfs}, procfs: {procfs}}}\n"
                      f"collectors: {{health: {{drill_dir: {tmp_path / 'drills'}}}}}\n")  # fmt: skip
    for device, port in (("mlx5_6", "1"), ("mlx5_0", "2")):
        refused = drill(config, "nic", "--device", device, "--port", port)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert (
            f"--device {device} --port {port}: no GPU's traffic leaves by it (NCCL's: mlx5_0 port 1)" in refused.stderr
        )
    assert not drill_store.nic_drills(str(tmp_path / "drills"))
    started = drill(config, "nic", "--device", "mlx5_0")
    assert started.returncode == 0, started.stderr
    assert "GPU 0, 1 use it" in started.stdout


def test_a_drill_names_the_gpus_as_the_collector_does_with_the_nccl_topology_file(tmp_path):
    """An Azure ND H100 v5 VM: NCCL reads Azure's NCCL_TOPO_FILE, which puts each GPU beside its own VF (GPU 1 uses
    mlx5_ib1), as the infiniband collector's nccl_topo_file option says. The drill reads the same (accelmon.host
    .nccl_nics); before, it ignored the file and named GPU 2 for mlx5_ib1 (sysfs's PHB, in device order)."""
    from tests.support.pci_tree import azure_nd_h100_v5, azure_topo_file

    sysfs, procfs = azure_nd_h100_v5(tmp_path)
    topo = azure_topo_file(tmp_path / "topo.xml")
    config = tmp_path / "exporter.yml"
    config.write_text(f"paths: {{sysfs: {sysfs}, procfs: {procfs}}}\n"
                      f"collectors: {{health: {{drill_dir: {tmp_path / 'drills'}}}, "
                      f"infiniband: {{nccl_topo_file: {topo}}}}}\n")  # fmt: skip
    started = drill(config, "nic", "--device", "mlx5_ib1")
    assert started.returncode == 0, started.stderr
    assert "GPU 1 use it" in started.stdout
