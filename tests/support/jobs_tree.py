"""A procfs tree with the NVIDIA driver's per-GPU `information` files, for the jobs collector.

The format is the driver's (`/proc/driver/nvidia/gpus/<bus id>/information`, as NVIDIA's driver README shows it);
no real host's file was recorded for it (docs/hardware.md has none), so the fields used are the ones
named there: `GPU UUID`, `Bus Location` and `Device Minor`. Bus ids and UUIDs are the fake driver's.
"""

from __future__ import annotations

from pathlib import Path

# Device minor numbers out of PCI bus order, as on hosts where Slurm's index (the minor) is not NVML's (bus order).
MINORS = (2, 0, 3, 1, 4, 5, 6, 7)


def bus_id(index: int) -> str:
    return f"0000:{0x18 + index * 0x10:02x}:00.0"


def uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-4000-8000-000000000000"  # the fake driver's UUID of NVML index `index`


def nvidia_procfs(root: Path, gpus: int = 4, minors: tuple[int, ...] = MINORS) -> Path:
    for index in range(gpus):
        folder = root / "driver" / "nvidia" / "gpus" / bus_id(index)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "information").write_text(
            "Model: \t\t NVIDIA H100 80GB HBM3\n"
            "IRQ:   \t\t 151\n"
            f"GPU UUID: \t {uuid(index)}\n"
            "Video BIOS: \t 96.00.99.00.01\n"
            "Bus Type: \t PCIe\n"
            "DMA Size: \t 52 bits\n"
            "DMA Mask: \t 0xfffffffffffff\n"
            f"Bus Location: \t {bus_id(index)}\n"
            f"Device Minor: \t {minors[index]}\n"
            "GPU Excluded:\t No\n"
        )
    (root / "driver" / "nvidia" / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.0\n")
    return root


def slurm_job_cgroup(cgroup_root: Path, job: int, pids: tuple[int, ...], version: int = 2, uid: int = 1000) -> Path:
    """A Slurm job's cgroup with `pids` in its first step's task, where Slurm's cgroup plugin puts it: v2 under
    system.slice/slurmstepd.scope, v1 under every controller's slurm/uid_<uid> (Slurm's cgroup.conf layout)."""
    if version == 2:
        jobs = [cgroup_root / "system.slice" / "slurmstepd.scope"]
    else:
        jobs = [cgroup_root / controller / "slurm" / f"uid_{uid}" for controller in ("freezer", "memory", "devices")]
    for parent in jobs:
        task = parent / f"job_{job}" / "step_0" / "user" / "task_0"
        task.mkdir(parents=True, exist_ok=True)
        (task / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))
        (parent / f"job_{job}" / "cgroup.procs").write_text("")  # v2: no process in an inner node
    return cgroup_root
