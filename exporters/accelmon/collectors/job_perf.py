"""Hardware and software counters per batch job, counted by the kernel in the job's cgroup: cycles, instructions,
cache references and misses, branch misses, context switches, CPU migrations, page faults, and floating-point
operations by precision where the CPU's micro-architecture is in the table of `accelmon.host.perf_events`.

Example exposition lines::

    accelmon_job_instructions_total{job_id="4242"} 8.1e+13
    accelmon_job_floating_point_operations_total{job_id="4242",precision="double"} 2.2e+13
    accelmon_job_perf_event_available{event="cycles",reason="no_pmu"} 0

Off unless enabled: counting whole CPUs for a cgroup needs CAP_PERFMON, which the role grants the exporter only
with this collector on. Counters open when a job's record and cgroup appear (one per event and CPU of the job's
cpuset) and close when the record goes, so counts start within one interval of the job's start; an exporter
restart starts them again from zero, which `rate()` and `increase()` take as a counter reset.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
from dataclasses import dataclass, field
from typing import Optional

from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import Option, Registration, never, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.host import perf_events
from accelmon.host.perf_events import Counters, Event, KernelCounters, PerfError
from accelmon.job_sources import recorded_job_ids
from accelmon.job_sources.cgroups import cpu_list, job_cgroups, read_first
from accelmon.job_sources.oar import OAR_RUNTIME_DIR
from accelmon.job_sources.slurm import STATE_DIR

log = logging.getLogger("accelmon.job_perf")

JOB = ("job_id",)
C = Catalogue(
    "job_perf",
    "Batch jobs' hardware and software counters (perf events)",
    "Source: perf_event_open(2) in cgroup mode on each job's cgroup (v2: `job_<id>`; v1: the perf_event "
    "controller's), one counter per event and CPU of the job's cpuset, counting (never sampling), user and kernel "
    "time. Values are scaled by time enabled over time running where the kernel multiplexed more events than the "
    "CPU has counters. FLOPS events by micro-architecture: docs/jobs.md. Needs CAP_PERFMON (or "
    "kernel.perf_event_paranoid <= 0); `accelmon_job_perf_event_available` says which events count and why not.",
)
METRICS = {
    "cycles": C.counter("accelmon_job_cpu_cycles_total", "CPU cycles the job's tasks ran.", JOB),
    "instructions": C.counter("accelmon_job_instructions_total", "Instructions the job's tasks retired.", JOB),
    "cache_references": C.counter(
        "accelmon_job_cache_references_total", "Cache references (the CPU's generic event: last level on Intel).", JOB
    ),
    "cache_misses": C.counter(
        "accelmon_job_cache_misses_total", "Cache misses (the CPU's generic event: last level on Intel).", JOB
    ),
    "branch_misses": C.counter("accelmon_job_branch_misses_total", "Mispredicted branches of the job's tasks.", JOB),
    "context_switches": C.counter("accelmon_job_context_switches_total", "Context switches of the job's tasks.", JOB),
    "cpu_migrations": C.counter(
        "accelmon_job_cpu_migrations_total", "Moves of the job's tasks from one CPU to another.", JOB
    ),
    "page_faults": C.counter("accelmon_job_page_faults_total", "Page faults of the job's tasks.", JOB),
}
FLOPS = C.counter(
    "accelmon_job_floating_point_operations_total",
    "Floating-point operations the job's tasks retired (vector instructions counted per element, FMA as two), "
    "by precision (`any` where the CPU does not tell them apart).",
    [*JOB, "precision"],
)
AVAILABLE = C.gauge(
    "accelmon_job_perf_event_available",
    "1 if the event counts on this host, 0 if not, with the reason (counting, no_pmu, not_supported, permission, "
    "no_perf_cgroup, kernel_refused, too_many_open_files, unknown_microarchitecture).",
    ["event", "reason"],
)
JOBS = C.gauge(
    "accelmon_job_perf_jobs",
    "Jobs with a record, by counting state (counting, no_cgroup, no_perf_cgroup: a v1 host without the perf_event "
    "controller, over_budget: max_counters reached, no_events: no event counts on this host, "
    "accelmon_job_perf_event_available says why).",
    ["state"],
)
OPEN = C.gauge("accelmon_job_perf_counters_open", "Counters (file descriptors) open for the jobs now.")
ERRORS = C.counter(
    "accelmon_job_perf_errors_total", "Counters that could not be opened or read for a job, by reason.", ["reason"]
)
JOB_STATES = ("counting", "no_cgroup", "no_perf_cgroup", "over_budget", "no_events")
FLOPS_EVENT = "flops"  # the `event` label of the FLOPS events' availability, whatever the CPU's raw events are

INTERVAL = seconds("interval_seconds", 10, "how often the jobs' counters are read")
MAX_COUNTERS = Option(
    "max_counters",
    8192.0,
    "most counters open at once (one per event and CPU of each job): a job that would pass it is not counted",
    minimum=1,
    maximum=1_000_000,
    whole=True,
)


@dataclass
class _Job:
    cgroup_fd: int
    counters: dict[str, list[int]] = field(default_factory=dict)  # event name -> one fd per CPU


def perf_cgroup_root(cgroup_root: str, procfs: str) -> Optional[str]:
    """The root of the hierarchy the perf_event controller is on: v1's `perf_event` mount where /proc/cgroups
    gives it a v1 hierarchy, else the unified one (v2 only: the root itself; hybrid: `unified` below it)."""
    try:
        with open(os.path.join(procfs, "cgroups"), encoding="ascii", errors="replace") as stream:
            on_v1 = any(line.split()[:2][1:] != ["0"] for line in stream if line.startswith("perf_event"))
    except OSError:
        on_v1 = False
    if on_v1:
        v1 = os.path.join(cgroup_root, "perf_event")
        return v1 if os.path.isdir(v1) else None
    for candidate in (cgroup_root, os.path.join(cgroup_root, "unified")):
        if os.path.exists(os.path.join(candidate, "cgroup.controllers")):
            return candidate
    return None


def perf_cgroup(directories: list[str]) -> Optional[str]:
    """The job's directory that perf counts in: v2's one, or v1's perf_event controller's."""
    for directory in directories:
        if os.path.exists(os.path.join(directory, "cgroup.controllers")):
            return directory
    for directory in directories:
        if any("perf_event" in part.split(",") for part in directory.split(os.sep)):
            return directory
    return None


def has_pmu(sysfs: str) -> bool:
    """Whether the kernel shows a CPU performance monitoring unit (x86 `cpu`, hybrid `cpu_core`, Arm `armv8_*`)."""
    try:
        names = os.listdir(os.path.join(sysfs, "bus", "event_source", "devices"))
    except OSError:
        return False
    return any(name in ("cpu", "cpu_core") or name.startswith("armv8") for name in names)


class JobPerfCollector(Collector):
    name = "job_perf"

    def __init__(
        self,
        state_dir: str,
        sysfs: str,
        procfs: str,
        max_counters: int,
        counters: Counters | None = None,
        oar_runtime_dir: str = "",
    ) -> None:
        self.state_dir = state_dir
        self.oar_runtime_dir = oar_runtime_dir
        self.sysfs = sysfs
        self.cgroup_root = os.path.join(sysfs, "fs", "cgroup")
        self.procfs = procfs
        self.max_counters = max_counters
        self.counters: Counters = counters or KernelCounters()
        self.events: list[Event] = []  # those that count on this host
        self.availability: dict[str, str] = {}  # event label -> "counting" or why not
        self.jobs: dict[str, _Job] = {}
        self.errors: dict[str, int] = {}

    def start(self) -> None:
        """Which events count here, found by opening each on one CPU for the cgroup hierarchy's root; and a file
        descriptor limit that fits max_counters."""
        try:
            with open(os.path.join(self.procfs, "cpuinfo"), encoding="utf-8", errors="replace") as stream:
                cpuinfo = stream.read()
        except OSError:
            cpuinfo = ""
        architecture, flops = perf_events.flops_events(cpuinfo)
        pmu = has_pmu(self.sysfs)
        probe_root = perf_cgroup_root(self.cgroup_root, self.procfs)
        cpu = (self._online_cpus() or [0])[0]
        try:
            probe_fd = os.open(probe_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if probe_root else -1
        except OSError:
            probe_fd = -1
        try:
            for event in (*perf_events.SOFTWARE, *perf_events.HARDWARE, *flops):
                if event.type != perf_events.TYPE_SOFTWARE and not pmu:
                    reason = "no_pmu"
                else:
                    reason = self._probe(event, probe_fd, cpu)
                label = FLOPS_EVENT if event.precision else event.name
                if reason == "counting":
                    self.events.append(event)
                if self.availability.get(label) in (None, "counting"):
                    self.availability[label] = reason  # FLOPS: counting only if each of its events counts
        finally:
            if probe_fd >= 0:
                os.close(probe_fd)
        if not flops:
            self.availability[FLOPS_EVENT] = "unknown_microarchitecture"
        elif self.availability[FLOPS_EVENT] != "counting":
            self.events = [event for event in self.events if not event.precision]
        missing = sorted(label for label, reason in self.availability.items() if reason != "counting")
        if missing:
            log.warning(
                "job_perf: not counted here: %s",
                ", ".join(f"{label} ({self.availability[label]})" for label in missing),
            )
        log.info("job_perf: CPU micro-architecture %s", architecture or "not in the FLOPS table")
        self._raise_file_limit()

    def _probe(self, event: Event, cgroup_fd: int, cpu: int) -> str:
        if cgroup_fd < 0:
            return "no_perf_cgroup"  # the perf_event controller's v1 hierarchy is not mounted
        try:
            fd = self.counters.open(event, cgroup_fd, cpu)
        except PerfError as error:
            if error.errno == errno.ENOENT and event.type == perf_events.TYPE_SOFTWARE:
                return "no_perf_cgroup"  # every kernel has software events: the controller is not on this hierarchy
            return error.reason
        self.counters.close(fd)
        return "counting"

    def _raise_file_limit(self) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = self.max_counters + 1024  # room for everything else the exporter opens
        if soft != resource.RLIM_INFINITY and soft < wanted:
            new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            except (ValueError, OSError) as error:
                log.warning("job_perf: could not raise the open file limit to %d: %s", new, error)

    def _online_cpus(self) -> list[int]:
        try:
            with open(os.path.join(self.sysfs, "devices", "system", "cpu", "online"), encoding="ascii") as stream:
                return cpu_list(stream.read()) or []
        except OSError:
            return []

    def sample(self) -> Samples:
        out = Samples()
        recorded = recorded_job_ids(self.state_dir, self.oar_runtime_dir)
        for job in [job for job in self.jobs if job not in recorded]:
            self._close(self.jobs.pop(job))
        states = dict.fromkeys(JOB_STATES, 0)
        missing = [job for job in recorded if job not in self.jobs]
        cgroups = job_cgroups(self.cgroup_root, set(missing)) if missing and self.events else {}
        for job in sorted(recorded):
            if job in self.jobs:
                states["counting"] += 1
                self._read(job, self.jobs[job], out)
            elif self.events:
                states[self._open(job, cgroups.get(job))] += 1
            else:
                states["no_events"] += 1  # every job on this host is uncounted for the same reasons
        for label, reason in self.availability.items():
            out.add(AVAILABLE, (label, reason), 1 if reason == "counting" else 0)
        for state, count in states.items():
            out.add(JOBS, (state,), count)
        out.add(OPEN, (), self._open_count())
        for reason, count in sorted(self.errors.items()):
            out.add(ERRORS, (reason,), count)
        return out

    def _open_count(self) -> int:
        return sum(len(fds) for job in self.jobs.values() for fds in job.counters.values())

    def _open(self, job: str, directories: Optional[list[str]]) -> str:
        """Opens the job's counters; its state: counting (read from the next sample on) or why not."""
        if not directories:
            return "no_cgroup"
        directory = perf_cgroup(directories)
        if directory is None:
            return "no_perf_cgroup"
        cpus = cpu_list(read_first(directories, "cpuset.cpus.effective") or read_first(directories, "cpuset.cpus"))
        cpus = cpus or self._online_cpus() or [0]
        if self._open_count() + len(cpus) * len(self.events) > self.max_counters:
            return "over_budget"
        try:
            state = _Job(os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        except OSError:
            return "no_cgroup"  # gone between the walk and the open: the job ended
        for event in self.events:
            fds: list[int] = []
            try:
                for cpu in cpus:
                    fds.append(self.counters.open(event, state.cgroup_fd, cpu))
            except PerfError as error:
                self._error(error.reason)
                for fd in fds:
                    self.counters.close(fd)
                continue  # that event is left out for this job; the others count
            state.counters[event.name] = fds
        self.jobs[job] = state
        return "counting"

    def _read(self, job: str, state: _Job, out: Samples) -> None:
        flops: dict[str, float] = {}
        for event in self.events:
            fds = state.counters.get(event.name)
            if not fds:
                continue
            try:
                values = [perf_events.scaled(*self.counters.read(fd)) for fd in fds]
            except OSError:
                self._error("read_failed")
                continue
            if None in values:
                continue  # multiplexed out on some CPU so far: no estimate yet, the next sample has one
            total = sum(value for value in values if value is not None)
            if event.precision:
                flops[event.precision] = flops.get(event.precision, 0.0) + total * event.flops_per_count
            else:
                out.add(METRICS[event.name], (job,), total)
        for precision, value in sorted(flops.items()):
            out.add(FLOPS, (job, precision), value)

    def _error(self, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1

    def _close(self, state: _Job) -> None:
        for fds in state.counters.values():
            for fd in fds:
                self.counters.close(fd)
        os.close(state.cgroup_fd)

    def stop(self) -> None:
        for state in self.jobs.values():
            self._close(state)
        self.jobs.clear()


REGISTRATION = register(
    Registration(
        name="job_perf",
        help="batch jobs' hardware and software counters (perf events, needs CAP_PERFMON; default: off)",
        build=lambda options, paths: JobPerfCollector(
            str(options["state_dir"]),
            paths.sysfs,
            paths.procfs,
            int(options["max_counters"]),
            oar_runtime_dir=str(options["oar_runtime_dir"]),
        ),
        catalogue=C,
        options=(INTERVAL, STATE_DIR, OAR_RUNTIME_DIR, MAX_COUNTERS),
        enabled_by_default=never,
        capabilities=("CAP_PERFMON",),
    )
)
