"""The kernel's perf events, counted per cgroup: the narrow interface to `perf_event_open(2)` that the job_perf
collector uses, and the event table (generic events, and FLOPS events by CPU micro-architecture).

Counting, never sampling: each event is opened in cgroup mode (`PERF_FLAG_PID_CGROUP`: the cgroup directory's file
descriptor as pid, one counter per CPU) and read as (value, time enabled, time running). The kernel counts only while
a task of that cgroup or of a descendant runs on the CPU, so a job's counts include every step and task Slurm puts
below `job_<id>`, and nothing else. When more hardware events are open than the CPU has counters, the kernel
multiplexes them; the value scaled by enabled/running is the estimate `perf stat` also prints.

Why the system call through ctypes rather than the distribution's `perf` tool: it is in every kernel we support
(Linux 4.18+, which has cgroup mode), needs nothing installed beside the exporter's Python, costs one `read(2)` per
counter per sample instead of a second long-running process to parse, and the counters open and close with the
jobs. Cgroup mode counts on whole CPUs, which the kernel allows to CAP_PERFMON (Linux 5.8+; CAP_SYS_ADMIN before)
or with `kernel.perf_event_paranoid` at 0 or below: the exporter's unit gets CAP_PERFMON only when this collector is
enabled. Sources: perf_event_open(2); the kernel's include/uapi/linux/perf_event.h for the numbers below.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass
from typing import Optional, Protocol

# include/uapi/linux/perf_event.h
TYPE_HARDWARE, TYPE_SOFTWARE, TYPE_RAW = 0, 1, 4
FLAG_PID_CGROUP = 1 << 2
FLAG_FD_CLOEXEC = 1 << 3
FORMAT_TOTAL_TIME_ENABLED, FORMAT_TOTAL_TIME_RUNNING = 1, 2
ATTR_SIZE = 64  # PERF_ATTR_SIZE_VER0: every field used here; newer kernels zero-fill the rest
SYSCALL_NUMBER = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "s390x": 331}


@dataclass(frozen=True)
class Event:
    """One counter: its name (the `event` label), the perf type and config, and for FLOPS events the precision
    and how many floating-point operations one count stands for."""

    name: str
    type: int
    config: int
    precision: str = ""  # FLOPS events only: single, double, or any (a CPU that does not tell them apart)
    flops_per_count: int = 0


SOFTWARE = (
    Event("context_switches", TYPE_SOFTWARE, 3),  # PERF_COUNT_SW_CONTEXT_SWITCHES
    Event("cpu_migrations", TYPE_SOFTWARE, 4),  # PERF_COUNT_SW_CPU_MIGRATIONS
    Event("page_faults", TYPE_SOFTWARE, 2),  # PERF_COUNT_SW_PAGE_FAULTS
)
HARDWARE = (
    Event("cycles", TYPE_HARDWARE, 0),  # PERF_COUNT_HW_CPU_CYCLES
    Event("instructions", TYPE_HARDWARE, 1),
    Event("cache_references", TYPE_HARDWARE, 2),
    Event("cache_misses", TYPE_HARDWARE, 3),  # the CPU's last-level cache on Intel
    Event("branch_misses", TYPE_HARDWARE, 5),
)


def _raw(name: str, event: int, umask: int, precision: str, flops: int) -> Event:
    """A core PMU event by its code and unit mask (x86: config = event | umask << 8)."""
    return Event(name, TYPE_RAW, event | umask << 8, precision, flops)


# Intel FP_ARITH_INST_RETIRED (event 0xC7), Broadwell to Granite Rapids: one count per instruction, standing for
# one operation per vector element (an FMA counts twice). Intel's perfmon event files, event FP_ARITH_INST_RETIRED.*.
INTEL_FLOPS = (
    _raw("fp_scalar_double", 0xC7, 0x01, "double", 1),
    _raw("fp_scalar_single", 0xC7, 0x02, "single", 1),
    _raw("fp_128b_packed_double", 0xC7, 0x04, "double", 2),
    _raw("fp_128b_packed_single", 0xC7, 0x08, "single", 4),
    _raw("fp_256b_packed_double", 0xC7, 0x10, "double", 4),
    _raw("fp_256b_packed_single", 0xC7, 0x20, "single", 8),
    _raw("fp_512b_packed_double", 0xC7, 0x40, "double", 8),
    _raw("fp_512b_packed_single", 0xC7, 0x80, "single", 16),
)
# AMD PMCx003 FpRetSseAvxOps counts FLOPs themselves (a multiply-add counts 2). Zen 1 and 2 (family 17h) split
# them by precision in the unit mask (single 0x0F, double 0xF0); Zen 3 to 5 (19h, 1Ah) do not (0x0F: all).
# AMD's Processor Programming Reference for each family; Linux's pmu-events fp_ret_sse_avx_ops.*.
AMD_ZEN12_FLOPS = (
    _raw("fp_ret_sse_avx_single", 0x03, 0x0F, "single", 1),
    _raw("fp_ret_sse_avx_double", 0x03, 0xF0, "double", 1),
)
AMD_ZEN3_FLOPS = (_raw("fp_ret_sse_avx_all", 0x03, 0x0F, "any", 1),)
# Intel server cores with FP_ARITH_INST_RETIRED (family 6): Broadwell-EP/EX, Skylake/Cascade/Cooper Lake-SP,
# Ice Lake-SP, Sapphire and Emerald Rapids, Granite Rapids.
INTEL_MODELS = {
    0x4F: "broadwell", 0x56: "broadwell", 0x55: "skylake_sp", 0x6A: "icelake_sp", 0x6C: "icelake_sp",
    0x8F: "sapphire_rapids", 0xCF: "emerald_rapids", 0xAD: "granite_rapids", 0xAE: "granite_rapids",
}  # fmt: skip
AMD_FAMILIES = {0x17: ("zen2", AMD_ZEN12_FLOPS), 0x19: ("zen3_4", AMD_ZEN3_FLOPS), 0x1A: ("zen5", AMD_ZEN3_FLOPS)}


def cpu_identity(cpuinfo: str) -> tuple[str, int, int]:
    """(vendor, family, model) of the first CPU in /proc/cpuinfo's text; ("", 0, 0) where it does not say."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    try:
        return fields.get("vendor_id", ""), int(fields.get("cpu family", "0")), int(fields.get("model", "0"))
    except ValueError:
        return fields.get("vendor_id", ""), 0, 0


def flops_events(cpuinfo: str) -> tuple[str, tuple[Event, ...]]:
    """The micro-architecture's name and its FLOPS events; ("", ()) for a CPU this table does not cover."""
    vendor, family, model = cpu_identity(cpuinfo)
    if vendor == "GenuineIntel" and family == 6 and model in INTEL_MODELS:
        return INTEL_MODELS[model], INTEL_FLOPS
    if vendor in ("AuthenticAMD", "HygonGenuine") and family in AMD_FAMILIES:
        return AMD_FAMILIES[family]
    return "", ()


# Why a counter could not be opened: bounded label values, from the errno of perf_event_open.
REASONS = {
    errno.EACCES: "permission",  # neither CAP_PERFMON nor perf_event_paranoid <= 0
    errno.EPERM: "permission",
    errno.ENOENT: "not_supported",  # no such event on this CPU (or no PMU at all: see no_pmu)
    errno.EOPNOTSUPP: "not_supported",
    errno.ENODEV: "not_supported",
    errno.EINVAL: "kernel_refused",  # e.g. a kernel without CONFIG_CGROUP_PERF
    errno.EBADF: "kernel_refused",
    errno.EMFILE: "too_many_open_files",
    errno.ENFILE: "too_many_open_files",
    errno.ENOSYS: "kernel_refused",
}


class PerfError(OSError):
    """perf_event_open failed; `reason` is one of REASONS' values."""

    def __init__(self, code: int) -> None:
        super().__init__(code, os.strerror(code))
        self.reason = REASONS.get(code, "kernel_refused")


class Counters(Protocol):
    """What the collector needs of the kernel (tests pass a fake)."""

    def open(self, event: Event, cgroup_fd: int, cpu: int) -> int: ...

    def read(self, fd: int) -> tuple[int, int, int]: ...

    def close(self, fd: int) -> None: ...


class KernelCounters:
    """perf_event_open(2) through libc's syscall(2)."""

    def __init__(self) -> None:
        self._number = SYSCALL_NUMBER.get(platform.machine())
        self._syscall = ctypes.CDLL(None, use_errno=True).syscall if self._number else None

    def open(self, event: Event, cgroup_fd: int, cpu: int) -> int:
        if self._syscall is None or self._number is None:
            raise PerfError(errno.ENOSYS)  # an architecture whose system call number this table lacks
        attr = bytearray(ATTR_SIZE)
        struct.pack_into("IIQ", attr, 0, event.type, ATTR_SIZE, event.config)
        struct.pack_into("Q", attr, 32, FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING)  # read_format
        # flags (offset 40) all clear: enabled from the start, user and kernel time both counted.
        fd = self._syscall(
            ctypes.c_long(self._number), ctypes.create_string_buffer(bytes(attr), ATTR_SIZE),
            ctypes.c_int(cgroup_fd), ctypes.c_int(cpu), ctypes.c_int(-1),
            ctypes.c_ulong(FLAG_PID_CGROUP | FLAG_FD_CLOEXEC),
        )  # fmt: skip
        if fd < 0:
            raise PerfError(ctypes.get_errno())
        return int(fd)

    def read(self, fd: int) -> tuple[int, int, int]:
        """(count, nanoseconds enabled, nanoseconds running)."""
        data = os.read(fd, 24)
        if len(data) != 24:
            raise OSError(errno.EIO, f"short read of a perf counter ({len(data)} bytes)")
        value, enabled, running = struct.unpack("QQQ", data)
        return value, enabled, running

    def close(self, fd: int) -> None:
        os.close(fd)


def scaled(value: int, enabled: int, running: int) -> Optional[float]:
    """The count over the whole time the counter was enabled: the kernel multiplexes more events than the CPU has
    counters, and counted this one only `running` of `enabled` nanoseconds. None before it ran at all."""
    if running <= 0:
        return None if enabled > 0 else 0.0
    return value * (enabled / running) if running < enabled else float(value)
