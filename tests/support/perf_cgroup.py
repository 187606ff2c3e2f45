"""A real cgroup that the kernel's perf events can count in, for the job_perf test and bench: job `<id>` under a
cgroup of the caller's own, seen through a fixture sysfs whose CPU list and PMU list are the host's."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator


def perf_event_on_v1() -> bool:
    """Whether the perf_event controller is bound to a v1 hierarchy now (on our hybrid machines it moves there once a
    systemd container mounts it, as the Molecule hosts do; it is on the unified hierarchy otherwise)."""
    with open("/proc/cgroups", encoding="ascii") as stream:
        return any(line.split()[1] != "0" for line in stream if line.startswith("perf_event"))


def can_make_cgroups() -> bool:
    return os.geteuid() == 0


@contextlib.contextmanager
def job_cgroup(root: Path, job: int) -> Iterator[Path]:
    """Yields job `job`'s real cgroup directory; `root`/sys is the fixture sysfs whose fs/cgroup holds it: the
    caller's own cgroup on the unified hierarchy or, where perf_event is on a v1 hierarchy, that hierarchy mounted
    again under fs/cgroup/perf_event (a second mount of an existing hierarchy changes nothing else). Needs root."""
    sys_root = root / "sys"
    cgroup = sys_root / "fs" / "cgroup"
    cgroup.mkdir(parents=True)
    (sys_root / "devices").symlink_to("/sys/devices")
    (sys_root / "bus").symlink_to("/sys/bus")
    mounted = None
    if perf_event_on_v1():
        mounted = cgroup / "perf_event"
        mounted.mkdir()
        subprocess.run(["mount", "-t", "cgroup", "-o", "perf_event", "perf_event", str(mounted)], check=True)
        parent = mounted / f"accelmon-test-{os.getpid()}"
    else:
        candidates = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
        unified = next(p for p in candidates if (p / "cgroup.controllers").exists())
        parent = unified / f"accelmon-test-{os.getpid()}"
        cgroup.rmdir()
        cgroup.symlink_to(parent)
    # Where Slurm's cgroup v2 plugin puts it (accelmon.job_sources.cgroups knows a job's directory by its parent too).
    directory = parent / "slurmstepd.scope" / f"job_{job}"
    directory.mkdir(parents=True)
    try:
        yield directory
    finally:
        for leaf in (directory, directory.parent, parent):
            for _ in range(50):  # a process that just exited may still be leaving the cgroup
                try:
                    leaf.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], check=True)
