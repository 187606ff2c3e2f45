"""Which GPUs a reset takes (issue 57, point 6): linked GPUs reset together where the platform needs it (nvidia-smi(1),
`-r`: older than Ampere, or Ampere without the Fabric Manager), else a reboot; a GPU in MIG mode is rebooted, not
reset (its instances would be lost). The wiring is what the scan read through NVML (the fake answers as nvml.h
describes nvmlDeviceGetNvLinkRemoteDeviceType and nvmlDeviceGetNvLinkRemotePciInfo_v2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from accelmon import health
from accelmon.config import load
from accelmon.exporter.checks import Check
from accelmon.health import reset_scope
from accelmon.health.remediation import Journal
from accelmon.scan import scan_health
from tests.support.fake_scontrol import Cluster
from tests.support.jobs_tree import nvidia_procfs
from tests.test_reset_holders import NODE, reset_loop

pytestmark = pytest.mark.unit
MANY = "nvidia-smi --gpu-reset -i {pci_bus_ids}"


def bus(index: int) -> str:
    return f"00000000:{0x18 + index * 0x10:02X}:00.0"  # as the fake NVML numbers its GPUs


def gpu(index: int, capability: str = "9.0", links: tuple[tuple[str, str], ...] = (), mig: bool = False,
        verdict: str = "ok") -> health.GpuHealth:  # fmt: skip
    action = "reset_gpu" if verdict == "failure" else "none"
    check = Check("ecc", verdict, "uncorrectable errors" if verdict == "failure" else "fine", action)
    return health.GpuHealth(str(index), f"GPU-{index}", [check], f"S{index}", bus(index), capability, mig, links)


def switched(count: int, capability: str, failing: int = 0, **extra: bool) -> health.NodeHealth:
    """An HGX board: every GPU's links lead to the NVSwitches."""
    links = (("switch", "00000000:C0:00.0"), ("switch", "00000000:C1:00.0"))
    verdicts = ["failure" if n == failing else "ok" for n in range(count)]
    return health.NodeHealth([gpu(n, capability, links, verdict=verdicts[n], **extra) for n in range(count)], [])


def taken(scope: reset_scope.Scope) -> list[str]:
    return [g.index for g in scope.gpus]


def test_hopper_on_nvswitch_resets_the_failing_gpu_alone_with_or_without_the_fabric_manager():
    for fabric_manager in (True, False):
        scope = reset_scope.of(switched(8, "9.0", failing=3), [bus(3)], fabric_manager, MANY)
        assert (taken(scope), scope.together, scope.reboot) == (["3"], False, "")


def test_ampere_on_nvswitch_needs_the_fabric_manager_to_reset_one_gpu():
    alone = reset_scope.of(switched(8, "8.0", failing=3), [bus(3)], True, MANY)
    assert taken(alone) == ["3"]
    every = reset_scope.of(switched(8, "8.0", failing=3), [bus(3)], False, MANY)
    assert (taken(every), every.together, every.reboot) == (["3", "0", "1", "2", "4", "5", "6", "7"], True, "")


def test_volta_resets_every_gpu_its_links_reach_through_the_gpus_they_lead_to():
    """A hybrid cube mesh cut down: 0-1 and 1-2 linked, 3 alone. A reset of 0 takes 1, and 1 being reset takes 2."""
    node = health.NodeHealth(
        [
            gpu(0, "7.0", (("gpu", bus(1)),), verdict="failure"),
            gpu(1, "7.0", (("gpu", bus(0)), ("gpu", bus(2)))),
            gpu(2, "7.0", (("gpu", bus(1)),)),
            gpu(3, "7.0"),
        ],
        [],
    )
    scope = reset_scope.of(node, [bus(0)], True, MANY)
    assert (taken(scope), scope.together, scope.reboot) == (["0", "1", "2"], True, "")
    # PCIe GPUs without NVLink reset alone whatever their age.
    assert taken(reset_scope.of(node, [bus(3)], False, MANY)) == ["3"]


def test_a_reboot_does_where_a_reset_cannot_be_right():
    """A GPU in MIG mode (its instances would be lost); a linked GPU the scan does not list (it cannot be named); a
    reset command that takes one GPU while several must go together."""
    mig = reset_scope.of(switched(4, "9.0", failing=1, mig=True), [bus(1)], True, MANY)
    assert mig.reboot == "GPU 1 in MIG mode: a reset loses its instances"
    lost = health.NodeHealth([gpu(0, "7.0", (("gpu", bus(5)),), verdict="failure")], [])
    assert (
        reset_scope.of(lost, [bus(0)], True, MANY).reboot == "GPU 0's NVLink peer 00000000:68:00.0 is not in the scan"
    )
    one = reset_scope.of(switched(2, "8.0"), [bus(0)], False, "nvidia-smi --gpu-reset -i {pci_bus_id}")
    assert one.reboot == "GPU 0, 1 must be reset together and gpu_reset_command takes one GPU ({pci_bus_ids})"
    # The same command is right for a GPU that resets alone.
    assert reset_scope.of(switched(2, "9.0"), [bus(0)], False, "nvidia-smi -r -i {pci_bus_id}").reboot == ""


def test_the_scan_reads_the_wiring_from_nvml(tmp_path, fake_nvml):
    """Through the fake NVML: two Volta GPUs joined by an NVLink bridge (link 0 each), the other links to switches."""
    procfs = nvidia_procfs(tmp_path / "proc", gpus=2)
    (procfs / "stat").write_text("btime 1764000000\n")
    fake_nvml.configure(
        "gpus 2\nnvlink 0 2\nnvlink 1 2\nnvlink_peer 0 0 1\nnvlink_peer 1 0 0\ncapability 0 7 0\ncapability 1 7 0\n"
    )
    (tmp_path / "kmsg").write_text("")
    config = tmp_path / "exporter.yml"
    config.write_text(yaml.safe_dump({"paths": {"procfs": str(procfs), "kmsg": str(tmp_path / "kmsg")}}))
    node = scan_health(load(str(config)))
    assert [(g.compute_capability, g.mig_mode, g.nvlink_remotes) for g in node.gpus] == [
        ("7.0", False, (("gpu", bus(1)), ("switch", "00000000:C1:00.0"))),
        ("7.0", False, (("gpu", bus(0)), ("switch", "00000000:C1:00.0"))),
    ]
    assert taken(reset_scope.of(node, [bus(1)], True, MANY)) == ["1", "0"]


def linked_node(tmp_path: Path, *, mig: bool = False) -> tuple[Cluster, health.NodeHealth]:
    """gpu-7: two Volta GPUs joined by NVLink, GPU 0 failing an ECC check, drained by a first check in act mode."""
    node = health.NodeHealth(
        [gpu(0, "7.0", (("gpu", bus(1)),), mig=mig, verdict="failure"), gpu(1, "7.0", (("gpu", bus(0)),))], []
    )
    cluster = Cluster(tmp_path, {NODE: "IDLE", **{f"gpu-{n}": "IDLE" for n in range(10, 20)}})
    reset_loop(tmp_path, cluster, nvidia_procfs(tmp_path / "proc", gpus=2)).run(node, lambda resets: node)
    assert "DRAIN" in cluster.node(NODE)["state"]
    return cluster, node


def test_linked_gpus_are_reset_in_one_command_and_only_the_failing_one_counts_as_repaired(tmp_path):
    cluster, node = linked_node(tmp_path)
    commands = tmp_path / "resets"
    loop = reset_loop(tmp_path, cluster, nvidia_procfs(tmp_path / "proc2", gpus=2))
    loop.options.reset_command = f"sh -c 'echo $0 >> {commands}' {{pci_bus_ids}}"
    passing = health.NodeHealth([gpu(0, "7.0", (("gpu", bus(1)),)), gpu(1, "7.0", (("gpu", bus(0)),))], [])
    resets_seen: list[dict[str, float]] = []
    loop.run(node, lambda resets: resets_seen.append(resets) or passing)
    assert commands.read_text() == f"{bus(0)},{bus(1)}\n"
    assert set(resets_seen[0]) == {"GPU-0", "GPU-1"}  # XIDs the reset answers are those of both GPUs
    started = next(
        r for r in Journal.read(loop.options.journal).records if (r.event, r.outcome) == ("repair", "started")
    )
    assert [g["index"] for g in started.gpus] == ["0"]  # the repeat rule keys on the failing GPU only
    assert started.detail.endswith("with GPU 1 (NVLink-linked: reset together)")
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}


def test_a_gpu_in_mig_mode_is_rebooted_not_reset(tmp_path, capsys):
    cluster, node = linked_node(tmp_path, mig=True)
    commands = tmp_path / "resets"
    loop = reset_loop(tmp_path, cluster, nvidia_procfs(tmp_path / "proc2", gpus=2))
    loop.options.reset_command = f"sh -c 'echo $0 >> {commands}' {{pci_bus_ids}}"
    loop.run(node, lambda resets: node)
    assert not commands.exists()
    assert "REBOOT" in cluster.node(NODE)["state"]
    requested = Journal.read(loop.options.journal).records[-1]
    assert (requested.event, requested.action, requested.outcome) == ("repair", "reboot_node", "requested")
    assert requested.detail == "reboot_node for GPU 0, not a reset: GPU 0 in MIG mode: a reset loses its instances"
