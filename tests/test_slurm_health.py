"""accelmon-slurm-health, Slurm's HealthCheckProgram, as slurmd runs it: a fresh process over the fake NVML and a
fixture kernel log, with a stand-in `scontrol` that records what it was asked and answers a node state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.jobs_tree import bus_id, nvidia_procfs
from tests.support.kernel_log_lines import BOOT, record, xid_line
from tests.support.processes import exporter_env

SCONTROL = """#!/bin/sh
# Stand-in for Slurm 22.05's scontrol: records its arguments, refuses --json as 22.05 does, answers `show node`
# with $NODE_STATE.
echo "$@" >> "{calls}"
case "$*" in
  *--json*) echo "scontrol: unrecognized option '--json'" >&2; exit 1 ;;
esac
case "$1" in
  show) echo "NodeName=gpu-7 Arch=x86_64 CoresPerSocket=1 State=$NODE_STATE ThreadsPerCore=1" ;;
  update) exit "${{UPDATE_STATUS:-0}}" ;;
esac
"""


@pytest.fixture
def node(tmp_path: Path, fake_nvml_dir: Path):
    """Runs the health check over 4 fake GPUs; `kmsg` is the kernel log; returns (result, scontrol calls)."""
    procfs = nvidia_procfs(tmp_path / "proc", gpus=4)
    (procfs / "stat").write_text(f"btime {BOOT}\n")
    calls = tmp_path / "calls"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(SCONTROL.format(calls=calls))
    scontrol.chmod(0o755)
    (tmp_path / "nvml.conf").write_text("gpus 4\n")
    config = tmp_path / "exporter.yml"
    paths = {"procfs": str(procfs), "kmsg": str(tmp_path / "kmsg")}
    journal = str(tmp_path / "remediation.jsonl")
    config.write_text(yaml.safe_dump({"paths": paths, "collectors": {"health": {"remediation_journal": journal}}}))

    def check(
        kmsg: str, state: str = "IDLE", *extra: str, **env: str
    ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
        (tmp_path / "kmsg").write_text(kmsg)
        calls.write_text("")
        environment = exporter_env(fake_nvml_dir, tmp_path / "nvml.conf")
        environment.update(NODE_STATE=state, SLURMD_NODENAME="gpu-7", **env)
        command = [
            sys.executable,
            "-m",
            "accelmon.schedulers.slurm.health",
            "--config",
            str(config),
            "--scontrol",
            str(scontrol),
        ]
        result = subprocess.run([*command, *extra], env=environment, capture_output=True, text=True, timeout=60)
        return result, calls.read_text().splitlines()

    return check


XID_79_ON_GPU_2 = record(1, 5.0, xid_line(bus_id(2).rsplit(".", 1)[0], 79, "GPU has fallen off the bus."))


def test_a_failing_gpu_drains_the_node_with_a_reason_naming_it(node):
    result, calls = node(XID_79_ON_GPU_2)
    assert result.returncode == 0, result.stderr
    assert calls == [
        "show node gpu-7 --json",  # Slurm's JSON where scontrol has it (23.02+); 22.05 refuses: the text form
        "show node gpu-7 --oneliner",
        "show nodes --oneliner",  # the circuit breaker's count: this one node, none out
        "update NodeName=gpu-7 State=DRAIN Reason=accelmon: GPU 2 xid: reboot_node",
        "show nodes --oneliner",  # the drain verified by Slurm's order of the claims
    ]
    assert "drained node gpu-7: accelmon: GPU 2 xid: reboot_node" in result.stderr
    assert "GPU 2     failure  xid" in result.stdout


def test_a_node_without_failure_is_never_touched_and_never_resumed(node):
    result, calls = node("")
    # Its own node read (the pause switch its Comment carries), nothing changed: it never resumes a drained node.
    assert result.returncode == 0 and calls == ["show node gpu-7 --json", "show node gpu-7 --oneliner"]
    # The fake's GPU 2 is in hardware thermal slowdown: a warning, for the alert and the dashboard, not a drain.
    assert result.stdout.startswith("node verdict: warning")


@pytest.mark.parametrize("state", ["IDLE+DRAIN", "DOWN*", "MIXED+DRAIN"])
def test_a_node_already_out_keeps_its_state_and_reason(node, state):
    result, calls = node(XID_79_ON_GPU_2, state)
    assert calls == ["show node gpu-7 --json", "show node gpu-7 --oneliner"]
    assert f"node gpu-7 is already {state}: left as it is" in result.stderr


def test_a_warning_does_not_drain(node):
    xid_94 = record(1, 5.0, xid_line(bus_id(1).rsplit(".", 1)[0], 94, "Contained ECC error."))
    result, calls = node(xid_94)
    assert (
        not [call for call in calls if not call.startswith("show node gpu-7")] and "verdict: warning" in result.stdout
    )


def test_faults_of_slurm_or_settings_never_fail_the_health_check(node, tmp_path):
    result, calls = node(XID_79_ON_GPU_2, "IDLE", UPDATE_STATUS="1")
    assert result.returncode == 0 and "scontrol could not drain gpu-7" in result.stderr
    result, calls = node(XID_79_ON_GPU_2, "IDLE", "--scontrol", str(tmp_path / "missing"))
    assert result.returncode == 0 and "scontrol failed" in result.stderr  # no scontrol at all
    (tmp_path / "bad.yml").write_text("collectors: {nvml: {interval_seconds: -1}}\n")
    result, calls = node(XID_79_ON_GPU_2, "IDLE", "--config", str(tmp_path / "bad.yml"))
    assert result.returncode == 0 and calls == []
    assert "interval_seconds" in result.stderr and "nothing drained" in result.stderr


def test_dry_run_changes_nothing(node):
    result, calls = node(XID_79_ON_GPU_2, "IDLE", "--dry-run")
    # It reads Slurm (the node, the breaker's count) and changes nothing.
    assert calls == ["show node gpu-7 --json", "show node gpu-7 --oneliner", "show nodes --oneliner"]
    assert "would drain gpu-7 within the circuit breaker (1 node(s) listed): accelmon: GPU 2 xid: reboot_node" in (
        result.stderr
    )


DCGMI = """#!/bin/sh
# Stand-in for DCGM's dcgmi: `diag -r 1 -j` prints $DIAG_REPORT and exits $DIAG_STATUS.
echo "dcgmi $@" >> "{calls}"
cat "$DIAG_REPORT"
exit "${{DIAG_STATUS:-0}}"
"""


def diag_report(*failing: str) -> str:
    """A report shaped as `dcgmi diag -r 1 -j` prints it (DCGM 3): categories of tests, each with its results."""
    tests = [
        {"name": name, "results": [{"gpu_id": "0", "status": "Fail" if name in failing else "Pass"}]}
        for name in ("Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks", "GPU Memory")
    ]
    return json.dumps({"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": tests}]}})


def journal_config(tmp_path: Path) -> Path:
    """A config whose journal is the test's own (the default, /var/lib/accelmon, is the machine's)."""
    config = tmp_path / "prolog.yml"
    config.write_text(yaml.safe_dump({"collectors": {"health": {"remediation_journal": str(tmp_path / "j.jsonl")}}}))
    return config


@pytest.fixture
def prolog(tmp_path: Path):
    calls = tmp_path / "calls"
    scontrol, dcgmi = tmp_path / "scontrol", tmp_path / "dcgmi"
    scontrol.write_text(SCONTROL.format(calls=calls))
    dcgmi.write_text(DCGMI.format(calls=calls))
    for program in (scontrol, dcgmi):
        program.chmod(0o755)

    def run(report: str, status: int = 0, *extra: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
        (tmp_path / "report.json").write_text(report)
        calls.write_text("")
        env = exporter_env(None, None)
        env.update(NODE_STATE="MIXED", SLURMD_NODENAME="gpu-7", DIAG_REPORT=str(tmp_path / "report.json"))
        env["DIAG_STATUS"] = str(status)
        command = [sys.executable, "-m", "accelmon.schedulers.slurm.health", "--diag", "--scontrol", str(scontrol),
                   "--config", str(journal_config(tmp_path))]  # fmt: skip
        result = subprocess.run(
            [*command, "--dcgmi", str(dcgmi), *extra], env=env, capture_output=True, text=True, timeout=60
        )
        return result, calls.read_text().splitlines()

    return run


def test_prolog_diag_that_fails_drains_and_fails_the_prolog(prolog):
    result, calls = prolog(diag_report("GPU Memory", "Denylist"), 226)
    assert result.returncode == 1, result.stderr  # Slurm requeues the job and keeps the node drained
    assert calls[0] == "dcgmi diag -r 1 -j"
    # Through the circuit breaker, as the health check's drains (count, drain, verify).
    assert calls[-3:] == [
        "show nodes --oneliner",
        "update NodeName=gpu-7 State=DRAIN Reason=accelmon: dcgmi diag -r 1 failed: Denylist, GPU Memory",
        "show nodes --oneliner",
    ]


def test_prolog_diag_that_passes_or_cannot_run_never_blocks_a_job(prolog, tmp_path):
    passed, calls = prolog(diag_report(), 0)
    assert passed.returncode == 0 and calls == ["dcgmi diag -r 1 -j"]
    assert "dcgmi diag -r 1 passed" in passed.stderr
    # The host engine is down: dcgmi prints an error, not a report.
    down, calls = prolog("Error: unable to establish a connection to the specified host: localhost", 255)
    assert down.returncode == 0 and calls == ["dcgmi diag -r 1 -j"]
    assert "dcgmi diag gave no report (status 255)" in down.stderr
    missing, calls = prolog(diag_report(), 0, "--dcgmi", str(tmp_path / "no-dcgmi"))
    assert missing.returncode == 0 and calls == [] and "dcgmi diag could not run" in missing.stderr


def test_prolog_diag_drains_through_the_breaker(tmp_path):
    """A diagnostic failing everywhere (a bad driver roll-out) is the mass event the breaker exists for: with as many
    nodes out by accelmon as it allows, the prolog drains nothing and lets the job run."""
    from tests.support.fake_scontrol import Cluster

    out = {f"gpu-{n}": "IDLE+DRAIN|accelmon: GPU 0 xid: reboot_node" for n in range(3)}
    cluster = Cluster(tmp_path, {"gpu-7": "MIXED", **out, **{f"gpu-{n}": "IDLE" for n in range(10, 20)}})
    result = failing_prolog(tmp_path, cluster.command)
    assert result.returncode == 0, result.stderr  # the job runs
    assert cluster.node("gpu-7") == {"state": "MIXED", "reason": ""}
    assert "circuit breaker: 3 node(s) out by accelmon in 24 h of 14 checked, limit 3: no drain" in result.stderr


def failing_prolog(tmp_path: Path, scontrol: Path) -> subprocess.CompletedProcess[str]:
    """The prolog on gpu-7 as slurmd runs it, its diagnostic failing GPU Memory, Slurm reached through `scontrol`."""
    dcgmi = tmp_path / "dcgmi"
    dcgmi.write_text(DCGMI.format(calls=tmp_path / "dcgmi-calls"))
    dcgmi.chmod(0o755)
    (tmp_path / "report.json").write_text(diag_report("GPU Memory"))
    env = exporter_env(None, None)
    env.update(SLURMD_NODENAME="gpu-7", DIAG_REPORT=str(tmp_path / "report.json"), DIAG_STATUS="226")
    command = [sys.executable, "-m", "accelmon.schedulers.slurm.health", "--diag", "--scontrol", str(scontrol),
               "--config", str(journal_config(tmp_path))]  # fmt: skip
    return subprocess.run([*command, "--dcgmi", str(dcgmi)], env=env, capture_output=True, text=True, timeout=60)
