"""Which batch job holds which GPU: one `accelmon_gpu_job_info` series per (GPU, job), from a record per job on each
of its nodes: Slurm's prolog writes one to `state_dir` and its epilog removes it (the role's
`templates/slurm-*.sh.j2`); OAR writes its own (below), so OAR needs no hook.

Example exposition line::

    accelmon_gpu_job_info{account="physics",gpu="1",job_id="4242",user="alice",uuid="GPU-5d3c..."} 1.0

Device series never carry job labels (a job label on every metric multiplies and churns series); dashboards and
rules join on `uuid` at query time. A record is a small `KEY=VALUE` file per job in the state directory (written
by root, read here): `scheduler`, `job_id`, `user`, `account`, `gpus` (comma-separated). A GPU is named by UUID
(recent Slurm fills SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES with them) or by index. Slurm's index follows the
device minor number (/dev/nvidiaN), which is not always NVML's index (NVML counts in PCI bus order): an index is
resolved through `<procfs>/driver/nvidia/gpus/<bus id>/information`, which gives each GPU's minor number, UUID
and bus location, and NVML's index is the GPU's place in bus order. A malformed line is skipped and counted;
a GPU the host does not have is counted in `accelmon_jobs_unresolved_gpus`, never guessed.

Where records come from (Slurm's prolog, OAR's own job files, OAR 2.5.9 as measured in the Molecule `oar`
scenario) and how processes are put in jobs by their cgroup: `accelmon.job_sources`, a module a scheduler and one
for the cgroups.
"""

from __future__ import annotations

import logging
import os
import re
import time

from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import Option, Registration, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.host.nvidia import NVML_DEVICES, DriverGpu, NvmlSession, driver_gpus
from accelmon.job_sources import has_job_records
from accelmon.job_sources.oar import OAR_RUNTIME_DIR, OarJobs
from accelmon.job_sources.slurm import STATE_DIR, read_record, record_names

log = logging.getLogger("accelmon.jobs")

CATALOGUE = Catalogue(
    "jobs",
    "Batch jobs on GPUs",
    "Source: the records Slurm's prolog writes to `state_dir` (installed by the role with "
    "`accelmon_exporter_jobs: slurm`), and OAR's own job files in `oar_runtime_dir` (`<user>_<id>.env`, "
    "`<id>_resources`: GPUs from the `gpudevice` property). GPU indices are device minor numbers, turned into NVML's "
    "index and the UUID through `/proc/driver/nvidia/gpus/*/information`. Join device series to jobs on `uuid`.",
)
JOB_INFO = CATALOGUE.gauge(
    "accelmon_gpu_job_info",
    "A batch job holding a GPU; value is 1. A GPU shared by two jobs has two series.",
    ["gpu", "uuid", "job_id", "user", "account"],
)
JOBS = CATALOGUE.gauge("accelmon_jobs_running", "Jobs with a record on this host (with or without GPUs).", ())
UNRESOLVED = CATALOGUE.gauge(
    "accelmon_jobs_unresolved_gpus", "GPUs named in job records that match no GPU of this host.", ()
)
MALFORMED = CATALOGUE.counter(
    "accelmon_jobs_malformed_lines_total",
    "Lines of job records that were not KEY=VALUE, skipped (each counted once).",
    (),
)

NVML_REFRESH_SECONDS = 60.0  # a UUID NVML did not list is asked about again at most this often
UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")
OAR_NODE_NAME = Option(
    "oar_node_name",
    "",
    "this node's network_address in OAR's resources (empty: the host name; domains ignored)",
    empty=True,
)
OAR_GPU_PROPERTY = Option(
    "oar_gpu_property", "gpudevice", "the OAR resource property that holds a GPU's device minor number"
)


class JobsCollector(Collector):
    name = "jobs"

    def __init__(
        self, state_dir: str, procfs: str, nvml: NvmlSession | None = None, oar: OarJobs | None = None
    ) -> None:
        self.state_dir = state_dir
        self.procfs = procfs
        # NVML names a GPU by UUID where the driver's procfs files do not (a container without /proc/driver/nvidia):
        # asked only then, its answer kept until a UUID it did not list turns up.
        self.nvml = nvml
        self.oar = oar
        self._nvml_indices: dict[str, str] = {}
        self._nvml_asked = -NVML_REFRESH_SECONDS  # monotonic time of the last listing
        self.malformed = 0
        self._counted: dict[str, tuple[int, int]] = {}  # record -> (mtime_ns, size) whose bad lines were counted

    def _read(self, path: str, name: str) -> dict[str, str] | None:
        try:
            status = os.stat(path)
            record, bad = read_record(path)
        except OSError:
            return None  # removed by the epilog while being read
        version = (status.st_mtime_ns, status.st_size)
        if bad and self._counted.get(name) != version:
            self._counted[name] = version
            self.malformed += bad
            log.warning("job record %s: %d malformed line(s) skipped", path, bad)
        return record if record.get("job_id") else None

    def _records(self) -> list[dict[str, str]]:
        names = record_names(self.state_dir)
        records = [self._read(os.path.join(self.state_dir, name), name) for name in names]
        self._counted = {k: v for k, v in self._counted.items() if k in names}
        oar = self.oar.records() if self.oar is not None else []
        return [record for record in records if record is not None] + oar

    def sample(self) -> Samples:
        out = Samples()
        records = self._records()
        by_minor, by_uuid = driver_gpus(self.procfs)
        unresolved = 0
        seen: set[tuple[str, str]] = set()
        for record in records:
            for token in filter(None, (t.strip() for t in record.get("gpus", "").split(","))):
                if token.isdigit() and token in by_minor:
                    gpu = by_minor[token]
                elif token in by_uuid:
                    gpu = by_uuid[token]
                elif token.startswith("GPU-") and UUID.match(token) and self._nvml_index(token):
                    gpu = DriverGpu(self._nvml_indices[token], token)
                elif UUID.match(token) and token.startswith("MIG-"):
                    gpu = DriverGpu("", token)  # a MIG instance (the driver lists GPUs only): joined by its own UUID
                else:
                    unresolved += 1
                    continue
                if (gpu.uuid, record["job_id"]) in seen:
                    continue  # one job named the same GPU twice (index and UUID)
                seen.add((gpu.uuid, record["job_id"]))
                labels = (gpu.index, gpu.uuid, record["job_id"], record.get("user", ""), record.get("account", ""))
                out.add(JOB_INFO, labels, 1)
        out.add(JOBS, (), len(records))
        out.add(UNRESOLVED, (), unresolved)
        out.add(MALFORMED, (), self.malformed + (self.oar.malformed if self.oar is not None else 0))
        return out

    def _nvml_index(self, uuid: str) -> bool:
        """Whether NVML lists a GPU of this UUID (its index kept in _nvml_indices)."""
        now = time.monotonic()
        if uuid not in self._nvml_indices and self.nvml is not None and now - self._nvml_asked >= NVML_REFRESH_SECONDS:
            self._nvml_asked = now
            found = self.nvml.gpus() or []
            self._nvml_indices = {gpu_uuid: str(index) for index, _, gpu_uuid in found if gpu_uuid}
        return uuid in self._nvml_indices

    def stop(self) -> None:
        if self.nvml is not None:
            self.nvml.close()


REGISTRATION = register(
    Registration(
        name="jobs",
        help="batch jobs holding GPUs, from Slurm prolog records or OAR's job files (default: on where either is kept)",
        build=lambda options, paths: JobsCollector(
            str(options["state_dir"]),
            paths.procfs,
            NvmlSession("no GPU index for job records that name GPUs by UUID"),
            OarJobs(str(options["oar_runtime_dir"]), str(options["oar_node_name"]), str(options["oar_gpu_property"]))
            if options["oar_runtime_dir"]
            else None,
        ),
        catalogue=CATALOGUE,
        options=(
            seconds("interval_seconds", 5, "how often the job records are read"),
            STATE_DIR,
            OAR_RUNTIME_DIR,
            OAR_NODE_NAME,
            OAR_GPU_PROPERTY,
        ),
        enabled_by_default=has_job_records,
        # NVML is opened only to name a GPU a record gives by UUID, but then the unit must let it reach the device.
        devices=NVML_DEVICES,
    )
)
