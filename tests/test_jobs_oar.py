"""OAR jobs: read from the files OAR's job resource manager keeps on each node of a job (no hook to install), and
their cgroups, in the formats the real OAR 2.5.9 wrote in the Molecule `oar` scenario (tests/support/jobs_tree.py)."""

from __future__ import annotations

import os

import pytest

from accelmon import job_sources
from accelmon.collectors import collectors, jobs
from accelmon.collectors.job_resources import JobResourcesCollector
from accelmon.exporter.registry import Paths
from accelmon.job_sources import cgroups, oar
from tests.support.exposition import promtool_check, sample_value, text_of
from tests.support.jobs_tree import (
    JOB_USER_SECONDS,
    MINORS,
    job_cgroup_stats,
    nvidia_procfs,
    oar_job_cgroup,
    oar_job_files,
    uuid,
)
from tests.support.jobs_tree import job_info as info
from tests.support.jobs_tree import only_value as value


@pytest.fixture
def node(tmp_path):
    """An OAR node called node1: its runtime directory (no Slurm state directory) and the driver's procfs files."""
    return tmp_path / "oar", nvidia_procfs(tmp_path / "proc")


def collector(runtime, procfs, tmp_path, node_name="node1") -> jobs.JobsCollector:
    oar_jobs = oar.OarJobs(str(runtime), node_name)
    return jobs.JobsCollector(str(tmp_path / "no-state-dir"), str(procfs), oar=oar_jobs)


def nvml_index(minor: int) -> str:
    return str(MINORS[:4].index(minor))


def test_a_two_node_job_names_this_nodes_gpus_by_device_minor(node, tmp_path):
    """A job on node1 (GPUs with minors 0 and 2) and node2 (minor 1): node1 names its own two, through the
    driver's minor numbers (not NVML's order), with OAR's user and project."""
    runtime, procfs = node
    oar_job_files(runtime, 42, "alice", "physics", [("node1", 0, "0"), ("node1", 1, "2"), ("node2", 0, "1")])
    samples = collector(runtime, procfs, tmp_path).sample()
    assert info(samples) == {
        (nvml_index(0), uuid(int(nvml_index(0))), "42", "alice", "physics"),
        (nvml_index(2), uuid(int(nvml_index(2))), "42", "alice", "physics"),
    }
    assert nvml_index(0) != "0"  # the trap is set: minor 0 is not NVML's GPU 0
    assert value(samples, jobs.JOBS) == 1 and value(samples, jobs.UNRESOLVED) == 0
    # node2's exporter, on the same files (OAR writes the whole job's resources on each node), names only its GPU.
    assert info(collector(runtime, procfs, tmp_path, "node2.cluster.example").sample()) == {
        (nvml_index(1), uuid(int(nvml_index(1))), "42", "alice", "physics")
    }


def test_cpu_only_jobs_shared_nodes_and_the_end_of_a_job(node, tmp_path):
    runtime, procfs = node
    oar_job_files(runtime, 7, "bob", "", [("node1", 3, "")])  # no GPU property on that resource
    oar_job_files(runtime, 8, "carol", "ml", [("node1", 4, "3")])
    made = collector(runtime, procfs, tmp_path)
    samples = made.sample()
    assert value(samples, jobs.JOBS) == 2
    assert info(samples) == {(nvml_index(3), uuid(int(nvml_index(3))), "8", "carol", "ml")}
    assert job_sources.recorded_job_ids(str(tmp_path / "no-state-dir"), str(runtime)) == {"7", "8"}
    for name in ("carol_8.env", "8", "8_resources"):  # what OAR's job resource manager removes at the job's end
        (runtime / name).unlink()
    samples = made.sample()
    assert info(samples) == set() and value(samples, jobs.JOBS) == 1


def test_bad_files_are_skipped_and_counted_once(node, tmp_path):
    runtime, procfs = node
    oar_job_files(runtime, 5, "dan", "", [("node1", 0, "1")])
    with (runtime / "5_resources").open("a") as stream:
        stream.write("garbage without properties\n")
    oar_job_files(runtime, 6, "erin", "", [("node1", 1, "3")])
    (runtime / "erin_6.env").write_text("export OAR_JOBID='66'\n")  # not this job's file: skipped
    (runtime / "frank_x.env").write_text("export OAR_JOBID='9'\n")  # not a name OAR gives: not read
    made = collector(runtime, procfs, tmp_path)
    for _ in range(3):
        samples = made.sample()
    assert info(samples) == {(nvml_index(1), uuid(int(nvml_index(1))), "5", "dan", "")}
    assert value(samples, jobs.MALFORMED) == 2  # counted once, however often the files are read
    with (runtime / "5_resources").open("a") as stream:
        stream.write("more garbage\n")  # changed: read again, its new bad line counted
    assert value(made.sample(), jobs.MALFORMED) == 4


def test_the_job_of_a_cgroup_slurm_and_oar():
    assert cgroups.job_of_cgroup("/sys/fs/cgroup/cpuset/oar/alice_42") == "42"
    assert cgroups.job_of_cgroup("/sys/fs/cgroup/memory/slurm/uid_1000/job_7") == "7"
    assert cgroups.job_of_cgroup("/sys/fs/cgroup/cpuset/user.slice/alice_42") is None  # not under OAR's /oar
    assert cgroups.job_of_cgroup("/sys/fs/cgroup/cpuset/oar") is None


def test_an_oar_jobs_cgroup_and_its_processes(node, tmp_path):
    runtime, _ = node
    cgroup = tmp_path / "sys" / "fs" / "cgroup"
    oar_job_files(runtime, 42, "alice", "physics", [("node1", 0, "0")])
    oar_job_cgroup(cgroup, 42, "alice", (4101, 4102))
    job_cgroup_stats(cgroup, 42, version=1, oar_user="alice")
    oar_job_cgroup(cgroup, 43, "bob", (4200,))  # a job whose files are gone (ended): not read
    text = text_of(JobResourcesCollector(str(tmp_path / "no-state-dir"), str(cgroup), str(runtime)))
    promtool_check(text)
    assert sample_value(text, "accelmon_job_cpu_seconds_total", job_id="42", mode="user") == pytest.approx(
        JOB_USER_SECONDS, rel=0.01
    )
    assert sample_value(text, "accelmon_job_cpus_allocated", job_id="42") == 7
    assert 'job_id="43"' not in text
    assert sample_value(text, "accelmon_jobs_without_cgroup") == 0
    job_of = cgroups.JobOfProcess(str(cgroup))
    assert (job_of(4101), job_of(4200), job_of(1)) == ("42", "43", "")


def test_the_job_collectors_turn_on_where_oar_keeps_its_files(tmp_path):
    runtime = tmp_path / "var" / "lib" / "oar"
    registrations = collectors()
    for name in ("jobs", "job_resources"):
        options = {**registrations[name].defaults, "state_dir": str(tmp_path / "none"), "oar_runtime_dir": str(runtime)}
        assert not registrations[name].enabled_by_default(Paths(), options)
        runtime.mkdir(parents=True, exist_ok=True)
        assert registrations[name].enabled_by_default(Paths(), options)
        assert not registrations[name].enabled_by_default(Paths(), {**options, "oar_runtime_dir": ""})
        os.rmdir(runtime)
