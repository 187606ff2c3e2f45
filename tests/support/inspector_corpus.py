"""NCCL Inspector's Prometheus files as each release writes them, made from that release's own format strings
(NVIDIA/nccl, `git show TAG:PATH`; the lines named are the tag's). The collector's tests read them
(tests/test_nccl_inspector.py), and docs/jobs.md's table says what each release gives.

- v2.29.3-1 `ext-profiler/inspector/inspector_prom.cc` (v2.29.7-1: the same file moved to
  `plugins/profiler/inspector/`, 7 lines added, the format unchanged): the labels cached per communicator (lines
  88-101: `comm_id`, `hostname`, `rank`, `slurm_job`, `slurm_job_id`, `nranks`, `n_nodes`, `gpu_device_id`), then
  per collective `collective`, `coll_sn`, `timestamp`, `message_size` (143-149; the size "%.2f%s" in 1024-based
  units, "%zuB" under 1 KiB: lines 42-59), and three lines each (230-236): algorithm bandwidth, bus bandwidth (GB/s),
  the execution time (microseconds). The latest completed collective of each communicator.
- v2.30.3-1 and v2.30.7-1 `plugins/profiler/inspector/inspector_prom.cc` (identical): what completed during the
  dump interval, in buckets by (nranks, nnodes, collective, message size range, communicator name, algorithm and
  protocol) (lines 41-80), each bucket's bus bandwidth a geometric mean and its execution time an arithmetic mean
  (93-109, 451-459); labels `version` ("v5.1": NCCL_PROFILER_INTERFACE_VERSION 5 in inspector.h line 24, the
  format's minor 1 at line 91), `slurm_job_id`, `node` (the host name), `gpu` ("GPU<CUDA device>", line 690),
  `comm_name` (the communicator's name as the application set it, "unknown" when none: lines 576-577), `n_nodes`,
  `nranks`, `collective`, `message_size` (a range "4-5GB": lines 129-160), `algo_proto` (lines 246-258); point to
  point in `nccl_p2p_*` with `p2p_operation` in place of `collective` and no `algo_proto` (305-318, 511-514). No
  communicator id, no rank, no algorithm bandwidth.
"""

from __future__ import annotations

import math

VERSION_2_30 = "v5.1"


def size_2_29(size: int) -> str:
    """inspectorFormatHumanReadableSize, v2.29.3-1 lines 42-59."""
    units = ("B", "KB", "MB", "GB", "TB")
    value, unit = float(size), 0
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    return f"{size}B" if unit == 0 else f"{value:.2f}{units[unit]}"


def file_2_29(
    rank: int, bus_gbs: float, *, comm: str = "0xd152c00f111816", job: str = "4242", nranks: int = 16,
    collective: str = "AllReduce", size: int = 2 << 30, exec_us: int = 61974, cuda_device: int = 0,
) -> str:  # fmt: skip
    """One communicator's three lines (v2.29.3-1 lines 90-101, 143-149, 230-236); free text among the labels."""
    labels = (
        f'comm_id="{comm}",hostname="pool0-0002",rank="{rank}",slurm_job="train",slurm_job_id="{job}",'
        f'nranks="{nranks}",n_nodes="2",gpu_device_id="GPU{cuda_device}",collective="{collective}",'
        f'coll_sn="228924",timestamp="2026-11-27T03:31:47Z",message_size="{size_2_29(size)}"'
    )
    return (
        f"nccl_algorithm_bandwidth_gbs{{{labels}}} {bus_gbs * nranks / (2 * (nranks - 1)):.6g}\n"
        f"nccl_bus_bandwidth_gbs{{{labels}}} {bus_gbs:.6g}\n"
        f"nccl_collective_exec_time_microseconds{{{labels}}} {float(exec_us):.6g}\n"
    )


def size_range_2_30(size: int) -> str:
    """inspectorPromFormatMessageSizeRange, v2.30.7-1 lines 129-160: the floor of the size in its 1024-based unit,
    and that plus one."""
    if size == 0:
        return "0B"
    units = ("B", "KB", "MB", "GB", "TB")
    value, unit = float(size), 0
    while value >= 1024 and unit < 4:
        value /= 1024
        unit += 1
    lower = max(math.floor(max(value, 1.0)), 1)
    return f"{lower}-{lower + 1}{units[unit]}"


def bucket_2_30(
    bus_gbs: float, *, comm_name: str = "DP Group 0", job: str = "4242", node: str = "pool0-0002",
    cuda_device: int = 0, nranks: int = 16, n_nodes: int = 2, collective: str = "AllReduce", size: int = 4 << 30,
    algo_proto: str = "Ring_LL128", exec_us: float = 9498.47,
) -> str:  # fmt: skip
    """One collective bucket's two lines (v2.30.7-1 lines 246-258, 456-459)."""
    labels = (
        f'version="{VERSION_2_30}",slurm_job_id="{job}",node="{node}",gpu="GPU{cuda_device}",'
        f'comm_name="{comm_name}",n_nodes="{n_nodes}",nranks="{nranks}",collective="{collective}",'
        f'message_size="{size_range_2_30(size)}",algo_proto="{algo_proto}"'
    )
    return (
        f"nccl_bus_bandwidth_gbs{{{labels}}} {bus_gbs:.6g}\n"
        f"nccl_collective_exec_time_microseconds{{{labels}}} {exec_us:.6g}\n"
    )


def p2p_bucket_2_30(
    bus_gbs: float, *, comm_name: str = "PP Group 0", job: str = "4242", cuda_device: int = 0, nranks: int = 16,
    operation: str = "Send", size: int = 512 << 20, exec_us: float = 1154.87,
) -> str:  # fmt: skip
    """One point-to-point bucket's two lines (v2.30.7-1 lines 305-318, 511-514)."""
    labels = (
        f'version="{VERSION_2_30}",slurm_job_id="{job}",node="pool0-0002",gpu="GPU{cuda_device}",'
        f'comm_name="{comm_name}",n_nodes="2",nranks="{nranks}",p2p_operation="{operation}",'
        f'message_size="{size_range_2_30(size)}"'
    )
    return (
        f"nccl_p2p_bus_bandwidth_gbs{{{labels}}} {bus_gbs:.6g}\n"
        f"nccl_p2p_exec_time_microseconds{{{labels}}} {exec_us:.6g}\n"
    )
