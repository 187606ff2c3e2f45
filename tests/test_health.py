"""Health verdicts: each check on samples the collectors really made (the fake NVML under pynvml, the kernel-log
collector on fixture logs), one XID counted from one source only, the served metrics, and `--scan`'s table,
JSON and exit statuses."""

from __future__ import annotations

import json
import subprocess

import pytest

from accelmon import health
from accelmon.collectors import collectors, fabric, kernel_log, nvml
from accelmon.collectors.health import served
from accelmon.collectors.kernel_log import KernelLogCollector
from accelmon.collectors.nvml import NvmlCollector
from accelmon.exporter.metrics import Samples
from accelmon.health import gpu_metrics
from tests.support.exposition import promtool_check, sample_value, series, text_of
from tests.support.jobs_tree import nvidia_procfs, uuid
from tests.support.kernel_log_lines import BOOT, HISTORY, record, xid_line
from tests.support.paths import ROOT
from tests.support.processes import exporter_command, exporter_env, on_fixtures, run_once
from tests.support.waiting import wait_until

# The collectors whose checks these tests judge (a check runs only where its collector does).
CHECKED = [fabric.REGISTRATION, kernel_log.REGISTRATION, nvml.REGISTRATION]

HOUR = 3600.0


@pytest.fixture
def procfs(tmp_path):
    root = nvidia_procfs(tmp_path / "proc", gpus=4)
    (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BOOT}\n")
    return root


@pytest.fixture
def nvml_samples(fake_nvml):
    """One NVML sample of 4 fake GPUs: GPU 1 lost, GPU 2 in hardware thermal slowdown, an XID 79 on GPU 2
    delivered as an NVML event."""
    fake_nvml.configure("gpus 4\nlost 1\n")
    collector = NvmlCollector()
    collector.start()
    fake_nvml.queue_xid(2, 79)

    def counted() -> Samples | None:  # the event thread counts it within a few waits
        sample = collector.sample()
        return sample if any(spec.name == "accelmon_gpu_xid_errors_total" for spec in sample.rows) else None

    yield wait_until(counted, what="the XID event counted")
    fake_nvml.release()
    collector.stop()


def kernel_log_sample(tmp_path, procfs, text: str) -> Samples:
    log = tmp_path / "kmsg"
    log.write_text(text)
    collector = KernelLogCollector(kmsg=str(log), procfs=str(procfs))
    collector.start()
    return collector.sample()


def gpu(node: health.NodeHealth, index: str) -> health.GpuHealth:
    return next(g for g in node.gpus if g.index == index)


def check(node: health.NodeHealth, index: str, name: str) -> health.Check:
    return next(c for c in gpu(node, index).checks if c.name == name)


def test_kernel_log_and_nvml_give_one_verdict_per_gpu(tmp_path, procfs, nvml_samples):
    node = health.evaluate(
        [nvml_samples, kernel_log_sample(tmp_path, procfs, HISTORY)], now=BOOT + 60, registrations=CHECKED
    )
    assert [g.index for g in node.gpus] == ["0", "1", "2", "3"]
    # GPU 1: NVML lost it (no UUID from NVML); the driver's procfs files still name it.
    assert gpu(node, "1").uuid == uuid(1)
    assert check(node, "1", "gpu_lost") == health.Check(
        "gpu_lost", "failure", "the GPU stopped answering its driver library (NVML, amdsmi)", "reboot_node"
    )
    # GPU 2: XID 79, seen both as an NVML event and in the kernel log, is judged once, from the kernel log.
    xid = check(node, "2", "xid")
    assert (xid.verdict, xid.action) == ("failure", "reboot_node")
    assert xid.detail == "XID 79 fallen_off_the_bus at 2025-11-24 16:00:07 UTC"
    assert check(node, "2", "slowdown").verdict == "warning"
    assert gpu(node, "2").action == "reboot_node"  # the most disruptive action of its failing checks
    # GPU 3: the driver asked for a node reboot (XID 154).
    assert check(node, "3", "xid").action == "reboot_node"
    # GPU 0: an application's XID 13, 52 s ago: a warning, for an hour.
    assert (check(node, "0", "xid").verdict, check(node, "0", "xid").action) == ("warning", "restart_app")
    later = health.evaluate(
        [nvml_samples, kernel_log_sample(tmp_path, procfs, HISTORY)], now=BOOT + 8 + HOUR + 1, registrations=CHECKED
    )
    assert check(later, "0", "xid").verdict == "ok"
    assert check(later, "2", "xid").verdict == "failure"  # critical XIDs stay until the node reboots
    assert node.verdict == "failure" and node.exit_status() == 2


def test_without_the_kernel_log_nvml_events_are_judged(tmp_path, procfs, nvml_samples):
    unreadable = KernelLogCollector(kmsg=str(tmp_path), procfs=str(procfs))  # a directory: unreadable
    unreadable.start()
    node = health.evaluate([nvml_samples, unreadable.sample()], now=BOOT, registrations=CHECKED)
    xid = check(node, "2", "xid")
    assert (xid.verdict, xid.action) == ("failure", "reboot_node")
    assert xid.detail == "XID 79 fallen_off_the_bus x1 (NVML events)"
    assert node.checks == [
        health.Check("kernel_log", "warning", "the kernel log is unreadable: XIDs only from NVML's events")
    ]


def test_lost_gpu_and_served_states(tmp_path, procfs):
    samples = Samples()
    samples.add(nvml.UP, ["0", uuid(0)], 1)
    samples.add(nvml.UP, ["1", ""], 0)
    node = health.evaluate([samples, kernel_log_sample(tmp_path, procfs, "")], now=BOOT, registrations=CHECKED)
    # GPUs 2 and 3 are in the driver's files but NVML does not list them at all.
    assert [(g.index, check(node, g.index, "gpu_lost").verdict) for g in node.gpus] == [
        ("0", "ok"),
        ("1", "failure"),
        ("2", "failure"),
        ("3", "failure"),
    ]

    text = text_of(served(node))
    promtool_check(text)
    assert sample_value(text, "accelmon_gpu_health_verdict", gpu="1", uuid=uuid(1)) == 2
    assert sample_value(text, "accelmon_gpu_health_check_state", gpu="0", check="gpu_lost", action="none") == 0
    assert sample_value(text, "accelmon_node_health_verdict") == 2
    assert node.drain_reason().startswith("accelmon: GPU 1 gpu_lost: reboot_node; GPU 2 gpu_lost")
    assert len(node.drain_reason()) <= len("accelmon: ") + 200


def documented_checks() -> tuple[list[str], list[str]]:
    """docs/health.md's table of checks: (GPU checks, node checks), in the table's order."""
    text = (ROOT / "docs" / "health.md").read_text()
    table = [
        row
        for row in text[text.index("| check | collector |") :].split("\n\n")[0].splitlines()[2:]
        if row.startswith("|")
    ]
    names = [row.split("|")[1].strip() for row in table]
    gpu = [name.strip("`") for name in names if not name.endswith("(node)")]
    node = [name.split()[0].strip("`") for name in names if name.endswith("(node)")]
    return gpu, node


def documented_json() -> dict:
    text = (ROOT / "docs" / "health.md").read_text()
    return json.loads(text[text.index("```json\n", text.index("## `accelmon-exporter --scan`")) + 8 :].split("```")[0])


def test_the_json_is_what_docs_promise(tmp_path, procfs, nvml_samples):
    """The keys and the check order of the scan's JSON are what docs/health.md shows and tabulates."""
    promised = documented_json()
    document = json.loads(
        health.dumps(
            health.evaluate([nvml_samples, kernel_log_sample(tmp_path, procfs, "")], now=0, registrations=CHECKED)
        )
    )
    assert set(document) == set(promised)
    assert set(document["gpus"][0]) == set(promised["gpus"][0])
    assert set(document["gpus"][0]["checks"][0]) == set(promised["gpus"][0]["checks"][0])
    assert set(document["checks"][0]) == set(promised["checks"][0])
    gpu_checks, node_checks = documented_checks()
    assert [c["name"] for c in document["gpus"][0]["checks"]] == health.check_names(CHECKED)[0]
    assert health.check_names(collectors().values()) == (gpu_checks, node_checks)


def test_a_check_is_declared_where_its_series_are_served():
    """A check is declared by the collector whose series it reads, so it runs only where that collector runs. The
    GPU device checks (accelmon.health.gpu_metrics) judge series that nvml and amd both serve: both declare the same
    check objects, and each runs once. No two checks share a name."""
    by_name: dict[str, object] = {}
    for registration in collectors().values():
        for declared in (*registration.gpu_checks, *registration.node_checks):
            assert by_name.setdefault(declared.name, declared) is declared, f"two checks named {declared.name}"
    serving_devices = [r for r in collectors().values() if gpu_metrics.UP in r.lists_gpus]
    assert sorted(r.name for r in serving_devices) == ["amd", "nvml"]
    for registration in serving_devices:
        assert set(gpu_metrics.DEVICE_CHECKS) <= set(registration.gpu_checks)
        assert set(gpu_metrics.DEVICE_DRILLS) <= set(registration.drills)
    both = health.check_names([r for r in collectors().values() if r.name in ("amd", "nvml")])[0]
    assert len(both) == len(set(both)) == len(gpu_metrics.DEVICE_CHECKS) + 1  # and AMD's xgmi
    assert [name for name, r in collectors().items() if r.scan] == ["amd", "fabric", "kernel_log", "nvml"]


def scan(
    tmp_path, fake_nvml_dir, gpus: int, log: str, *extra: str, nvml_extra: str = ""
) -> subprocess.CompletedProcess[str]:
    """`--scan` over `gpus` fake GPUs that the driver's procfs files list too, and the kernel log `log`."""
    procfs = nvidia_procfs(tmp_path / f"proc{gpus}", gpus=gpus)
    (procfs / "stat").write_text(f"btime {BOOT}\n")
    (tmp_path / "nvml.conf").write_text(f"gpus {gpus}\n{nvml_extra}")
    (tmp_path / "kmsg").write_text(log)
    args = ["--scan", "--path.procfs", str(procfs), "--path.kmsg", str(tmp_path / "kmsg"), *extra]
    return subprocess.run(
        exporter_command(*args),
        env=exporter_env(fake_nvml_dir, tmp_path / "nvml.conf"),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_scan_exit_status_table_and_json(tmp_path, fake_nvml_dir):
    healthy = scan(tmp_path, fake_nvml_dir, 2, "")  # GPU 1 is at its software power cap: fine
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert healthy.stdout.startswith("node verdict: ok\n")
    warned = scan(tmp_path, fake_nvml_dir, 3, "")  # GPU 2 in hardware thermal slowdown
    assert warned.returncode == 1, warned.stdout
    assert "GPU 2     warning  slowdown" in warned.stdout
    # A GPU whose link trained at x8 Gen4 (the fake driver's real-format answer); GPU 0, idle at Gen5 x16 as the
    # H100 was: fine.
    narrow = scan(tmp_path, fake_nvml_dir, 2, "", nvml_extra="pcie 1 4 8\n")
    assert narrow.returncode == 1, narrow.stdout
    assert "GPU 1     warning  pcie             PCIe link degraded: x8 of x16, Gen4 of Gen5 while busy" in narrow.stdout
    assert "GPU 0     ok" in narrow.stdout
    failed = scan(tmp_path, fake_nvml_dir, 4, HISTORY, "--json")
    assert failed.returncode == 2
    document = json.loads(failed.stdout)
    assert document["verdict"] == "failure"
    assert [g["verdict"] for g in document["gpus"]] == ["ok", "ok", "failure", "failure"]
    # A scan has no "since the start": what the log holds is judged as history is.
    again = scan(tmp_path, fake_nvml_dir, 4, record(1, 1.0, xid_line("0000:18:00", 48)))
    assert again.returncode == 2 and "XID 48 double_bit_ecc_error" in again.stdout


def test_scan_that_cannot_run_says_why_with_its_own_status(tmp_path, fake_nvml_dir):
    (tmp_path / "bad.yml").write_text("collectors: {nvml: {interval_seconds: -1}}\n")
    result = scan(tmp_path, fake_nvml_dir, 1, "", "--config", str(tmp_path / "bad.yml"))
    assert result.returncode == 3
    assert "interval_seconds" in result.stderr


def test_a_check_whose_collector_does_not_run_is_absent_not_ok(tmp_path, fake_nvml_dir):
    """A node with NVIDIA GPUs and only the nvml collector: the served verdicts and the scan judge nvml's checks and
    nothing else. AMD's xgmi, DCGM's dcgm, the fabric's and the kernel log's checks give no series and no line: a
    check that did not run would be false assurance as "ok"."""
    (tmp_path / "nvml.conf").write_text("gpus 2\n")
    env = exporter_env(fake_nvml_dir, tmp_path / "nvml.conf")
    served_text = run_once(on_fixtures(tmp_path / "host", "nvml", "health"), env).stdout
    judged = {
        labels["check"] for labels, _ in series(served_text, "accelmon_gpu_health_check_state") if labels["gpu"] == "0"
    }
    assert judged == set(health.check_names([nvml.REGISTRATION])[0]) == {c.name for c in gpu_metrics.DEVICE_CHECKS}
    assert not series(served_text, "accelmon_node_health_check_state")  # fabric_manager, kernel_log: not running
    scanned = subprocess.run(
        exporter_command("--scan", "--json", *on_fixtures(tmp_path / "host", "nvml")),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    document = json.loads(scanned.stdout)
    assert [c["name"] for c in document["gpus"][0]["checks"]] == health.check_names([nvml.REGISTRATION])[0]
    assert document["checks"] == []
