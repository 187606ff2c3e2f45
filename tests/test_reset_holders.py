"""A GPU reset that can succeed on a real node (issue 57, point 6 and 7): the resetting process lets NVML go after its
scan; who holds the GPU is found by its device file, the services among them stopped and started again, and anything
left named in the journal instead of running a reset the driver refuses; DCGM's diagnostic after the reset is asked
again while its host engine comes back, and "could not run" is never a pass."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from accelmon import health
from accelmon.checks import Check
from accelmon.config import load
from accelmon.gpu_holders import Holder, device_files, holders
from accelmon.remediation import Journal
from accelmon.scan import scan_health
from accelmon.slurm import repair
from accelmon.slurm.fleet import Limits
from accelmon.slurm.repair import Options, SlurmRepair
from tests.support.fake_scontrol import Cluster
from tests.support.jobs_tree import bus_id, nvidia_procfs
from tests.test_fleet import run
from tests.test_remediation import failing

NODE = "gpu-7"
BUS = "00000000:2A:00.0"  # GPU 2 of tests.test_remediation.failing, as NVML prints it: minor 3 in nvidia_procfs


def holding(procfs: Path, pid: int, command: str, cgroup: str, *devices: str) -> None:
    """Process `pid` in procfs, its descriptors open on `devices`, in `cgroup` (its /proc/PID/cgroup line)."""
    (procfs / str(pid) / "fd").mkdir(parents=True)
    (procfs / str(pid) / "comm").write_text(command + "\n")
    (procfs / str(pid) / "cgroup").write_text(cgroup + "\n")
    (procfs / str(pid) / "fd" / "0").symlink_to("/dev/null")
    for number, device in enumerate(devices, 3):
        (procfs / str(pid) / "fd" / str(number)).symlink_to(device)


def node_procfs(tmp_path: Path) -> Path:
    procfs = nvidia_procfs(tmp_path / "proc", gpus=4)
    (procfs / "driver" / "nvidia" / "gpus" / bus_id(2)).rename(procfs / "driver" / "nvidia" / "gpus" / "0000:2a:00.0")
    return procfs


def test_who_holds_a_gpu_is_read_from_its_device_file(tmp_path):
    procfs = node_procfs(tmp_path)
    assert device_files(str(procfs), [BUS]) == {BUS: "/dev/nvidia3"}  # NVML's 8-digit domain, the driver's 4
    holding(procfs, 900, "nvidia-persiste", "0::/system.slice/nvidia-persistenced.service", "/dev/nvidia3")
    holding(procfs, 901, "python3", "0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0", "/dev/nvidia3")
    holding(procfs, 902, "dcgm-exporter", "12:devices:/system.slice/dcgm-exporter.service", "/dev/nvidiactl")
    holding(procfs, 903, "accelmon-export", "1:name=systemd:/system.slice/accelmon-exporter.service", "/dev/nvidia3")
    assert holders(str(procfs), {"/dev/nvidia3"}) == [
        Holder(900, "nvidia-persiste", "nvidia-persistenced.service"),
        Holder(901, "python3", ""),  # a job's process: named, never stopped by accelmon
        Holder(903, "accelmon-export", "accelmon-exporter.service"),  # cgroup v1's named hierarchy
    ]


def reset_loop(tmp_path: Path, cluster: Cluster, procfs: Path, runner=run, dcgmi: str = "dcgmi") -> SlurmRepair:
    options = Options("act", str(tmp_path / "journal.jsonl"), 7 * 86400.0, Limits(),
                      "true {pci_bus_id}", ("accelmon-exporter.service",), str(procfs))  # fmt: skip
    loop = SlurmRepair(options, NODE, str(cluster.command), runner, dcgmi=dcgmi)
    loop.fleet.sleep = lambda seconds: None
    return loop


def passing() -> health.NodeHealth:
    return health.NodeHealth([health.GpuHealth("2", "GPU-2", [Check("ecc", "ok", "fine")], "S2", BUS)], [])


def drained_for_a_reset(tmp_path: Path, procfs: Path) -> Cluster:
    cluster = Cluster(tmp_path, {NODE: "IDLE", **{f"gpu-{n}": "IDLE" for n in range(10, 20)}})
    reset_loop(tmp_path, cluster, procfs).run(failing("reset_gpu", "ecc"), lambda resets: failing("reset_gpu", "ecc"))
    assert "DRAIN" in cluster.node(NODE)["state"]
    return cluster


def test_the_services_holding_the_gpu_are_stopped_and_started_again(tmp_path):
    """nvidia-persistenced holds GPU 2 (it is not in gpu_holders): found by its device file, stopped with the listed
    units, the reset runs, both started again, the node resumed."""
    procfs = node_procfs(tmp_path)
    holding(procfs, 900, "nvidia-persiste", "0::/system.slice/nvidia-persistenced.service", "/dev/nvidia3")
    holding(procfs, 903, "accelmon-export", "0::/system.slice/accelmon-exporter.service", "/dev/nvidia3")
    pids = {"nvidia-persistenced.service": 900, "accelmon-exporter.service": 903}
    cluster = drained_for_a_reset(tmp_path, procfs)
    systemctl: list[str] = []

    def runner(command: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
        if command[0] != "systemctl":
            return run(command, timeout)
        systemctl.append(" ".join(command[1:]))
        if command[1] == "stop":  # the service's process ends and lets the GPU go
            for entry in (procfs / str(pids[command[2]]) / "fd").iterdir():
                entry.unlink()
        return subprocess.CompletedProcess(command, 0, "", "")

    reset_loop(tmp_path, cluster, procfs, runner).run(failing("reset_gpu", "ecc"), lambda resets: passing())
    assert systemctl == [
        "is-active --quiet accelmon-exporter.service", "stop accelmon-exporter.service",
        "is-active --quiet nvidia-persistenced.service", "stop nvidia-persistenced.service",
        "start accelmon-exporter.service", "start nvidia-persistenced.service",
    ]  # fmt: skip
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}


def test_a_process_that_keeps_the_gpu_is_named_and_no_reset_is_run(tmp_path):
    """A user's process that outlived its job holds GPU 2 (a job scope: never accelmon's to stop): the reset the driver
    would refuse is not run; the journal names the process; the node is left drained for a person."""
    procfs = node_procfs(tmp_path)
    holding(procfs, 901, "python3", "0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0", "/dev/nvidia3")
    cluster = drained_for_a_reset(tmp_path, procfs)
    resets = tmp_path / "resets"
    loop = reset_loop(tmp_path, cluster, procfs)
    loop.options.reset_command = f"sh -c 'echo $0 >> {resets}' {{pci_bus_id}}"
    loop.run(failing("reset_gpu", "ecc"), lambda r: passing())
    assert not resets.exists()
    failed = Journal.read(loop.options.journal).records[-2]
    assert (failed.event, failed.outcome) == ("repair", "failed")
    assert failed.detail == "not reset: still held by pid 901 (python3)"
    assert "DRAIN" in cluster.node(NODE)["state"] and "still held by pid 901" in cluster.node(NODE)["reason"]


def test_the_scan_lets_nvml_go_before_the_reset(tmp_path, fake_nvml):
    """The measured failure: the scan's XID thread waits 2 s for events but was joined for 0.05 s, so nvmlShutdown
    was skipped (2 inits, 1 shutdown) and the process that goes on to reset the GPU still held it."""
    procfs = nvidia_procfs(tmp_path / "proc", gpus=2)
    (procfs / "stat").write_text("btime 1764000000\n")
    fake_nvml.configure("gpus 2\n")
    (tmp_path / "kmsg").write_text("")
    config = tmp_path / "exporter.yml"
    config.write_text(yaml.safe_dump({"paths": {"procfs": str(procfs), "kmsg": str(tmp_path / "kmsg")}}))
    # The library counts since it was loaded into this process: other tests' calls are taken off.
    inits, shutdowns = fake_nvml.calls_of("nvmlInitWithFlags"), fake_nvml.calls_of("nvmlShutdown")
    scan_health(load(str(config)))
    scan_health(load(str(config)))
    opened = fake_nvml.calls_of("nvmlInitWithFlags") - inits  # the nvml and fabric collectors each open a session
    closed = fake_nvml.calls_of("nvmlShutdown") - shutdowns
    assert opened >= 2 and closed == opened, (opened, closed)


DCGMI = """#!/bin/sh
# Stand-in for dcgmi after a reset: the host engine answers from the Nth call on ($READY_AT), before it does not.
count=$(( $(cat "{count}" 2>/dev/null || echo 0) + 1 )); echo $count > "{count}"
if [ "$count" -lt {ready_at} ]; then echo "Error: unable to establish a connection to the specified host"; exit 255; fi
echo '{{"tests": [{{"name": "Memory", "results": [{{"status": "Pass"}}]}}]}}'
"""


@pytest.mark.parametrize(("ready_at", "resumed"), [(3, True), (10_000, False)], ids=["comes-back", "never"])
def test_dcgms_diagnostic_after_a_reset_waits_for_its_host_engine_and_never_passes_unrun(
    tmp_path, monkeypatch, ready_at, resumed
):
    """nv-hostengine, stopped around the reset, answers again on the third try: the diagnostic runs and passes, the
    node is resumed. One that never answers (within DIAG_READY_SECONDS, cut short here) leaves the node drained
    saying the diagnostic could not run: before, "could not run" resumed it."""
    monkeypatch.setattr(repair, "DIAG_READY_SECONDS", 60.0 if resumed else 0.3)
    procfs = node_procfs(tmp_path)
    cluster = drained_for_a_reset(tmp_path, procfs)
    dcgmi = tmp_path / "dcgmi"
    dcgmi.write_text(DCGMI.format(count=tmp_path / "count", ready_at=ready_at))
    dcgmi.chmod(0o755)
    loop = reset_loop(tmp_path, cluster, procfs, dcgmi=str(dcgmi))
    loop.run(failing("reset_gpu", "ecc"), lambda r: passing())
    node = cluster.node(NODE)
    if resumed:
        assert node == {"state": "IDLE", "reason": ""}
        assert (tmp_path / "count").read_text().strip() == "3"
    else:
        assert "DRAIN" in node["state"] and "could not run" in node["reason"], node


def joining(index: str = "2") -> health.NodeHealth:
    """GPU `index` registering with its NVLink fabric again (the Fabric Manager at work): a warning, not a pass."""
    check = Check("fabric", "warning", "fabric registration in progress", "check_fabric")
    return health.NodeHealth([health.GpuHealth(index, f"GPU-{index}", [check], f"S{index}", BUS)], [])


@pytest.mark.parametrize("joins", [True, False], ids=["joins-again", "never-joins"])
def test_a_reset_gpu_passes_only_once_it_has_joined_its_nvlink_fabric(tmp_path, monkeypatch, joins):
    """A reset GPU on an NVSwitch system registers with the fabric again; "in progress" is a warning, which resumed
    the node before its GPU could run CUDA. The loop rescans until it completes (resumed) or FABRIC_READY_SECONDS
    pass (left drained, saying so)."""
    monkeypatch.setattr(repair, "FABRIC_READY_SECONDS", 60.0 if joins else 0.3)
    procfs = node_procfs(tmp_path)
    cluster = drained_for_a_reset(tmp_path, procfs)
    scans = iter([joining(), joining()])
    loop = reset_loop(tmp_path, cluster, procfs)
    loop.run(failing("reset_gpu", "ecc"), lambda r: next(scans, passing()) if joins else joining())
    node = cluster.node(NODE)
    if joins:
        assert node == {"state": "IDLE", "reason": ""}
    else:
        assert "DRAIN" in node["state"] and "still joining the NVLink fabric" in node["reason"], node


def test_a_node_back_from_its_reboot_waits_for_its_fabric(tmp_path):
    cluster = Cluster(tmp_path, {NODE: "IDLE", **{f"gpu-{n}": "IDLE" for n in range(10, 20)}})
    procfs = node_procfs(tmp_path)
    reset_loop(tmp_path, cluster, procfs).run(failing("reboot_node"), lambda r: failing("reboot_node"))
    reset_loop(tmp_path, cluster, procfs).run(failing("reboot_node"), lambda r: failing("reboot_node"))  # reboots
    cluster.boot(NODE)
    lines: list[str] = []
    loop = reset_loop(tmp_path, cluster, procfs)
    loop.say = lines.append
    loop.run(joining(), lambda r: joining())
    assert "DRAIN" in cluster.node(NODE)["state"]
    assert any("not in the NVLink fabric yet" in line for line in lines), lines
    reset_loop(tmp_path, cluster, procfs).run(passing(), lambda r: passing())
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}
