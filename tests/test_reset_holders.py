"""A GPU reset that can succeed on a real node (issue 57, point 6 and 7): the resetting process lets NVML go after its
scan; who holds the GPU is found by its device file, the services among them stopped and started again, and anything
left named in the journal instead of running a reset the driver refuses; DCGM's diagnostic after the reset is asked
again while its host engine comes back, and "could not run" is never a pass."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional

import pytest

from accelmon import health
from accelmon.config import load
from accelmon.exporter.checks import Check
from accelmon.health.remediation import Journal
from accelmon.host.gpu_holders import Holder, cgroups, device_files, holders, service, systemd_cgroup
from accelmon.scan import scan_health
from accelmon.schedulers.slurm import diag, gpu_reset, repair
from accelmon.schedulers.slurm.fleet import Limits
from accelmon.schedulers.slurm.repair import Options, SlurmRepair
from tests.support.fake_scontrol import Cluster
from tests.support.jobs_tree import bus_id, nvidia_procfs, scan_config
from tests.test_fleet import run
from tests.test_remediation import failing

NODE = "gpu-7"
BUS = "00000000:2A:00.0"  # GPU 2 of tests.test_remediation.failing, as NVML prints it: minor 3 in nvidia_procfs


def holding(procfs: Path, pid: int, command: str, cgroup: str, *devices: str, uid: int = 0) -> None:
    """Process `pid` of user `uid` in procfs, its descriptors open on `devices`, in `cgroup` (its /proc/PID/cgroup
    lines)."""
    (procfs / str(pid) / "fd").mkdir(parents=True)
    (procfs / str(pid) / "comm").write_text(command + "\n")
    (procfs / str(pid) / "cgroup").write_text(cgroup + "\n")
    (procfs / str(pid) / "status").write_text(f"Name:\t{command}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
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
        Holder(900, "nvidia-persiste", "nvidia-persistenced.service", "/system.slice/nvidia-persistenced.service"),
        # a job's process: named, never stopped by accelmon
        Holder(901, "python3", "", "/system.slice/slurmstepd.scope/job_12/step_0/user/task_0", job=True),
        # cgroup v1's named hierarchy
        Holder(903, "accelmon-export", "accelmon-exporter.service", "/system.slice/accelmon-exporter.service"),
    ]


V1_JOB = "\n".join(  # a job's process on cgroup v1: Slurm's controllers say job 12, systemd's hierarchy slurmd's unit
    ["7:freezer:/slurm/uid_1000/job_12/step_0/task_0", "4:devices:/slurm/uid_1000/job_12/step_0/task_0",
     "1:name=systemd:/system.slice/slurmd.service", "0::/system.slice/slurmd.service"]
)  # fmt: skip
MANAGER = "/user.slice/user-1000.slice/user@1000.service/app.slice"  # a user's own systemd manager's cgroups


@pytest.mark.parametrize(
    ("lines", "path", "unit"),
    [
        ("0::/system.slice/nvidia-persistenced.service", "/system.slice/nvidia-persistenced.service",
         "nvidia-persistenced.service"),
        ("0::/system.slice/x.service/worker", "/system.slice/x.service/worker", "x.service"),  # a cgroup of its own
        ("0::/system.slice/getty@tty1.service", "/system.slice/getty@tty1.service", "getty@tty1.service"),
        (V1_JOB, "/system.slice/slurmd.service", "slurmd.service"),  # named systemd's, not the unified line
        ("1:name=systemd:/system.slice/slurmd.service", "/system.slice/slurmd.service", "slurmd.service"),
        # A user's manager names what it makes: "x:y" once made the parser read "y/slurmd.service".
        (f"0::{MANAGER}/x:y/slurmd.service", f"{MANAGER}/x:y/slurmd.service", ""),
        (f"0::{MANAGER}/evil.service", f"{MANAGER}/evil.service", ""),  # once read as user@1000.service
        ("0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0",
         "/system.slice/slurmstepd.scope/job_12/step_0/user/task_0", ""),
        ("0::/system.slice/system-getty.slice/getty@tty1.service",  # a nested slice: not /system.slice/NAME.service
         "/system.slice/system-getty.slice/getty@tty1.service", ""),
        ("0::/system.slice/-H.service", "/system.slice/-H.service", ""),  # systemctl would read it as an option
        ("0::/system.slice/--force.service", "/system.slice/--force.service", ""),
        ("0::/system.slice/a b.service", "/system.slice/a b.service", ""),
        ("0::/app.slice/x.service:0::/system.slice/y.service", "/app.slice/x.service:0::/system.slice/y.service", ""),
        ("garbage\n12:devices:/system.slice/dcgm.service", "", ""),  # v1 without systemd's hierarchy: no path
        # systemd in a container that sees the host's cgroup tree (podman on cgroup v1): its root is the container's.
        ("1:name=systemd:/libpod_parent/libpod-ab12/system.slice/gpu-standin.service",
         "/libpod_parent/libpod-ab12/system.slice/gpu-standin.service", "gpu-standin.service"),
        # A user's manager may make a system.slice of its own: never systemd's root.
        (f"0::{MANAGER}/../system.slice/nvidia-persistenced.service",
         f"{MANAGER}/../system.slice/nvidia-persistenced.service", ""),
        ("0::/user.slice/user-1000.slice/user@1000.service/system.slice/nvidia-persistenced.service",
         "/user.slice/user-1000.slice/user@1000.service/system.slice/nvidia-persistenced.service", ""),
    ],
    ids=["service", "below-it", "instance", "v1-job", "v1", "user-manager-colon", "user-manager", "slurm-step",
         "nested-slice", "dash-H", "dash-dash-force", "space", "colons", "no-systemd-hierarchy", "container-root",
         "user-system-slice-dots", "user-system-slice"],
)  # fmt: skip
def test_a_holders_unit_is_a_system_service_read_strictly(lines, path, unit):
    """Issue 64, point 6: each line is ID:CONTROLLERS:PATH split at its first two colons; systemd's hierarchy (v1's
    name=systemd, else v2's unified line) gives the path; the unit counts only as /system.slice/NAME.service with a
    name systemd allows."""
    assert systemd_cgroup(cgroups(lines)) == path
    assert service(path) == unit


def reset_loop(tmp_path: Path, cluster: Cluster, procfs: Path, runner=run, dcgmi: str = "dcgmi") -> SlurmRepair:
    options = Options("act", str(tmp_path / "journal.jsonl"), 7 * 86400.0, Limits(),
                      "true {pci_bus_id}", ("accelmon-exporter.service",), str(procfs))  # fmt: skip
    loop = SlurmRepair(options, NODE, str(cluster.command), runner, dcgmi=dcgmi)
    loop.fleet.sleep = lambda seconds: None
    return loop


def passing() -> health.NodeHealth:
    """The node of `failing` after its reset: the same GPUs, every check passing."""
    return health.NodeHealth(
        [
            health.GpuHealth("0", "GPU-0", [Check("ecc", "ok", "fine")], "S0", "00000000:18:00.0"),
            health.GpuHealth("2", "GPU-2", [Check("ecc", "ok", "fine")], "S2", BUS),
        ],
        [],
    )


def drained_for_a_reset(tmp_path: Path, procfs: Path) -> Cluster:
    cluster = Cluster(tmp_path, {NODE: "IDLE", **{f"gpu-{n}": "IDLE" for n in range(10, 20)}})
    reset_loop(tmp_path, cluster, procfs).run(failing("reset_gpu", "ecc"), lambda resets: failing("reset_gpu", "ecc"))
    assert "DRAIN" in cluster.node(NODE)["state"]
    return cluster


def test_the_services_holding_the_gpu_are_stopped_and_started_again(tmp_path):
    """nvidia-persistenced holds GPU 2 (it is not in gpu_holders): found by its device file, stopped with the listed
    units, the reset runs, both started again, the node resumed."""
    procfs = node_procfs(tmp_path)
    # As NVIDIA's sample unit runs it: `nvidia-persistenced --user nvidia-persistenced`, its process not root's. A
    # unit under /system.slice is the system manager's all the same: stopped (it used to be refused, and every reset
    # escalated to hardware service).
    holding(procfs, 900, "nvidia-persiste", "0::/system.slice/nvidia-persistenced.service", "/dev/nvidia3", uid=998)
    holding(procfs, 903, "accelmon-export", "0::/system.slice/accelmon-exporter.service", "/dev/nvidia3")
    cluster, systemd, _ = reset_held(tmp_path, procfs, "nvidia-persistenced.service")
    assert (tmp_path / "resets").read_text() == BUS + "\n"
    assert systemd.calls == [
        "is-active --quiet -- accelmon-exporter.service", "stop -- accelmon-exporter.service",
        "show --property=ControlGroup --value -- nvidia-persistenced.service",  # systemd confirms where it runs
        "is-active --quiet -- nvidia-persistenced.service", "stop -- nvidia-persistenced.service",
        "start -- accelmon-exporter.service", "start -- nvidia-persistenced.service",
    ]  # fmt: skip
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}


class Systemd:
    """systemctl as the reset asks it: each of `units` runs in /system.slice/UNIT unless `groups` says where (""
    where systemd does not answer); stopping one ends the processes procfs puts in it (their descriptors closed).
    Every call is kept (`calls`), and must pass its unit after "--"."""

    def __init__(self, procfs: Path, *units: str, groups: Optional[dict[str, str]] = None) -> None:
        self.procfs = procfs
        self.calls: list[str] = []
        self.groups = {unit: f"/system.slice/{unit}" for unit in units}
        self.groups.update(groups or {})

    def __call__(self, command: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
        if command[0] != "systemctl":
            return run(command, timeout)
        self.calls.append(" ".join(command[1:]))
        assert command[-2] == "--", command  # a unit name is never read as an option
        verb, unit = command[1], command[-1]
        group = self.groups.get(unit, "")
        if verb == "show":
            return subprocess.CompletedProcess(command, 0 if unit in self.groups else 1, group + "\n", "")
        if verb == "is-active":
            return subprocess.CompletedProcess(command, 0 if group else 3, "", "")
        if verb == "stop" and group:
            for process in self.procfs.iterdir():
                lines = (process / "cgroup").read_text() if (process / "cgroup").exists() else ""
                if any(path == group or path.startswith(group + "/") for path in cgroups(lines).values()):
                    for entry in (process / "fd").iterdir():
                        entry.unlink()
        return subprocess.CompletedProcess(command, 0, "", "")

    def stopped(self) -> list[str]:
        return [call.split()[-1] for call in self.calls if call.startswith("stop ")]


def reset_held(
    tmp_path: Path, procfs: Path, *units: str, groups: Optional[dict[str, str]] = None
) -> tuple[Cluster, Systemd, SlurmRepair]:
    """GPU 2's reset on its drained node, who holds it as `procfs` says, systemd running `units` and the configured
    holder accelmon-exporter.service (Systemd), the rescan passing; each reset run is written to tmp_path/resets."""
    cluster = drained_for_a_reset(tmp_path, procfs)
    systemd = Systemd(procfs, "accelmon-exporter.service", *units, groups=groups)
    loop = reset_loop(tmp_path, cluster, procfs, systemd)
    loop.options.reset_command = f"sh -c 'echo $0 >> {tmp_path / 'resets'}' {{pci_bus_id}}"
    loop.run(failing("reset_gpu", "ecc"), lambda r: passing())
    return cluster, systemd, loop


@pytest.mark.parametrize(
    ("cgroup", "uid", "groups"),
    [
        (V1_JOB, 1000, {}),  # a job's leftover process on cgroup v1: slurmd is never stopped for it
        ("1:name=systemd:/system.slice/slurmd.service", 0, {}),  # slurmd itself, whoever's the process
        (f"0::{MANAGER}/x:y/slurmd.service", 1000, {}),  # a user's manager's cgroup that ends like slurmd's
        (f"0::{MANAGER}/evil.service", 1000, {}),  # user@1000.service is a user's: never stopped
        ("0::/system.slice/-H.service", 0, {}),  # systemctl's options, as unit names
        ("0::/system.slice/--force.service", 0, {}),
        ("0::/system.slice/systemd-logind.service", 0, {}),
        ("0::/system.slice/dbus.service", 0, {}),
        ("0::/system.slice/sshd.service", 0, {}),
        # systemd does not confirm: the unit runs elsewhere, does not run, or systemctl does not answer
        ("0::/system.slice/nvidia-persistenced.service", 0, {"nvidia-persistenced.service": "/system.slice/other"}),
        ("0::/system.slice/nvidia-persistenced.service", 0, {"nvidia-persistenced.service": ""}),
        ("0::/system.slice/nvidia-persistenced.service", 0, {"nvidia-persistenced.service": "/"}),
    ],
    ids=["v1-job-in-slurmd", "slurmd", "user-manager-colon", "user-manager", "dash-H", "dash-dash-force",
         "systemd-unit", "dbus", "sshd", "elsewhere", "not-running", "root-cgroup"],
)  # fmt: skip
def test_a_holder_accelmon_may_not_stop_is_named_and_its_unit_left_running(tmp_path, monkeypatch, cgroup, uid, groups):
    """Issue 64, point 6: the reset stops only processes in a system service that systemd confirms holds them,
    never Slurm's daemons, sshd, the bus, systemd's own, a user's or one named like an option; such a holder is named
    in the journal, no reset is run, and only the configured units are stopped (and started again)."""
    monkeypatch.setattr(gpu_reset, "HOLDERS_EXIT_SECONDS", 0.2)
    procfs = node_procfs(tmp_path)
    holding(procfs, 950, "python3", cgroup, "/dev/nvidia3", uid=uid)
    cluster, systemd, loop = reset_held(tmp_path, procfs, "slurmd.service", "user@1000.service", "-H.service",
                                        "--force.service", "nvidia-persistenced.service", "systemd-logind.service",
                                        "dbus.service", "sshd.service", groups=groups)  # fmt: skip
    assert systemd.stopped() == ["accelmon-exporter.service"], systemd.calls
    assert not (tmp_path / "resets").exists()
    failed = Journal.read(loop.options.journal).records[-2]
    assert failed.detail.startswith("not reset: still held by pid 950 (python3"), failed.detail
    assert "DRAIN" in cluster.node(NODE)["state"]


def test_the_health_checks_own_unit_is_never_stopped(tmp_path, monkeypatch):
    """The unit the check runs in (/proc/self/cgroup, read as a holder's) holds the GPU: named, not stopped."""
    monkeypatch.setattr(gpu_reset, "HOLDERS_EXIT_SECONDS", 0.2)
    procfs = node_procfs(tmp_path)
    (procfs / "self").mkdir()
    (procfs / "self" / "cgroup").write_text("0::/system.slice/accelmon-health.service\n")
    holding(procfs, 960, "accelmon-slurm", "0::/system.slice/accelmon-health.service", "/dev/nvidia3")
    cluster, systemd, _ = reset_held(tmp_path, procfs, "accelmon-health.service")
    assert systemd.stopped() == ["accelmon-exporter.service"], systemd.calls
    assert "still held by pid 960" in cluster.node(NODE)["reason"]


def test_a_root_service_systemd_confirms_is_stopped_from_a_cgroup_below_its_own(tmp_path):
    """A service's process in a cgroup of its own below the unit's (Delegate=yes): systemd's ControlGroup is its
    parent, so it is confirmed and stopped; a second process of it is stopped with it."""
    procfs = node_procfs(tmp_path)
    holding(procfs, 970, "nv-hostengine", "0::/system.slice/nvidia-dcgm.service/engine", "/dev/nvidia3")
    holding(procfs, 971, "nv-hostengine", "0::/system.slice/nvidia-dcgm.service", "/dev/nvidia3")
    cluster, systemd, _ = reset_held(tmp_path, procfs, "nvidia-dcgm.service")
    assert (tmp_path / "resets").read_text() == BUS + "\n"
    assert systemd.stopped() == ["accelmon-exporter.service", "nvidia-dcgm.service"], systemd.calls
    assert systemd.calls.count("show --property=ControlGroup --value -- nvidia-dcgm.service") == 1
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}


def test_a_process_that_keeps_the_gpu_is_named_and_no_reset_is_run(tmp_path, monkeypatch):
    """A user's process that outlived its job holds GPU 2 (a job scope: never accelmon's to stop): the reset the driver
    would refuse is not run; the journal names the process; the node is left drained for a person."""
    # The wait for holders to let go, cut short: with the loop's sleep a no-op, its 10 s re-read procfs on one core.
    monkeypatch.setattr(gpu_reset, "HOLDERS_EXIT_SECONDS", 0.2)
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
    config = scan_config(tmp_path, fake_nvml)
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
    monkeypatch.setattr(diag, "DIAG_READY_SECONDS", 60.0 if resumed else 0.3)
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


@pytest.mark.parametrize(
    ("cgroup", "confirms"),
    [
        ("/system.slice/gpu-standin.service", True),
        ("/system.slice/gpu-standin.service/worker", True),
        ("/libpod_parent/libpod-ab12/system.slice/gpu-standin.service", True),  # systemd's root is the container's
        ("/system.slice/gpu-standin.service-other", False),
        ("/user.slice/user-1000.slice/user@1000.service/system.slice/gpu-standin.service", False),
    ],
)
def test_systemd_confirms_a_holder_from_its_own_root(cgroup, confirms):
    """The Molecule cluster's systemd runs in a container that sees the host's cgroup tree (cgroup v1): /proc and
    systemd both name the stand-in holder /libpod_parent/libpod-ID/system.slice/gpu-standin.service (measured in the
    image: `systemctl show -p ControlGroup` gives the full path). Read strictly from the root, it was never stopped
    and every reset failed."""
    holder = Holder(900, "python3", "gpu-standin.service", cgroup)
    root = cgroup.split("/system.slice/")[0] if cgroup.startswith("/libpod_parent") else ""
    assert gpu_reset.confirmed(holder, f"{root}/system.slice/gpu-standin.service") is confirms
    user = "/user.slice/user-1000.slice/user@1000.service"  # a user's manager's "system.slice" is never systemd's
    mimic = f"{user}/system.slice/gpu-standin.service"
    assert not gpu_reset.confirmed(Holder(900, "x", "gpu-standin.service", mimic), mimic)
