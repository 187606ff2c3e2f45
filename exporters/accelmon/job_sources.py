"""Where batch jobs come from, for every collector and hook that needs to know which job is which: the records of
Slurm's prolog and OAR's own job files (which jobs run here, their user, account and GPUs), and the cgroups their
schedulers make (which processes and which cgroup directories are a job's). The job collectors (`jobs`,
`job_resources`, `job_perf`), the process collectors (`gpu_processes`, `neuron`) and the scheduler hooks read jobs
through this module only; no collector imports another.

Slurm: the role's prolog writes a small `KEY=VALUE` record per job into `state_dir` and its epilog removes it
(`scheduler`, `job_id`, `user`, `account`, `gpus`, comma-separated indices or UUIDs).

OAR (2.5, Debian's packages): its job resource manager (`job_resource_manager_cgroups.pl`) runs on every node of a
job at its start and end, and writes there, in OAR's runtime directory (oar.conf OAR_RUNTIME_DIRECTORY, by default
/var/lib/oar, world-readable), `<user>_<job id>.env` (OAR_JOBID, OAR_USER, OAR_PROJECT_NAME as `export KEY='VALUE'`)
and `<job id>_resources` (one line per resource of the job, `property = 'value' ,` pairs); both are removed when
the job ends. The GPUs on this node are the `gpudevice` property (the device minor number, the property OAR's own
device cgroup reads) of the job's resources whose `network_address` is this host (docs/jobs.md). Measured with
OAR 2.5.9 in the Molecule `oar` scenario.

Processes are put in jobs by their cgroup (`JobOfProcess`): Slurm's cgroup plugins make a directory `job_<id>` for
each job, whose tree lists the job's processes in world-readable `cgroup.procs` files, so this works where the
exporter's hardening (ProtectProc=invisible) hides other users' processes in /proc. OAR's cgroup is
`<controller>/oar/<user>_<job id>` (cgroup v1, OAR's CPUSET_PATH `/oar`).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Callable
from typing import Any, Optional

from accelmon.validation import Option

log = logging.getLogger("accelmon.jobs")

KEYS = ("scheduler", "job_id", "user", "account", "gpus")
MAX_VALUE = 256  # a label value longer than this is cut: a record is input from a script, not trusted to be small
MAX_RECORD_BYTES = 64 * 1024
# The job records' directory: one declaration, which job_resources and job_perf share and the role reads through
# `--check-config --json` (and renders into the prolog and epilog).
STATE_DIR = Option(
    "state_dir", "/run/accelmon/jobs", "where the scheduler's prolog writes one record per job", shared=True
)
OAR_RUNTIME_DIR = Option(
    "oar_runtime_dir",
    "/var/lib/oar",
    "OAR's runtime directory (oar.conf OAR_RUNTIME_DIRECTORY), where OAR keeps a file per job on each of its nodes; "
    "empty: OAR jobs are not read",
    empty=True,
    shared=True,
)
# Slurm's job cgroup: cgroup v1 <controller>/slurm[_<node>]/uid_<uid>/job_<id>, cgroup v2
# system.slice/slurmstepd.scope/job_<id>; the steps and tasks below it.
SLURM_JOB_CGROUP = re.compile(r"^job_(\d+)$")
# OAR's: cgroup v1 <controller>/oar/<user>_<id> (OAR's CPUSET_PATH, /oar), no directories below it.
OAR_JOB_CGROUP = re.compile(r"^.+_(\d+)$")
OAR_CGROUP_PARENT = "oar"
OAR_ENV_FILE = re.compile(r"^(?P<user>.+)_(?P<job>\d+)\.env$")
OAR_ENV_LINE = re.compile(r"^export (OAR_[A-Z_]+)='([^']*)'$")
OAR_PROPERTY = re.compile(r"\s*(\w+) = '([^']*)' ?,?")
MAX_CGROUP_DEPTH = 6  # from the cgroup root down to a job's directory (v1: 4, v2: 3); deeper trees are not read


def job_of_cgroup(directory: str) -> str | None:
    """The batch job whose cgroup `directory` is (Slurm's `job_<id>`, OAR's `oar/<user>_<id>`), else None."""
    name = os.path.basename(directory)
    match = SLURM_JOB_CGROUP.match(name)
    if match is None and os.path.basename(os.path.dirname(directory)) == OAR_CGROUP_PARENT:
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


def _clean(value: str) -> str:
    return "".join(c for c in value if c.isprintable())[:MAX_VALUE]


def read_record(path: str) -> tuple[dict[str, str], int]:
    """A job record's known keys, and how many lines were malformed; OSError if it is gone."""
    with open(path, encoding="utf-8", errors="replace") as stream:
        text = stream.read(MAX_RECORD_BYTES)
    record: dict[str, str] = {}
    bad = 0
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not line.strip() or line.startswith("#"):
            continue
        if not sep or key.strip() not in KEYS:
            bad += 1
            continue
        record[key.strip()] = _clean(value.strip())
    return record, bad


def record_names(state_dir: str) -> list[str]:
    """The records in the state directory (a name starting with a dot is one being written)."""
    try:
        return sorted(n for n in os.listdir(state_dir) if not n.startswith("."))
    except OSError:
        return []


def oar_record_names(runtime_dir: str) -> list[str]:
    """OAR's per-job files on this node (`<user>_<job id>.env`); none where OAR is not read."""
    if not runtime_dir:
        return []
    try:
        return sorted(name for name in os.listdir(runtime_dir) if OAR_ENV_FILE.match(name))
    except OSError:
        return []


def read_oar_record(runtime_dir: str, name: str, node: str, gpu_property: str) -> tuple[dict[str, str], int]:
    """An OAR job's record on this node, in the keys of a Slurm one, from OAR's own files (module docstring), and
    how many of their lines were malformed; OSError if the job ended meanwhile (OAR removed its files)."""
    match = OAR_ENV_FILE.match(name)
    if match is None:
        return {}, 1
    job = match.group("job")
    with open(os.path.join(runtime_dir, name), encoding="utf-8", errors="replace") as stream:
        lines = stream.read(MAX_RECORD_BYTES).splitlines()
    env: dict[str, str] = {}
    for found in filter(None, map(OAR_ENV_LINE.match, lines)):
        env[found.group(1)] = found.group(2)
    if env.get("OAR_JOBID") != job:
        return {}, 1  # not the file OAR writes for this job
    bad = 0
    gpus: list[str] = []
    try:
        with open(os.path.join(runtime_dir, job + "_resources"), encoding="utf-8", errors="replace") as stream:
            for line in stream:  # one line per resource of the job, on every node: a large job's file is large
                if not line.strip():
                    continue
                properties = dict(OAR_PROPERTY.findall(line)) if len(line) <= MAX_RECORD_BYTES else {}
                if "network_address" not in properties:
                    bad += 1
                    continue
                if properties.get("type", "default") != "default" or _short(properties["network_address"]) != node:
                    continue
                gpu = properties.get(gpu_property, "")
                if gpu and gpu not in gpus:
                    gpus.append(gpu)
    except FileNotFoundError:
        pass  # OAR writes it before the .env and removes it after: a job without it has no GPUs to name
    record = {
        "scheduler": "oar",
        "job_id": job,
        "user": _clean(env.get("OAR_USER", match.group("user"))),
        "account": _clean(env.get("OAR_PROJECT_NAME", "")),
        "gpus": _clean(",".join(gpus)),
    }
    return record, bad


def _oar_job(name: str) -> str:
    """The job id in the name of OAR's `<user>_<job id>.env`."""
    match = OAR_ENV_FILE.match(name)
    return match.group("job") if match else ""


def _short(host: str) -> str:
    return host.split(".")[0].lower()


class OarJobs:
    """OAR's jobs on this node, from the files OAR keeps for each (module docstring). A file is parsed again only
    when it changed, so its malformed lines are counted once and a large job's resource list is not re-read."""

    def __init__(self, runtime_dir: str, node_name: str = "", gpu_property: str = "gpudevice") -> None:
        self.runtime_dir = runtime_dir
        self.node = _short(node_name or socket.gethostname())
        self.gpu_property = gpu_property
        self.malformed = 0
        self._parsed: dict[str, tuple[tuple[int, ...], dict[str, str]]] = {}  # name -> (files' versions, record)

    def records(self) -> list[dict[str, str]]:
        records = []
        parsed = {}
        for name in oar_record_names(self.runtime_dir):
            path = os.path.join(self.runtime_dir, name)
            resources = os.path.join(self.runtime_dir, _oar_job(name) + "_resources")
            try:
                version = _version(path) + _version(resources)
                if name in self._parsed and self._parsed[name][0] == version:
                    record = self._parsed[name][1]
                else:
                    record, bad = read_oar_record(self.runtime_dir, name, self.node, self.gpu_property)
                    if bad:
                        self.malformed += bad
                        log.warning("OAR job files %s: %d malformed line(s) skipped", path, bad)
            except OSError:
                continue  # the job ended while being read
            parsed[name] = (version, record)
            if record:
                records.append(record)
        self._parsed = parsed
        return records


def _version(path: str) -> tuple[int, ...]:
    """A file's (mtime, size), or () for a file that is not there."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return ()
    return (status.st_mtime_ns, status.st_size)


def recorded_job_ids(state_dir: str, oar_runtime_dir: str = "") -> set[str]:
    """The ids of the jobs with a record (Slurm's prolog's, or OAR's own): what bounds every per-job series."""
    ids = {_oar_job(name) for name in oar_record_names(oar_runtime_dir)}
    for name in record_names(state_dir):
        try:
            job = read_record(os.path.join(state_dir, name))[0].get("job_id", "")
        except OSError:
            continue
        if job.isdigit():
            ids.add(job)
    return ids


def has_job_records(paths: Any, options: dict[str, object]) -> bool:
    """Whether this host keeps job records: accelmon's state directory (made by the role for Slurm) or OAR's."""
    return os.path.isdir(str(options["state_dir"])) or (
        bool(options["oar_runtime_dir"]) and os.path.isdir(str(options["oar_runtime_dir"]))
    )


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
