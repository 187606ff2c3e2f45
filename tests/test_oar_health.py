"""accelmon-oar-health, an OAR node check, as OAR's oarnodecheckrun runs it: a fresh process over the fake NVML and a
fixture kernel log, CHECKLOGFILE naming the check log to create only when the check found a problem. The real OAR
runs it in the Molecule `oar` scenario (a failing GPU makes OAR suspect the node)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.jobs_tree import bus_id, nvidia_procfs
from tests.support.kernel_log_lines import BOOT, record, xid_line
from tests.support.processes import exporter_env

XID_79_ON_GPU_2 = record(1, 5.0, xid_line(bus_id(2).rsplit(".", 1)[0], 79, "GPU has fallen off the bus."))
XID_94_ON_GPU_1 = record(1, 5.0, xid_line(bus_id(1).rsplit(".", 1)[0], 94, "Contained ECC error."))


@pytest.fixture
def node(tmp_path: Path, fake_nvml_dir: Path):
    """Runs the check over 4 fake GPUs with `kmsg` as the kernel log; returns (result, the check log or None)."""
    procfs = nvidia_procfs(tmp_path / "proc", gpus=4)
    (procfs / "stat").write_text(f"btime {BOOT}\n")
    (tmp_path / "nvml.conf").write_text("gpus 4\n")
    config = tmp_path / "exporter.yml"
    config.write_text(yaml.safe_dump({"paths": {"procfs": str(procfs), "kmsg": str(tmp_path / "kmsg")}}))
    checklog = tmp_path / "checklogs" / "accelmon-health.2026-11-25.10:00:00"
    checklog.parent.mkdir()

    def check(kmsg: str, *extra: str, checklog_env: bool = True) -> tuple[subprocess.CompletedProcess[str], str | None]:
        (tmp_path / "kmsg").write_text(kmsg)
        checklog.unlink(missing_ok=True)
        environment = exporter_env(fake_nvml_dir, tmp_path / "nvml.conf")
        if checklog_env:
            environment["CHECKLOGFILE"] = str(checklog)
        command = [sys.executable, "-m", "accelmon.schedulers.oar.health", "--config", str(config), *extra]
        result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60)
        return result, checklog.read_text() if checklog.exists() else None

    return check


def test_a_failing_gpu_leaves_a_check_log_naming_it(node):
    result, log = node(XID_79_ON_GPU_2)
    assert result.returncode == 0, result.stderr
    assert log == "accelmon: GPU 2 xid: reboot_node\n"
    assert "GPU 2     failure  xid" in result.stdout


def test_a_healthy_node_or_a_warning_leaves_no_log(node):
    for kmsg in ("", XID_94_ON_GPU_1):  # the fake's GPU 2 is in thermal slowdown: a warning; XID 94 one too
        result, log = node(kmsg)
        assert result.returncode == 0 and log is None, result.stdout
        assert result.stdout.startswith("node verdict: warning")


def test_run_by_hand_or_with_bad_settings_it_changes_nothing(node, tmp_path):
    result, log = node(XID_79_ON_GPU_2, checklog_env=False)
    assert result.returncode == 0 and log is None
    assert "would leave a check log: accelmon: GPU 2 xid: reboot_node" in result.stderr
    (tmp_path / "bad.yml").write_text("collectors: {nvml: {interval_seconds: -1}}\n")
    result, log = node(XID_79_ON_GPU_2, "--config", str(tmp_path / "bad.yml"))
    assert result.returncode == 0 and log is None and "interval_seconds" in result.stderr
