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

OAR (2.5, Debian's packages): its job resource manager (`job_resource_manager_cgroups.pl`) runs on every node of a
job at its start and end, and writes there, in OAR's runtime directory (oar.conf OAR_RUNTIME_DIRECTORY, by default
/var/lib/oar, world-readable), `<user>_<job id>.env` (OAR_JOBID, OAR_USER, OAR_PROJECT_NAME as `export KEY='VALUE'`)
and `<job id>_resources` (one line per resource of the job, `property = 'value' ,` pairs); both are removed when
the job ends. The GPUs on this node are the `gpudevice` property (the device minor number, the property OAR's own
device cgroup reads) of the job's resources whose `network_address` is this host (docs/jobs.md). Measured with
OAR 2.5.9 in the Molecule `oar` scenario.

Processes are put in jobs by their cgroup (`JobOfProcess`, for the Neuron collector's runtimes): Slurm's cgroup
plugins make a directory `job_<id>` for each job, whose tree lists the job's processes in world-readable
`cgroup.procs` files, so this works where the exporter's hardening (ProtectProc=invisible) hides other users'
processes in /proc. OAR's cgroup is `<controller>/oar/<user>_<job id>` (cgroup v1, OAR's CPUSET_PATH `/oar`).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from accelmon.collectors.nvml import NvmlSession
from accelmon.core import Catalogue, Collector, Samples
from accelmon.registry import Option, Paths, Registration, register, seconds

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

KEYS = ("scheduler", "job_id", "user", "account", "gpus")
MAX_VALUE = 256  # a label value longer than this is cut: a record is input from a script, not trusted to be small
MAX_RECORD_BYTES = 64 * 1024
NVML_REFRESH_SECONDS = 60.0  # a UUID NVML did not list is asked about again at most this often
# The job records' directory: one declaration, which job_resources and job_perf share and the role reads through
# `--check-config --json` (and renders into the prolog and epilog).
STATE_DIR = Option(
    "state_dir", "/run/accelmon/jobs", "where the scheduler's prolog writes one record per job", shared=True
)
OAR_RUNTIME_DIR = Option(
    "oar_runtime_dir",
    "/var/lib/oar",
    "OAR's runtime directory (oar.conf OAR_RUNTIME_DIRECTORY), where OAR keeps a file per job on each of its nodes; "
    "empty: OAR jobs are not read",
    empty=True,
    shared=True,
)
OAR_NODE_NAME = Option(
    "oar_node_name",
    "",
    "this node's network_address in OAR's resources (empty: the host name; domains ignored)",
    empty=True,
)
OAR_GPU_PROPERTY = Option(
    "oar_gpu_property", "gpudevice", "the OAR resource property that holds a GPU's device minor number"
)
UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")
# Slurm's job cgroup: cgroup v1 <controller>/slurm[_<node>]/uid_<uid>/job_<id>, cgroup v2
# system.slice/slurmstepd.scope/job_<id>; the steps and tasks below it.
SLURM_JOB_CGROUP = re.compile(r"^job_(\d+)$")
# OAR's: cgroup v1 <controller>/oar/<user>_<id> (OAR's CPUSET_PATH, /oar), no directories below it.
OAR_JOB_CGROUP = re.compile(r"^.+_(\d+)$")
OAR_CGROUP_PARENT = "oar"
OAR_ENV_FILE = re.compile(r"^(?P<user>.+)_(?P<job>\d+)\.env$")
OAR_ENV_LINE = re.compile(r"^export (OAR_[A-Z_]+)='([^']*)'$")
OAR_PROPERTY = re.compile(r"\s*(\w+) = '([^']*)' ?,?")
MAX_CGROUP_DEPTH = 6  # from the cgroup root down to a job's directory (v1: 4, v2: 3); deeper trees are not read


@dataclass(frozen=True)
class Gpu:
    index: str  # NVML's index: the GPU's place in PCI bus order
    uuid: str


def job_of_cgroup(directory: str) -> str | None:
    """The batch job whose cgroup `directory` is (Slurm's `job_<id>`, OAR's `oar/<user>_<id>`), else None."""
    name = os.path.basename(directory)
    match = SLURM_JOB_CGROUP.match(name)
    if match is None and os.path.basename(os.path.dirname(directory)) == OAR_CGROUP_PARENT:
        match = OAR_JOB_CGROUP.match(name)
    return match.group(1) if match else None


def _driver_gpus(procfs: str) -> list[tuple[str, Gpu, dict[str, str]]]:
    """(bus id, GPU, fields of its information file) for each GPU the NVIDIA driver lists in procfs."""
    root = os.path.join(procfs, "driver", "nvidia", "gpus")
    try:
        buses = sorted(os.listdir(root), key=str.lower)
    except OSError:
        return []
    out = []
    for position, bus in enumerate(buses):
        fields: dict[str, str] = {}
        try:
            with open(os.path.join(root, bus, "information"), encoding="utf-8", errors="replace") as stream:
                for line in stream:
                    key, sep, value = line.partition(":")
                    if sep:
                        fields[key.strip()] = value.strip()
        except OSError:
            continue
        out.append((bus.lower(), Gpu(str(position), fields.get("GPU UUID", "")), fields))
    return out


def driver_gpus(procfs: str) -> tuple[dict[str, Gpu], dict[str, Gpu]]:
    """This host's GPUs as the NVIDIA driver lists them in procfs: by device minor number, and by UUID."""
    by_minor: dict[str, Gpu] = {}
    by_uuid: dict[str, Gpu] = {}
    for _, gpu, fields in _driver_gpus(procfs):
        if fields.get("Device Minor", "").isdigit():
            by_minor[fields["Device Minor"]] = gpu
        if gpu.uuid:
            by_uuid[gpu.uuid] = gpu
    return by_minor, by_uuid


def driver_gpus_by_bus(procfs: str) -> dict[str, Gpu]:
    """This host's GPUs by PCI bus id (`0000:18:00.0`, lower case), as the driver lists them: a GPU that fell off
    the bus keeps its entry, so it can still be named."""
    return {bus: gpu for bus, gpu, _ in _driver_gpus(procfs)}


def job_pids(cgroup_root: str) -> dict[int, str]:
    """Every process in a batch job's cgroup, with its job id."""
    pids: dict[int, str] = {}
    base_depth = cgroup_root.rstrip(os.sep).count(os.sep)
    for directory, subdirectories, _ in os.walk(cgroup_root):  # symlinks (v1's cpu -> cpu,cpuacct) not followed
        job = job_of_cgroup(directory)
        if job is None:
            if directory.count(os.sep) - base_depth >= MAX_CGROUP_DEPTH:
                subdirectories.clear()
            continue
        subdirectories.clear()  # the job's own tree is read below, once
        for inner, _, files in os.walk(directory):
            if "cgroup.procs" not in files:
                continue
            try:
                with open(os.path.join(inner, "cgroup.procs"), encoding="ascii", errors="replace") as stream:
                    for line in stream:
                        if line.strip().isdigit():
                            pids.setdefault(int(line), job)
            except OSError:
                continue  # the step ended while being read
    return pids


class JobOfProcess:
    """The batch job a process runs in ("" for none), from the cgroup tree under `cgroup_root`. The tree is read
    again only when asked about a process it did not hold, and at most every `refresh_seconds`: a new runtime is
    placed within that time, and a node without jobs costs one walk per period, not one per question."""

    def __init__(
        self, cgroup_root: str, refresh_seconds: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cgroup_root = cgroup_root
        self.refresh_seconds = refresh_seconds
        self._clock = clock
        self._pids: dict[int, str] = {}
        self._read_at: float | None = None

    def __call__(self, pid: int) -> str:
        now = self._clock()
        if pid not in self._pids and (self._read_at is None or now - self._read_at >= self.refresh_seconds):
            self._pids = job_pids(self.cgroup_root)
            self._read_at = now
        return self._pids.get(pid, "")


def _clean(value: str) -> str:
    return "".join(c for c in value if c.isprintable())[:MAX_VALUE]


def read_record(path: str) -> tuple[dict[str, str], int]:
    """A job record's known keys, and how many lines were malformed; OSError if it is gone."""
    with open(path, encoding="utf-8", errors="replace") as stream:
        text = stream.read(MAX_RECORD_BYTES)
    record: dict[str, str] = {}
    bad = 0
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not line.strip() or line.startswith("#"):
            continue
        if not sep or key.strip() not in KEYS:
            bad += 1
            continue
        record[key.strip()] = _clean(value.strip())
    return record, bad


def record_names(state_dir: str) -> list[str]:
    """The records in the state directory (a name starting with a dot is one being written)."""
    try:
        return sorted(n for n in os.listdir(state_dir) if not n.startswith("."))
    except OSError:
        return []


def oar_record_names(runtime_dir: str) -> list[str]:
    """OAR's per-job files on this node (`<user>_<job id>.env`); none where OAR is not read."""
    if not runtime_dir:
        return []
    try:
        return sorted(name for name in os.listdir(runtime_dir) if OAR_ENV_FILE.match(name))
    except OSError:
        return []


def read_oar_record(runtime_dir: str, name: str, node: str, gpu_property: str) -> tuple[dict[str, str], int]:
    """An OAR job's record on this node, in the keys of a Slurm one, from OAR's own files (module docstring), and
    how many of their lines were malformed; OSError if the job ended meanwhile (OAR removed its files)."""
    match = OAR_ENV_FILE.match(name)
    if match is None:
        return {}, 1
    job = match.group("job")
    with open(os.path.join(runtime_dir, name), encoding="utf-8", errors="replace") as stream:
        lines = stream.read(MAX_RECORD_BYTES).splitlines()
    env: dict[str, str] = {}
    for found in filter(None, map(OAR_ENV_LINE.match, lines)):
        env[found.group(1)] = found.group(2)
    if env.get("OAR_JOBID") != job:
        return {}, 1  # not the file OAR writes for this job
    bad = 0
    gpus: list[str] = []
    try:
        with open(os.path.join(runtime_dir, job + "_resources"), encoding="utf-8", errors="replace") as stream:
            for line in stream:  # one line per resource of the job, on every node: a large job's file is large
                if not line.strip():
                    continue
                properties = dict(OAR_PROPERTY.findall(line)) if len(line) <= MAX_RECORD_BYTES else {}
                if "network_address" not in properties:
                    bad += 1
                    continue
                if properties.get("type", "default") != "default" or _short(properties["network_address"]) != node:
                    continue
                gpu = properties.get(gpu_property, "")
                if gpu and gpu not in gpus:
                    gpus.append(gpu)
    except FileNotFoundError:
        pass  # OAR writes it before the .env and removes it after: a job without it has no GPUs to name
    record = {
        "scheduler": "oar",
        "job_id": job,
        "user": _clean(env.get("OAR_USER", match.group("user"))),
        "account": _clean(env.get("OAR_PROJECT_NAME", "")),
        "gpus": _clean(",".join(gpus)),
    }
    return record, bad


def _oar_job(name: str) -> str:
    """The job id in the name of OAR's `<user>_<job id>.env`."""
    match = OAR_ENV_FILE.match(name)
    return match.group("job") if match else ""


def _short(host: str) -> str:
    return host.split(".")[0].lower()


class OarJobs:
    """OAR's jobs on this node, from the files OAR keeps for each (module docstring). A file is parsed again only
    when it changed, so its malformed lines are counted once and a large job's resource list is not re-read."""

    def __init__(self, runtime_dir: str, node_name: str = "", gpu_property: str = "gpudevice") -> None:
        self.runtime_dir = runtime_dir
        self.node = _short(node_name or socket.gethostname())
        self.gpu_property = gpu_property
        self.malformed = 0
        self._parsed: dict[str, tuple[tuple[int, ...], dict[str, str]]] = {}  # name -> (files' versions, record)

    def records(self) -> list[dict[str, str]]:
        records = []
        parsed = {}
        for name in oar_record_names(self.runtime_dir):
            path = os.path.join(self.runtime_dir, name)
            resources = os.path.join(self.runtime_dir, _oar_job(name) + "_resources")
            try:
                version = _version(path) + _version(resources)
                if name in self._parsed and self._parsed[name][0] == version:
                    record = self._parsed[name][1]
                else:
                    record, bad = read_oar_record(self.runtime_dir, name, self.node, self.gpu_property)
                    if bad:
                        self.malformed += bad
                        log.warning("OAR job files %s: %d malformed line(s) skipped", path, bad)
            except OSError:
                continue  # the job ended while being read
            parsed[name] = (version, record)
            if record:
                records.append(record)
        self._parsed = parsed
        return records


def _version(path: str) -> tuple[int, ...]:
    """A file's (mtime, size), or () for a file that is not there."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return ()
    return (status.st_mtime_ns, status.st_size)


def recorded_job_ids(state_dir: str, oar_runtime_dir: str = "") -> set[str]:
    """The ids of the jobs with a record (Slurm's prolog's, or OAR's own): what bounds every per-job series."""
    ids = {_oar_job(name) for name in oar_record_names(oar_runtime_dir)}
    for name in record_names(state_dir):
        try:
            job = read_record(os.path.join(state_dir, name))[0].get("job_id", "")
        except OSError:
            continue
        if job.isdigit():
            ids.add(job)
    return ids


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
                    gpu = Gpu(self._nvml_indices[token], token)
                elif UUID.match(token) and token.startswith("MIG-"):
                    gpu = Gpu("", token)  # a MIG instance (the driver lists GPUs only): joined by its own UUID
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


def has_job_records(paths: Paths, options: dict[str, object]) -> bool:
    """Whether this host keeps job records: accelmon's state directory (made by the role for Slurm) or OAR's."""
    return os.path.isdir(str(options["state_dir"])) or (
        bool(options["oar_runtime_dir"]) and os.path.isdir(str(options["oar_runtime_dir"]))
    )


register(
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
    )
)
