"""Which job uses how much of each GPU: NVML's compute processes and per-process utilization samples, put in their
batch job through the job cgroup tree, so a GPU shared by several jobs (time-slicing, MPS, MIG) is split between
them.

Example exposition lines::

    accelmon_gpu_job_memory_used_bytes{gpu="1",gpu_instance_id="",job_id="4242",uuid="GPU-…"} 2.1e+10
    accelmon_gpu_job_sm_utilization_ratio{gpu="1",job_id="4242",uuid="GPU-…"} 0.45

One series per (GPU, job) that runs on it, never per process (pids churn): processes outside any job are summed
under `job_id=""`. Memory comes from nvmlDeviceGetComputeRunningProcesses (per MIG instance where MIG is on: its
`gpu_instance_id`). SM and memory utilization: of a GPU whose processes are all one job's (a batch scheduler's
usual whole-GPU allocation), the GPU's own utilization (nvmlDeviceGetUtilizationRates); of a GPU shared by jobs,
nvmlDeviceGetProcessUtilization, the driver's samples since the previous read, averaged per process (NVML has no
such samples in MIG mode: no utilization series there). The shared case alone pays for the per-process samples: 2.2
ms of CPU a call on an H100, the GPU's rates 0.013 ms (docs/hardware.md). A GPU that does not answer is left out
while the others go on.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from typing import Any, Callable

from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import Registration, register, seconds
from accelmon.host.nvidia import NVML_DEVICES, OwnSessionCollector, nvidia_driver_loaded
from accelmon.job_sources.cgroups import JobOfProcess

log = logging.getLogger("accelmon.gpu_processes")

INTERVAL = seconds("interval_seconds", 10, "how often each GPU's processes and their utilization samples are read")
C = Catalogue(
    "gpu_processes",
    "GPU use per job (NVML processes)",
    "Source: nvmlDeviceGetComputeRunningProcesses, and for utilization nvmlDeviceGetUtilizationRates (a GPU held "
    "by one job) or nvmlDeviceGetProcessUtilization (a GPU shared by jobs), every "
    f"`interval_seconds` ({INTERVAL.default:g} s); processes are put in jobs by the job cgroup tree (Slurm's "
    '`job_<id>` directories). `job_id=""` sums the processes in no job. Percent to ratio (/100). On an H100 '
    "(docs/hardware.md) the per-process samples cost 2.2 ms of CPU a call (2.9 ms answering that there is none), "
    "so they are asked only of a GPU that jobs share; the process list costs 0.01-0.07 ms, the GPU's rates 0.013 ms.",
)
JOB_GPU = ("gpu", "uuid", "job_id")
MEMORY = C.gauge(
    "accelmon_gpu_job_memory_used_bytes",
    "GPU memory the job's processes hold on this GPU (or MIG instance).",
    [*JOB_GPU, "gpu_instance_id"],
)
PROCESSES = C.gauge("accelmon_gpu_job_processes", "The job's compute processes on this GPU.", JOB_GPU)
SM = C.gauge(
    "accelmon_gpu_job_sm_utilization_ratio",
    "Share of time a kernel of the job's processes ran on this GPU (0..1): the GPU's utilization where the job "
    "holds the GPU alone, else the mean of its processes' samples over the last interval (the jobs of a GPU add up "
    "to at most its utilization).",
    JOB_GPU,
)
MEMORY_UTILIZATION = C.gauge(
    "accelmon_gpu_job_memory_utilization_ratio",
    "Share of time the job's processes read or wrote this GPU's memory (0..1; measured as the SM share is).",
    JOB_GPU,
)
NO_INSTANCE = 0xFFFFFFFF  # NVML's gpuInstanceId outside MIG


class GpuProcessesCollector(OwnSessionCollector):
    name = "gpu_processes"
    purpose = "no per-job GPU use"

    def __init__(self, job_of: Callable[[int], str], nvml: Any = None, wall_clock: Callable[[], float] = time.time):
        super().__init__(nvml)
        self.job_of = job_of
        self._wall_clock = wall_clock
        self._gpus: list[tuple[int, Any, str]] = []
        self._since: dict[int, int] = {}  # GPU index -> the newest sample's time stamp (µs) already read
        self._no_samples: set[int] = set()  # GPUs whose driver has no per-process samples (MIG, old drivers)

    def found(self, gpus: list[tuple[int, Any, str]]) -> None:
        self._gpus = [gpu for gpu in gpus if gpu[1] is not None]

    def sample(self) -> Samples:
        self.ensure_open()
        out = Samples()
        for index, handle, uuid in self._gpus:
            try:
                self._sample_gpu(index, handle, uuid, out)
            except self.nvml.NVMLError as error:
                log.debug("GPU %d: %s", index, error)  # lost or busy: the device counters report it
        return out

    def _sample_gpu(self, index: int, handle: Any, uuid: str, out: Samples) -> None:
        nvml = self.nvml
        memory: dict[tuple[str, str], float] = defaultdict(float)
        processes: dict[str, int] = defaultdict(int)
        jobs: dict[int, str] = {}
        for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            job = jobs.setdefault(process.pid, self.job_of(process.pid))
            instance = "" if process.gpuInstanceId in (None, NO_INSTANCE) else str(process.gpuInstanceId)
            memory[(job, instance)] += float(process.usedGpuMemory or 0)  # None: the driver does not say
            processes[job] += 1
        for (job, instance), used in sorted(memory.items()):
            out.add(MEMORY, [str(index), uuid, job, instance], used)
        for job, count in sorted(processes.items()):
            out.add(PROCESSES, [str(index), uuid, job], count)
        if not processes:
            return
        if len(processes) == 1 and all(instance == "" for _, instance in memory):
            sm, mem = self._held_by_one_job(index, handle, next(iter(processes)))
        elif index in self._no_samples:
            return
        else:
            sm, mem = self._utilization(index, handle, jobs)
        for job in sorted(processes):
            out.add(SM, [str(index), uuid, job], sm.get(job, 0.0))
            out.add(MEMORY_UTILIZATION, [str(index), uuid, job], mem.get(job, 0.0))

    def _held_by_one_job(self, index: int, handle: Any, job: str) -> tuple[dict[str, float], dict[str, float]]:
        """Every process on the GPU is `job`'s, so the GPU's utilization is the job's: over the driver's last sample
        period (1/6 to 1 s) rather than the whole interval, for a hundredth of the per-process samples' cost."""
        rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
        self._since[index] = int(self._wall_clock() * 1e6)  # should jobs come to share it, samples from now on count
        return {job: rates.gpu / 100}, {job: rates.memory / 100}

    def _utilization(self, index: int, handle: Any, jobs: dict[int, str]) -> tuple[dict[str, float], dict[str, float]]:
        """Per job, the mean over the driver's samples since the last read of its processes' SM and memory use,
        summed over the job's processes; nothing new since then is no use."""
        nvml = self.nvml
        since = self._since.get(index, int((self._wall_clock() - 60) * 1e6))
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except nvml.NVMLError_NotFound:
            return {}, {}  # no sample since `since`: the GPU ran none of them
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            log.info("GPU %d: no per-process utilization samples (MIG or an old driver)", index)
            self._no_samples.add(index)
            return {}, {}
        per_process: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for sample in samples:
            per_process[sample.pid].append((float(sample.smUtil), float(sample.memUtil)))
            self._since[index] = max(self._since.get(index, 0), int(sample.timeStamp))
        sm: dict[str, float] = defaultdict(float)
        mem: dict[str, float] = defaultdict(float)
        for pid, values in per_process.items():
            job = jobs.get(pid)
            if job is None:
                continue  # a process that ended since the process list was read
            sm[job] += sum(v[0] for v in values) / len(values) / 100
            mem[job] += sum(v[1] for v in values) / len(values) / 100
        return dict(sm), dict(mem)


REGISTRATION = register(
    Registration(
        name="gpu_processes",
        help="GPU memory and SM use per job and GPU, from NVML's processes (default: on where the driver is loaded)",
        build=lambda options, paths: GpuProcessesCollector(
            job_of=JobOfProcess(os.path.join(paths.sysfs, "fs", "cgroup"))
        ),
        catalogue=C,
        options=(INTERVAL,),
        enabled_by_default=nvidia_driver_loaded,
        devices=NVML_DEVICES,
    )
)
