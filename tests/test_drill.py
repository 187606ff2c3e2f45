"""accelmon-drill: a rehearsed fault is judged by the real check and catalogue in `--scan`, in the served verdicts
and in the Slurm hook's drain reason, says DRILL wherever a person reads it, survives an exporter restart, ends by
itself or at `stop`, and bad arguments change nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from accelmon import health
from accelmon.exporter.checks import ActiveDrill
from accelmon.health import drill_store
from tests.support.jobs_tree import nvidia_procfs
from tests.support.kernel_log_lines import BOOT
from tests.support.processes import (
    exporter_command,
    exporter_env,
    free_port,
    start_exporter,
    stop,
    wait_until_serving,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="accelmon-drill start and stop need root")


@pytest.fixture
def node(tmp_path, fake_nvml_dir):
    """A node of 2 healthy fake GPUs (the driver's procfs lists them; an empty kernel log), an exporter config that
    puts drill_dir in tmp_path, and the environment every command of the node runs with."""
    procfs = nvidia_procfs(tmp_path / "proc", gpus=2)
    (procfs / "stat").write_text(f"btime {BOOT}\n")
    (tmp_path / "kmsg").write_text("")
    (tmp_path / "nvml.conf").write_text("gpus 2\nnvlink 0 4\nnvlink 1 4\n")
    config = tmp_path / "exporter.yml"
    config.write_text(
        f"paths: {{procfs: {procfs}, kmsg: {tmp_path / 'kmsg'}}}\n"
        f"collectors: {{health: {{drill_dir: {tmp_path / 'drills'}, interval_seconds: 0.2,"
        f" remediation_journal: {tmp_path / 'remediation.jsonl'}}}}}\n"
    )
    return config, exporter_env(fake_nvml_dir, tmp_path / "nvml.conf")


def run_drill(node, *args: str) -> subprocess.CompletedProcess[str]:
    config, env = node
    command = [sys.executable, "-m", "accelmon.drills.drill", "--config", str(config), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def scan(node) -> tuple[int, dict]:
    config, env = node
    result = subprocess.run(
        exporter_command("--scan", "--json", "--config", str(config)),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, json.loads(result.stdout)


def checks_of(document: dict, gpu: str) -> dict[str, dict]:
    (entry,) = [g for g in document["gpus"] if g["index"] == gpu]
    return {c["name"]: c for c in entry["checks"]}


def test_an_xid_drill_fails_the_gpu_as_the_catalogue_says_then_stops(node, tmp_path):
    assert scan(node)[0] == 0
    started = run_drill(node, "start", "--gpu", "1", "--xid", "79")
    assert started.returncode == 0, started.stderr
    assert "GPU 1, XID 79" in started.stdout
    status, document = scan(node)
    assert status == 2  # failure
    xid = checks_of(document, "1")["xid"]
    assert (xid["verdict"], xid["action"], xid["drill"]) == ("failure", "reboot_node", True)  # the catalogue's
    assert xid["detail"].startswith("DRILL (accelmon-drill until ") and "XID 79 fallen_off_the_bus at " in xid["detail"]
    assert checks_of(document, "0")["xid"]["verdict"] == "ok"  # only the drilled GPU
    assert "drill=" not in json.dumps(document["gpus"][0])
    listed = run_drill(node, "status", "--json")
    (entry,) = json.loads(listed.stdout)
    assert (entry["gpu"], entry["check"], entry["xid"], entry["in_force"]) == ("1", "xid", 79, True)
    assert entry["expires"] - entry["started"] == 30 * 60  # the default: a forgotten drill ends by itself
    stopped = run_drill(node, "stop")
    assert stopped.returncode == 0 and "1 drill(s) ended" in stopped.stdout and "RESUME" in stopped.stdout
    assert scan(node)[0] == 0
    assert run_drill(node, "status").stdout.startswith("no drill")


@pytest.mark.parametrize(
    ("check", "verdict", "action", "detail"),
    [
        ("gpu_lost", "failure", "reboot_node", "stopped answering"),
        ("ecc", "failure", "reset_gpu", "1 uncorrectable ECC errors"),
        ("nvlink", "failure", "check_fabric", "NVLink down: link 0 (3 of 4 up)"),
        ("pcie", "warning", "hardware_service", "PCIe link degraded: x8 of x16"),
        ("slowdown", "warning", "hardware_service", "clocks held down: hw_slowdown"),
    ],
)
def test_each_drillable_check_judges_its_fault(node, check, verdict, action, detail):
    assert run_drill(node, "start", "--gpu", "0", "--check", check, "--minutes", "5").returncode == 0
    status, document = scan(node)
    judged = checks_of(document, "0")[check]
    assert (judged["verdict"], judged["action"], judged["drill"]) == (verdict, action, True)
    assert detail in judged["detail"] and judged["detail"].startswith("DRILL")
    assert status == health.VERDICTS.index(verdict)


def test_two_drills_on_two_gpus_and_stop_of_one(node):
    assert run_drill(node, "start", "--gpu", "0", "--check", "ecc").returncode == 0
    assert run_drill(node, "start", "--gpu", "1", "--xid", "48").returncode == 0
    _, document = scan(node)
    assert checks_of(document, "0")["ecc"]["verdict"] == "failure"
    assert checks_of(document, "1")["xid"]["verdict"] == "failure"  # 48: double-bit ECC, critical
    assert "1 drill(s) ended" in run_drill(node, "stop", "--gpu", "0").stdout
    _, document = scan(node)
    assert checks_of(document, "0")["ecc"]["verdict"] == "ok"
    assert checks_of(document, "1")["xid"]["drill"] is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("start", "--gpu", "7", "--xid", "79"), "--gpu 7: this node's GPUs are 0, 1"),
        (("start", "--gpu", "0", "--check", "fan"), "no check 'fan' can be drilled; these can: ecc, gpu_lost"),
        (("start", "--gpu", "0", "--xid", "0"), "--xid 0: an XID is a number from 1 to 65535"),
        (("start", "--gpu", "0", "--check", "ecc", "--minutes", "0"), "--minutes 0: from more than 0 to 1440"),
    ],
)
def test_bad_arguments_are_refused_and_change_nothing(node, tmp_path, args, message):
    result = run_drill(node, *args)
    assert result.returncode == 2
    assert message in result.stderr and "nothing changed" in result.stderr
    assert not (tmp_path / "drills").exists() or not list((tmp_path / "drills").iterdir())


def test_missing_arguments_are_refused_by_the_parser(node, tmp_path):
    for args in (
        ("start", "--gpu", "0"),
        ("start", "--xid", "79"),
        ("start", "--gpu", "0", "--xid", "79", "--check", "ecc"),
    ):
        result = run_drill(node, *args)
        assert result.returncode == 2 and "usage: accelmon-drill" in result.stderr
    assert not (tmp_path / "drills").exists()


def test_a_drill_ends_by_itself(node, tmp_path):
    """An expired drill is not judged (a forgotten one cannot keep a node drained); status says it ended."""
    drill_store.write(str(tmp_path / "drills"), ActiveDrill("0", "ecc", time.time() - 120, time.time() - 60))
    assert scan(node)[0] == 0
    assert "ended by itself at" in run_drill(node, "status").stdout
    (tmp_path / "drills" / "stray.json").write_text("not json")  # skipped and logged, never fatal
    assert scan(node)[0] == 0


def health_series(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def wait_for_line(port: int, line: str, present: bool = True, timeout: float = 20.0) -> str:
    """The exposition once `line` is in it (or, `present` False, once it is not)."""

    def served() -> str | None:
        text = health_series(port)
        return text if (line in text) == present else None

    return wait_until(served, timeout, f"{line!r} {'served' if present else 'gone'}", every=0.2)


def test_the_served_verdict_follows_a_drill_across_an_exporter_restart(node):
    """Served: the drilled check's state and accelmon_gpu_health_drill_active (the alerts mark a drill by it); the
    device series stay the real ones. The drill is a file: a restarted exporter judges it again."""
    config, env = node
    port = free_port()
    args = ["--config", str(config), "--web.listen-address", f"127.0.0.1:{port}"]
    assert run_drill(node, "start", "--gpu", "1", "--check", "gpu_lost").returncode == 0
    drilled = (
        'accelmon_gpu_health_drill_active{check="gpu_lost",gpu="1",uuid="GPU-00000001-0000-4000-8000-000000000000"} 1.0'
    )
    for _ in range(2):  # the exporter, then the exporter restarted
        process = start_exporter(args, env)
        try:
            wait_until_serving(port)
            real = 'accelmon_gpu_up{gpu="1",uuid="GPU-00000001-0000-4000-8000-000000000000"} 1.0'
            wait_for_line(port, real)  # the nvml collector's first sample (slower than the health one under load)
            text = wait_for_line(port, drilled)
            assert drilled in text
            state = [
                line
                for line in text.splitlines()
                if line.startswith("accelmon_gpu_health_check_state") and 'check="gpu_lost",gpu="1"' in line
            ]
            assert state == [
                'accelmon_gpu_health_check_state{action="reboot_node",check="gpu_lost",gpu="1",'
                'uuid="GPU-00000001-0000-4000-8000-000000000000"} 2.0'
            ]
            assert real in text  # the device series stay the real ones
        finally:
            stop(process)
    process = start_exporter(args, env)
    try:
        wait_until_serving(port)
        assert run_drill(node, "stop").returncode == 0
        assert "accelmon_gpu_health_drill_active{" not in wait_for_line(
            port, "accelmon_gpu_health_drill_active{", False
        )
    finally:
        stop(process)


def test_the_slurm_hook_drains_with_a_reason_that_says_drill(node, tmp_path):
    """accelmon-slurm-health over a drilled GPU: the node is drained (a fake scontrol records the call) and the
    reason says DRILL first, where `sinfo -R` shows it."""
    config, env = node
    calls = tmp_path / "scontrol.calls"
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncase "$1" in show) echo "NodeName=n1 State=IDLE" ;; esac\n')
    scontrol.chmod(0o755)
    assert run_drill(node, "start", "--gpu", "0", "--xid", "79").returncode == 0
    env = {**env, "PATH": f"{scontrol.parent}:{env['PATH']}", "SLURMD_NODENAME": "n1"}
    result = subprocess.run(
        [sys.executable, "-m", "accelmon.schedulers.slurm.health", "--config", str(config)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    drained = [line for line in calls.read_text().splitlines() if line.startswith("update")]
    assert drained == ["update NodeName=n1 State=DRAIN Reason=accelmon DRILL, no fault: GPU 0 xid: reboot_node"]


def test_the_json_of_a_check_has_its_drill_flag():
    """docs/health.md's JSON names the field; a check of the hardware says false."""
    node = health.NodeHealth([health.GpuHealth("0", "GPU-0", [health.Check("xid", "ok", "fine")])], [])
    assert node.as_json()["gpus"][0]["checks"][0]["drill"] is False  # type: ignore[index]
