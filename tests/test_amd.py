"""AMD Instinct GPUs: the amd collector through AMD's real amdsmi bindings (pinned 7.0.2) over the fake
libamd_smi.so (tests/fakeamdsmi), the health checks over what it serves, and the ways amdsmi fails."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from accelmon import health
from accelmon.collectors import amd
from accelmon.collectors.amd import AmdCollector, amd_only
from accelmon.config import load
from accelmon.exporter.registry import Paths
from accelmon.host.amdsmi_library import load_amdsmi
from accelmon.scan import plan
from tests.support.clock import ManualClock
from tests.support.exposition import check_golden, promtool_check, sample_value, text_of
from tests.support.fakeamdsmi import build_fake_amdsmi
from tests.support.processes import exporter_command, exporter_env, run_once

# The collectors whose checks these tests judge (a check runs only where its collector does).
CHECKED = [amd.REGISTRATION]

UUID0 = "00ff74a1-0000-1000-8000-000000001000"
UUID1 = "01ff74a1-0000-1000-8001-000000001001"
GIB = 2**30


@pytest.fixture
def make(fake_amdsmi, started):
    """A started collector over the fake configured with `config`, on a clock the test moves."""

    def build(config: str = "") -> tuple[AmdCollector, ManualClock]:
        fake_amdsmi.configure(config)
        clock = ManualClock()
        return started(AmdCollector(slow_interval=30, clock=clock)), clock

    return build


def read(collector: AmdCollector) -> str:
    text = text_of(collector)
    promtool_check(text)
    return text


def test_the_fake_keeps_the_bindings_struct_layouts(fake_amdsmi):
    import amdsmi

    for name in ("amdsmi_asic_info_t", "amdsmi_engine_usage_t", "amdsmi_power_info_t", "amdsmi_clk_info_t",
                 "amdsmi_error_count_t", "amdsmi_pcie_info_t", "amdsmi_driver_info_t", "amdsmi_vbios_info_t",
                 "amdsmi_version_t", "amdsmi_gpu_metrics_t"):  # fmt: skip
        assert fake_amdsmi.size_of(name) == ctypes.sizeof(getattr(amdsmi.amdsmi_wrapper, name)), name
    assert amdsmi.amdsmi_wrapper.amdsmi_get_gpu_metrics_info  # bound from the fake, as every other symbol


def test_amd_gpus_are_served_under_the_shared_names_and_their_own(make):
    collector, _ = make("gpus 2\n")
    text = read(collector)
    gpu0, gpu1 = {"gpu": "0", "uuid": UUID0}, {"gpu": "1", "uuid": UUID1}
    # What a dashboard or rule written for NVIDIA GPUs reads, in the same units.
    assert sample_value(text, "accelmon_gpu_info", vendor="amd", name="AMD Instinct MI300X", **gpu0) == 1
    assert sample_value(text, "accelmon_gpu_info", pci_bus_id="0000:21:00.0", **gpu1) == 1
    assert sample_value(text, "accelmon_gpu_up", **gpu1) == 1
    assert sample_value(text, "accelmon_gpu_utilization_ratio", **gpu1) == pytest.approx(0.2)  # GFX activity
    assert sample_value(text, "accelmon_gpu_memory_utilization_ratio", **gpu1) == pytest.approx(0.1)  # UMC
    assert sample_value(text, "accelmon_gpu_memory_used_bytes", **gpu1) == 2 * GIB
    assert sample_value(text, "accelmon_gpu_memory_free_bytes", **gpu1) == 190 * GIB
    assert sample_value(text, "accelmon_gpu_power_watts", **gpu1) == 310
    assert sample_value(text, "accelmon_gpu_power_limit_watts", **gpu1) == 750
    assert sample_value(text, "accelmon_gpu_temperature_celsius", **gpu1) == 51  # hotspot
    assert sample_value(text, "accelmon_gpu_memory_temperature_celsius", **gpu1) == 46  # VRAM
    assert sample_value(text, "accelmon_gpu_sm_clock_hertz", **gpu1) == 1510e6
    assert sample_value(text, "accelmon_gpu_sm_clock_max_hertz", **gpu1) == 2100e6
    assert sample_value(text, "accelmon_gpu_pcie_link_generation", **gpu1) == 5
    assert sample_value(text, "accelmon_gpu_pcie_replays_total", **gpu1) == 3
    assert sample_value(text, "accelmon_gpu_energy_joules_total", **gpu1) == pytest.approx(1e6, rel=1e-3)
    # What only AMD says.
    assert sample_value(text, "accelmon_amd_gpu_temperature_celsius", sensor="edge", **gpu1) == 41
    assert sample_value(text, "accelmon_amd_gpu_partition_info", compute_partition="SPX", memory_partition="NPS1",
                        **gpu0) == 1  # fmt: skip
    assert sample_value(text, "accelmon_amd_gpu_xgmi_link_up", link="6", **gpu0) == 1
    assert sample_value(text, "accelmon_amd_gpu_xgmi_link_up", link="7", **gpu0) is None  # no eighth peer
    assert sample_value(text, "accelmon_amd_gpu_xgmi_read_bytes_total", link="0", **gpu0) >= 1e9  # KB -> bytes


def test_ras_errors_per_block_add_up_to_the_ecc_total_and_fail_the_health_check(make):
    # GPU 1's UMC (HBM) counted 5 corrected, 2 uncorrected and 1 deferred error; its GFX block 3 corrected.
    collector, _ = make("gpus 2\necc 1 1 5 2 1\necc 1 4 3 0 0\n")
    samples = collector.sample()
    text = text_of(samples)
    gpu1 = {"gpu": "1", "uuid": UUID1}
    assert sample_value(text, "accelmon_amd_gpu_ras_errors_total", block="umc", type="uncorrected", **gpu1) == 2
    assert sample_value(text, "accelmon_amd_gpu_ras_errors_total", block="gfx", type="corrected", **gpu1) == 3
    assert sample_value(text, "accelmon_amd_gpu_ras_errors_total", block="df", **gpu1) is None  # RAS off there
    assert sample_value(text, "accelmon_gpu_ecc_errors_total", type="corrected", scope="volatile", **gpu1) == 8
    assert sample_value(text, "accelmon_gpu_ecc_errors_total", type="uncorrected", scope="volatile", **gpu1) == 2
    assert sample_value(text, "accelmon_amd_gpu_ecc_deferred_errors_total", **gpu1) == 1
    node = health.evaluate([samples], now=0, registrations=CHECKED)
    checks = {gpu.index: {c.name: c for c in gpu.checks} for gpu in node.gpus}
    assert checks["1"]["ecc"].verdict == "failure" and checks["1"]["ecc"].action == "reset_gpu"
    assert checks["0"]["ecc"].verdict == "ok"


def test_counters_are_read_on_the_slow_schedule_and_served_in_between(make, fake_amdsmi):
    collector, clock = make("gpus 1\n")
    read(collector)
    clock.now += 1
    text = read(collector)
    assert fake_amdsmi.calls_of("amdsmi_get_energy_count") == 1  # once in two samples 1 s apart
    assert sample_value(text, "accelmon_gpu_energy_joules_total", gpu="0") is not None  # and still served
    assert fake_amdsmi.calls_of("amdsmi_get_gpu_activity") == 2
    clock.now += 30
    read(collector)
    assert fake_amdsmi.calls_of("amdsmi_get_energy_count") == 2
    # The RAS blocks are learnt once (19 calls), their counts read each slow interval (7 blocks on).
    assert fake_amdsmi.calls_of("amdsmi_get_gpu_ras_block_features_enabled") == 19
    assert fake_amdsmi.calls_of("amdsmi_get_gpu_ecc_count") == 14


def test_throttle_reasons_judge_slowdown_like_nvidias(make):
    # GPU 0 held down by temperature (bit 33, TEMP_CORE), GPU 1 by its power cap (bit 0, PPT0): only the first
    # is a slowdown, as NVIDIA's power cap is not one.
    collector, _ = make(f"gpus 2\nthrottle 0 {1 << 33}\nthrottle 1 1\n")
    samples = collector.sample()
    text = text_of(samples)
    assert sample_value(text, "accelmon_gpu_clock_event_active", gpu="0", reason="thermal_limit") == 1
    assert sample_value(text, "accelmon_gpu_clock_event_active", gpu="1", reason="power_limit") == 1
    assert sample_value(text, "accelmon_gpu_clock_event_active", gpu="1", reason="thermal_limit") == 0
    node = health.evaluate([samples], now=0, registrations=CHECKED)
    slowdown = {gpu.index: next(c for c in gpu.checks if c.name == "slowdown") for gpu in node.gpus}
    assert slowdown["0"].verdict == "warning" and "thermal_limit" in slowdown["0"].detail
    assert slowdown["1"].verdict == "ok"


def test_a_degraded_pcie_link_and_a_downed_xgmi_link_are_judged(make):
    collector, _ = make("gpus 2\npcie 0 32000 8\nxgmi_down 1 3\nxgmi_error 1 2\n")
    samples = collector.sample()
    text = text_of(samples)
    assert sample_value(text, "accelmon_amd_gpu_xgmi_link_up", gpu="1", link="3") == 0
    assert sample_value(text, "accelmon_amd_gpu_xgmi_error_state", gpu="1") == 2
    node = health.evaluate([samples], now=0, registrations=CHECKED)
    checks = {gpu.index: {c.name: c for c in gpu.checks} for gpu in node.gpus}
    assert checks["0"]["pcie"].verdict == "warning" and "x8 of x16" in checks["0"]["pcie"].detail
    assert checks["1"]["xgmi"] == health.Check("xgmi", "failure", "XGMI down: link 3 (6 of 7 up)", "reset_gpu")
    assert checks["0"]["xgmi"].verdict == "ok"
    assert node.verdict == "failure"


def test_a_field_the_gpu_lacks_is_asked_once_and_the_rest_is_served(make, fake_amdsmi):
    collector, clock = make("gpus 1\nunsupported amdsmi_get_gpu_metrics_info\nunsupported amdsmi_get_temp_metric\n")
    read(collector)
    clock.now += 1
    text = read(collector)
    assert fake_amdsmi.calls_of("amdsmi_get_gpu_metrics_info") == 1
    assert fake_amdsmi.calls_of("amdsmi_get_temp_metric") == 3  # each sensor once
    assert sample_value(text, "accelmon_gpu_clock_event_active", gpu="0") is None
    assert sample_value(text, "accelmon_gpu_temperature_celsius", gpu="0") is None
    assert sample_value(text, "accelmon_gpu_power_watts", gpu="0") == 300
    assert sample_value(text, "accelmon_gpu_up", gpu="0") == 1


def test_a_gpu_lost_mid_run_is_reported_while_the_others_go_on_and_comes_back(make, fake_amdsmi):
    collector, _ = make("gpus 2\n")
    read(collector)
    fake_amdsmi.set_lost(1)
    text = read(collector)
    assert sample_value(text, "accelmon_gpu_up", gpu="1", uuid=UUID1) == 0
    assert sample_value(text, "accelmon_gpu_up", gpu="0") == 1
    assert sample_value(text, "accelmon_gpu_power_watts", gpu="0") == 300
    assert sample_value(text, "accelmon_gpu_power_watts", gpu="1") is None
    checks = {g.index: g for g in health.evaluate([collector.sample()], now=0, registrations=CHECKED).gpus}
    assert checks["1"].verdict == "failure" and checks["1"].action == "reboot_node"
    fake_amdsmi.set_lost(1, False)  # after a GPU reset: everything again, its counters at once
    text = read(collector)
    assert sample_value(text, "accelmon_gpu_up", gpu="1") == 1
    assert sample_value(text, "accelmon_gpu_energy_joules_total", gpu="1") is not None


def test_without_the_package_the_collector_says_why_and_serves_nothing(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # `import amdsmi` fails as where it is not installed
    collector = AmdCollector()
    collector.start()
    assert collector.sample().rows == {}
    assert not collector.hardware_answering()
    assert "the amdsmi package is not installed" in caplog.text


LOAD = "from accelmon.host.amdsmi_library import load_amdsmi; module, why = load_amdsmi(); print(why)"


def load_in_a_fresh_process(rocm: str) -> subprocess.CompletedProcess[str]:
    env = {**exporter_env(None, None), "ROCM_PATH": rocm}
    return subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, timeout=60)


def test_a_missing_library_is_named_and_kept_off_stdout(tmp_path):
    result = load_in_a_fresh_process(str(tmp_path / "no-rocm"))
    assert result.returncode == 0, result.stderr
    # The bindings' own print went nowhere: stdout holds only the reason.
    assert result.stdout.strip().startswith("libamd_smi.so was not found"), result.stdout


def test_a_library_older_than_the_pinned_bindings_is_named(tmp_path):
    older = tmp_path / "rocm-old"
    build_fake_amdsmi(older, leave_out=("amdsmi_get_gpu_metrics_info",))
    result = load_in_a_fresh_process(str(older))
    assert result.returncode == 0, result.stderr
    assert "does not match the amdsmi 7.0.2 bindings" in result.stdout
    assert "amdsmi_get_gpu_metrics_info" in result.stdout


def test_once_serves_amd_gpus_beside_the_other_collectors(fake_rocm, tmp_path):
    config = tmp_path / "fake-amdsmi.conf"
    config.write_text("gpus 2\n")
    settings = tmp_path / "accelmon.yaml"
    settings.write_text("collectors:\n  amd:\n    enabled: true\n")
    env = {**exporter_env(None, None), "ROCM_PATH": str(fake_rocm), "FAKE_AMDSMI_CONFIG": str(config)}
    result = run_once(["--config", str(settings)], env)
    assert result.returncode == 0, result.stderr
    promtool_check(result.stdout)
    assert sample_value(result.stdout, "accelmon_gpu_power_watts", gpu="1", uuid=UUID1) == 310
    assert 'accelmon_collector_success{collector="amd"} 1.0' in result.stdout
    assert 'accelmon_collector_success{collector="nvml"} 1.0' in result.stdout  # no NVIDIA driver: nothing, no fault
    scan = subprocess.run(
        exporter_command("--scan", "--json", "--config", str(settings)),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert scan.returncode == 0, scan.stdout + scan.stderr
    assert [gpu["verdict"] for gpu in json.loads(scan.stdout)["gpus"]] == ["ok", "ok"]


def test_on_by_default_only_on_an_amd_host_without_nvidias_driver(tmp_path):
    sysfs, devfs, procfs = tmp_path / "sys", tmp_path / "dev", tmp_path / "proc"
    for directory in (sysfs, devfs, procfs):
        directory.mkdir()
    paths = Paths(sysfs=str(sysfs), procfs=str(procfs), devfs=str(devfs))
    assert not amd_only(paths, {})
    (sysfs / "module" / "amdgpu").mkdir(parents=True)
    assert not amd_only(paths, {})  # the module without /dev/kfd: no compute device
    (devfs / "kfd").touch()
    assert amd_only(paths, {})
    (procfs / "driver" / "nvidia").mkdir(parents=True)
    (procfs / "driver" / "nvidia" / "version").write_text("NVRM version: 580\n")
    assert not amd_only(paths, {})  # both vendors: the operator enables one (docs/amd.md)
    assert amd.REGISTRATION.hardware_present(paths, {})


def test_load_reports_the_bindings_when_they_load(fake_amdsmi):
    module, why = load_amdsmi()
    assert module is not None and why == ""


def test_the_plan_names_the_paths_the_detection_reads(tmp_path):
    """--check-config --json gives the role the amd collector's hardware markers, resolved against the configured
    paths: the role looks for exactly what the collector's own detection reads, and both agree on a fixture host."""
    settings = tmp_path / "accelmon.yml"
    settings.write_text(f"paths:\n  sysfs: {tmp_path / 'sys'}\n  devfs: {tmp_path / 'dev'}\n")
    markers = plan(load(str(settings)))["collectors"]["amd"]["hardware_markers"]
    assert markers == [str(tmp_path / "sys" / "module" / "amdgpu"), str(tmp_path / "dev" / "kfd")]
    paths = Paths(sysfs=str(tmp_path / "sys"), devfs=str(tmp_path / "dev"))
    assert not amd.amd_driver_loaded(paths, {})
    (tmp_path / "sys" / "module" / "amdgpu").mkdir(parents=True)
    assert not amd.amd_driver_loaded(paths, {})  # the driver without its compute device: not yet
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kfd").touch()
    assert amd.amd_driver_loaded(paths, {}) and all(os.path.exists(marker) for marker in markers)


def test_golden(make):
    collector, _ = make("gpus 2\nstill 1\n")
    check_golden("amd_mi300x.prom", read(collector), collector="amd")
