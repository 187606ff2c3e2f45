"""Which processes and which cgroup directories are a batch job's, from the cgroups the schedulers make.

Processes are put in jobs by their cgroup (`JobOfProcess`): Slurm's cgroup plugins make a directory `job_<id>` for
each job, whose tree lists the job's processes in world-readable `cgroup.procs` files, so this works where the
exporter's hardening (ProtectProc=invisible) hides other users' processes in /proc. OAR's cgroup is
`<controller>/oar/<user>_<job id>` (cgroup v1, OAR's CPUSET_PATH `/oar`).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Optional

# Slurm's job cgroup: cgroup v1 <controller>/slurm[_<node>]/uid_<uid>/job_<id>, cgroup v2
# system.slice/slurmstepd.scope/job_<id>; the steps and tasks below it.
SLURM_JOB_CGROUP = re.compile(r"^job_(\d+)$")
# OAR's: cgroup v1 <controller>/oar/<user>_<id> (OAR's CPUSET_PATH, /oar), no directories below it.
OAR_JOB_CGROUP = re.compile(r"^.+_(\d+)$")
OAR_CGROUP_PARENT = "oar"
MAX_CGROUP_DEPTH = 6  # from the cgroup root down to a job's directory (v1: 4, v2: 3); deeper trees are not read


# Where Slurm puts `job_<id>`: under v1's uid_<uid>, under v2's slurmstepd.scope (<node>_slurmstepd.scope where
# several slurmd share a host).
SLURM_JOB_PARENT = re.compile(r"^(uid_\d+|(.+_)?slurmstepd\.scope)$")
# A user's own subtree on cgroup v2 (systemd delegates user@<uid>.service to its user, who may make any directory in
# it): nothing there is a scheduler's, whatever its name.
USER_SUBTREE = re.compile(r"^(user\.slice|user@\d+\.service)$")


def job_of_cgroup(directory: str) -> str | None:
    """The batch job whose cgroup `directory` is (Slurm's `uid_<uid>/job_<id>` or `slurmstepd.scope/job_<id>`, OAR's
    `oar/<user>_<id>`), else None. The parent is part of the name: a user who makes `job_100` in their delegated
    subtree (user@<uid>.service) must not have their processes counted as job 100's."""
    parts = directory.split(os.sep)
    if len(parts) < 2 or any(USER_SUBTREE.match(part) for part in parts):
        return None
    name, parent = parts[-1], parts[-2]
    match = SLURM_JOB_CGROUP.match(name) if SLURM_JOB_PARENT.match(parent) else None
    if match is None and parent == OAR_CGROUP_PARENT:
        match = OAR_JOB_CGROUP.match(name)
    return match.group(1) if match else None


def job_pids(cgroup_root: str) -> dict[int, str]:
    """Every process in a batch job's cgroup, with its job id."""
    pids: dict[int, str] = {}
    pending = [(cgroup_root, 0)]
    while pending:
        directory, depth = pending.pop()
        job = job_of_cgroup(directory)
        if job is not None:
            _read_job_tree(directory, job, pids)  # the job's own tree, once
        elif depth < MAX_CGROUP_DEPTH:
            pending.extend((below, depth + 1) for below in _subdirectories(directory, with_leaves=False))
    return pids


def _subdirectories(directory: str, with_leaves: bool = True) -> list[str]:
    """The directories in `directory` (symlinks, as v1's cpu -> cpu,cpuacct, not followed). Without leaves: not
    those that hold no directory and are no job's, which a walk for jobs need not list. A cgroup directory holds
    30-60 files and most are leaves (one per service and scope), so skipping them halves a walk: a directory's
    link count is 2 + its subdirectories on cgroupfs (kernfs) and tmpfs; where a file system keeps no such count
    (btrfs answers 1), every directory is listed."""
    try:
        with os.scandir(directory) as entries:
            found = [entry for entry in entries if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []  # removed while being read
    if with_leaves:
        return [entry.path for entry in found]
    inner = []
    for entry in found:
        try:
            leaf = entry.stat(follow_symlinks=False).st_nlink == 2
        except OSError:
            continue
        if not leaf or job_of_cgroup(entry.path) is not None:
            inner.append(entry.path)
    return inner


def _read_job_tree(directory: str, job: str, pids: dict[int, str]) -> None:
    pending = [directory]
    while pending:
        inner = pending.pop()
        try:
            with open(os.path.join(inner, "cgroup.procs"), encoding="ascii", errors="replace") as stream:
                for line in stream:
                    if line.strip().isdigit():
                        pids.setdefault(int(line), job)
        except OSError:
            pass  # no such file (a v1 controller without it) or the step ended while being read
        pending.extend(_subdirectories(inner))


class JobOfProcess:
    """The batch job a process runs in ("" for none), from the cgroup tree under `cgroup_root`. The tree is read
    again only when asked about a process it did not hold, and at most every `refresh_seconds`: a new runtime is
    placed within that time, and a node without jobs costs one walk per period, not one per question. A process
    a walk found in no job (a service using a GPU, a login session's tool) is not looked for again before
    `recheck_seconds`: otherwise it made every sample walk the host's whole cgroup tree (33 ms a sample on our
    machine, half the exporter's CPU); a process asked about since the latest walk is judged by the next one."""

    def __init__(
        self,
        cgroup_root: str,
        refresh_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        recheck_seconds: float = 60.0,
    ) -> None:
        self.cgroup_root = cgroup_root
        self.refresh_seconds = refresh_seconds
        self.recheck_seconds = recheck_seconds
        self._clock = clock
        self._pids: dict[int, str] = {}
        self._read_at: float | None = None
        self._in_no_job: dict[int, float] = {}  # pid -> when a walk last found it in no job
        self._asked: set[int] = set()  # asked about since the latest walk, and not in it
        self._asked_in_no_job: set[int] = set()  # found in no job, and asked about again since the latest walk

    def __call__(self, pid: int) -> str:
        job = self._pids.get(pid)
        if job is not None:
            return job
        now = self._clock()
        checked = self._in_no_job.get(pid)
        if checked is not None and now - checked < self.recheck_seconds:
            self._asked_in_no_job.add(pid)
            return ""
        if self._read_at is None or now - self._read_at >= self.refresh_seconds:
            self._pids = job_pids(self.cgroup_root)
            self._read_at = now
            # Running before this walk began and not in it: in no job (tasks are in their job's cgroup from start).
            # Every process found in no job before is judged again by this walk: one walk a recheck period for all
            # of them, not one for each process found at another time (two walks a minute for a node's services).
            # Those not asked about since the walk before expire as before: ended processes are not kept.
            judged = {p: now for p in (*self._asked_in_no_job, *self._asked, pid) if p not in self._pids}
            kept = {p: t for p, t in self._in_no_job.items() if now - t < self.recheck_seconds and p not in judged}
            self._in_no_job = {**kept, **judged}
            self._asked_in_no_job.clear()
            self._asked.clear()
            return self._pids.get(pid, "")
        self._asked.add(pid)  # started after the latest walk, perhaps: the next walk tells
        return ""


def job_cgroups(root: str, jobs: set[str]) -> dict[str, list[str]]:
    """The cgroup directories of each job in `jobs`: one (v2) or one per controller (v1)."""
    found: dict[str, list[str]] = {}
    base = root.rstrip(os.sep).count(os.sep)
    for directory, subdirectories, _ in os.walk(root):  # symlinks (v1's cpu -> cpu,cpuacct) not followed
        job = job_of_cgroup(directory)
        if job is not None:
            subdirectories.clear()
            if job in jobs:
                found.setdefault(job, []).append(directory)
        elif directory.count(os.sep) - base >= MAX_CGROUP_DEPTH:
            subdirectories.clear()
    return found


def read_first(directories: list[str], name: str) -> Optional[str]:
    """The first of `directories` that has the file `name`: the controller that owns it (v1), or the one (v2)."""
    for directory in directories:
        try:
            with open(os.path.join(directory, name), encoding="ascii", errors="replace") as stream:
                return stream.read()
        except OSError:
            continue
    return None


def cpu_list(cpuset: Optional[str]) -> Optional[list[int]]:
    """The CPUs of a cpuset list such as `0-3,8,10-11`; None for an empty or malformed one."""
    if cpuset is None or not cpuset.strip():
        return None
    cpus: list[int] = []
    for part in cpuset.strip().split(","):
        first, _, last = part.partition("-")
        try:
            cpus.extend(range(int(first), int(last) + 1) if last else [int(first)])
        except ValueError:
            return None
    return cpus
