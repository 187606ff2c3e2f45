"""PCIe ACS on the bridges of each GPU's NCCL paths (issue 68, point 7): the root pass (accelmon.host.pcie_acs) over
fixture trees whose bridges' `config` files hold an ACS capability, its state file as the pcie_acs collector trusts
and serves it, and the path rule's acs_redirect reason by promtool over the collector's own scrapes. The paths: each
GPU's to the NICs NCCL uses for it (a PXN GPU's through its NVLink peer), and GPU-to-GPU P2P over PCIe."""

from __future__ import annotations

import json
import logging
import os
import struct
import time

import pytest

from accelmon.collectors.pcie_acs import PcieAcsCollector
from accelmon.config import Settings
from accelmon.exporter.registry import Paths
from accelmon.host import pcie_acs
from accelmon.scan import refresh_pcie_acs
from tests.support.exposition import check_golden, promtool_check, series, text_of
from tests.support.jobs_tree import uuid
from tests.support.path_rules import path_faults_test
from tests.support.pci_tree import (
    DGX_H100_COMPUTE,
    GEN4,
    bridge_config,
    bridged_pcie_pair,
    cpuinfo,
    dgx_h100,
    far_compute_hca,
    gpu,
    gpus_without_nics_on_one_socket,
    healthy_idle_node,
    nic,
    number_gpus,
    pcie_server,
)

RR_CR = 0x04 | 0x08  # P2P Request and Completion Redirect: what Linux sets, with SV and UF, where an IOMMU is on
SV = 0x01  # Source Validation alone: ACS on, peer-to-peer not redirected
# The healthy idle node's bridges on its GPUs' paths to mlx5_0, which both use: GPU 0 below the switch they share
# (its upstream port 01:00.0 and two downstream ports), GPU 1 from another root port through the host bridge (PHB:
# NCCL goes through host memory there, so the root pass lists none of them).
GPU0_BRIDGES = ["0000:01:00.0", "0000:02:00.0", "0000:02:01.0"]
GPU1_BRIDGES = ["0000:00:02.0", "0000:05:00.0", "0000:06:00.0", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0"]


def node_with_acs(tmp_path, redirect: str = "0000:02:00.0", unreadable: str = "0000:02:01.0"):
    """The healthy idle node, every bridge with ACS Source Validation on; `redirect` with RR and CR too, and
    `unreadable` giving 64 bytes (as to a process without CAP_SYS_ADMIN)."""
    sysfs, procfs = healthy_idle_node(tmp_path)
    for bridge in {*GPU0_BRIDGES, *GPU1_BRIDGES, "0000:06:01.0"}:
        bridge_config(sysfs, bridge, SV | (RR_CR if bridge == redirect else 0), 64 if bridge == unreadable else 4096)
    return sysfs, procfs


def test_the_acs_control_is_found_along_the_extended_capability_chain(tmp_path):
    sysfs, _ = healthy_idle_node(tmp_path)
    bridge_config(sysfs, "0000:02:00.0", SV | RR_CR)
    bridge_config(sysfs, "0000:02:01.0", None)
    bridge_config(sysfs, "0000:01:00.0", SV, size=64)
    assert pcie_acs.read_control(str(sysfs), "0000:02:00.0") == 0x0D
    assert pcie_acs.read_control(str(sysfs), "0000:02:01.0") == 0  # no ACS capability: nothing redirects
    assert pcie_acs.read_control(str(sysfs), "0000:01:00.0") is None  # unknown, not 0
    assert pcie_acs.read_control(str(sysfs), "0000:00:02.0") is None  # no config file
    looped = bytearray(4096)
    struct.pack_into("<I", looped, 0x100, 0x0001 | 0x100 << 20)  # a capability whose next is itself
    assert pcie_acs.acs_control(bytes(looped)) == 0
    gone = bytes(0x100) + b"\xff" * 0xF00  # a function removed reads all ones
    assert pcie_acs.acs_control(gone) is None


def test_the_root_pass_lists_each_gpus_bridges_to_its_nccl_nic_with_their_acs(tmp_path):
    sysfs, procfs = node_with_acs(tmp_path)
    state = pcie_acs.survey(str(sysfs), str(procfs))
    assert state["paths"] == [
        {"gpu": "0", "uuid": uuid(0), "device": "mlx5_0", "bridges": GPU0_BRIDGES},
        {"gpu": "1", "uuid": uuid(1), "device": "mlx5_0", "bridges": []},
    ]
    assert state["bridges"]["0000:02:00.0"] == SV | RR_CR
    assert state["bridges"]["0000:01:00.0"] == SV
    assert state["bridges"]["0000:02:01.0"] is None
    assert "0000:00:01.0" not in state["bridges"]  # a root port: on no PIX or PXB path
    assert "0000:06:01.0" not in state["bridges"]  # the storage HCA's port: no GPU's NCCL path


def test_a_dgx_h100s_gpus_cross_both_switch_levels_to_their_own_hca_and_unread_bridges_stay_unknown(tmp_path):
    """PXB through a top switch and two leaves: each GPU's path to its compute HCA crosses the top switch's upstream
    port, its two downstream ports and each leaf's two ports (7); bridges whose config cannot be read are null."""
    sysfs, procfs = dgx_h100(tmp_path)
    state = pcie_acs.survey(str(sysfs), str(procfs))
    assert [(p["gpu"], p["device"], len(p["bridges"])) for p in state["paths"]] == [
        (str(i), DGX_H100_COMPUTE[i], 7) for i in range(8)
    ]
    assert state["paths"][0]["bridges"][:2] == ["0000:18:00.0", "0000:19:00.0"]
    assert set(state["bridges"].values()) == {None}


@pytest.mark.e2e
def test_a_healthy_gpu_whose_nic_is_on_another_root_port_records_no_acs_fault(tmp_path):
    """The far-HCA node (GPU 0 on socket 0, its compute HCA on socket 1: SYS) with the IOMMU on: Linux sets Source
    Validation, P2P Request and Completion Redirect and Upstream Forwarding on every root port with ACS
    (pci_std_enable_acs). NCCL turns GPUDirect RDMA off beyond PXB (paths.cc ncclTopoCheckGdr) and goes through host
    memory, which that does not slow: no bridge is listed and promtool records no fault. Before, both root ports
    were listed and acs_redirect recorded for good."""
    sysfs, procfs = far_compute_hca(tmp_path)
    for root_port in ("0000:00:01.0", "0000:20:01.0", "0000:80:01.0"):
        bridge_config(sysfs, root_port, SV | RR_CR | 0x10)
    state = pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), time.time())
    assert [(p["gpu"], p["device"], p["bridges"]) for p in state["paths"]] == [("0", "mlx5_1", [])]
    assert state["bridges"] == {}
    collector = collector_of(sysfs, procfs, tmp_path)
    assert path_faults_test([text_of(collector) for _ in range(3)], [], tmp_path) == ""


def collector_of(sysfs, procfs, tmp_path, **options) -> PcieAcsCollector:
    options = {"state": str(tmp_path / "acs.json"), "owner": os.getuid(), **options}
    return PcieAcsCollector(procfs=str(procfs), **options)


def acs_series(text: str) -> dict[str, object]:
    return {
        "checked": series(text, "accelmon_pcie_acs_checked"),
        "redirect": {labels["bridge"]: value for labels, value in series(text, "accelmon_pcie_acs_redirect")},
        "unknown": {labels["bridge"]: value for labels, value in series(text, "accelmon_pcie_acs_unknown") if value},
        "refused": series(text, "accelmon_pcie_acs_state_refused_total"),
    }


def test_the_exporter_serves_the_root_passs_acs_and_a_bridge_it_could_not_read_as_unknown(tmp_path):
    sysfs, procfs = node_with_acs(tmp_path)
    pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), time.time())
    text = text_of(collector_of(sysfs, procfs, tmp_path))
    promtool_check(text)
    served = acs_series(text)
    assert served["checked"] == [({"reason": "read"}, 1.0)]
    assert served["redirect"] == {"0000:01:00.0": 0.0, "0000:02:00.0": 1.0}
    assert served["unknown"] == {"0000:02:01.0": 1.0}
    crossed = {(labels["gpu"], labels["bridge"]) for labels, _ in series(text, "accelmon_gpu_pcie_path_bridge_info")}
    assert crossed == {("0", b) for b in GPU0_BRIDGES}


def test_the_health_hooks_root_pass_writes_the_state_where_the_exporter_reads_it(tmp_path):
    sysfs, procfs = node_with_acs(tmp_path)
    settings = Settings()
    settings.paths = Paths(sysfs=str(sysfs), procfs=str(procfs))
    settings.collector("pcie_acs").options["pcie_acs_state"] = str(tmp_path / "acs.json")
    refresh_pcie_acs(settings, logging.getLogger("test"))
    status = os.stat(tmp_path / "acs.json")
    assert status.st_mode & 0o777 == 0o644
    assert json.loads((tmp_path / "acs.json").read_text())["bridges"]["0000:02:00.0"] == SV | RR_CR


@pytest.mark.parametrize("spoil, reason", [
    (lambda path: path.unlink(), "missing"),
    (lambda path: path.chmod(0o666), "untrusted"),
    (lambda path: path.chmod(0o664), "untrusted"),
    (lambda path: (path.rename(path.with_name("r.json")), path.symlink_to(path.with_name("r.json"))), "untrusted"),
    (lambda path: path.write_text('{"version": 1, "bridges": [], "paths": []}'), "malformed"),
    (lambda path: path.write_text("not json"), "malformed"),
])  # fmt: skip
def test_a_missing_untrusted_or_malformed_state_is_not_checked_and_counted(tmp_path, spoil, reason):
    """Hostile input: a file others may write, a link, or not the root pass's is refused (counted once a version),
    never served as ACS off."""
    sysfs, procfs = node_with_acs(tmp_path)
    state = tmp_path / "acs.json"
    pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(state), time.time())
    spoil(state)
    collector = collector_of(sysfs, procfs, tmp_path)
    text_of(collector)
    served = acs_series(text_of(collector))
    assert served["checked"] == [({"reason": reason}, 0.0)]
    assert served["redirect"] == {} and served["unknown"] == {}
    assert served["refused"] == [({}, 0.0 if reason == "missing" else 1.0)]


def test_a_state_not_roots_or_too_old_is_not_checked(tmp_path):
    sysfs, procfs = node_with_acs(tmp_path)
    pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), time.time())
    other = collector_of(sysfs, procfs, tmp_path, owner=os.getuid() + 1)
    assert acs_series(text_of(other))["checked"] == [({"reason": "untrusted"}, 0.0)]
    late = collector_of(sysfs, procfs, tmp_path, max_age=3600.0, wall=lambda: time.time() + 7200)
    assert acs_series(text_of(late))["checked"] == [({"reason": "stale"}, 0.0)]
    early = collector_of(sysfs, procfs, tmp_path, wall=lambda: time.time() - 600)  # the clock stepped back
    assert acs_series(text_of(early))["checked"] == [({"reason": "stale"}, 0.0)]


def test_entries_with_hostile_names_are_skipped_and_counted(tmp_path):
    sysfs, procfs = node_with_acs(tmp_path)
    path = tmp_path / "acs.json"
    state = pcie_acs.survey(str(sysfs), str(procfs))
    state["bridges"]['0000:02:00.0"} 1\nevil'] = 4
    state["bridges"]["0000:05:00.0"] = 1 << 20  # past 16 bits: no control register
    state["paths"].append({"gpu": "2", "uuid": 'G"', "device": "mlx5_0", "bridges": []})
    pcie_acs.write_state(str(path), state, time.time())
    text = text_of(collector_of(sysfs, procfs, tmp_path))
    promtool_check(text)
    assert series(text, "accelmon_pcie_acs_state_entries_skipped") == [({}, 3.0)]  # two bridges, one path
    assert {labels["gpu"] for labels, _ in series(text, "accelmon_gpu_pcie_path_bridge_info")} == {"0"}


@pytest.mark.e2e
def test_a_bridge_redirecting_peer_to_peer_is_a_path_fault_of_the_gpus_that_cross_it(tmp_path):
    """promtool over the collector's own scrapes: RR and CR on GPU 0's downstream port put GPU 0's path to mlx5_0
    at fault (pcie_path acs_redirect), not GPU 1's; the bridge that could not be read is no fault."""
    sysfs, procfs = node_with_acs(tmp_path)
    pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), time.time())
    collector = collector_of(sysfs, procfs, tmp_path)
    expected = [{"labels": f'accelmon:gpu_path_fault{{device="mlx5_0",gpu="0",instance="n1:19470",node="n1",'
                           f'part="pcie_path",reason="acs_redirect",uuid="{uuid(0)}"}}', "value": 1}]  # fmt: skip
    assert path_faults_test([text_of(collector) for _ in range(3)], expected, tmp_path) == ""
    bridge_config(sysfs, "0000:02:00.0", SV)
    pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), time.time())
    assert path_faults_test([text_of(collector) for _ in range(3)], [], tmp_path) == ""


def pcie_gpu_server(root, nics: bool = True):
    """An 8-GPU PCIe server without NVLink (L40S or A100 PCIe cards, Gen4 x16): two sockets, two root complexes each,
    a PCIe switch on each with two GPUs and (with `nics`) one 400G HCA on its downstream ports. NCCL: the two GPUs
    of a switch PIX to each other (P2P, within PXB) and to their HCA, which both use; GPUs of different switches
    PHB or SYS to each other (no P2P: paths.cc `ncclTopoCheckP2p`'s PXB)."""
    sysfs, procfs = root / "sys", root / "proc"
    for index, bus in enumerate((0x10, 0x30, 0x90, 0xB0)):
        top = [f"pci0000:{bus:02x}", f"0000:{bus:02x}:01.0", f"0000:{bus + 1:02x}:00.0"]
        for leaf in range(2):
            gpu(sysfs, procfs, [*top, f"0000:{bus + 2:02x}:{leaf:02x}.0", f"0000:{bus + 3 + leaf:02x}:00.0"],
                index // 2, GEN4)  # fmt: skip
        if nics:
            nic(sysfs, f"mlx5_{index}", [*top, f"0000:{bus + 2:02x}:02.0", f"0000:{bus + 5:02x}:00.0"], index // 2,
                None, GEN4)  # fmt: skip
    number_gpus(procfs)
    cpuinfo(procfs)
    return sysfs, procfs


def switch_bridges(bus: int, *ports: int) -> list[str]:
    """A switch's upstream port and the named downstream ports, in the order the root pass lists them."""
    return [f"0000:{bus + 1:02x}:00.0", *(f"0000:{bus + 2:02x}:{port:02x}.0" for port in ports)]


def test_a_pxn_gpu_crosses_its_nvlink_peers_bridges_to_the_nic(tmp_path):
    """GPUs 2 and 3 (socket 1, no NIC) reach mlx5_0 and mlx5_1 by PXN through GPUs 0 and 1 (NVSwitches): their
    traffic goes over NVLink to the peer and down the peer's PCIe path, so the peer's bridges are theirs too. Before,
    a PXN path listed no bridge and no ACS fault could reach GPUs 2 and 3."""
    sysfs, procfs = gpus_without_nics_on_one_socket(tmp_path)
    state = pcie_acs.survey(str(sysfs), str(procfs))
    own = {(p["gpu"], p["device"]): p["bridges"] for p in state["paths"] if "via" not in p}
    relayed = {(p["gpu"], p["device"], p["via"]): p["bridges"] for p in state["paths"] if "via" in p}
    assert own == {("0", "mlx5_0"): switch_bridges(0x10, 0, 1), ("1", "mlx5_1"): switch_bridges(0x20, 0, 1)}
    assert relayed == {
        (g, f"mlx5_{peer}", str(peer)): switch_bridges(0x10 + 0x10 * peer, 0, 1) for g in "23" for peer in (0, 1)
    }
    assert state["p2p"] == []  # NVLink joins every GPU: no PCIe P2P


def test_gpus_without_nvlink_list_the_bridges_of_their_pcie_p2p(tmp_path):
    """The PCIe server: each switch's two GPUs are PIX to each other, so NCCL's P2P between them crosses the
    switch's upstream port and their two downstream ports; no pair across switches (PHB, SYS: past PXB). With
    NVSwitches (a DGX H100) no pair at all: NVLink carries it."""
    sysfs, procfs = pcie_gpu_server(tmp_path)
    state = pcie_acs.survey(str(sysfs), str(procfs))
    pairs = {(p["gpu"], p["peer"]): p["bridges"] for p in state["p2p"]}
    buses = (0x10, 0x30, 0x90, 0xB0)
    assert pairs == {
        (str(2 * k + a), str(2 * k + 1 - a)): switch_bridges(bus, a, 1 - a)
        for k, bus in enumerate(buses)
        for a in (0, 1)
    }
    assert [(p["gpu"], p["device"]) for p in state["paths"]] == [(str(g), f"mlx5_{g // 2}") for g in range(8)]
    dgx = pcie_acs.survey(*map(str, dgx_h100(tmp_path / "dgx")))
    assert dgx["p2p"] == []


@pytest.mark.parametrize("conf, cpu, expected", [
    ("", "GenuineIntel", {("0", "1"), ("1", "0")}),  # PXB through the two-level switch tree; GPU 2 is PHB
    ("NCCL_P2P_LEVEL=PIX\n", "GenuineIntel", set()),
    ("NCCL_P2P_LEVEL=SYS\n", "GenuineIntel", {(a, b) for a in "012" for b in "012" if a != b}),
    ("NCCL_P2P_LEVEL=3\n", "GenuineIntel", {(a, b) for a in "012" for b in "012" if a != b}),  # old 3: PHB
    ("NCCL_P2P_LEVEL=1\n", "GenuineIntel", set()),  # old 1: PIX
    ("NCCL_P2P_LEVEL=SYS\nNCCL_P2P_DISABLE=1\n", "GenuineIntel", set()),
    ("", "AuthenticAMD", {("0", "1"), ("1", "0")}),  # SYS on AMD only with 2 GPUs at most; this node has 3
])  # fmt: skip
def test_the_p2p_pairs_follow_ncclss_p2p_level(tmp_path, conf, cpu, expected):
    """paths.cc `ncclTopoCheckP2p`: P2P within PXB by default, NCCL_P2P_LEVEL by name or old number,
    NCCL_P2P_DISABLE=1 none, read from /etc/nccl.conf as the root pass reads it."""
    sysfs, procfs = pcie_server(tmp_path)
    cpuinfo(procfs, cpu)
    (tmp_path / "nccl.conf").write_text(conf)
    state = pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "nccl.conf"), str(tmp_path / "acs.json"), 0.0)
    assert {(p["gpu"], p["peer"]) for p in state["p2p"]} == expected


def test_an_amd_node_of_two_gpus_takes_p2p_across_sockets(tmp_path):
    """NCCL allows P2P between pairs of GPUs on AMD systems (p2pLevel SYS with 2 GPUs at most)."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    gpu(sysfs, procfs, ["pci0000:00", "0000:00:01.0", "0000:01:00.0"], 0, GEN4)
    gpu(sysfs, procfs, ["pci0000:80", "0000:80:01.0", "0000:81:00.0"], 1, GEN4)
    number_gpus(procfs)
    cpuinfo(procfs, "AuthenticAMD", 25, 0x11)
    state = pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), 0.0)
    assert {(p["gpu"], p["peer"]): p["bridges"] for p in state["p2p"]} == {
        ("0", "1"): [],
        ("1", "0"): [],
    }  # fmt: skip: through the root complex, which a root port's ACS does not slow


def pcie_gpu_server_with_acs(tmp_path, redirect=(), nics: bool = True):
    """The PCIe server, every switch port with ACS Source Validation on, those in `redirect` with RR and CR too."""
    sysfs, procfs = pcie_gpu_server(tmp_path, nics)
    for bus in (0x10, 0x30, 0x90, 0xB0):
        for bridge in switch_bridges(bus, *((0, 1, 2) if nics else (0, 1))):
            bridge_config(sysfs, bridge, SV | (RR_CR if bridge in redirect else 0))
    return sysfs, procfs


def test_the_exporter_serves_each_gpu_pairs_p2p_bridges(tmp_path):
    sysfs, procfs = pcie_gpu_server_with_acs(tmp_path, nics=False)
    pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), time.time())
    text = text_of(collector_of(sysfs, procfs, tmp_path))
    promtool_check(text)
    crossed = series(text, "accelmon_gpu_pcie_p2p_bridge_info")
    assert {(labels["gpu"], labels["peer_gpu"]) for labels, _ in crossed} == {
        (str(a), str(a ^ 1)) for a in range(8)}  # fmt: skip
    assert {labels["bridge"] for labels, _ in crossed if labels["gpu"] == "0"} == set(switch_bridges(0x10, 0, 1))
    assert series(text, "accelmon_gpu_pcie_path_bridge_info") == []  # no NIC: no GPU-NIC path


def test_p2p_entries_with_hostile_names_are_skipped_and_counted(tmp_path):
    sysfs, procfs = pcie_gpu_server_with_acs(tmp_path, nics=False)
    state = pcie_acs.survey(str(sysfs), str(procfs))
    state["p2p"] += [
        {"gpu": "0", "uuid": uuid(0), "peer": '1"} 1', "bridges": []},
        {"gpu": "0", "uuid": uuid(0), "peer": "1", "bridges": ["0000:ff:00.0"]},  # a bridge the state does not hold
        {"gpu": "0", "uuid": uuid(0)},
    ]
    pcie_acs.write_state(str(tmp_path / "acs.json"), state, time.time())
    text = text_of(collector_of(sysfs, procfs, tmp_path))
    promtool_check(text)
    assert series(text, "accelmon_pcie_acs_state_entries_skipped") == [({}, 3.0)]
    assert len(series(text, "accelmon_gpu_pcie_p2p_bridge_info")) == 8 * 3


def test_a_state_without_p2p_from_an_older_root_pass_is_read(tmp_path):
    sysfs, procfs = node_with_acs(tmp_path)
    state = pcie_acs.survey(str(sysfs), str(procfs))
    del state["p2p"]
    pcie_acs.write_state(str(tmp_path / "acs.json"), state, time.time())
    text = text_of(collector_of(sysfs, procfs, tmp_path))
    assert acs_series(text)["checked"] == [({"reason": "read"}, 1.0)]
    assert len(series(text, "accelmon_gpu_pcie_path_bridge_info")) == len(GPU0_BRIDGES)


def test_the_acs_options_once_the_infiniband_collectors_are_still_taken(tmp_path):
    """Configs written while the infiniband collector served ACS set its pcie_acs_state there: it is one setting
    with the pcie_acs collector's, which the root pass and the collector read."""
    from accelmon.config import load
    from accelmon.scan import build_samplers

    sysfs, procfs = node_with_acs(tmp_path)
    config = tmp_path / "exporter.yml"
    config.write_text(
        f"paths: {{sysfs: {sysfs}, procfs: {procfs}}}\n"
        f"collectors:\n  infiniband: {{pcie_acs_state: {tmp_path / 'old.json'}, pcie_acs_max_age_seconds: 60}}\n"
    )
    settings = load(str(config))
    assert settings.collector("pcie_acs").options == {
        "pcie_acs_state": str(tmp_path / "old.json"), "pcie_acs_max_age_seconds": 60}  # fmt: skip
    refresh_pcie_acs(settings, logging.getLogger("test"))
    assert json.loads((tmp_path / "old.json").read_text())["bridges"]["0000:02:00.0"] == SV | RR_CR
    (collector,) = [s.collector for s in build_samplers(settings) if s.name == "pcie_acs"]
    assert collector.acs.path == str(tmp_path / "old.json") and collector.acs.max_age == 60


def fault(gpu: int, **labels: str) -> dict[str, object]:
    names = {"gpu": str(gpu), "instance": "n1:19470", "node": "n1", "part": "pcie_path", "reason": "acs_redirect",
             "uuid": uuid(gpu), **labels}  # fmt: skip
    return {"labels": "accelmon:gpu_path_fault{" + ",".join(f'{k}="{v}"' for k, v in sorted(names.items())) + "}",
            "value": 1}  # fmt: skip


@pytest.mark.e2e
def test_a_redirect_on_a_pxn_peers_path_is_a_fault_of_the_gpus_relaying_through_it(tmp_path):
    """promtool over the collector's own scrapes: RR and CR on GPU 0's downstream port put GPU 0's path to mlx5_0
    at fault, and GPUs 2 and 3's, which reach mlx5_0 by PXN through GPU 0; ACS off, no fault anywhere."""
    sysfs, procfs = gpus_without_nics_on_one_socket(tmp_path)
    for peer in (0, 1):
        for bridge in switch_bridges(0x10 + 0x10 * peer, 0, 1):
            bridge_config(sysfs, bridge, SV | (RR_CR if bridge == "0000:12:00.0" else 0))
    pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), time.time())
    collector = collector_of(sysfs, procfs, tmp_path)
    expected = [fault(g, device="mlx5_0") for g in (0, 2, 3)]
    assert path_faults_test([text_of(collector) for _ in range(3)], expected, tmp_path) == ""
    bridge_config(sysfs, "0000:12:00.0", SV)
    pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), time.time())
    assert path_faults_test([text_of(collector) for _ in range(3)], [], tmp_path) == ""


@pytest.mark.e2e
@pytest.mark.parametrize("nics", [True, False])
def test_a_redirect_between_two_pcie_gpus_is_a_fault_of_both(tmp_path, nics):
    """promtool over the collector's own scrapes: RR and CR on GPU 1's downstream port put the P2P of GPUs 0 and 1
    at fault (each with peer_gpu the other) and, where it has one, GPU 1's path to its HCA; the other pairs, and a
    node whose bridges are all sound, record none."""
    sysfs, procfs = pcie_gpu_server_with_acs(tmp_path, ["0000:12:01.0"], nics)
    pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), time.time())
    collector = collector_of(sysfs, procfs, tmp_path)
    expected = [fault(0, peer_gpu="1"), fault(1, peer_gpu="0"), *([fault(1, device="mlx5_0")] if nics else [])]
    assert path_faults_test([text_of(collector) for _ in range(3)], expected, tmp_path) == ""
    bridge_config(sysfs, "0000:12:01.0", SV)
    pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), time.time())
    assert path_faults_test([text_of(collector) for _ in range(3)], [], tmp_path) == ""


def test_golden(tmp_path):
    """The collector's whole part of a scrape on the PCIe server with a redirect on GPU 1's downstream port, pinned."""
    sysfs, procfs = pcie_gpu_server_with_acs(tmp_path, ["0000:12:01.0"])
    pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), 1_000_000.0)
    text = text_of(collector_of(sysfs, procfs, tmp_path, wall=lambda: 1_000_060.0))
    promtool_check(text)
    check_golden("pcie_acs_pcie_gpu_server.prom", text, collector="pcie_acs")


def test_the_root_pass_takes_nvlink_bridges_as_the_infiniband_collector_does(tmp_path, fake_nvml):
    """Two PCIe GPUs an NVLink bridge joins (no NVSwitch): NCCL sends GPU 1's traffic to GPU 0's HCA through GPU 0
    (PXN, NVLink read from NVML), so the root pass lists GPU 0's bridges for GPU 1 too, via GPU 0, as the collector
    chooses (accelmon.host.nccl_nics). Before, the pass knew NVLink from NVSwitches only: GPU 1 was PHB, its traffic
    through the root complex and its fault on GPU 0's bridges never recorded."""
    import pynvml

    sysfs, procfs = bridged_pcie_pair(tmp_path)
    bridges = [f"nvlink_peer {g} {link} {1 - g}" for g in (0, 1) for link in range(12)]
    fake_nvml.configure("\n".join(["gpus 2", "nvlink_unbridged 0 12", "nvlink_unbridged 1 12", *bridges]) + "\n")
    state = pcie_acs.refresh(str(sysfs), str(procfs), str(tmp_path / "none"), str(tmp_path / "acs.json"), 0.0,
                             nvml=pynvml)  # fmt: skip
    paths = {(p["gpu"], p["device"], p.get("via")): p["bridges"] for p in state["paths"]}
    mine = ["0000:16:00.0", "0000:17:00.0", "0000:17:01.0"]  # GPU 0's switch: upstream, its port, the HCA's
    assert paths == {("0", "mlx5_0", None): mine, ("1", "mlx5_0", "0"): mine}
    assert state["p2p"] == []  # NVLink carries the pair's P2P
