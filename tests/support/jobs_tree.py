"""A procfs tree with the NVIDIA driver's per-GPU `information` files, for the jobs collector.

The format is the driver's (`/proc/driver/nvidia/gpus/<bus id>/information`, as NVIDIA's driver README shows it);
no real host's file was recorded for it (docs/hardware.md has none), so the fields used are the ones
named there: `GPU UUID`, `Bus Location` and `Device Minor`. Bus ids and UUIDs are the fake driver's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

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


def fabric_manager_process(procfs: Path, pid: int = 5150) -> Path:
    """The NVIDIA Fabric Manager running, as procfs shows it (its comm): what an NVSwitch system needs."""
    (procfs / str(pid)).mkdir(parents=True, exist_ok=True)
    (procfs / str(pid) / "comm").write_text("nv-fabricmanager\n")
    return procfs


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


# What the job-resources tests expect from `job_cgroup_stats` (seconds and bytes, after the collector's conversions).
JOB_USER_SECONDS, JOB_SYSTEM_SECONDS, JOB_THROTTLED_SECONDS = 7312.5, 120.25, 3.5
JOB_MEMORY, JOB_PEAK, JOB_LIMIT, JOB_SWAP = 6 * 2**30, 7 * 2**30, 8 * 2**30, 2**20
JOB_READ, JOB_WRITTEN, JOB_TASKS = 3 * 2**20 + 4096, 5 * 2**20, 42


def job_cgroup_stats(
    cgroup_root: Path, job: int, version: int = 2, uid: int = 1000, user_hz: int = 100, oar_user: str = ""
) -> None:
    """The accounting files of a Slurm job's cgroup as the kernel writes them (Documentation/admin-guide/cgroup-v2.rst
    and cgroup-v1/*.rst): v2 in the job's one directory, v1 in each controller's; values are the JOB_* above.
    With `oar_user`, an OAR job's (v1 only): `<controller>/oar/<user>_<job>`."""
    if version == 2:
        job_dir = cgroup_root / "system.slice" / "slurmstepd.scope" / f"job_{job}"
        job_dir.mkdir(parents=True, exist_ok=True)
        files = {
            "cgroup.controllers": "cpuset cpu io memory pids\n",
            "cpu.stat": (
                f"usage_usec {int((JOB_USER_SECONDS + JOB_SYSTEM_SECONDS) * 1e6)}\n"
                f"user_usec {int(JOB_USER_SECONDS * 1e6)}\nsystem_usec {int(JOB_SYSTEM_SECONDS * 1e6)}\n"
                f"nr_periods 100\nnr_throttled 7\nthrottled_usec {int(JOB_THROTTLED_SECONDS * 1e6)}\n"
            ),
            "cpuset.cpus.effective": "0-3,8,10-11\n",
            "memory.current": f"{JOB_MEMORY}\n",
            "memory.peak": f"{JOB_PEAK}\n",
            "memory.max": f"{JOB_LIMIT}\n",
            "memory.swap.current": f"{JOB_SWAP}\n",
            "io.stat": (
                f"8:0 rbytes={JOB_READ - 4096} wbytes={JOB_WRITTEN} rios=10 wios=20 dbytes=0 dios=0\n"
                "259:0 rbytes=4096 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n"
            ),
            "pids.current": f"{JOB_TASKS}\n",
        }
        for name, text in files.items():
            (job_dir / name).write_text(text)
        return
    by_controller = {
        "cpu,cpuacct": {
            "cpuacct.stat": f"user {int(JOB_USER_SECONDS * user_hz)}\nsystem {int(JOB_SYSTEM_SECONDS * user_hz)}\n",
            "cpu.stat": f"nr_periods 100\nnr_throttled 7\nthrottled_time {int(JOB_THROTTLED_SECONDS * 1e9)}\n",
        },
        "cpuset": {"cpuset.cpus": "0-3,8,10-11\n"},
        "memory": {
            "memory.usage_in_bytes": f"{JOB_MEMORY}\n",
            "memory.max_usage_in_bytes": f"{JOB_PEAK}\n",
            "memory.limit_in_bytes": f"{JOB_LIMIT}\n",
            "memory.memsw.usage_in_bytes": f"{JOB_MEMORY + JOB_SWAP}\n",
        },
        "blkio": {
            "blkio.throttle.io_service_bytes": (
                f"8:0 Read {JOB_READ}\n8:0 Write {JOB_WRITTEN}\n8:0 Sync 0\n8:0 Async 0\n8:0 Total "
                f"{JOB_READ + JOB_WRITTEN}\nTotal {JOB_READ + JOB_WRITTEN}\n"
            )
        },
        "pids": {"pids.current": f"{JOB_TASKS}\n"},
    }
    for controller, files in by_controller.items():
        job_dir = cgroup_root / controller / "slurm" / f"uid_{uid}" / f"job_{job}"
        if oar_user:
            job_dir = cgroup_root / controller / "oar" / f"{oar_user}_{job}"
        job_dir.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (job_dir / name).write_text(text)


def oar_job_files(runtime_dir: Path, job: int, user: str, project: str, resources: list[tuple[str, int, str]]) -> None:
    """The files OAR 2.5.9's job resource manager (job_resource_manager_cgroups.pl) writes on each node of a job, in
    the format the real OAR wrote them in the Molecule `oar` scenario (docs/jobs.md): `<user>_<job>.env` and
    `<job>_resources`, one line per resource (`resources`: network_address, cpuset, gpudevice, "" for none)."""
    runtime_dir.mkdir(parents=True, exist_ok=True)
    (runtime_dir / f"{job}_resources").write_text(
        "".join(
            f" type = 'default' , network_address = '{node}' , besteffort = 'YES' , deploy = 'NO' , "
            f"desktop_computing = 'NO' , available_upto = '2147483647' , cpuset = '{cpuset}' , "
            f"last_available_upto = '0' , drain = 'NO' , gpudevice = '{gpu}' \n"
            for node, cpuset, gpu in resources
        )
    )
    (runtime_dir / str(job)).write_text("".join(sorted({f"{node}\n" for node, _, _ in resources})))
    (runtime_dir / f"{user}_{job}.env").write_text(
        f"export OAR_JOBID='{job}'\nexport OAR_ARRAYID='{job}'\nexport OAR_ARRAYINDEX='1'\n"
        f"export OAR_USER='{user}'\nexport OAR_WORKDIR='/home/{user}'\nexport OAR_JOB_NAME=''\n"
        f"export OAR_PROJECT_NAME='{project}'\nexport OAR_STDOUT='OAR.{job}.stdout'\n"
        f"export OAR_STDERR='OAR.{job}.stderr'\nexport OAR_FILE_NODES='{runtime_dir}/{job}'\n"
        f"export OAR_RESOURCE_PROPERTIES_FILE='{runtime_dir}/{job}_resources'\nexport OAR_JOB_WALLTIME='0:5:0'\n"
        "export OAR_JOB_WALLTIME_SECONDS='300'\nexport OAR_NODEFILE=$OAR_FILE_NODES\n"
        "export OAR_NODE_FILE=$OAR_FILE_NODES\nexport OAR_RESOURCE_FILE=$OAR_RESOURCE_PROPERTIES_FILE\n"
        "export OAR_O_WORKDIR=$OAR_WORKDIR\nexport OAR_WORKING_DIRECTORY=$OAR_WORKDIR\n"
        "export OAR_JOB_ID=$OAR_JOBID\nexport OAR_ARRAY_ID=$OAR_ARRAYID\nexport OAR_ARRAY_INDEX=$OAR_ARRAYINDEX\n"
    )


def oar_job_cgroup(cgroup_root: Path, job: int, user: str, pids: tuple[int, ...]) -> Path:
    """An OAR job's cgroup (v1) with `pids`, where OAR's job resource manager makes it: one directory per controller
    it uses, `<controller>/oar/<user>_<job>`, the processes in the job's directory itself."""
    for controller in ("cpuset", "cpu", "cpuacct", "devices", "freezer"):
        job_dir = cgroup_root / controller / "oar" / f"{user}_{job}"
        job_dir.mkdir(parents=True, exist_ok=True)
        (job_dir / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))
    return cgroup_root


def job_info(samples) -> set[tuple[str, ...]]:
    """The label values of the jobs collector's accelmon_gpu_job_info series in `samples`."""
    from accelmon.collectors.jobs import JOB_INFO

    return {labels for labels, _ in samples.rows.get(JOB_INFO, [])}


def only_value(samples, spec) -> float:
    """The value of the one series of `spec` (a metric without labels) in `samples`."""
    return samples.rows[spec][0][1]


def scan_config(root: Path, fake_nvml: Any, gpus: int = 2) -> Path:
    """An exporter config for a real scan of `gpus` GPUs: the fake NVML answering for them, the driver's procfs
    listing them, an empty kernel log. Returns the config file."""
    procfs = nvidia_procfs(root / "proc", gpus=gpus)
    (procfs / "stat").write_text("btime 1764000000\n")
    fake_nvml.configure(f"gpus {gpus}\n")
    (root / "kmsg").write_text("")
    config = root / "exporter.yml"
    config.write_text(yaml.safe_dump({"paths": {"procfs": str(procfs), "kmsg": str(root / "kmsg")}}))
    return config
