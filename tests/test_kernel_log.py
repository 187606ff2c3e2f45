"""The kernel-log collector on fixture logs in /dev/kmsg's format, on this machine's real /dev/kmsg, and on the
faults a kernel log has: overwritten records (EPIPE), records too long, bytes of any kind, an unreadable log, and
XID text that is not the driver's (quoted by another kernel message, written from userspace)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from accelmon import health
from accelmon.collectors import kernel_log
from accelmon.collectors.kernel_log import KernelLogCollector, bus_id
from accelmon.exporter.metrics import Samples, render
from accelmon.health import xid
from accelmon.host.kmsg import KernelLog, Record, parse_record
from tests.support.exposition import check_golden, promtool_check, sample_value
from tests.support.jobs_tree import nvidia_procfs, uuid
from tests.support.kernel_log_lines import BOOT, HISTORY, USER_INFO, USER_WARNING, record, xid_line
from tests.support.processes import exporter_command, exporter_env


@pytest.fixture
def procfs(tmp_path):
    root = nvidia_procfs(tmp_path / "proc", gpus=4)
    (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BOOT}\n")
    return root


def value(samples: Samples, metric: str, **labels: str) -> float | None:
    for spec, rows in samples.rows.items():
        if spec.name == metric:
            for values, number in rows:
                if all(dict(zip(spec.labels, values)).get(k) == v for k, v in labels.items()):
                    return number
    return None


def collector(tmp_path, procfs, text: str) -> tuple[KernelLogCollector, os.PathLike]:
    log = tmp_path / "kmsg"
    log.write_text(text)
    made = KernelLogCollector(kmsg=str(log), procfs=str(procfs))
    made.start()
    return made, log


def test_history_names_gpus_through_procfs_and_the_catalogue(tmp_path, procfs):
    made, _ = collector(tmp_path, procfs, HISTORY)
    out = made.sample()
    gpu2 = {"gpu": "2", "uuid": uuid(2), "pci_bus_id": "0000:38:00.0"}
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", **gpu2, xid="79") == 1
    assert value(out, "accelmon_gpu_kernel_xid_last_timestamp_seconds", **gpu2, xid="79") == BOOT + 7
    # The older format (no `PCI:`) names GPU 0 as well.
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="0", xid="13") == 1
    # History is not news: every known GPU's events counter is present, at 0.
    for index in range(4):
        assert value(out, "accelmon_gpu_kernel_xid_events_total", gpu=str(index)) == 0
    # A bus id the driver does not list is still counted, named by its bus only; its code is "unknown".
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", pci_bus_id="0000:99:00.0", gpu="", xid="999") == 1
    assert value(out, "accelmon_xid_catalogue_info", xid="999", name="unknown", severity="warning") == 1
    assert value(out, "accelmon_xid_catalogue_info", xid="79", name="fallen_off_the_bus", action="reboot_node") == 1
    # XID 154's message says which recovery the driver wants.
    assert value(out, "accelmon_gpu_recovery_action_state", gpu="3", action="reboot_node") == 1
    assert value(out, "accelmon_nvswitch_sxid_errors_total", nvswitch="0", sxid="20034", fatal="true") == 1
    assert value(out, "accelmon_nvswitch_sxid_errors_total", nvswitch="2", sxid="12028", fatal="false") == 1
    assert value(out, "accelmon_kernel_log_records_total") == 7  # continuation lines are not records
    for reason in kernel_log.SKIP_REASONS:  # every line naming an XID was the driver's
        assert value(out, "accelmon_kernel_log_skipped_xid_records_total", reason=reason) == 0
    assert value(out, "accelmon_kernel_log_readable") == 1
    assert made.hardware_answering() is True


def test_following_the_log_counts_new_xids_as_events(tmp_path, procfs):
    made, log = collector(tmp_path, procfs, HISTORY)
    made.sample()
    with open(log, "a") as stream:
        stream.write(record(107, 60.0, xid_line("0000:38:00", 79)))
        stream.write(record(108, 61.0, xid_line("0000:28:00", 94)))
        stream.write(record(109, 62.0, xid_line("0000:28:00", 94))[:-1])  # not ended yet: read when it is
    out = made.sample()
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="2", xid="79") == 2
    assert value(out, "accelmon_gpu_kernel_xid_events_total", gpu="2") == 1
    assert value(out, "accelmon_gpu_kernel_xid_events_total", gpu="1") == 1
    with open(log, "a") as stream:
        stream.write("\n")
    out = made.sample()
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="1", xid="94") == 2
    assert value(out, "accelmon_gpu_kernel_xid_last_timestamp_seconds", gpu="1", xid="94") == BOOT + 62
    assert value(out, "accelmon_kernel_log_lost_records_total") == 0


def test_bad_records_are_skipped_and_counted_and_gaps_are_lost_records(tmp_path, procfs):
    text = (
        record(1, 1.0, "first")
        + "no header at all\n"
        + "4,x,5,-;bad sequence\n"
        + record(2, 2.0, "NVRM: Xid (PCI:0000:18:00): 48, " + "A" * 200_000)  # a line longer than any record
        + record(
            3, 3.0, "NVRM: Xid (PCI:0000:18:00): 31, \udcff bytes".encode("utf-8", "surrogateescape").decode("latin-1")
        )
        + record(10, 4.0, xid_line("0000:18:00", 63))  # 4..9 were overwritten before they were read
    )
    log = tmp_path / "kmsg"
    log.write_bytes(text.encode("latin-1", errors="replace") + b"\xff\xfe;\x00\n")
    made = KernelLogCollector(kmsg=str(log), procfs=str(procfs))
    made.start()
    out = made.sample()
    assert value(out, "accelmon_kernel_log_malformed_records_total") == 4
    # Sequence numbers never read as records: 2 (skipped as too long) and 4..9 (overwritten).
    assert value(out, "accelmon_kernel_log_lost_records_total") == 7
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="0", xid="31") == 1
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="0", xid="63") == 1
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="0", xid="48") is None


def test_xid_text_that_is_not_the_drivers_is_skipped_and_counted(tmp_path, procfs):
    """Issue 64: any user can put XID text in the kernel log. An unprivileged mount in a user namespace
    (`unshare -Urm mount -t tmpfs -o "NVRM: Xid (PCI:0000:18:00): 79, ..." none /tmp`) makes tmpfs log the option;
    a write to /dev/kmsg is logged with the user facility; a process may name itself after the driver's prefix. None
    of these is an XID: GPU 0 stays healthy, each is counted by reason, and the driver's own line beside them counts."""
    fallen = xid_line("0000:18:00", 79, "pid=1, name=x, GPU has fallen off the bus.")
    switch_down = "nvidia-nvswitch0: SXid (PCI:0000:a3:00.0): 20034, Fatal, Link 30 LTSSM Fault Up"
    text = (
        # The kernel's own messages (facility 0) quoting what a user gave them: not at the message's start.
        record(1, 1.0, f"tmpfs: Unknown parameter '{fallen}'", priority=3)
        + record(2, 2.0, f"tmpfs: Unknown parameter '{switch_down}'", priority=3)
        + record(3, 3.0, f"overlayfs: failed to resolve '{fallen}': -2")
        # Written to /dev/kmsg: the kernel gives them the user facility whatever prefix the writer sends.
        + record(4, 4.0, fallen, priority=USER_WARNING)
        + record(5, 5.0, fallen, priority=USER_INFO)
        + record(6, 6.0, switch_down, priority=USER_WARNING)
        # A process named `NVRM: Xid (PCI:` (15 characters, the most a name holds) that crashed: the kernel's
        # message starts with the prefix, but what follows is not the driver's form.
        + record(7, 7.0, "NVRM: Xid (PCI:[4242]: segfault at 0 ip 0000000000401000 sp 00007ffd0000 error 4", priority=6)
        + record(8, 8.0, xid_line("0000:28:00", 94, "pid=7, name=python3, Contained ECC error."))  # the driver's
    )
    made, _ = collector(tmp_path, procfs, text)
    out = made.sample()
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="0") is None
    assert value(out, "accelmon_xid_catalogue_info", xid="79") is None
    assert value(out, "accelmon_nvswitch_sxid_errors_total") is None
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="1", xid="94") == 1
    skipped = "accelmon_kernel_log_skipped_xid_records_total"
    assert value(out, skipped, reason="not_driver") == 3
    assert value(out, skipped, reason="not_kernel") == 3
    assert value(out, skipped, reason="unparsed") == 1
    assert value(out, "accelmon_kernel_log_malformed_records_total") == 0
    node = health.evaluate([out], now=BOOT + 60, registrations=[kernel_log.REGISTRATION])
    checks = {gpu.index: next(c for c in gpu.checks if c.name == "xid") for gpu in node.gpus}
    assert checks["0"].verdict == "ok" and checks["0"].action == "none", checks["0"]
    assert checks["1"].verdict == "warning" and "contained_ecc_error" in checks["1"].detail, checks["1"]


def test_the_drivers_own_forms_are_read_strictly(tmp_path, procfs):
    """The forms the drivers print: a MIG GPU's XID names its GPU and compute instances inside the parenthesis;
    an SXid line without Fatal or Non-fatal (Correctable, or details after an error) is the driver's but not
    counted; the driver's prefix followed by anything else is not an XID."""
    text = (
        record(1, 1.0, "NVRM: Xid (PCI:0000:38:00 GPU-I:01 GPU-CI:00): 94, pid=7, name=python3, Contained ECC error.")
        + record(2, 2.0, "NVRM: Xid (PCI:0000:48:00 GPU-I:02): 13, pid=8, name=python3, Graphics Exception")
        + record(3, 3.0, "nvidia-nvswitch1: SXid (PCI:0000:b3:00.0): 12028, Correctable, Link 02 ingress error")
        + record(4, 4.0, "nvidia-nvswitch1: SXid (PCI:0000:b3:00.0): 24007, Fatal, Link 44 sourcetrack timeout")
        + record(5, 5.0, "nvidia-nvswitch1: SXid (PCI:0000:b3:00.0): 24007, Data {0x00000000, 0x00000000}")
        + record(6, 6.0, "NVRM: Xid (PCI:0000:18:00): seventy-nine, GPU has fallen off the bus.")
        + record(7, 7.0, "NVRM: Xid (PCI:0000:18:00): 79")  # the driver always prints `%d, ` and a message
        + record(8, 8.0, "nvidia-nvswitch1: SXid (PCI:0000:b3:00): 24007, Fatal, no function in the bus id")
    )
    made, _ = collector(tmp_path, procfs, text)
    out = made.sample()
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="2", xid="94") == 1
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="3", xid="13") == 1
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="0") is None
    assert value(out, "accelmon_nvswitch_sxid_errors_total", nvswitch="1", sxid="24007", fatal="true") == 1
    assert value(out, "accelmon_nvswitch_sxid_errors_total", sxid="12028") is None
    assert value(out, "accelmon_kernel_log_skipped_xid_records_total", reason="unparsed") == 3


def test_a_truncated_log_is_read_again_from_its_start(tmp_path, procfs):
    made, log = collector(tmp_path, procfs, HISTORY)
    made.sample()
    log.write_text(record(1, 1.0, xid_line("0000:18:00", 48)))  # rotated: shorter than what was read
    out = made.sample()
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="0", xid="48") == 1
    assert value(out, "accelmon_kernel_log_lost_records_total") == 0


def test_the_device_path_survives_epipe_and_records_too_long(tmp_path, procfs):
    """/dev/kmsg gives one record per read, EPIPE when records were overwritten (the next read gives the oldest
    left, whose sequence number says how many were lost), EINVAL for a record longer than the buffer, EAGAIN at
    the end. Played by a scripted read(2) on a real character device."""
    script = [
        record(1, 1.0, xid_line("0000:18:00", 13)).encode(),
        BrokenPipeError(errno.EPIPE, "overwritten"),
        record(41, 2.0, xid_line("0000:28:00", 79)).encode(),
        OSError(errno.EINVAL, "too long"),
        BlockingIOError(errno.EAGAIN, "no more"),
        record(43, 3.0, xid_line("0000:28:00", 79)).encode(),
        BlockingIOError(errno.EAGAIN, "no more"),
    ]

    def read(fd: int, size: int) -> bytes:
        step = script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    made = KernelLogCollector(kmsg="/dev/null", procfs=str(procfs), reader=KernelLog("/dev/null", read=read))
    made.start()
    out = made.sample()
    assert value(out, "accelmon_kernel_log_lost_records_total") == 39
    assert value(out, "accelmon_kernel_log_malformed_records_total") == 1
    assert value(out, "accelmon_gpu_kernel_xid_errors_total", gpu="1", xid="79") == 1
    out = made.sample()  # the next sample goes on from there: a new XID, with the record between lost
    assert value(out, "accelmon_gpu_kernel_xid_events_total", gpu="1") == 1
    assert value(out, "accelmon_kernel_log_lost_records_total") == 40
    assert not script


@pytest.mark.e2e  # this machine's own kernel log, readable by root only: not a fixture
def test_this_machines_real_kmsg(procfs):
    """/dev/kmsg as the kernel serves it (readable by root here): read to its end without blocking, every record
    parsed, none lost between two samples."""
    made = KernelLogCollector(kmsg="/dev/kmsg", procfs=str(procfs))
    made.start()
    first = made.sample()
    if os.geteuid() != 0 and value(first, "accelmon_kernel_log_readable") == 0:
        pytest.fail("run as root: /dev/kmsg is what this test reads")  # a machine's dmesg_restrict
    assert value(first, "accelmon_kernel_log_readable") == 1
    assert value(first, "accelmon_kernel_log_records_total") > 0
    assert value(first, "accelmon_kernel_log_malformed_records_total") == 0
    second = made.sample()
    assert value(second, "accelmon_kernel_log_records_total") >= value(first, "accelmon_kernel_log_records_total")
    made.stop()


def test_an_unreadable_log_is_said_once_and_the_others_go_on(tmp_path, procfs, caplog):
    made = KernelLogCollector(kmsg=str(tmp_path), procfs=str(procfs))  # a directory: reading it fails (EISDIR)
    made.start()
    for _ in range(3):
        out = made.sample()
    assert value(out, "accelmon_kernel_log_readable") == 0
    assert made.hardware_answering() is False
    assert len([r for r in caplog.records if "kernel log unreadable" in r.getMessage()]) == 1


@pytest.mark.e2e  # this machine's own kernel log and its kernel.dmesg_restrict setting
def test_permission_denied_without_cap_syslog(procfs, fake_nvml_dir, tmp_path):
    """The real /dev/kmsg read without CAP_SYSLOG, as a service without the role's grant meets it where
    kernel.dmesg_restrict=1 (this machine's setting, and Debian's and Ubuntu's default): the exporter runs, the
    kernel_log collector says it cannot read (self-metric, one warning naming the fix), NVML goes on."""
    assert Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1", "this test needs dmesg_restrict=1"
    # Root keeps its uid but loses every capability; anyone else has none to lose.
    drop = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"] if os.geteuid() == 0 else []
    config = tmp_path / "fake-nvml.conf"
    config.write_text("gpus 2\n")
    args = ["--once", "--path.procfs", str(procfs), "--no-collector.infiniband", "--no-collector.neuron"]
    result = subprocess.run(
        [*drop, *exporter_command(*args)],
        env=exporter_env(fake_nvml_dir, config),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert sample_value(result.stdout, "accelmon_kernel_log_readable") == 0
    assert sample_value(result.stdout, "accelmon_collector_success", collector="kernel_log") == 1
    assert sample_value(result.stdout, "accelmon_gpu_up", gpu="1") == 1
    assert result.stderr.count("kernel log unreadable") == 1 and "CAP_SYSLOG" in result.stderr, result.stderr
    # The node's health says XIDs are only NVML's now.
    assert sample_value(result.stdout, "accelmon_node_health_check_state", check="kernel_log") == 1
    promtool_check(result.stdout)


def test_the_catalogue_is_consistent():
    for code, info in xid.XIDS.items():
        assert info.code == code and info.name.isidentifier() and info.name == info.name.lower()
        assert info.meaning.endswith(".")
    assert xid.xid(79).action == "reboot_node" and xid.xid(79).severity == "critical"
    assert xid.xid(12345).name == "unknown" and xid.xid(12345).code == 12345
    assert xid.most_disruptive(["restart_app", "reboot_node", "reset_gpu"]) == "reboot_node"
    assert xid.sxid(fatal=True) == ("critical", "check_fabric")
    with pytest.raises(ValueError, match="unknown"):
        xid.XidInfo(1, "x", "fatal", "none", "x.")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0000:12:00", "0000:12:00.0"), ("00000000:1A:00.0", "0000:1a:00.0"), ("0000:c3:00.1", "0000:c3:00.0")],
)
def test_bus_ids_are_named_as_procfs_names_them(text, expected):
    assert bus_id(text) == expected


def test_a_record_is_parsed_by_the_kernel_abi():
    parsed = parse_record("6,339,5140900,-,caller=T1;NVRM: hello\n SUBSYSTEM=pci")
    assert parsed == Record(sequence=339, microseconds=5140900, facility=0, message="NVRM: hello")
    # PRIORITY is facility * 8 + level: 14 is LOG_USER at KERN_INFO, what the kernel makes of a write of `<6>...`.
    assert parse_record("14,340,5140901,-;written by a user").facility == 1
    assert parse_record("6,339,5140900;no flags") is None
    assert parse_record("x,339,5140900,-;no priority") is None
    assert parse_record("\u0664,339,5140900,-;a digit, but not an ASCII one") is None
    assert parse_record("just text") is None


def test_a_kernel_log_given_explicitly_turns_the_collector_on_without_a_driver(tmp_path):
    """--path.kmsg names a log on purpose: where no NVIDIA driver is loaded (the collector's auto setting is off) it
    is read, not silently ignored; without the flag the collector stays off there."""
    log = tmp_path / "kmsg"
    log.write_text(record(10, 5_000_000, xid_line("0000:18:00", 79, "GPU has fallen off the bus.")))
    bare = tmp_path / "proc"
    bare.mkdir()
    common = [*exporter_command(), "--once", "--path.procfs", str(bare), "--path.sysfs", str(tmp_path / "sys")]
    given = subprocess.run(
        [*common, "--path.kmsg", str(log)], capture_output=True, text=True, env=exporter_env(None, None)
    )
    assert "accelmon_kernel_log_readable 1.0" in given.stdout, given.stderr
    assert (
        "accelmon_kernel_log_readable"
        not in subprocess.run(common, capture_output=True, text=True, env=exporter_env(None, None)).stdout
    )


def test_golden(tmp_path, procfs):
    """The collector's part of a scrape over the fixture history: every XID named by GPU and catalogue."""
    made, _ = collector(tmp_path, procfs, HISTORY)
    text = render(made.sample()).decode()
    promtool_check(text)
    check_golden("kernel_log_history.prom", text)
