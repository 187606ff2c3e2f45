"""The NVLink and fabric collector over the real pynvml binding and the fake libnvidia-ml.so.1."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pynvml
import pytest

from accelmon import health
from accelmon.collectors import fabric, nvml
from accelmon.collectors.fabric import FabricCollector
from accelmon.collectors.nvml import NvmlCollector
from accelmon.exporter.metrics import Samples
from accelmon.exporter.runtime import Exporter, Sampler
from accelmon.host.fabric_manager import fabric_manager_running
from tests.support.checks import check, nvml_only
from tests.support.exposition import check_golden, promtool_check, sample_value, text_of
from tests.support.waiting import returns_while_blocked, wait_until

# The fabric's checks, with NVML listing the GPUs to judge (as on a node, where both run).
CHECKED = [fabric.REGISTRATION, nvml.REGISTRATION]

UUID0 = "GPU-00000000-0000-4000-8000-000000000000"


@pytest.fixture
def procfs(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    (root / "1").mkdir(parents=True)
    (root / "1" / "comm").write_text("systemd\n")
    return root


@pytest.fixture
def make_collector(fake_nvml, procfs, started) -> Iterator[Callable[[str], FabricCollector]]:
    def make(config: str) -> FabricCollector:
        fake_nvml.configure(config)
        return started(FabricCollector(procfs=str(procfs)))

    yield make
    fake_nvml.release()


def read(collector: FabricCollector) -> str:
    return text_of(collector)


def gpu0_up() -> Samples:
    """NVML's listing of the fake's GPU 0, for the checks to judge the fabric collector's series of it."""
    samples = Samples()
    samples.add(nvml.UP, ["0", UUID0], 1)
    return samples


def test_gpus_without_nvlink_or_fabric_have_no_series_and_are_asked_once(make_collector, fake_nvml):
    collector = make_collector("gpus 2\n")
    before = fake_nvml.calls_of("nvmlDeviceGetNvLinkState")
    for _ in range(3):
        text = read(collector)
    assert "accelmon_gpu_nvlink" not in text
    assert "accelmon_gpu_fabric" not in text
    assert "accelmon_fabric_manager_running" not in text  # no fabric: no Fabric Manager needed
    assert fake_nvml.calls_of("nvmlDeviceGetNvLinkState") - before == 2  # NotSupported once per GPU, then never


def test_link_states_and_error_counters_per_link(make_collector):
    text = read(
        make_collector("gpus 2\nnvlink 0 18\nnvlink_down 0 7\nnvlink_errors 0 3 0 12\nnvlink_errors 0 3 2 40\n")
    )
    links = {str(link) for link in range(18)}
    for link in links:
        assert sample_value(text, "accelmon_gpu_nvlink_link_up", gpu="0", link=link) == (0 if link == "7" else 1)
    assert sample_value(text, "accelmon_gpu_nvlink_link_up", gpu="0", link="18") is None  # an H100 has 18
    assert sample_value(text, "accelmon_gpu_nvlink_errors_total", gpu="0", link="3", type="replay") == 12
    assert sample_value(text, "accelmon_gpu_nvlink_errors_total", gpu="0", link="3", type="crc_flit") == 40
    assert sample_value(text, "accelmon_gpu_nvlink_errors_total", gpu="0", link="4", type="recovery") == 0
    assert sample_value(text, "accelmon_gpu_nvlink_link_up", gpu="1") is None  # GPU 1 has no NVLink


def test_what_each_link_leads_to_is_asked_once_and_served_every_interval(make_collector, fake_nvml):
    """accelmon_gpu_nvlink_remote_info (which GPUs a reset must take together, accelmon.health.reset_scope): GPU 0's
    link 0 is a bridge to GPU 1, its other links lead to NVSwitches. The wiring does not change while the driver runs:
    asked once per link, then served from memory (18 links x 2 calls would be 36 calls a GPU at every interval)."""
    collector = make_collector("gpus 2\nnvlink 0 4\nnvlink_peer 0 0 1\n")
    text = read(collector)
    assert sample_value(text, "accelmon_gpu_nvlink_remote_info", gpu="0", link="0", remote_type="gpu",
                        remote_pci_bus_id="00000000:28:00.0") == 1  # fmt: skip
    assert sample_value(text, "accelmon_gpu_nvlink_remote_info", gpu="0", link="3", remote_type="switch",
                        remote_pci_bus_id="00000000:C3:00.0") == 1  # fmt: skip
    asked = fake_nvml.calls_of("nvmlDeviceGetNvLinkRemotePciInfo_v2")
    for _ in range(3):
        again = read(collector)
    assert fake_nvml.calls_of("nvmlDeviceGetNvLinkRemotePciInfo_v2") == asked
    assert again.count("accelmon_gpu_nvlink_remote_info{") == 4


def test_a_pcie_gpu_without_a_bridge_has_no_link_down(make_collector, fake_nvml):
    """An A100 PCIe without an NVLink bridge answers each of its 12 links down (DCGM's health watch reports all 12
    down there: NVIDIA/DCGM#49, NVIDIA/NVSentinel#1481) and names nothing at their other end: no link series, so no
    link_down fault and no nvlink failure, and the 12 counted as unconnected (before: 12 links down, a failure).
    Its neighbour, bridged to GPU 0 by links 0-3, serves those four; the other eight are unconnected too."""
    collector = make_collector("gpus 2\nnvlink_unbridged 0 12\nnvlink_unbridged 1 12\n"
                               + "".join(f"nvlink_peer 1 {link} 0\n" for link in range(4)))  # fmt: skip
    text = read(collector)
    assert sample_value(text, "accelmon_gpu_nvlink_link_up", gpu="0") is None
    assert 'accelmon_gpu_nvlink_link_up{gpu="0"' not in text
    assert sample_value(text, "accelmon_gpu_nvlink_links_unconnected", gpu="0") == 12
    assert [sample_value(text, "accelmon_gpu_nvlink_link_up", gpu="1", link=str(link)) for link in range(12)] == [
        1, 1, 1, 1, None, None, None, None, None, None, None, None,
    ]  # fmt: skip
    assert sample_value(text, "accelmon_gpu_nvlink_links_unconnected", gpu="1") == 8
    promtool_check(text)
    node = health.evaluate([gpu0_up(), collector.sample()], now=0, registrations=CHECKED)
    assert check(node, "0", "nvlink").verdict == "ok"


def test_a_bridged_link_seen_up_that_goes_down_is_a_link_lost(make_collector, fake_nvml):
    """A link once up stays served when it goes down, even where NVML then names nothing at its other end: a bridge
    that lost its links is a fault (link_down), not a GPU without NVLink."""
    bridge = "".join(f"nvlink_peer 0 {link} 1\n" for link in range(4))
    collector = make_collector("gpus 2\nnvlink_unbridged 0 12\n" + bridge)
    assert sample_value(read(collector), "accelmon_gpu_nvlink_link_up", gpu="0", link="2") == 1
    fake_nvml.configure("gpus 2\nnvlink_unbridged 0 12\n")  # the bridge gone: read by the fake at the next init
    pynvml.nvmlInit()  # another reader's init; the collector's handles stay valid
    try:
        text = read(collector)
    finally:
        pynvml.nvmlShutdown()
    assert [sample_value(text, "accelmon_gpu_nvlink_link_up", gpu="0", link=str(link)) for link in range(5)] == [
        0, 0, 0, 0, None,
    ]  # fmt: skip
    assert sample_value(text, "accelmon_gpu_nvlink_links_unconnected", gpu="0") == 8


def test_driver_without_per_link_counters_still_reports_link_states(make_collector, fake_nvml):
    collector = make_collector("gpus 1\nnvlink 0 4\nunsupported nvmlDeviceGetNvLinkErrorCounter\n")
    read(collector)
    asked = fake_nvml.calls_of("nvmlDeviceGetNvLinkErrorCounter")
    text = read(collector)
    assert sample_value(text, "accelmon_gpu_nvlink_link_up", gpu="0", link="3") == 1
    assert "accelmon_gpu_nvlink_errors_total{" not in text
    assert fake_nvml.calls_of("nvmlDeviceGetNvLinkErrorCounter") == asked  # not asked again


def test_fabric_state_status_clique_and_degraded_bandwidth(make_collector, procfs):
    # state 3 completed, status 0 success, health mask: degraded bandwidth true (1)
    text = read(make_collector("gpus 2\nfabric 0 3 0 1\nfabric 1 1 0 2\n"))
    assert sample_value(text, "accelmon_gpu_fabric_state", gpu="0", uuid=UUID0) == 3
    assert sample_value(text, "accelmon_gpu_fabric_status", gpu="0") == 0
    assert sample_value(text, "accelmon_gpu_fabric_bandwidth_degraded", gpu="0") == 1
    assert sample_value(text, "accelmon_gpu_fabric_state", gpu="1") == 1  # not started
    assert sample_value(text, "accelmon_gpu_fabric_bandwidth_degraded", gpu="1") == 0
    info = sample_value(
        text, "accelmon_gpu_fabric_info", gpu="0", clique_id="1", cluster_uuid="a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf"
    )
    assert info == 1
    assert sample_value(text, "accelmon_fabric_manager_running") == 0  # a fabric, and no Fabric Manager


def test_fabric_manager_found_by_its_process_name(make_collector, procfs):
    (procfs / "4242").mkdir()
    (procfs / "4242" / "comm").write_text("nv-fabricmanager\n")
    assert fabric_manager_running(str(procfs))
    text = read(make_collector("gpus 1\nfabric 0 3 0 2\n"))
    assert sample_value(text, "accelmon_fabric_manager_running") == 1
    assert not fabric_manager_running(str(procfs / "missing"))


def test_older_driver_without_the_versioned_fabric_call(make_collector, fake_nvml):
    before = fake_nvml.calls_of("nvmlDeviceGetGpuFabricInfoV")  # counted since the library loaded
    collector = make_collector("gpus 1\nfabric 0 2 0 1\nmissing nvmlDeviceGetGpuFabricInfoV\n")
    text = read(collector)
    assert sample_value(text, "accelmon_gpu_fabric_state", gpu="0") == 2  # from nvmlDeviceGetGpuFabricInfo
    assert "accelmon_gpu_fabric_bandwidth_degraded{" not in text  # the old call has no health mask
    read(collector)
    assert fake_nvml.calls_of("nvmlDeviceGetGpuFabricInfoV") - before == 1  # FunctionNotFound: asked once


def test_a_lost_gpu_leaves_the_others_reporting(make_collector, fake_nvml):
    collector = make_collector("gpus 2\nnvlink 0 2\nnvlink 1 2\nfabric 0 3 0 2\nfabric 1 3 0 2\n")
    read(collector)
    fake_nvml.set_lost(0)
    text = read(collector)
    assert sample_value(text, "accelmon_gpu_nvlink_link_up", gpu="0") is None
    assert sample_value(text, "accelmon_gpu_nvlink_link_up", gpu="1", link="1") == 1
    assert sample_value(text, "accelmon_gpu_fabric_state", gpu="1") == 3
    fake_nvml.set_lost(0, False)
    assert sample_value(read(collector), "accelmon_gpu_nvlink_link_up", gpu="0", link="1") == 1


def test_a_hung_link_call_stops_only_this_collector(fake_nvml, procfs):
    """An NVLink call that never returns: the device counters go on, the fabric series go stale."""
    fake_nvml.configure("gpus 1\nnvlink 0 2\nhang nvmlDeviceGetNvLinkErrorCounter\n")
    fabric = Sampler(FabricCollector(procfs=str(procfs)), interval=0.1)
    devices = Sampler(NvmlCollector(), interval=0.1)
    exporter = Exporter([fabric, devices], stale_after_intervals=3)
    exporter.start()
    try:
        wait_until(lambda: devices.state().samples >= 5, what="five NVML samples beside the stuck fabric call")
        text = returns_while_blocked(lambda: exporter.exposition().decode())
        assert fabric.state().samples == 0  # stuck in its first sample
        assert 'accelmon_collector_success{collector="nvml"} 1.0' in text
        assert sample_value(text, "accelmon_gpu_up", gpu="0") == 1
    finally:
        fake_nvml.release()
        exporter.stop()


@pytest.mark.parametrize(
    ("rows", "name", "verdict", "action", "detail"),
    [
        ([], "nvlink", "ok", "none", "no NVLink reported"),
        (
            [(fabric.LINK_UP, [str(link)], 0 if link == 5 else 1) for link in range(18)],
            "nvlink",
            "failure",
            "check_fabric",
            "NVLink down: link 5 (17 of 18 up)",
        ),
        (
            [(fabric.LINK_UP, ["0"], 1), (fabric.LINK_ERRORS, ["0", "recovery"], 2)],
            "nvlink",
            "warning",
            "check_fabric",
            "NVLink errors since the driver loaded: link 0: 2 recovery",
        ),
        # CRC errors are judged by their rate (the alert), not by a count since the driver loaded.
        ([(fabric.LINK_UP, ["0"], 1), (fabric.LINK_ERRORS, ["0", "crc_flit"], 500)], "nvlink", "ok", "none", None),
        ([], "fabric", "ok", "none", "no NVLink fabric"),
        ([(fabric.FABRIC_STATE, [], 3), (fabric.FABRIC_STATUS, [], 0)], "fabric", "ok", "none", None),
        ([(fabric.FABRIC_STATE, [], 2)], "fabric", "warning", "check_fabric", "fabric registration in progress"),
        (
            [(fabric.FABRIC_STATE, [], 3), (fabric.FABRIC_STATUS, [], 0), (fabric.FABRIC_DEGRADED, [], 1)],
            "fabric",
            "warning",
            "check_fabric",
            None,
        ),
        (
            [(fabric.FABRIC_STATE, [], 3), (fabric.FABRIC_STATUS, [], 999)],
            "fabric",
            "failure",
            "check_fabric",
            "fabric registration failed (NVML error 999)",
        ),
    ],
)
def test_nvlink_and_fabric_checks(rows, name, verdict, action, detail):
    found = check(health.evaluate([nvml_only(rows)], now=0, registrations=CHECKED), "0", name)
    assert (found.verdict, found.action) == (verdict, action), found
    if detail is not None:
        assert found.detail == detail


def test_fabric_not_started_without_fabric_manager_fails_gpu_and_node(fake_nvml, tmp_path):
    """What an HGX node whose Fabric Manager did not start shows, as the fabric collector samples it."""
    procfs = tmp_path / "proc"
    procfs.mkdir()
    fake_nvml.configure("gpus 2\nfabric 0 1 0 0\nfabric 1 3 0 2\nnvlink 1 18\nnvlink_down 1 17\n")
    devices, links = NvmlCollector(), FabricCollector(procfs=str(procfs))
    devices.start()
    links.start()
    try:
        node = health.evaluate([devices.sample(), links.sample()], now=0, registrations=CHECKED)
    finally:
        fake_nvml.release()
        links.stop()
        devices.stop()
    assert check(node, "0", "fabric") == health.Check(
        "fabric", "failure", "fabric registration not started; the Fabric Manager is not running", "check_fabric"
    )
    assert check(node, "1", "fabric").verdict == "ok"
    assert check(node, "1", "nvlink").detail == "NVLink down: link 17 (17 of 18 up)"
    assert (
        health.Check(
            "fabric_manager",
            "failure",
            "the NVIDIA Fabric Manager is not running on an NVSwitch system",
            "check_fabric",
        )
        in node.checks
    )
    assert node.drain_reason() == (
        "accelmon: GPU 0 fabric: check_fabric; GPU 1 nvlink: check_fabric; fabric_manager: check_fabric"
    )


def test_golden(make_collector):
    """Two H100s: GPU 0's 18 links, one down and one counting errors, its fabric up with degraded bandwidth; GPU 1
    without NVLink, its fabric not started; no Fabric Manager."""
    text = read(
        make_collector("gpus 2\nnvlink 0 18\nnvlink_down 0 7\nnvlink_errors 0 3 0 12\nfabric 0 3 0 1\nfabric 1 1 0 2\n")
    )
    promtool_check(text)
    check_golden("fabric_h100x2.prom", text)


@pytest.mark.parametrize("wiring", ["fabric", "nvswitches"])
def test_a_link_on_an_nvlink_fabric_never_up_since_the_start_is_a_link_lost(make_collector, procfs, wiring):
    """A GPU of an NVSwitch board (every link wired: an HGX H100's 18 to its switches) whose link 17 did not train
    before the exporter started (a reboot onto a dead link) and whose other end NVML then names nothing: a link
    down, a fault, never a link that leads nowhere. Wired where the GPU reports an NVLink fabric (Hopper and later)
    or the nvidia-nvswitch driver lists switches (an A100 board). Before, it was hidden as unconnected: no link_down
    path fault, no nvlink failure, on a node running with a link lost."""
    if wiring == "nvswitches":
        (procfs / "driver" / "nvidia-nvswitch" / "devices" / "0000:c0:00.0").mkdir(parents=True)
    config = "gpus 2\nnvlink_unbridged 0 18\n" + "".join(f"nvlink_peer 0 {link} 1\n" for link in range(17))
    collector = make_collector(config + ("fabric 0 3 0 2\n" if wiring == "fabric" else ""))
    text = read(collector)
    assert sample_value(text, "accelmon_gpu_nvlink_link_up", gpu="0", link="16") == 1
    assert sample_value(text, "accelmon_gpu_nvlink_link_up", gpu="0", link="17") == 0
    assert sample_value(text, "accelmon_gpu_nvlink_links_unconnected", gpu="0") == 0
    node = health.evaluate([gpu0_up(), collector.sample()], now=0, registrations=CHECKED)
    assert check(node, "0", "nvlink").verdict == "failure"
