"""Per-job GPU use: the fake driver's processes, put in Slurm jobs through a fixture cgroup tree."""

from __future__ import annotations

import pytest

from accelmon.collectors.gpu_processes import GpuProcessesCollector
from accelmon.job_sources.cgroups import JobOfProcess
from tests.support.exposition import check_golden, promtool_check, sample_value, text_of
from tests.support.jobs_tree import slurm_job_cgroup

MIB = 2**20
UUID1 = "GPU-00000001-0000-4000-8000-000000000000"


@pytest.fixture
def make(fake_nvml, tmp_path, started):
    """A collector over the fake driver configured with `config`; pids 501 in job 100, 502 in job 200 (cgroup v2)."""
    cgroup = tmp_path / "cgroup"
    slurm_job_cgroup(cgroup, 100, (501,))
    slurm_job_cgroup(cgroup, 200, (502, 504))

    def build(config: str) -> GpuProcessesCollector:
        fake_nvml.configure(config)
        return started(GpuProcessesCollector(job_of=JobOfProcess(str(cgroup))))

    return build


def read(collector: GpuProcessesCollector) -> str:
    text = text_of(collector)
    promtool_check(text)
    return text


def test_a_shared_gpu_is_split_between_its_jobs(make):
    # GPU 1 runs a process of job 100, one of job 200 and one outside any job; GPU 0 runs none.
    text = read(make("gpus 2\nprocess_samples 1\nprocess 1 501 1024\nprocess 1 502 2048\nprocess 1 503 256\n"))
    gpu1 = {"gpu": "1", "uuid": UUID1}
    assert sample_value(text, "accelmon_gpu_job_memory_used_bytes", job_id="100", **gpu1) == 1024 * MIB
    assert sample_value(text, "accelmon_gpu_job_memory_used_bytes", job_id="200", **gpu1) == 2048 * MIB
    assert sample_value(text, "accelmon_gpu_job_memory_used_bytes", job_id="", **gpu1) == 256 * MIB
    assert sample_value(text, "accelmon_gpu_job_memory_used_bytes", job_id="100", gpu_instance_id="") is not None
    # The fake's samples: SM 10 % + 5 % x (pid mod 7), memory half of that.
    assert sample_value(text, "accelmon_gpu_job_sm_utilization_ratio", job_id="100", **gpu1) == pytest.approx(0.30)
    assert sample_value(text, "accelmon_gpu_job_sm_utilization_ratio", job_id="200", **gpu1) == pytest.approx(0.35)
    assert sample_value(text, "accelmon_gpu_job_sm_utilization_ratio", job_id="", **gpu1) == pytest.approx(0.40)
    assert sample_value(text, "accelmon_gpu_job_memory_utilization_ratio", job_id="100", **gpu1) == pytest.approx(0.15)
    assert sample_value(text, "accelmon_gpu_job_processes", job_id="200", **gpu1) == 1
    assert sample_value(text, "accelmon_gpu_job_processes", gpu="0") is None  # a GPU with no process: no series


def test_two_processes_of_one_job_add_up_and_mig_instances_are_kept_apart(make):
    text = read(make("gpus 1\nprocess_samples 1\nprocess 0 502 1000 1\nprocess 0 504 500 2\n"))
    assert sample_value(text, "accelmon_gpu_job_processes", job_id="200") == 2
    assert sample_value(text, "accelmon_gpu_job_memory_used_bytes", job_id="200", gpu_instance_id="1") == 1000 * MIB
    assert sample_value(text, "accelmon_gpu_job_memory_used_bytes", job_id="200", gpu_instance_id="2") == 500 * MIB
    # 502 mod 7 = 5 (35 %), 504 mod 7 = 0 (10 %)
    assert sample_value(text, "accelmon_gpu_job_sm_utilization_ratio", job_id="200") == pytest.approx(0.45)


def test_a_gpu_held_by_one_job_is_judged_by_its_own_utilization_without_per_process_samples(make, fake_nvml):
    # GPU 1: two processes of job 200 alone; the fake's GPU 1 is 20 % busy, its memory 10 %.
    collector = make("gpus 2\nprocess_samples 1\nprocess 1 502 1000\nprocess 1 504 500\n")
    before = fake_nvml.calls_of("nvmlDeviceGetProcessUtilization")
    text = read(collector)
    gpu1 = {"gpu": "1", "uuid": UUID1, "job_id": "200"}
    assert sample_value(text, "accelmon_gpu_job_sm_utilization_ratio", **gpu1) == pytest.approx(0.20)
    assert sample_value(text, "accelmon_gpu_job_memory_utilization_ratio", **gpu1) == pytest.approx(0.10)
    assert sample_value(text, "accelmon_gpu_job_processes", **gpu1) == 2
    assert fake_nvml.calls_of("nvmlDeviceGetProcessUtilization") == before  # 2.2 ms a call on an H100: not made


def test_no_sample_since_the_last_read_is_no_use(make):
    # Two jobs share GPU 0; the driver answers NOT_FOUND: no sample since then.
    text = read(make("gpus 1\nprocess 0 501 100\nprocess 0 502 100\n"))
    assert sample_value(text, "accelmon_gpu_job_sm_utilization_ratio", job_id="100") == 0
    assert sample_value(text, "accelmon_gpu_job_memory_used_bytes", job_id="100") == 100 * MIB


def test_without_per_process_samples_only_memory_is_served_and_asked_once(make, fake_nvml):
    collector = make("gpus 1\nprocess 0 501 100\nprocess 0 502 100\nunsupported nvmlDeviceGetProcessUtilization\n")
    before = fake_nvml.calls_of("nvmlDeviceGetProcessUtilization")
    read(collector)
    text = read(collector)
    assert "accelmon_gpu_job_sm_utilization_ratio{" not in text
    assert sample_value(text, "accelmon_gpu_job_memory_used_bytes", job_id="100") == 100 * MIB
    assert fake_nvml.calls_of("nvmlDeviceGetProcessUtilization") - before == 1


def test_a_lost_gpu_leaves_the_others(make, fake_nvml):
    collector = make("gpus 2\nprocess 0 501 100\nprocess 1 502 200\n")
    fake_nvml.set_lost(0)
    text = read(collector)
    assert sample_value(text, "accelmon_gpu_job_memory_used_bytes", gpu="0") is None
    assert sample_value(text, "accelmon_gpu_job_memory_used_bytes", gpu="1", job_id="200") == 200 * MIB
    fake_nvml.set_lost(0, False)


def test_golden(make):
    text = read(make("gpus 2\nprocess_samples 1\nprocess 1 501 1024\nprocess 1 502 2048\nprocess 1 503 256\nmig 0 2\n"))
    check_golden("gpu_processes_shared.prom", text)
