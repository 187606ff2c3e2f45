"""PCIe ACS on the bridges of each GPU's NCCL path (issue 68, point 7): the root pass (accelmon.host.pcie_acs) over
fixture trees whose bridges' `config` files hold an ACS capability, its state file as the infiniband collector
trusts and serves it, and the path rule's acs_redirect reason by promtool over the collector's own scrapes."""

from __future__ import annotations

import json
import logging
import os
import struct
import time

import pytest

from accelmon.collectors.infiniband import InfinibandCollector
from accelmon.config import Settings
from accelmon.exporter.registry import Paths
from accelmon.host import pcie_acs
from accelmon.scan import refresh_pcie_acs
from tests.support.exposition import promtool_check, series, text_of
from tests.support.jobs_tree import uuid
from tests.support.path_rules import path_faults_test
from tests.support.pci_tree import DGX_H100_COMPUTE, bridge_config, dgx_h100, healthy_idle_node

RR_CR = 0x04 | 0x08  # P2P Request and Completion Redirect: what Linux sets, with SV and UF, where an IOMMU is on
SV = 0x01  # Source Validation alone: ACS on, peer-to-peer not redirected
# The healthy idle node's bridges on its GPUs' paths to mlx5_0, which both use: GPU 0 below the switch they share
# (its upstream port 01:00.0 and two downstream ports), GPU 1 from another root port through the host bridge.
GPU0_BRIDGES = ["0000:01:00.0", "0000:02:00.0", "0000:02:01.0"]
GPU1_BRIDGES = ["0000:00:02.0", "0000:05:00.0", "0000:06:00.0", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0"]


def node_with_acs(tmp_path, redirect: str = "0000:02:00.0", unreadable: str = "0000:00:02.0"):
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
        {"gpu": "1", "uuid": uuid(1), "device": "mlx5_0", "bridges": GPU1_BRIDGES},
    ]
    assert state["bridges"]["0000:02:00.0"] == SV | RR_CR
    assert state["bridges"]["0000:01:00.0"] == SV
    assert state["bridges"]["0000:00:02.0"] is None
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


def collector_of(sysfs, procfs, tmp_path, **options) -> InfinibandCollector:
    options = {"pcie_acs_state": str(tmp_path / "acs.json"), "pcie_acs_owner": os.getuid(), **options}
    return InfinibandCollector(sysfs=str(sysfs), procfs=str(procfs), nccl_conf=str(tmp_path / "none"), **options)


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
    assert served["redirect"] == {**dict.fromkeys(set(GPU0_BRIDGES + GPU1_BRIDGES) - {"0000:00:02.0"}, 0.0),
                                  "0000:02:00.0": 1.0}  # fmt: skip
    assert served["unknown"] == {"0000:00:02.0": 1.0}
    crossed = {(labels["gpu"], labels["bridge"]) for labels, _ in series(text, "accelmon_gpu_pcie_path_bridge_info")}
    assert crossed == {("0", b) for b in GPU0_BRIDGES} | {("1", b) for b in GPU1_BRIDGES}


def test_the_health_hooks_root_pass_writes_the_state_where_the_exporter_reads_it(tmp_path):
    sysfs, procfs = node_with_acs(tmp_path)
    settings = Settings()
    settings.paths = Paths(sysfs=str(sysfs), procfs=str(procfs))
    settings.collector("infiniband").options["pcie_acs_state"] = str(tmp_path / "acs.json")
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
    other = collector_of(sysfs, procfs, tmp_path, pcie_acs_owner=os.getuid() + 1)
    assert acs_series(text_of(other))["checked"] == [({"reason": "untrusted"}, 0.0)]
    late = collector_of(sysfs, procfs, tmp_path, pcie_acs_max_age=3600.0, wall=lambda: time.time() + 7200)
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
    assert series(text, "accelmon_pcie_acs_state_entries_skipped") == [({}, 4.0)]  # GPU 1's path lost 05:00.0
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
