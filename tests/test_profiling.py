"""The profiling collector: GPM through the fake libnvidia-ml, DCGM through fake bindings; backend choice."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from accelmon.collectors.profiling import ProfilingCollector
from tests.support.clock import ManualClock
from tests.support.exposition import check_golden, promtool_check, text_of
from tests.support.exposition import sample_value as value
from tests.support.paths import FAKE_DCGM_BINDINGS
from tests.support.processes import exporter_env, run_once

FAKE_DCGM = str(FAKE_DCGM_BINDINGS)


def make(clock=None, **options) -> ProfilingCollector:
    options.setdefault("dcgm_bindings_paths", (FAKE_DCGM,))
    collector = ProfilingCollector(clock=clock or ManualClock(), **options)
    collector.start()
    return collector


def sample(collector: ProfilingCollector) -> str:
    return text_of(collector)


def test_dcgm_values_units_and_blanks(fake_dcgm, fake_nvml):
    fake_dcgm(up=True, gpus=[0, 1], blank=[1004])
    collector = make()
    try:
        text = sample(collector)
        assert value(text, "accelmon_gpu_profiling_backend_info", backend="dcgm") == 1
        assert value(text, "accelmon_gpu_sm_active_ratio", gpu="1") == pytest.approx(0.21)
        # DCGM's field 1001, dcgm-exporter's most-queried profiling field: the fake host engine's 0.1 + 0.01 x GPU.
        assert value(text, "accelmon_gpu_graphics_engine_active_ratio", gpu="1") == pytest.approx(0.11)
        assert value(text, "accelmon_gpu_tensor_active_ratio", gpu="0") is None  # blank is no value
        assert value(text, "accelmon_gpu_profiling_nvlink_receive_bytes_per_second", gpu="1") == 8_000_000
        assert value(text, "accelmon_gpu_dram_active_ratio", gpu="0", uuid="GPU-00000000-0000-4000-8000-000000000000")
        promtool_check(text)
    finally:
        collector.stop()


def test_gpm_when_no_host_engine(fake_dcgm, fake_nvml):
    fake_nvml.configure("gpus 3\ngpm 0\ngpm 2\n")  # GPU 1 has no GPM (pre-Hopper)
    clock = ManualClock()
    collector = make(clock, interval=0.2)
    try:
        time.sleep(0.11)  # the driver's own clock: two GPM samples more than 100 ms apart
        clock.now += 0.2  # the collector's: one full window
        text = sample(collector)
        assert value(text, "accelmon_gpu_profiling_backend_info", backend="gpm") == 1
        assert value(text, "accelmon_gpu_sm_active_ratio", gpu="2") == pytest.approx(0.52)
        assert value(text, "accelmon_gpu_graphics_engine_active_ratio", gpu="2") == pytest.approx(0.57)  # GPM %
        assert value(text, "accelmon_gpu_sm_active_ratio", gpu="1") is None
        assert value(text, "accelmon_gpu_profiling_pcie_receive_bytes_per_second", gpu="2") == 600 * 1024 * 1024
        assert value(text, "accelmon_gpu_profiling_nvlink_transmit_bytes_per_second", gpu="0") == 2000 * 1024 * 1024
        promtool_check(text)
    finally:
        collector.stop()


def test_gpm_per_mig_instance(fake_dcgm, fake_nvml):
    """A GPU in MIG mode: each GPU instance gets its own GPM windows (nvmlGpmMigSampleGet), so a job given an instance
    sees what it used of that instance; the whole GPU's series stay as they are."""
    fake_nvml.configure("gpus 2\nmig 1 2\ngpm 0\ngpm 1\n")
    before = fake_nvml.calls_of("nvmlGpmMigSampleGet")  # counted since the library was loaded in this process
    clock = ManualClock()
    collector = make(clock, interval=0.2)
    try:
        time.sleep(0.11)
        clock.now += 0.2
        text = sample(collector)
        promtool_check(text)
        # The fake's SM activity: 50 % + the GPU index, 5 % more per instance id (1 and 2 on GPU 1).
        for instance, ratio in (("1", 0.56), ("2", 0.61)):
            assert value(text, "accelmon_gpu_mig_sm_active_ratio", gpu="1", gpu_instance_id=instance) == (
                pytest.approx(ratio)
            )
            assert value(text, "accelmon_gpu_mig_tensor_active_ratio", gpu="1", gpu_instance_id=instance) == (
                pytest.approx(0.40)
            )
            assert value(text, "accelmon_gpu_mig_graphics_engine_active_ratio", gpu="1", gpu_instance_id=instance) == (
                pytest.approx(ratio + 0.05)
            )
        assert value(text, "accelmon_gpu_mig_sm_active_ratio", gpu="0") is None  # not in MIG mode
        assert value(text, "accelmon_gpu_sm_active_ratio", gpu="1") == pytest.approx(0.51)
        assert fake_nvml.calls_of("nvmlGpmMigSampleGet") - before == 4  # two windows' ends, two instances
    finally:
        collector.stop()


def test_no_backend_is_no_data_and_no_failure(fake_dcgm, fake_nvml):
    fake_nvml.configure("gpus 2\n")  # no GPM anywhere, no host engine
    collector = make()
    try:
        text = sample(collector)
        assert value(text, "accelmon_gpu_profiling_backend_info", backend="none") == 1
        assert "accelmon_gpu_sm_active_ratio" not in text
    finally:
        collector.stop()


def test_host_engine_coming_up_later_and_dying(fake_dcgm, fake_nvml):
    fake_nvml.configure("gpus 1\ngpm 0\n")
    clock = ManualClock()
    collector = make(clock, dcgm_retry_seconds=30)
    try:
        assert value(sample(collector), "accelmon_gpu_profiling_backend_info", backend="gpm") == 1
        fake_dcgm(up=True, gpus=[0])
        clock.now += 10
        assert value(sample(collector), "accelmon_gpu_profiling_backend_info", backend="gpm") == 1  # not retried yet
        clock.now += 30
        assert value(sample(collector), "accelmon_gpu_profiling_backend_info", backend="dcgm") == 1
        fake_dcgm(up=False)
        clock.now += 1
        text = sample(collector)  # the read fails: falls back to GPM at once
        assert value(text, "accelmon_gpu_profiling_backend_info", backend="gpm") == 1
    finally:
        collector.stop()


def test_forced_dcgm_with_engine_down_reports_none(fake_dcgm, fake_nvml):
    fake_nvml.configure("gpus 1\ngpm 0\n")
    collector = make(backend="dcgm")
    try:
        assert value(sample(collector), "accelmon_gpu_profiling_backend_info", backend="none") == 1
    finally:
        collector.stop()


def test_missing_bindings_fall_back(fake_dcgm, fake_nvml, tmp_path):
    fake_nvml.configure("gpus 1\ngpm 0\n")
    collector = make(dcgm_bindings_paths=(str(tmp_path / "nowhere"),))
    try:
        assert value(sample(collector), "accelmon_gpu_profiling_backend_info", backend="gpm") == 1
    finally:
        collector.stop()


def test_profiling_names_never_collide_with_nvml_collector(fake_nvml_dir, tmp_path, monkeypatch):
    """Both collectors in one process: one exposition, every family once, promtool clean."""
    config = tmp_path / "fake.conf"
    config.write_text("gpus 2\ngpm 0\ngpm 1\n")
    state = tmp_path / "dcgm.json"
    state.write_text(json.dumps({"up": False}))
    env = exporter_env(fake_nvml_dir, config)
    env["FAKE_DCGM_STATE"] = str(state)
    settings = tmp_path / "accelmon.yml"
    settings.write_text(
        "collectors:\n  profiling:\n    enabled: true\n    interval_seconds: 0.3\n"
        f"    dcgm_bindings_path: {FAKE_DCGM}\n"
    )
    result = run_once(["--config", str(settings)], env)
    assert result.returncode == 0, result.stderr
    promtool_check(result.stdout)
    names = [line.split()[2] for line in result.stdout.splitlines() if line.startswith("# TYPE")]
    assert len(names) == len(set(names))
    assert "accelmon_gpu_pcie_transmit_bytes_per_second" in names
    assert "accelmon_gpu_profiling_pcie_transmit_bytes_per_second" in names
    assert 'accelmon_gpu_profiling_backend_info{backend="gpm"} 1' in result.stdout
    check_golden(
        "profiling_gpm.prom",
        "\n".join(
            line
            for line in result.stdout.splitlines()
            if "profiling" in line or "_active_ratio" in line or "sm_occupancy" in line
        )
        + "\n",
    )


def test_bad_backend_is_refused(tmp_path):
    settings = tmp_path / "accelmon.yml"
    settings.write_text("collectors:\n  profiling:\n    backend: nsight\n")
    result = run_once(["--config", str(settings)], exporter_env(None, None))
    assert result.returncode == 2
    assert "collectors.profiling.backend: expected one of auto, dcgm, gpm" in result.stderr


def test_path_of_fake_bindings_exists():
    assert (Path(FAKE_DCGM) / "pydcgm.py").exists()


def test_gpm_never_publishes_a_short_window(fake_dcgm, fake_nvml):
    """A real H100 answers GPM samples closer than 100 ms with SUCCESS, zeros and a NaN DRAM value; the fake does
    the same. The collector publishes nothing from such a window (no zeros, no NaN), lets the window grow until
    it is full, then publishes the real values."""
    fake_nvml.configure("gpus 1\ngpm 0\n")
    clock = ManualClock()
    collector = make(clock, interval=1.0)
    try:
        text = sample(collector)  # microseconds after the first sample, as --once did
        assert value(text, "accelmon_gpu_profiling_backend_info", backend="gpm") == 1
        assert "accelmon_gpu_sm_active_ratio{" not in text and "NaN" not in text
        clock.now += 0.5  # half a window: still nothing
        assert "accelmon_gpu_sm_active_ratio{" not in sample(collector)
        time.sleep(0.11)
        clock.now += 0.5  # now a full window, measured from the first sample
        text = sample(collector)
        assert value(text, "accelmon_gpu_sm_active_ratio", gpu="0") == pytest.approx(0.50)
        assert value(text, "accelmon_gpu_dram_active_ratio", gpu="0") == pytest.approx(0.30)
    finally:
        collector.stop()


def test_fake_gpm_answers_close_samples_like_the_h100(fake_nvml):
    """Calibration of the fake against docs/hardware.md: samples 0 ms apart give SUCCESS, 0 and NaN."""
    import math

    import pynvml

    fake_nvml.configure("gpus 1\ngpm 0\n")
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(handle, first)
        pynvml.nvmlGpmSampleGet(handle, second)
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
        pynvml.nvmlGpmMetricsGet(request)
        assert request.metrics[0].nvmlReturn == 0 and request.metrics[0].value == 0.0
        assert request.metrics[1].nvmlReturn == 0 and math.isnan(request.metrics[1].value)
    finally:
        pynvml.nvmlShutdown()


def test_gpm_window_after_a_gap_is_dropped(fake_dcgm, fake_nvml):
    """The sampler was held up (a hung call, a suspended process): the long window is not this interval's value."""
    fake_nvml.configure("gpus 1\ngpm 0\n")
    clock = ManualClock()
    collector = make(clock, interval=1.0)
    try:
        time.sleep(0.11)
        clock.now += 60
        assert "accelmon_gpu_sm_active_ratio{" not in sample(collector)
        time.sleep(0.11)
        clock.now += 1
        assert value(sample(collector), "accelmon_gpu_sm_active_ratio", gpu="0") == pytest.approx(0.50)
    finally:
        collector.stop()


def test_once_waits_for_a_full_gpm_window(fake_nvml_dir, tmp_path):
    """`--once --collector.profiling` under load printed zeros and NaN on the H100; now it waits one window."""
    config = tmp_path / "fake.conf"
    config.write_text("gpus 1\ngpm 0\n")
    settings = tmp_path / "accelmon.yml"
    settings.write_text(
        "collectors:\n  profiling:\n    enabled: true\n    backend: gpm\n    interval_seconds: 0.5\n"
        "  infiniband:\n    enabled: false\n  neuron:\n    enabled: false\n"
    )
    started = time.monotonic()
    result = run_once(["--config", str(settings)], exporter_env(fake_nvml_dir, config))
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 0.5
    assert value(result.stdout, "accelmon_gpu_sm_active_ratio", gpu="0") == pytest.approx(0.50)
    assert "NaN" not in result.stdout
