"""Per-job CPU, memory and I/O from Slurm's job cgroups, v2 and v1, on fixture trees in the kernel's formats."""

from __future__ import annotations

import pytest
import yaml

from accelmon.collectors import job_resources
from accelmon.collectors.job_resources import JobResourcesCollector, cpu_count
from tests.support.exposition import check_golden, promtool_check, sample_value, text_of
from tests.support.jobs_tree import (
    JOB_LIMIT,
    JOB_MEMORY,
    JOB_PEAK,
    JOB_READ,
    JOB_SWAP,
    JOB_SYSTEM_SECONDS,
    JOB_TASKS,
    JOB_THROTTLED_SECONDS,
    JOB_USER_SECONDS,
    JOB_WRITTEN,
    job_cgroup_stats,
    slurm_job_cgroup,
)
from tests.support.processes import exporter_env, run_once


def record(state, job: int) -> None:
    (state / f"slurm-{job}").write_text(f"scheduler=slurm\njob_id={job}\nuser=alice\naccount=ml\ngpus=0\n")


@pytest.fixture
def node(tmp_path):
    state, cgroup = tmp_path / "jobs", tmp_path / "sys" / "fs" / "cgroup"
    state.mkdir()
    cgroup.mkdir(parents=True)
    return state, cgroup


def read(state, cgroup) -> str:
    text = text_of(JobResourcesCollector(str(state), str(cgroup)))
    promtool_check(text)
    return text


@pytest.mark.parametrize("version", [2, 1])
def test_a_jobs_cgroup_in_base_units(node, monkeypatch, version):
    state, cgroup = node
    monkeypatch.setattr(job_resources, "USER_HZ", 100.0)
    slurm_job_cgroup(cgroup, 4242, (101, 102), version=version)
    job_cgroup_stats(cgroup, 4242, version=version, user_hz=100)
    record(state, 4242)
    text = read(state, cgroup)
    job = {"job_id": "4242"}
    assert sample_value(text, "accelmon_job_cpu_seconds_total", mode="user", **job) == pytest.approx(JOB_USER_SECONDS)
    assert sample_value(text, "accelmon_job_cpu_seconds_total", mode="system", **job) == pytest.approx(
        JOB_SYSTEM_SECONDS
    )
    assert sample_value(text, "accelmon_job_cpu_throttled_seconds_total", **job) == pytest.approx(JOB_THROTTLED_SECONDS)
    assert sample_value(text, "accelmon_job_cpus_allocated", **job) == 7  # 0-3,8,10-11
    assert sample_value(text, "accelmon_job_memory_used_bytes", **job) == JOB_MEMORY
    assert sample_value(text, "accelmon_job_memory_peak_bytes", **job) == JOB_PEAK
    assert sample_value(text, "accelmon_job_memory_limit_bytes", **job) == JOB_LIMIT
    assert sample_value(text, "accelmon_job_swap_used_bytes", **job) == JOB_SWAP
    assert sample_value(text, "accelmon_job_io_bytes_total", direction="read", **job) == JOB_READ  # both disks
    assert sample_value(text, "accelmon_job_io_bytes_total", direction="write", **job) == JOB_WRITTEN
    assert sample_value(text, "accelmon_job_tasks", **job) == JOB_TASKS
    assert sample_value(text, "accelmon_jobs_without_cgroup") == 0


def test_only_jobs_with_a_record_and_what_the_kernel_has(node):
    state, cgroup = node
    for job in (1, 2):
        job_cgroup_stats(cgroup, job)
    record(state, 1)
    record(state, 3)  # a record without a cgroup: Slurm without its cgroup plugin
    job_dir = cgroup / "system.slice" / "slurmstepd.scope" / "job_1"
    (job_dir / "memory.peak").unlink()  # before Linux 5.19
    (job_dir / "memory.max").write_text("max\n")  # no limit
    (job_dir / "cpu.stat").write_text("usage_usec 10\nuser_usec 4000000\ngarbage\nsystem_usec x\n")
    text = read(state, cgroup)
    assert sample_value(text, "accelmon_job_tasks", job_id="2") is None  # no record: not served
    assert sample_value(text, "accelmon_job_memory_peak_bytes", job_id="1") is None
    assert sample_value(text, "accelmon_job_memory_limit_bytes", job_id="1") is None
    assert sample_value(text, "accelmon_job_cpu_seconds_total", job_id="1", mode="user") == 4
    assert sample_value(text, "accelmon_job_cpu_seconds_total", job_id="1", mode="system") is None
    assert sample_value(text, "accelmon_jobs_without_cgroup") == 1
    (state / "slurm-1").unlink()  # the epilog: the job's series leave with it
    assert 'job_id="1"' not in read(state, cgroup)


@pytest.mark.parametrize(
    ("cpuset", "count"), [("0-3,8,10-11\n", 7), ("5\n", 1), ("", None), ("0-x\n", None), (None, None)]
)
def test_cpu_count(cpuset, count):
    assert cpu_count(cpuset) == count


def test_the_exporter_serves_them_where_job_records_are_kept(node, tmp_path):
    state, cgroup = node
    job_cgroup_stats(cgroup, 77)
    record(state, 77)
    settings = tmp_path / "accelmon.yml"
    collectors = {"nvml": {"enabled": False}, "jobs": {"state_dir": str(state)}}
    collectors["job_resources"] = {"state_dir": str(state)}
    settings.write_text(yaml.safe_dump({"paths": {"sysfs": str(tmp_path / "sys")}, "collectors": collectors}))
    result = run_once(["--config", str(settings)], exporter_env(None, None))
    assert result.returncode == 0, result.stderr
    assert sample_value(result.stdout, "accelmon_job_tasks", job_id="77") == 42


def test_golden(node, monkeypatch):
    state, cgroup = node
    monkeypatch.setattr(job_resources, "USER_HZ", 100.0)
    slurm_job_cgroup(cgroup, 4242, (101, 102))
    job_cgroup_stats(cgroup, 4242, user_hz=100)
    record(state, 4242)
    record(state, 4243)  # a record whose cgroup is gone
    check_golden("job_resources_v2.prom", read(state, cgroup))
