"""What each batch job uses on the CPU side, from its cgroup: CPU time and throttling, memory (now, peak, limit,
swap), I/O bytes, tasks, and the CPUs it was given. The job-performance seed's per-job core, read as Princeton's
jobstats does (from the cgroups Slurm's plugins make), without a daemon per job.

Example exposition lines::

    accelmon_job_cpu_seconds_total{job_id="4242",mode="user"} 7312.5
    accelmon_job_memory_peak_bytes{job_id="4242"} 6.2e+10

Series exist only for jobs with a record (Slurm: in the jobs collector's state directory, the prolog writes it, the
epilog removes it; OAR: its own job files), so they are bounded by the jobs on the node and leave with the job. A
job's cgroup is found by its directory name: Slurm's `job_<id>`, cgroup v2 `system.slice/slurmstepd.scope/job_<id>`
(one directory, every controller), cgroup v1 `<controller>/slurm[_<node>]/uid_<uid>/job_<id>` (one per
controller); OAR's v1 `<controller>/oar/<user>_<id>` (its memory controller only where the site turned it on in
OAR's job_resource_manager_cgroups.pl). Counters are the kernel's, cumulative over the job's life: `rate()` gives
CPU cores in use, and used over `accelmon_job_cpus_allocated` the CPU efficiency. A file a kernel lacks (memory.peak
before Linux 5.19) leaves its series out; a job whose cgroup is not found is counted in `accelmon_jobs_without_cgroup`.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

from accelmon.exporter.metrics import Catalogue, MetricSpec, Samples, scaled
from accelmon.exporter.registry import Registration, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.job_sources import has_job_records, recorded_job_ids
from accelmon.job_sources.cgroups import cpu_list, job_cgroups, read_first
from accelmon.job_sources.oar import OAR_RUNTIME_DIR
from accelmon.job_sources.slurm import STATE_DIR

log = logging.getLogger("accelmon.job_resources")

JOB = ("job_id",)
INTERVAL = seconds("interval_seconds", 10, "how often the jobs' cgroups are read")
C = Catalogue(
    "job_resources",
    "Batch jobs' CPU, memory and I/O (cgroups)",
    "Source: each job's cgroup (v2: cpu.stat, memory.current/peak/max, memory.swap.current, io.stat, pids.current, "
    "cpuset.cpus.effective; v1: cpuacct, cpu, memory, blkio, pids and cpuset controllers), for the jobs with a "
    "record in `state_dir`. Conversions: microseconds (v2) and nanoseconds or USER_HZ ticks (v1) to seconds. "
    "Job series carry only `job_id`; join to user and account through `accelmon_gpu_job_info`.",
)
CPU = C.counter("accelmon_job_cpu_seconds_total", "CPU time the job's processes used, by mode.", [*JOB, "mode"])
THROTTLED = C.counter(
    "accelmon_job_cpu_throttled_seconds_total", "Time the job's processes were held back by its CPU quota.", JOB
)
CPUS = C.gauge("accelmon_job_cpus_allocated", "CPUs the job may run on (its cgroup's cpuset).", JOB)
MEMORY = C.gauge("accelmon_job_memory_used_bytes", "Memory the job uses now (page cache included).", JOB)
MEMORY_PEAK = C.gauge("accelmon_job_memory_peak_bytes", "Most memory the job has used at once.", JOB)
MEMORY_LIMIT = C.gauge("accelmon_job_memory_limit_bytes", "The job's memory limit (absent without one).", JOB)
SWAP = C.gauge("accelmon_job_swap_used_bytes", "Swap the job uses now.", JOB)
IO = C.counter(
    "accelmon_job_io_bytes_total", "Bytes the job read from and wrote to block devices.", [*JOB, "direction"]
)
TASKS = C.gauge("accelmon_job_tasks", "Processes and threads in the job.", JOB)
WITHOUT_CGROUP = C.gauge(
    "accelmon_jobs_without_cgroup", "Jobs with a record whose cgroup was not found (no cgroup plugin?).", ()
)

UNLIMITED = 2**62  # v1 reports "no limit" as a page-rounded 2^63-1
USER_HZ = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _number(text: Optional[str]) -> Optional[float]:
    if text is None:
        return None
    word = text.strip()
    if word == "max":
        return None  # v2: no limit
    try:
        return float(word)
    except ValueError:
        return None


def _keyed(text: Optional[str]) -> dict[str, float]:
    """`key value` lines (cpu.stat, cpuacct.stat), malformed lines skipped."""
    values: dict[str, float] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                values[parts[0]] = float(parts[1])
            except ValueError:
                continue
    return values


def cpu_count(cpuset: Optional[str]) -> Optional[int]:
    """How many CPUs a cpuset list such as `0-3,8,10-11` names."""
    cpus = cpu_list(cpuset)
    return None if cpus is None else len(cpus)


def io_bytes_v2(text: Optional[str]) -> Optional[tuple[float, float]]:
    """(read, written) over every device of io.stat (`8:0 rbytes=1 wbytes=2 rios=...`)."""
    if text is None:
        return None
    read = written = 0.0
    for line in text.splitlines():
        for field in line.split()[1:]:
            key, _, value = field.partition("=")
            if key in ("rbytes", "wbytes") and value.isdigit():
                if key == "rbytes":
                    read += float(value)
                else:
                    written += float(value)
    return read, written


def io_bytes_v1(text: Optional[str]) -> Optional[tuple[float, float]]:
    """(read, written) from blkio.throttle.io_service_bytes (`8:0 Read 123`; its `Total` lines skipped)."""
    if text is None:
        return None
    read = written = 0.0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            if parts[1] == "Read":
                read += float(parts[2])
            elif parts[1] == "Write":
                written += float(parts[2])
    return read, written


class JobResourcesCollector(Collector):
    name = "job_resources"

    def __init__(self, state_dir: str, cgroup_root: str, oar_runtime_dir: str = "") -> None:
        self.state_dir = state_dir
        self.cgroup_root = cgroup_root
        self.oar_runtime_dir = oar_runtime_dir

    def sample(self) -> Samples:
        out = Samples()
        jobs = recorded_job_ids(self.state_dir, self.oar_runtime_dir)
        cgroups = job_cgroups(self.cgroup_root, jobs) if jobs else {}
        for job in sorted(jobs):
            if job in cgroups:
                self._job(job, cgroups[job], out)
        out.add(WITHOUT_CGROUP, [], len(jobs - set(cgroups)))
        return out

    def _job(self, job: str, directories: list[str], out: Samples) -> None:
        labels = [job]

        def put(spec: MetricSpec, value: Optional[float], *extra: str) -> None:
            if value is not None:
                out.add(spec, [*labels, *extra], value)

        v2 = read_first(directories, "cgroup.controllers") is not None
        if v2:
            cpu = _keyed(read_first(directories, "cpu.stat"))
            put(CPU, scaled(cpu.get("user_usec"), 1e-6), "user")
            put(CPU, scaled(cpu.get("system_usec"), 1e-6), "system")
            put(THROTTLED, scaled(cpu.get("throttled_usec"), 1e-6))
            put(CPUS, cpu_count(read_first(directories, "cpuset.cpus.effective")))
            put(MEMORY, _number(read_first(directories, "memory.current")))
            put(MEMORY_PEAK, _number(read_first(directories, "memory.peak")))
            put(MEMORY_LIMIT, _number(read_first(directories, "memory.max")))
            put(SWAP, _number(read_first(directories, "memory.swap.current")))
            io = io_bytes_v2(read_first(directories, "io.stat"))
        else:
            ticks = _keyed(read_first(directories, "cpuacct.stat"))
            put(CPU, scaled(ticks.get("user"), 1 / USER_HZ), "user")
            put(CPU, scaled(ticks.get("system"), 1 / USER_HZ), "system")
            put(THROTTLED, scaled(_keyed(read_first(directories, "cpu.stat")).get("throttled_time"), 1e-9))
            put(CPUS, cpu_count(read_first(directories, "cpuset.cpus")))
            used = _number(read_first(directories, "memory.usage_in_bytes"))
            put(MEMORY, used)
            put(MEMORY_PEAK, _number(read_first(directories, "memory.max_usage_in_bytes")))
            limit = _number(read_first(directories, "memory.limit_in_bytes"))
            put(MEMORY_LIMIT, limit if limit is not None and limit < UNLIMITED else None)
            with_swap = _number(read_first(directories, "memory.memsw.usage_in_bytes"))
            put(SWAP, max(0.0, with_swap - used) if with_swap is not None and used is not None else None)
            io = io_bytes_v1(read_first(directories, "blkio.throttle.io_service_bytes"))
        if io is not None:
            put(IO, io[0], "read")
            put(IO, io[1], "write")
        put(TASKS, _number(read_first(directories, "pids.current")))


REGISTRATION = register(
    Registration(
        name="job_resources",
        help="batch jobs' CPU, memory and I/O from their cgroups (default: on where job records are kept)",
        build=lambda options, paths: JobResourcesCollector(
            str(options["state_dir"]), os.path.join(paths.sysfs, "fs", "cgroup"), str(options["oar_runtime_dir"])
        ),
        catalogue=C,
        options=(INTERVAL, STATE_DIR, OAR_RUNTIME_DIR),
        enabled_by_default=has_job_records,
    )
)
