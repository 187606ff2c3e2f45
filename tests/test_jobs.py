"""Jobs on GPUs: the Slurm prolog and epilog scripts and the collector that reads their records."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from accelmon.collectors import jobs
from accelmon.host.nvidia import NvmlSession
from accelmon.job_sources import cgroups
from tests.support.ansible import render_role_template
from tests.support.exposition import check_golden, promtool_check, sample_value, text_of
from tests.support.jobs_tree import MINORS, nvidia_procfs, slurm_job_cgroup, uuid
from tests.support.jobs_tree import job_info as info
from tests.support.jobs_tree import only_value as value
from tests.support.processes import exporter_env, run_once


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> Path:
    """The role's prolog and epilog as Ansible renders them, their state directory a symlink (`state`) that
    `slurm` points at each test's own directory: rendered once, run many times."""
    rendered = tmp_path_factory.mktemp("slurm-scripts")
    for script in ("prolog", "epilog"):
        render_role_template(
            "accelmon_exporter", f"slurm-{script}.sh.j2", rendered / f"{script}.sh",
            {"__accelmon_exporter_jobs_dir": str(rendered / "state")},
        )  # fmt: skip
    return rendered


@pytest.fixture
def slurm(scripts):
    def run(script: str, state_dir, **env: str) -> subprocess.CompletedProcess[str]:
        """Runs the prolog or epilog as slurmd would: as root, with the job's SLURM_* variables and no PATH."""
        link = scripts / "state"
        link.unlink(missing_ok=True)
        link.symlink_to(state_dir)  # dangling where the test's directory does not exist: no state directory
        return subprocess.run(["/bin/sh", str(scripts / f"{script}.sh")], env=env, capture_output=True, text=True)

    return run


@pytest.fixture
def host(tmp_path):
    state = tmp_path / "jobs"
    state.mkdir()
    return state, nvidia_procfs(tmp_path / "proc")


@pytest.mark.e2e  # the role's prolog and epilog, rendered by ansible-playbook
def test_slurm_index_is_the_device_minor_not_nvmls_index(host, slurm):
    """Slurm's GPU 0 is /dev/nvidia0; on this host that GPU is second in PCI bus order, so NVML calls it 1."""
    state, procfs = host
    assert slurm("prolog", state, SLURM_JOB_ID="4242", SLURM_JOB_USER="alice", SLURM_JOB_ACCOUNT="physics",
                 SLURM_JOB_GPUS="0,2").returncode == 0  # fmt: skip
    samples = jobs.JobsCollector(str(state), str(procfs)).sample()
    nvml_index = {minor: str(index) for index, minor in enumerate(MINORS[:4])}
    assert info(samples) == {
        (nvml_index[0], uuid(int(nvml_index[0])), "4242", "alice", "physics"),
        (nvml_index[2], uuid(int(nvml_index[2])), "4242", "alice", "physics"),
    }
    assert nvml_index[0] == "1" and nvml_index[2] == "0"  # the trap is really set
    assert value(samples, jobs.JOBS) == 1 and value(samples, jobs.UNRESOLVED) == 0


@pytest.mark.e2e  # the role's prolog and epilog, rendered by ansible-playbook
def test_uuids_shared_gpus_and_the_epilog(host, slurm):
    state, procfs = host
    # Recent Slurm: UUIDs. Two jobs share GPU 3 (a shared GRES): two info series for it.
    slurm("prolog", state, SLURM_JOB_ID="1", SLURM_JOB_USER="alice", SLURM_JOB_GPUS=f"{uuid(3)},{uuid(1)}")
    slurm("prolog", state, SLURM_JOB_ID="2", SLURM_JOB_USER="bob", CUDA_VISIBLE_DEVICES=uuid(3))
    collector = jobs.JobsCollector(str(state), str(procfs))
    assert info(collector.sample()) == {
        ("3", uuid(3), "1", "alice", ""),
        ("1", uuid(1), "1", "alice", ""),
        ("3", uuid(3), "2", "bob", ""),
    }
    assert slurm("epilog", state, SLURM_JOB_ID="1").returncode == 0
    assert info(collector.sample()) == {("3", uuid(3), "2", "bob", "")}
    slurm("epilog", state, SLURM_JOB_ID="2")
    samples = collector.sample()
    assert info(samples) == set() and value(samples, jobs.JOBS) == 0
    assert os.listdir(state) == []


@pytest.mark.e2e  # the role's prolog and epilog, rendered by ansible-playbook
def test_a_job_without_gpus_unknown_gpus_and_mig(host, slurm):
    state, procfs = host
    slurm("prolog", state, SLURM_JOB_ID="7", SLURM_JOB_USER="carol")  # a CPU-only job
    slurm("prolog", state, SLURM_JOB_ID="8", SLURM_JOB_GPUS="0,9,GPU-not-here,MIG-1c2d3e4f-aaaa")
    samples = jobs.JobsCollector(str(state), str(procfs)).sample()
    assert value(samples, jobs.JOBS) == 2
    # Minor 9 and GPU-not-here are no GPUs of this host: counted, never guessed. A MIG instance (the driver lists
    # whole GPUs only) is kept with its own UUID, which the NVML collector's MIG series carry.
    assert info(samples) == {("1", uuid(1), "8", "", ""), ("", "MIG-1c2d3e4f-aaaa", "8", "", "")}
    assert value(samples, jobs.UNRESOLVED) == 2


@pytest.mark.e2e  # the role's prolog and epilog, rendered by ansible-playbook
def test_a_uuid_the_driver_files_do_not_list_gets_its_index_from_nvml(fake_nvml, tmp_path, slurm):
    """No /proc/driver/nvidia (the exporter in a container): NVML names the GPU; a UUID NVML lacks stays unresolved."""
    fake_nvml.configure("gpus 2\n")
    state = tmp_path / "jobs"
    state.mkdir()
    slurm("prolog", state, SLURM_JOB_ID="11", SLURM_JOB_GPUS="GPU-00000001-0000-4000-8000-000000000000,GPU-gone")
    collector = jobs.JobsCollector(str(state), str(tmp_path / "no-proc"), NvmlSession("test"))
    try:
        samples = collector.sample()
        assert info(samples) == {("1", "GPU-00000001-0000-4000-8000-000000000000", "11", "", "")}
        assert value(samples, jobs.UNRESOLVED) == 1
        listed = fake_nvml.calls_of("nvmlDeviceGetCount_v2")
        collector.sample()
        assert fake_nvml.calls_of("nvmlDeviceGetCount_v2") == listed  # the missing UUID is not asked again at once
    finally:
        collector.stop()


@pytest.mark.e2e  # the role's prolog and epilog, rendered by ansible-playbook
def test_values_cannot_forge_keys_and_bad_input_never_fails_the_job(host, tmp_path, slurm):
    state, procfs = host
    result = slurm("prolog", state, SLURM_JOB_ID="9", SLURM_JOB_USER="eve\ngpus=0,1,2,3", SLURM_JOB_GPUS="2")
    assert result.returncode == 0
    samples = jobs.JobsCollector(str(state), str(procfs)).sample()
    assert {labels[0] for labels in info(samples)} == {"0"}  # minor 2 only; the user's "gpus=" stayed in its value
    assert {labels[3] for labels in info(samples)} == {"evegpus=0,1,2,3"}
    # No state directory (the exporter's role not applied yet), a bogus job id: exit 0, nothing written.
    assert slurm("prolog", tmp_path / "missing", SLURM_JOB_ID="10", SLURM_JOB_GPUS="0").returncode == 0
    assert slurm("prolog", state, SLURM_JOB_ID="../../etc/x").returncode == 0
    assert slurm("epilog", tmp_path / "missing", SLURM_JOB_ID="10").returncode == 0
    assert sorted(os.listdir(state)) == ["slurm-9"]


def test_malformed_records_are_skipped_and_counted_once(host):
    state, procfs = host
    (state / "slurm-5").write_text("job_id=5\nuser=dan\nthis is not a pair\ngpus=1\ncolour=blue\n")
    (state / "slurm-6").write_text("user=nobody-without-a-job-id\n")
    (state / ".slurm-7.tmp").write_text("job_id=7\ngpus=0\n")  # still being written by a prolog
    collector = jobs.JobsCollector(str(state), str(procfs))
    for _ in range(3):
        samples = collector.sample()
    assert info(samples) == {("3", uuid(3), "5", "dan", "")}
    assert value(samples, jobs.MALFORMED) == 2  # two bad lines, counted once however often they are read
    (state / "slurm-5").write_text("job_id=5\ngpus=1\nbroken\n")  # rewritten: its bad line is new
    assert value(collector.sample(), jobs.MALFORMED) == 3


@pytest.mark.e2e  # the role's prolog and epilog, rendered by ansible-playbook
def test_exporter_serves_job_info_that_passes_promtool(tmp_path, fake_nvml_dir, slurm):
    state = tmp_path / "jobs"
    state.mkdir()
    procfs = nvidia_procfs(tmp_path / "proc")
    slurm("prolog", state, SLURM_JOB_ID="31", SLURM_JOB_USER="alice", SLURM_JOB_ACCOUNT="ml", SLURM_JOB_GPUS="1")
    config = tmp_path / "accelmon.yml"
    config.write_text(f"paths: {{procfs: {procfs}}}\ncollectors: {{jobs: {{state_dir: {state}}}}}\n")
    nvml = tmp_path / "fake-nvml.conf"
    nvml.write_text("gpus 4\n")
    result = run_once(["--config", str(config)], exporter_env(fake_nvml_dir, nvml))
    assert result.returncode == 0, result.stderr
    promtool_check(result.stdout)
    # Minor 1 is NVML's GPU 3 here: the info series and the device series meet on the same uuid.
    assert sample_value(result.stdout, "accelmon_gpu_job_info", gpu="3", uuid=uuid(3), job_id="31") == 1
    assert sample_value(result.stdout, "accelmon_gpu_up", gpu="3", uuid=uuid(3)) == 1
    # Job series (the info series, and per (GPU, job) use: accelmon_gpu_job_*) carry job_id; device series never.
    others = [line for line in result.stdout.splitlines() if not line.startswith("accelmon_gpu_job_")]
    assert not [line for line in others if "job_id" in line], "device series carry no job labels"


@pytest.mark.parametrize("version", [1, 2])
def test_processes_are_placed_in_jobs_by_their_cgroup(tmp_path, version):
    root = slurm_job_cgroup(tmp_path / "cgroup", 77, (3101, 3102), version=version)
    slurm_job_cgroup(root, 78, (4242,), version=version, uid=1001)
    (root / "system.slice" / "sshd.service").mkdir(parents=True)
    (root / "system.slice" / "sshd.service" / "cgroup.procs").write_text("555\n")
    assert cgroups.job_pids(str(root)) == {3101: "77", 3102: "77", 4242: "78"}


def test_a_users_own_job_named_directory_is_no_jobs(tmp_path):
    """cgroup v2 delegates user@<uid>.service to its user, who may make any directory there: `job_77` (or a
    `slurmstepd.scope/job_77` of their own) in it must not put their processes in job 77, whose GPUs, user and
    account they would then be counted under. Nor does a `job_<id>` in a place Slurm never puts one."""
    root = slurm_job_cgroup(tmp_path / "cgroup", 77, (3101,))
    user = root / "user.slice" / "user-1000.slice" / "user@1000.service"
    for forged in (user / "job_77", user / "app.slice" / "slurmstepd.scope" / "job_77", root / "other" / "job_77"):
        forged.mkdir(parents=True)
        (forged / "cgroup.procs").write_text("5555\n")
    assert cgroups.job_pids(str(root)) == {3101: "77"}
    assert cgroups.job_cgroups(str(root), {"77"}) == {
        "77": [str(root / "system.slice" / "slurmstepd.scope" / "job_77")]
    }


def test_a_job_directory_deeper_than_slurm_puts_it_is_not_read(tmp_path):
    deep = tmp_path / "a" / "b" / "c" / "d" / "e" / "f" / "g"
    slurm_job_cgroup(deep, 9, (99,))
    assert cgroups.job_pids(str(tmp_path)) == {}
    assert cgroups.job_pids(str(tmp_path / "a" / "b" / "c" / "d" / "e")) == {99: "9"}
    assert cgroups.job_pids(str(tmp_path / "missing")) == {}


def test_the_cgroup_tree_is_read_again_only_for_unknown_processes_and_at_most_every_period(tmp_path):
    root = slurm_job_cgroup(tmp_path / "cgroup", 77, (3101,))
    now = [0.0]
    job_of = cgroups.JobOfProcess(str(root), refresh_seconds=5, clock=lambda: now[0])
    assert job_of(3101) == "77"
    slurm_job_cgroup(root, 78, (4242,))
    now[0] = 1.0
    assert job_of(3101) == "77"  # known: no walk
    assert job_of(4242) == ""  # unknown, but the tree was read 1 s ago
    now[0] = 5.0
    assert job_of(4242) == "78"  # read again
    assert job_of(1) == ""  # a process in no job


def test_a_process_in_no_job_is_looked_for_again_only_after_the_recheck_period(tmp_path, monkeypatch):
    root = slurm_job_cgroup(tmp_path / "cgroup", 77, (3101,))
    walks = []
    walk = cgroups.job_pids
    monkeypatch.setattr(cgroups, "job_pids", lambda path: walks.append(path) or walk(path))
    now = [0.0]
    job_of = cgroups.JobOfProcess(str(root), refresh_seconds=5, recheck_seconds=60, clock=lambda: now[0])
    assert job_of(555) == "" and len(walks) == 1  # a service on the GPU: one walk finds it in no job
    for second in range(10, 60, 10):  # every sample after: no walk for it
        now[0] = second
        assert job_of(555) == ""
    assert len(walks) == 1
    slurm_job_cgroup(root, 78, (4242,))
    assert job_of(4242) == "78" and len(walks) == 2  # a new process is still looked for at once
    assert job_of(556) == "" and len(walks) == 2  # asked just after that walk: not in it, no new walk
    now[0] = 61.0
    assert job_of(555) == "" and len(walks) == 2  # asked about since the walk at 0: that at 50 judged it again
    now[0] = 110.0
    assert job_of(555) == "" and len(walks) == 3  # a period after the walk at 50
    now[0] = 115.0
    assert job_of(556) == "" and len(walks) == 3  # found in no job by the walk at 110 (asked since the one at 50)
    now[0] = 300.0
    assert job_of(4242) == "78" and len(walks) == 3
    assert job_of(999) == "" and len(walks) == 4
    assert set(job_of._in_no_job) == {556, 999}  # 555, not asked about for a period, is forgotten (it ended)


def test_golden(host):
    """Records as the prolog writes them (its own tests run it): Slurm's device minors, UUIDs, a MIG instance, a GPU
    the host does not have, and a malformed line."""
    state, procfs = host
    (state / "slurm-4242").write_text("scheduler=slurm\njob_id=4242\nuser=alice\naccount=physics\ngpus=0,2\n")
    (state / "slurm-4243").write_text(f"scheduler=slurm\njob_id=4243\nuser=bob\ngpus={uuid(3)},MIG-1c2d3e4f-aaaa,9\n")
    (state / "slurm-4244").write_text("scheduler=slurm\njob_id=4244\nnot a key value line\n")
    text = text_of(jobs.JobsCollector(str(state), str(procfs)))
    promtool_check(text)
    check_golden("jobs_slurm.prom", text)
