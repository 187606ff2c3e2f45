"""Fixture sysfs trees of InfiniBand HCAs, shaped like real ones (mlx5 with hw_counters, mlx4, OmniPath hfi1)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from tests.support.processes import free_port

COUNTERS = [
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_discards",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "VL15_dropped",
]
HW_COUNTERS = [
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "rx_atomic_requests",
    "rx_dct_connect",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "rx_write_requests",
]


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def add_device(
    sys_root: Path,
    name: str,
    ports: dict[int, dict],
    board_id: str = "MT_0000000838",
    fw_ver: str = "28.39.1002",
    hca_type: str | None = "MT4129",
    pci_address: str = "0000:17:00.0",
    numa_node: int = 0,
    hw_counters: bool = True,
    root: str = "pci0000:00",
) -> None:
    """One HCA. Each port: state, phys_state, rate, link_layer and a counter base value; overrides by name. The PCI
    function sits under root complex `root`, linked from bus/pci/devices as the kernel links it."""
    pci = sys_root / "devices" / root / pci_address
    write(pci / "numa_node", str(numa_node))
    for kind in ("max", "current"):  # its PCIe link, trained at its best (ConnectX-7: Gen5 x16)
        write(pci / f"{kind}_link_speed", "32.0 GT/s PCIe")
        write(pci / f"{kind}_link_width", "16")
    pci_link(sys_root, pci)
    device = pci / "infiniband" / name
    write(device / "board_id", board_id)
    write(device / "fw_ver", fw_ver)
    if hca_type is not None:
        write(device / "hca_type", hca_type)
    # Relative links, like the kernel's, so the tree can be archived and unpacked elsewhere.
    (device / "device").symlink_to(os.path.relpath(pci, device))
    classdir = sys_root / "class" / "infiniband"
    classdir.mkdir(parents=True, exist_ok=True)
    (classdir / name).symlink_to(os.path.relpath(device, classdir))
    for number, port in ports.items():
        base = port.get("base", 1000 * number)
        path = device / "ports" / str(number)
        write(path / "state", port.get("state", "4: ACTIVE"))
        write(path / "phys_state", port.get("phys_state", "5: LinkUp"))
        write(path / "rate", port.get("rate", "400 Gb/sec (4X NDR)"))
        write(path / "link_layer", port.get("link_layer", "InfiniBand"))
        for index, counter in enumerate(COUNTERS):
            value = port.get("counters", {}).get(counter, base + index)
            write(path / "counters" / counter, str(value))
        if hw_counters:
            for index, counter in enumerate(HW_COUNTERS):
                write(path / "hw_counters" / counter, str(port.get("hw", {}).get(counter, base + 100 + index)))


def pci_link(sys_root: Path, function: Path) -> None:
    """bus/pci/devices/<function>, a relative link (the tree is archived and unpacked elsewhere)."""
    links = sys_root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    (links / function.name).symlink_to(os.path.relpath(function, links))


def gpu_functions(sys_root: Path, gpus: int = 8) -> None:
    """The fake driver's GPUs as PCI functions (its bus ids, tests/support/jobs_tree.bus_id): the first half under
    socket 0's root complex beside mlx5_0 and mlx4_0, the rest under socket 1's, so that accelmon.host.topology finds
    each GPU's nearest NIC on the Molecule workers."""
    for index in range(gpus):
        root, numa = ("pci0000:00", 0) if index < gpus // 2 else ("pci0000:80", 1)
        function = sys_root / "devices" / root / f"0000:{0x18 + index * 0x10:02x}:00.0"
        write(function / "numa_node", str(numa))
        pci_link(sys_root, function)


def standard_tree(sys_root: Path) -> Path:
    """Two NDR HCAs, one with a port down and 64-bit counters; a ConnectX-3 without hw_counters."""
    add_device(
        sys_root,
        "mlx5_0",
        {1: {"base": 10, "counters": {"port_rcv_data": 2**40 + 3, "port_xmit_data": 2**33}}},
        pci_address="0000:17:00.0",
        numa_node=0,
    )
    add_device(
        sys_root,
        "mlx5_1",
        {1: {"state": "1: DOWN", "phys_state": "3: Disabled", "rate": "10 Gb/sec (4X SDR)", "base": 0}},
        pci_address="0000:b1:00.0",
        numa_node=1,
        root="pci0000:b0",  # socket 1's root complex
    )
    add_device(
        sys_root,
        "mlx4_0",
        {1: {"rate": "56 Gb/sec (4X FDR)", "base": 7}, 2: {"rate": "40 Gb/sec (4X QDR)", "link_layer": "Ethernet"}},
        board_id="MT_1090120019",
        fw_ver="2.42.5000",
        hca_type="MT4099",
        pci_address="0000:03:00.0",
        numa_node=0,
        hw_counters=False,
    )
    return sys_root


@contextlib.contextmanager
def node_exporter(sysfs: Path) -> Iterator[int]:
    """Debian's node_exporter with only its infiniband collector over `sysfs`, on a loopback port; stopped after."""
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    assert binary, "node_exporter not found: install Debian's prometheus-node-exporter (.ci/run does)"
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            "--collector.disable-defaults",
            "--collector.infiniband",
            f"--path.sysfs={sysfs}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield port
    finally:
        process.terminate()
        process.wait(10)


def scrape_node_exporter(port: int) -> str:
    for _ in range(100):  # bounded: at most ~10 s for it to come up
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                return response.read().decode()
        except OSError:
            time.sleep(0.1)
    raise AssertionError("node_exporter did not answer")


if __name__ == "__main__":
    # python -m tests.support.infiniband_tree OUT.tar.gz: the Molecule workers' sysfs as an archive: the standard
    # tree with the fake driver's GPUs placed beside it (gpu_functions), and Slurm job 100's cgroup (its process
    # 3101 runs on GPUs and is the Neuron runtime llama-serve).
    import tempfile

    from tests.support.jobs_tree import job_cgroup_stats, slurm_job_cgroup

    with tempfile.TemporaryDirectory() as work:
        root = standard_tree(Path(work) / "sys")
        gpu_functions(root)
        slurm_job_cgroup(root / "fs" / "cgroup", 100, (3101,))
        job_cgroup_stats(root / "fs" / "cgroup", 100)
        with tarfile.open(sys.argv[1], "w:gz") as archive:
            archive.add(root, arcname=".")
