"""accelmon-exporter as a user runs it: flags, config file, --once, golden expositions and promtool."""

from __future__ import annotations

import ctypes.util

import pytest

from accelmon.cli import parser, settings_from
from accelmon.collectors import collectors
from accelmon.config import ConfigError
from accelmon.scan import build_samplers
from tests.support.exposition import GOLDEN, by_collector, check_golden, promtool_check, sample_value, stable_lines
from tests.support.processes import (
    exporter_env,
    free_port,
    on_fixtures,
    run_once,
    start_exporter,
    wait_until_serving,
)

SCENARIOS = {
    # Eight H100s, one lost, one whose driver lacks the newer calls, MIG on one: what a busy node looks like.
    "nvml_h100x8.prom": "gpus 8\nlost 5\nmig 3 2\nunsupported nvmlDeviceGetFanSpeed\n",
    # An older driver: no memory temperature field, no clock-event API (throttle reasons instead), no V temps.
    "nvml_old_driver.prom": (
        "gpus 2\nname Tesla V100-SXM2-32GB\nmissing nvmlDeviceGetTemperatureV\n"
        "missing nvmlDeviceGetCurrentClocksEventReasons\nmissing nvmlDeviceGetMemoryInfo_v2\n"
        "unsupported_field 82\nunsupported_field 142\nunsupported_field 143\nunsupported_field 144\n"
        "unsupported_field 145\nmissing nvmlDeviceGetMigMode\n"
    ),
    # What a real H100 SXM with driver 580 answered (docs/hardware.md): no fan, no retired-page fields
    # (it remaps rows instead), every call costing the CPU it cost there.
    "nvml_h100_real.prom": "gpus 1\nprofile h100\n",
}


@pytest.mark.parametrize("golden", sorted(SCENARIOS))
def test_once_matches_golden_and_passes_promtool(golden, fake_nvml_dir, tmp_path):
    config = tmp_path / "fake.conf"
    config.write_text(SCENARIOS[golden])
    result = run_once(on_fixtures(tmp_path / "host", "nvml", "health"), exporter_env(fake_nvml_dir, config))
    assert result.returncode == 0, result.stderr
    promtool_check(result.stdout)
    check_golden(golden, result.stdout)


def test_a_default_on_collector_changes_only_its_own_golden_file(fake_nvml_dir, tmp_path):
    """Golden files are one per collector: a run without the (default-on) health collector, as if it had not been
    written yet, differs from a run with it only in health's own parts (its self-metrics included, and the states
    of the checks, split by the collector that declares each: health.nvml)."""
    config = tmp_path / "fake.conf"
    config.write_text(SCENARIOS["nvml_h100_real.prom"])
    env = exporter_env(fake_nvml_dir, config)
    with_health = by_collector(stable_lines(run_once(on_fixtures(tmp_path, "nvml", "health"), env).stdout))
    without = by_collector(stable_lines(run_once(on_fixtures(tmp_path, "nvml"), env).stdout))
    assert 'accelmon_collector_success{collector="health"} 1.0' in with_health["health"]
    assert {part: text for part, text in with_health.items() if part.split(".")[0] != "health"} == without
    assert "health.nvml" in with_health


def test_every_collector_has_a_golden_exposition():
    """Each collector's part of a scrape is pinned on fixtures by a golden file (`test_golden` in its own test file,
    or a scenario above): a change to what it serves is reviewed, not found by users."""
    pinned = {path.stem.split(".")[0] for path in GOLDEN.glob("*/*.prom")}
    assert sorted(set(collectors()) - pinned) == []


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has a libnvidia-ml: it cannot be hidden"
)
def test_once_without_nvidia_driver(tmp_path):
    """No libnvidia-ml at all: exit 0, only self-metrics, the collector counted as successful."""
    result = run_once(on_fixtures(tmp_path, "nvml"), exporter_env(None, None))
    assert result.returncode == 0, result.stderr
    assert "accelmon_gpu_" not in result.stdout
    assert 'accelmon_collector_success{collector="nvml"} 1.0\n' in result.stdout
    promtool_check(result.stdout)


def test_collector_can_be_turned_off(fake_nvml_dir, tmp_path):
    config = tmp_path / "fake.conf"
    config.write_text("gpus 1\n")
    result = run_once(["--no-collector.nvml"], exporter_env(fake_nvml_dir, config))
    assert result.returncode == 0
    assert "accelmon_gpu_up" not in result.stdout
    assert 'collector="nvml"' not in result.stdout


def settings(*argv: str):
    return settings_from(parser().parse_args(list(argv)))


def test_config_file_and_flags(tmp_path):
    config = tmp_path / "accelmon.yml"
    config.write_text(
        "web:\n  listen_address: 127.0.0.1:9999\nlog_level: debug\npaths:\n  sysfs: /host/sys\n"
        "collectors:\n  nvml:\n    enabled: true\n    interval_seconds: 5\n    pcie_interval_seconds: 30\n"
    )
    chosen = settings("--config", str(config), "--web.listen-address", ":19999", "--path.procfs", "/host/proc")
    assert chosen.listen_address == ":19999"  # the flag wins
    assert chosen.log_level == "debug"
    assert chosen.paths.sysfs == "/host/sys"
    assert chosen.paths.procfs == "/host/proc"
    samplers = build_samplers(chosen)
    # health reads the others' samples, so it comes last; kernel_log is off: /host/proc shows no NVIDIA driver.
    assert [(s.name, s.interval) for s in samplers] == [("nvml", 5.0), ("health", 5.0)]
    assert samplers[0].collector.pcie_interval == 30.0
    assert [s.name for s in build_samplers(settings("--config", str(config), "--no-collector.nvml"))] == ["health"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("collectors:\n  nvml:\n    interval_seconds: -1\n", "collectors.nvml.interval_seconds: expected a positive"),
        ("collectors:\n  nvml:\n    intervall_seconds: 1\n", "collectors.nvml: unknown key(s) intervall_seconds"),
        ("collectors:\n  gpu: {}\n", "collectors: unknown key(s) gpu"),
        ("collectors:\n  nvml:\n    enabled: maybe\n", "collectors.nvml.enabled: expected true, false or auto"),
        ("web:\n  listen_address: nowhere\n", "listen address 'nowhere'"),
        ("web:\n  allowed_clients: 10.0.0.5\n", "web.allowed_clients: expected a list"),
        ("web:\n  allowed_clients: [10.0.0.0/33]\n", "web.allowed_clients: '10.0.0.0/33' is no address or network"),
        # Issue 66 review: a typo's host bits under /0 let in everyone; a zone was dropped (fe80::1 of any link).
        ("web:\n  allowed_clients: [10.0.0.5/0]\n", "web.allowed_clients: '10.0.0.5/0' is no address or network"),
        ("web:\n  allowed_clients: ['fe80::1%eth0']\n", "'fe80::1%eth0': give the address without its zone"),
        ("log_level: loud\n", "log_level: expected one of"),
        ("- a list\n", "expected a mapping"),
        ("web: [\n", "not valid YAML"),
        # Each of these was accepted, or crashed with a traceback (issue 12):
        ("collectors:\n  nvml:\n    interval_seconds: .inf\n", "interval_seconds: expected a positive number"),
        ("collectors:\n  nvml:\n    interval_seconds: .nan\n", "interval_seconds: expected a positive number"),
        ("collectors:\n  nvml:\n    interval_seconds: 1.0e-9\n", "interval_seconds: expected at least 0.1"),
        ("collectors:\n  nvml:\n    interval_seconds: 1" + "0" * 400 + "\n", "expected a positive number"),
        ("paths:\n  sysfs: null\n", "paths.sysfs: expected a path, got None"),
        ("paths:\n  sysfs: [a]\n", "paths.sysfs: expected a path, got ['a']"),
        ("web:\n  listen_address: ':\uff11\uff19\uff14\uff17\uff10'\n", "listen address"),
        ("web:\n  listen_address: ':0'\n", "listen address ':0'"),
        ("log_level: info\nlog_level: debug\n", "key 'log_level' given twice"),
        (b"log_level: \xff\xfe\n", "not UTF-8 text"),
    ],
)
def test_bad_config_is_refused_with_the_setting_named(tmp_path, text, message):
    config = tmp_path / "bad.yml"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=None) as error:
        settings("--config", str(config))
    assert message in str(error.value)


def test_an_ipv4_mapped_allowed_client_is_read_as_the_ipv4_address_it_is(tmp_path):
    """A dual-stack socket's IPv4 client is matched as IPv4 (server.client_address): ::ffff:192.0.2.9 kept as IPv6
    matched no client ever (issue 66 review)."""
    config = tmp_path / "web.yml"
    config.write_text("web:\n  allowed_clients: ['::ffff:192.0.2.9', '::ffff:10.0.0.0/104']\n")
    assert [str(n) for n in settings("--config", str(config)).allowed_clients] == ["192.0.2.9/32", "10.0.0.0/8"]


def test_bad_config_exits_2_with_message(tmp_path, fake_nvml_dir):
    config = tmp_path / "bad.yml"
    config.write_text("collectors:\n  nvml:\n    interval_seconds: fast\n")
    result = run_once(["--config", str(config)], exporter_env(fake_nvml_dir, None))
    assert result.returncode == 2
    assert "collectors.nvml.interval_seconds" in result.stderr


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        settings("--config", str(tmp_path / "absent.yml"))


def test_check_config(tmp_path):
    good, bad = tmp_path / "good.yml", tmp_path / "bad.yml"
    good.write_text("collectors:\n  nvml:\n    enabled: false\n")
    bad.write_text("collectors:\n  nvml:\n    enabled: sometimes\n")
    import subprocess
    import sys

    run = [sys.executable, "-m", "accelmon", "--check-config", "--config"]
    assert subprocess.run([*run, str(good)], capture_output=True).returncode == 0
    refused = subprocess.run([*run, str(bad)], capture_output=True, text=True)
    assert refused.returncode == 2
    assert "collectors.nvml.enabled" in refused.stderr


def hardware(exposition: str, collector: str) -> tuple[float | None, float | None]:
    return (
        sample_value(exposition, "accelmon_collector_hardware_expected", collector=collector),
        sample_value(exposition, "accelmon_collector_hardware_answering", collector=collector),
    )


def test_a_broken_nvidia_driver_is_visible(tmp_path, fake_nvml_dir):
    """The kernel module is loaded (procfs has its version) but NVML does not answer: expected 1, answering 0.
    Before, nothing said so: success stayed 1 and no alert could fire."""
    procfs = tmp_path / "proc"
    (procfs / "driver" / "nvidia").mkdir(parents=True)
    (procfs / "driver" / "nvidia" / "version").write_text("NVRM version: NVIDIA UNIX Kernel Module  580.159.04\n")
    only_nvml = ["--no-collector.infiniband", "--no-collector.neuron"]
    broken = run_once([f"--path.procfs={procfs}", *only_nvml], exporter_env(None, None))  # no libnvidia-ml
    assert hardware(broken.stdout, "nvml") == (1, 0)
    promtool_check(broken.stdout)
    config = tmp_path / "fake.conf"
    config.write_text("gpus 1\n")
    working = run_once([f"--path.procfs={procfs}", *only_nvml], exporter_env(fake_nvml_dir, config))
    assert hardware(working.stdout, "nvml") == (1, 1)
    no_gpu_host = run_once([f"--path.procfs={tmp_path / 'empty'}", *only_nvml], exporter_env(None, None))
    assert hardware(no_gpu_host.stdout, "nvml") == (0, 0)  # no driver, no GPU: nothing wrong


def test_infiniband_enabled_without_devices_is_visible(tmp_path):
    result = run_once(
        ["--collector.infiniband", f"--path.sysfs={tmp_path}", "--no-collector.nvml", "--no-collector.neuron"],
        exporter_env(None, None),
    )
    assert result.returncode == 0, result.stderr
    assert hardware(result.stdout, "infiniband") == (1, 0)


def test_sigterm_during_a_hung_nvml_call_exits_promptly(tmp_path, fake_nvml_dir):
    """It took 38 s, with nvmlShutdown racing the sampler that was inside the hung call."""
    import signal
    import subprocess
    import time

    config = tmp_path / "fake.conf"
    config.write_text("gpus 1\nhang nvmlDeviceGetPowerUsage\n")
    port = free_port()
    process = start_exporter(
        [f"--web.listen-address=127.0.0.1:{port}", "--no-collector.infiniband", "--no-collector.neuron"],
        exporter_env(fake_nvml_dir, config),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until_serving(port)  # its NVML sampler hung in nvmlDeviceGetPowerUsage
        time.sleep(0.5)
        stopped = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
        assert time.monotonic() - stopped < 6
        stderr = process.stderr.read()
        assert "stuck in a hardware call" in stderr and "Traceback" not in stderr, stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
