"""Per-job perf counters: the arithmetic and bookkeeping on fixture cgroup trees with a fake kernel, and the real
kernel's perf_event_open in cgroup mode on a cgroup this test makes (software events here; hardware events where
the machine has a PMU, and otherwise the "unavailable, because" path for real)."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from accelmon.collectors.job_perf import JobPerfCollector, has_pmu
from accelmon.config import load
from accelmon.host import perf_events
from accelmon.host.perf_events import Event, PerfError
from accelmon.scan import plan
from tests.support.exposition import check_golden, promtool_check, sample_value, text_of
from tests.support.jobs_tree import job_cgroup_stats, slurm_job_cgroup
from tests.support.perf_cgroup import can_make_cgroups, job_cgroup

SAPPHIRE_RAPIDS = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n\nprocessor\t: 1\n"
ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
GRAVITON = "processor\t: 0\nBogoMIPS\t: 243.75\nCPU implementer\t: 0x41\n"


class FakeCounters:
    """The kernel as the collector sees it: each open counter reads (count, enabled ns, running ns) from `values`
    by event name; `refuse` makes opening an event fail with an errno."""

    def __init__(self, values: dict[str, tuple[int, int, int]], refuse: dict[str, int] | None = None) -> None:
        self.values = values
        self.refuse = refuse or {}
        self.open_fds: dict[int, tuple[str, int]] = {}
        self.opened_on: list[tuple[str, int]] = []
        self._next = 1000

    def open(self, event: Event, cgroup_fd: int, cpu: int) -> int:
        assert cgroup_fd >= 0
        if event.name in self.refuse:
            raise PerfError(self.refuse[event.name])
        self._next += 1
        self.open_fds[self._next] = (event.name, cpu)
        self.opened_on.append((event.name, cpu))
        return self._next

    def read(self, fd: int) -> tuple[int, int, int]:
        return self.values.get(self.open_fds[fd][0], (0, 0, 0))

    def close(self, fd: int) -> None:
        del self.open_fds[fd]


def host(tmp_path: Path, cpuinfo: str = SAPPHIRE_RAPIDS, pmu: bool = True, version: int = 2) -> Path:
    """A fixture root: sys (the cgroup tree, the CPU list, the PMU's event source), proc/cpuinfo and the jobs'
    state directory."""
    sys_root = tmp_path / "sys"
    cgroup = sys_root / "fs" / "cgroup"
    cgroup.mkdir(parents=True)
    if version == 2:
        (cgroup / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    else:
        (cgroup / "perf_event").mkdir()
    (sys_root / "devices" / "system" / "cpu").mkdir(parents=True)
    (sys_root / "devices" / "system" / "cpu" / "online").write_text("0-7\n")
    sources = sys_root / "bus" / "event_source" / "devices"
    for name in ("software", "tracepoint", *(["cpu"] if pmu else [])):
        (sources / name).mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    hierarchy = 0 if version == 2 else 10  # /proc/cgroups: 0 for a controller on the unified hierarchy
    (tmp_path / "proc" / "cgroups").write_text(
        f"#subsys_name\thierarchy\tnum_cgroups\tenabled\nperf_event\t{hierarchy}\t1\t1\n"
    )
    (tmp_path / "proc" / "cpuinfo").write_text(cpuinfo)
    (tmp_path / "jobs").mkdir()
    return tmp_path


def add_job(root: Path, job: int, version: int = 2, perf_event: bool = True) -> None:
    cgroup = root / "sys" / "fs" / "cgroup"
    slurm_job_cgroup(cgroup, job, (101,), version=version)
    job_cgroup_stats(cgroup, job, version=version)  # v2: cpuset 0-3,8,10-11 (7 CPUs); v1: see below
    if version == 1:
        (cgroup / "cpuset" / "slurm" / "uid_1000" / f"job_{job}").mkdir(parents=True, exist_ok=True)
        (cgroup / "cpuset" / "slurm" / "uid_1000" / f"job_{job}" / "cpuset.cpus").write_text("2-3\n")
        if perf_event:
            (cgroup / "perf_event" / "slurm" / "uid_1000" / f"job_{job}").mkdir(parents=True)
    (root / "jobs" / f"slurm-{job}").write_text(f"scheduler=slurm\njob_id={job}\nuser=alice\ngpus=0\n")


def collector(root: Path, counters, max_counters: int = 8192) -> JobPerfCollector:
    made = JobPerfCollector(str(root / "jobs"), str(root / "sys"), str(root / "proc"), max_counters, counters)
    made.start()
    if isinstance(counters, FakeCounters):
        counters.opened_on.clear()  # the probe's, on the hierarchy's root
    return made


def sample(made: JobPerfCollector) -> str:
    text = text_of(made)
    promtool_check(text)
    return text


def test_a_jobs_counters_are_summed_over_its_cpus_and_scaled_where_multiplexed(tmp_path):
    root = host(tmp_path)
    add_job(root, 4242)
    counters = FakeCounters(
        {
            "cycles": (1_000, 10, 10),
            "instructions": (600, 10, 5),  # counted half the time: twice the count is the estimate
            "context_switches": (3, 7, 7),
            "fp_scalar_double": (10, 1, 1),
            "fp_256b_packed_double": (5, 1, 1),  # 4 doubles each
            "fp_512b_packed_single": (2, 2, 1),  # 16 singles each, counted half the time
        }
    )
    made = collector(root, counters)
    first = sample(made)
    assert sample_value(first, "accelmon_job_perf_jobs", state="counting") == 1
    assert sample_value(first, "accelmon_job_cpu_cycles_total", job_id="4242") is None  # opened, read next time
    cpus = {cpu for _, cpu in counters.opened_on}
    assert cpus == {0, 1, 2, 3, 8, 10, 11}  # the job's cpuset, not every online CPU
    text = sample(made)
    job = {"job_id": "4242"}
    assert sample_value(text, "accelmon_job_cpu_cycles_total", **job) == 7 * 1_000
    assert sample_value(text, "accelmon_job_instructions_total", **job) == 7 * 1_200
    assert sample_value(text, "accelmon_job_context_switches_total", **job) == 7 * 3
    assert sample_value(text, "accelmon_job_floating_point_operations_total", precision="double", **job) == 7 * (
        10 + 5 * 4
    )
    assert sample_value(text, "accelmon_job_floating_point_operations_total", precision="single", **job) == 7 * (
        2 * 2 * 16
    )
    for event in ("cycles", "instructions", "context_switches", "flops"):
        assert sample_value(text, "accelmon_job_perf_event_available", event=event, reason="counting") == 1
    assert sample_value(text, "accelmon_job_perf_counters_open") == len(counters.open_fds) == 7 * (3 + 5 + 8)


def test_counters_close_when_the_jobs_record_goes(tmp_path):
    root = host(tmp_path)
    add_job(root, 1)
    add_job(root, 2)
    counters = FakeCounters({})
    made = collector(root, counters)
    sample(made)
    per_job = len(counters.open_fds) // 2
    (root / "jobs" / "slurm-1").unlink()
    text = sample(made)
    assert len(counters.open_fds) == per_job and sample_value(text, "accelmon_job_perf_counters_open") == per_job
    made.stop()
    assert not counters.open_fds


def test_a_job_that_would_pass_the_budget_is_not_counted(tmp_path):
    root = host(tmp_path)
    add_job(root, 1)
    add_job(root, 2)
    counters = FakeCounters({})
    per_job = 7 * (3 + 5 + 8)
    text = sample(collector(root, counters, max_counters=per_job + 1))
    assert sample_value(text, "accelmon_job_perf_jobs", state="counting") == 1
    assert sample_value(text, "accelmon_job_perf_jobs", state="over_budget") == 1
    assert len(counters.open_fds) == per_job


def test_v1_counts_in_the_perf_event_controller_and_says_when_there_is_none(tmp_path):
    root = host(tmp_path, version=1)
    add_job(root, 7, version=1)
    add_job(root, 8, version=1, perf_event=False)
    counters = FakeCounters({"cycles": (5, 1, 1)})
    made = collector(root, counters)
    text = sample(made)
    assert sample_value(text, "accelmon_job_perf_jobs", state="counting") == 1
    assert sample_value(text, "accelmon_job_perf_jobs", state="no_perf_cgroup") == 1
    assert {cpu for _, cpu in counters.opened_on} == {2, 3}  # the v1 cpuset controller's cpus
    assert sample_value(sample(made), "accelmon_job_cpu_cycles_total", job_id="7") == 2 * 5


def test_without_a_pmu_only_software_events_count_and_the_rest_say_why(tmp_path):
    root = host(tmp_path, pmu=False)
    add_job(root, 3)
    counters = FakeCounters({"page_faults": (9, 1, 1)})
    made = collector(root, counters)
    sample(made)
    text = sample(made)
    assert sample_value(text, "accelmon_job_page_faults_total", job_id="3") == 7 * 9
    for event in ("cycles", "instructions", "cache_misses", "flops"):
        assert sample_value(text, "accelmon_job_perf_event_available", event=event, reason="no_pmu") == 0
    assert sample_value(text, "accelmon_job_cpu_cycles_total", job_id="3") is None
    assert all(name in ("context_switches", "cpu_migrations", "page_faults") for name, _ in counters.opened_on)


@pytest.mark.parametrize(
    "refused, reason",
    [(errno.EACCES, "permission"), (errno.ENOENT, "not_supported"), (errno.EMFILE, "too_many_open_files")],
)
def test_an_event_the_kernel_refuses_is_left_out_with_its_reason(tmp_path, refused, reason):
    root = host(tmp_path)
    add_job(root, 3)
    counters = FakeCounters({"cycles": (1, 1, 1)}, refuse={"branch_misses": refused, "fp_scalar_single": refused})
    text = sample(collector(root, counters))
    assert sample_value(text, "accelmon_job_perf_event_available", event="branch_misses", reason=reason) == 0
    assert sample_value(text, "accelmon_job_perf_event_available", event="flops", reason=reason) == 0
    assert sample_value(text, "accelmon_job_perf_event_available", event="cycles", reason="counting") == 1
    assert not any(name.startswith("fp_") or name == "branch_misses" for name, _ in counters.opened_on)


def test_where_no_event_counts_every_job_is_counted_as_such(tmp_path):
    """A v1 host whose perf_event controller is not mounted: every event says why, and the job is still accounted."""
    root = host(tmp_path, version=1)
    (root / "sys" / "fs" / "cgroup" / "perf_event").rmdir()
    add_job(root, 3, version=1, perf_event=False)
    counters = FakeCounters({})
    text = sample(collector(root, counters))
    assert sample_value(text, "accelmon_job_perf_jobs", state="no_events") == 1
    assert sample_value(text, "accelmon_job_perf_jobs", state="counting") == 0
    assert sample_value(text, "accelmon_job_perf_event_available", event="page_faults", reason="no_perf_cgroup") == 0
    assert not counters.opened_on


def test_a_job_whose_counters_cannot_all_open_keeps_the_others(tmp_path):
    root = host(tmp_path)
    add_job(root, 3)
    counters = FakeCounters({"cycles": (2, 1, 1), "instructions": (4, 1, 1)})
    made = collector(root, counters)
    counters.refuse = {"instructions": errno.EMFILE}  # probed fine, then the process ran out of descriptors
    sample(made)
    text = sample(made)
    assert sample_value(text, "accelmon_job_cpu_cycles_total", job_id="3") == 7 * 2
    assert sample_value(text, "accelmon_job_instructions_total", job_id="3") is None
    assert sample_value(text, "accelmon_job_perf_errors_total", reason="too_many_open_files") == 1


def test_a_counter_not_yet_scheduled_gives_no_estimate_rather_than_zero(tmp_path):
    root = host(tmp_path)
    add_job(root, 3)
    made = collector(root, FakeCounters({"cycles": (0, 50, 0)}))
    sample(made)
    assert sample_value(sample(made), "accelmon_job_cpu_cycles_total", job_id="3") is None


@pytest.mark.parametrize(
    "cpuinfo, architecture, precisions",
    [(SAPPHIRE_RAPIDS, "sapphire_rapids", {"single", "double"}), (ZEN4, "zen3_4", {"any"}), (GRAVITON, "", set())],
)
def test_flops_events_by_micro_architecture(cpuinfo, architecture, precisions):
    name, events = perf_events.flops_events(cpuinfo)
    assert name == architecture and {event.precision for event in events} == precisions


def test_a_cpu_outside_the_flops_table_says_so(tmp_path):
    root = host(tmp_path, cpuinfo=GRAVITON)
    add_job(root, 3)
    text = sample(collector(root, FakeCounters({})))
    unknown = {"event": "flops", "reason": "unknown_microarchitecture"}
    assert sample_value(text, "accelmon_job_perf_event_available", **unknown) == 0


def test_the_unit_gets_cap_perfmon_only_with_the_collector_enabled(tmp_path):
    """The plan the role writes the unit from (--check-config --json): job_perf is opt-in, so by default no
    CAP_PERFMON; enabled, CAP_PERFMON and nothing more."""
    assert "CAP_PERFMON" not in plan(load(None))["capabilities"]
    config = tmp_path / "exporter.yml"
    config.write_text("collectors: {job_perf: {enabled: true}, kernel_log: {enabled: false}}\n")
    assert plan(load(str(config)))["capabilities"] == ["CAP_PERFMON"]


def test_scaling():
    assert perf_events.scaled(100, 10, 10) == 100
    assert perf_events.scaled(100, 10, 4) == 250
    assert perf_events.scaled(0, 0, 0) == 0  # the job never ran on that CPU
    assert perf_events.scaled(0, 5, 0) is None


# --- The real kernel ------------------------------------------------------------------------------------------


@pytest.fixture
def real_job(tmp_path):
    """Job 77's real cgroup (tests/support/perf_cgroup.py) and its record."""
    if not can_make_cgroups():
        pytest.skip("needs root to make a job's cgroup")
    with job_cgroup(tmp_path, 77) as job:
        (tmp_path / "jobs").mkdir()
        (tmp_path / "jobs" / "slurm-77").write_text("scheduler=slurm\njob_id=77\nuser=alice\ngpus=0\n")
        yield tmp_path, job


def test_the_kernel_counts_a_real_jobs_software_events_in_its_cgroup(real_job):
    """A process in job 77's cgroup sleeps 200 times and touches 2000 fresh pages: at least that many context
    switches and page faults are counted for the job, none for the test's own work outside it; hardware events
    count where the host has a PMU, and say no_pmu where it does not."""
    root, job = real_job
    made = JobPerfCollector(str(root / "jobs"), str(root / "sys"), "/proc", 8192)
    # The cgroup root is this test's, so the probe counts in it; /proc/cgroups says which hierarchy it is on.
    made.start()
    try:
        sample(made)  # opens job 77's counters
        worker = subprocess.Popen(
            [sys.executable, "-c", "import sys, time, mmap\nsys.stdin.readline()\n"
             "for _ in range(200): time.sleep(0.001)\n"
             "m = mmap.mmap(-1, 2000 * 4096)\nfor i in range(2000): m[i * 4096] = 1\n"],
            stdin=subprocess.PIPE,
        )  # fmt: skip
        (job / "cgroup.procs").write_text(str(worker.pid))
        worker.communicate(b"go\n", timeout=60)
        text = sample(made)
    finally:
        made.stop()
    assert sample_value(text, "accelmon_job_context_switches_total", job_id="77") >= 200
    assert sample_value(text, "accelmon_job_page_faults_total", job_id="77") >= 2000
    if has_pmu("/sys"):
        assert sample_value(text, "accelmon_job_instructions_total", job_id="77") > 0
    else:
        assert sample_value(text, "accelmon_job_perf_event_available", event="cycles", reason="no_pmu") == 0
        assert sample_value(text, "accelmon_job_cpu_cycles_total", job_id="77") is None


def test_golden(tmp_path):
    root = host(tmp_path)
    add_job(root, 4242)
    counters = FakeCounters(
        {
            "cycles": (1_000, 10, 10),
            "instructions": (600, 10, 5),
            "context_switches": (3, 7, 7),
            "fp_scalar_double": (10, 1, 1),
            "fp_256b_packed_double": (5, 1, 1),
            "fp_512b_packed_single": (2, 2, 1),
        }
    )
    made = collector(root, counters)
    sample(made)  # the counters open at the first sample and are read from the second
    check_golden("job_perf_sapphire_rapids.prom", sample(made))
