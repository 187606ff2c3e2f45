"""Kernel log records in /dev/kmsg's format (`PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;MESSAGE`, continuation lines
starting with a space), with the NVIDIA driver's XID and NVSwitch SXid lines as drivers print them (public bug
reports and NVIDIA's documentation: `NVRM: Xid (PCI:0000:2b:00): 79, pid=..., name=..., GPU has fallen off the bus.`;
older drivers leave out `PCI:`; SXids carry `Fatal` or `Non-fatal`). Bus ids are the fake driver's
(tests/support/jobs_tree.py): GPU i at 0000:{18 + 16 i:02x}:00.0."""

from __future__ import annotations

BOOT = 1_764_000_000  # btime of the fixture procfs: records count their microseconds from it

# PRIORITY is facility * 8 + level. The driver's lines are the kernel's (facility 0) at KERN_WARNING (4); what
# userspace writes to /dev/kmsg the kernel logs as LOG_USER (facility 1): 12 at KERN_WARNING, 14 at KERN_INFO.
KERNEL_WARNING = 4
USER_WARNING = 12
USER_INFO = 14


def record(sequence: int, seconds: float, message: str, priority: int = KERNEL_WARNING) -> str:
    return f"{priority},{sequence},{int(seconds * 1e6)},-;{message}\n"


def xid_line(bus: str, code: int, tail: str = "pid=1234, name=python3, Graphics Exception") -> str:
    return f"NVRM: Xid (PCI:{bus}): {code}, {tail}"


HISTORY = "".join(
    [
        record(100, 2.0, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15"),
        record(101, 7.0, xid_line("0000:38:00", 79, "pid=1101234, name=nvc:[driver], GPU has fallen off the bus.")),
        " SUBSYSTEM=pci\n DEVICE=+pci:0000:38:00.0\n",  # continuation lines of the record before
        record(102, 8.0, "NVRM: Xid (0000:18:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)"),  # no PCI:
        record(103, 9.0, "nvidia-nvswitch2: SXid (PCI:0000:c3:00.0): 12028, Non-fatal, Link 36 egress error"),
        record(104, 9.5, "nvidia-nvswitch0: SXid (PCI:0000:a3:00.0): 20034, Fatal, Link 30 LTSSM Fault Up"),
        record(
            105,
            9.6,
            xid_line("0000:48:00", 154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"),
        ),
        record(106, 9.7, xid_line("0000:99:00", 999, "a GPU the driver does not list, an XID nobody names")),
    ]
)
