"""NCCL Inspector's bandwidth by job, communicator, rank and GPU: a slow link shows as the ranks whose bus bandwidth
falls below their communicator's others' (docs/jobs.md, "NCCL Inspector").

Example exposition line::

    accelmon_nccl_bus_bandwidth_bytes_per_second{job_id="4242",communicator="0xd152c00f111816",rank="4",
        collective="AllReduce",gpu="4",uuid="GPU-2d3e..."} 3.71e+11

NCCL Inspector (NVIDIA/nccl ext-profiler/inspector, NCCL 2.29+; a profiler plugin the job loads) in its Prometheus
mode (`NCCL_INSPECTOR_PROM_DUMP=1`) rewrites, every `NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS` (30 s at
least), one file per GPU, `<NCCL_INSPECTOR_DUMP_DIR>/nccl_inspector_metrics_<GPU UUID>.prom`, holding for each of
the GPU's communicators that completed a collective since the last dump its latest one: `nccl_bus_bandwidth_gbs`,
`nccl_algorithm_bandwidth_gbs` (GB: 10^9 bytes, inspectorComputeCollBw) and
`nccl_collective_exec_time_microseconds`, labelled with the communicator (`comm_id`), `rank`, `slurm_job_id`,
`collective`, `message_size` (1024-based, "2.00GB") and free text (hostname, timestamp, the collective's sequence
number). This reads `dump_dir`'s files and those one directory down (a directory per job, named by its id, which
accelmon's prolog makes for the job's user and its TaskProlog points NCCL_INSPECTOR_DUMP_DIR at: the directory's name
is the job id served), and serves them in base units with bounded labels only: job id, communicator, rank,
collective (one of NCCL's), and the GPU's NVML index and UUID (from the file's name, through the driver's procfs).
A file older than `max_age_seconds` is a finished or stopped job's and is left out. A line that is not Inspector's,
a file over MAX_FILE_BYTES and lines past `max_communicators` a file are skipped and counted.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Callable, Optional

from prometheus_client.parser import text_string_to_metric_families

from accelmon.metrics import Catalogue, Samples
from accelmon.nvidia import driver_gpus
from accelmon.registry import Option, Registration, register, seconds
from accelmon.runtime import Collector

log = logging.getLogger("accelmon.nccl_inspector")

FILE = re.compile(r"^nccl_inspector_metrics_([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.prom$")
MAX_FILE_BYTES = 1 << 20  # 3 lines of about 400 bytes a communicator: hundreds of communicators a GPU
COLLECTIVES = ("AllGather", "AllReduce", "Broadcast", "Recv", "Reduce", "ReduceScatter", "SendRecv", "Send")
SIZE = re.compile(r"^(\d+(?:\.\d+)?)(B|KB|MB|GB|TB)$")
UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}  # inspectorFormatHumanReadableSize
LABELS = ["job_id", "communicator", "rank", "collective", "gpu", "uuid"]

C = Catalogue(
    "nccl_inspector",
    "NCCL Inspector's per-collective bandwidth (its Prometheus files)",
    "Source: NCCL Inspector's Prometheus files (NCCL 2.29+ profiler plugin, `NCCL_INSPECTOR_PROM_DUMP=1`) in "
    "dump_dir: each GPU's communicators' latest completed collective, rewritten every 30 s or more by the job; "
    "docs/jobs.md. Job series carry `job_id` only: join `accelmon_gpu_job_info` for user and account.",
)
BUS_BANDWIDTH = C.gauge(
    "accelmon_nccl_bus_bandwidth_bytes_per_second",
    "Bus bandwidth of the rank's latest completed collective in the communicator (NCCL's busBw: comparable across "
    "collectives and sizes of communicator). A rank far below its communicator's others sits behind a slow link.",
    LABELS,
)
ALGORITHM_BANDWIDTH = C.gauge(
    "accelmon_nccl_algorithm_bandwidth_bytes_per_second",
    "Algorithm bandwidth (bytes of the operation over its time) of the rank's latest completed collective.",
    LABELS,
)
DURATION = C.gauge(
    "accelmon_nccl_collective_duration_seconds",
    "How long the rank's latest completed collective in the communicator ran (its kernels: by the GPU's clock where "
    "Inspector has it).",
    LABELS,
)
MESSAGE = C.gauge(
    "accelmon_nccl_collective_message_bytes",
    "Message size of the rank's latest completed collective (as Inspector rounds it: 3 significant digits).",
    LABELS,
)
FILES = C.gauge(
    "accelmon_nccl_inspector_files",
    "Inspector files found, by state: fresh (read), stale (older than max_age_seconds: left out).",
    ["state"],
)
SKIPPED = C.counter(
    "accelmon_nccl_inspector_skipped_lines_total",
    "Lines skipped since start: not Inspector's (malformed, an unknown metric or collective), past max_communicators "
    "in a file, or of a file over its size cap.",
    (),
)

DUMP_DIR = Option(
    "dump_dir",
    "/var/lib/nccl-inspector",
    "where jobs' NCCL Inspector writes its Prometheus files (NCCL_INSPECTOR_DUMP_DIR), or its parent with a "
    "directory per job",
)
MAX_AGE = seconds("max_age_seconds", 120.0, "a file older than this is a finished job's and is left out")
MAX_COMMUNICATORS = Option(
    "max_communicators", 64.0, "communicators served per GPU file", minimum=1, maximum=4096, whole=True
)
# Inspector's metric -> (ours, multiplier, divisor) to base units: GB/s (10^9 bytes) and microseconds.
SOURCES = {
    "nccl_bus_bandwidth_gbs": (BUS_BANDWIDTH, 1e9, 1.0),
    "nccl_algorithm_bandwidth_gbs": (ALGORITHM_BANDWIDTH, 1e9, 1.0),
    "nccl_collective_exec_time_microseconds": (DURATION, 1.0, 1e6),
}


def message_bytes(text: str) -> Optional[float]:
    found = SIZE.match(text)
    return float(found.group(1)) * UNITS[found.group(2)] if found else None


class NcclInspectorCollector(Collector):
    name = "nccl_inspector"

    def __init__(
        self, dump_dir: str, max_age: float, max_communicators: int, procfs: str,
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.dump_dir = dump_dir
        self.max_age = max_age
        self.max_communicators = max_communicators
        self.procfs = procfs
        self.clock = clock
        self.skipped = 0
        self._told: set[str] = set()

    def files(self) -> list[tuple[str, str, str]]:
        """(path, GPU UUID, job id) of every Inspector file in dump_dir and one directory down; the job id is the
        directory's name where it is a job's (accelmon's prolog makes it, for the job's user alone), else empty."""
        found = []
        try:
            entries = sorted(os.scandir(self.dump_dir), key=lambda e: e.name)
        except OSError:
            return []
        for entry in entries:
            try:
                inner = sorted(os.scandir(entry.path), key=lambda e: e.name) if entry.is_dir() else [entry]
            except OSError:
                continue  # a job's directory removed while listed
            job = entry.name if entry.is_dir() and entry.name.isdigit() else ""
            for item in inner:
                matched = FILE.match(item.name)
                if matched and item.is_file():
                    found.append((item.path, "GPU-" + matched.group(1), job))
        return found

    def sample(self) -> Samples:
        out = Samples()
        fresh = stale = 0
        files = self.files()
        by_uuid = driver_gpus(self.procfs)[1] if files else {}
        now = self.clock()
        served: set[tuple[str, ...]] = set()  # a GPU's file in two places (a job's directory and dump_dir): once
        for path, uuid, job in files:
            try:
                status = os.stat(path)
                if now - status.st_mtime > self.max_age:
                    stale += 1
                    continue
                with open(path, "rb") as stream:
                    raw = stream.read(MAX_FILE_BYTES + 1)
            except OSError:
                continue  # removed with its job's directory
            fresh += 1
            if len(raw) > MAX_FILE_BYTES:
                self._skip(path, raw.count(b"\n"), f"over {MAX_FILE_BYTES} bytes")
                continue
            gpu = by_uuid[uuid].index if uuid in by_uuid else ""
            self.read_file(out, raw.decode(errors="replace"), (job, gpu, uuid), path, served)
        self._told &= {path for path, _, _ in files}  # forget the files of ended jobs
        out.add(FILES, ("fresh",), fresh)
        out.add(FILES, ("stale",), stale)
        out.add(SKIPPED, (), self.skipped)
        return out

    def read_file(
        self, out: Samples, text: str, where: tuple[str, str, str], path: str, served: set[tuple[str, ...]]
    ) -> None:
        """Serves a GPU's file; `where` is (job id of its directory or empty, GPU index, GPU UUID): the directory's
        job id wins over what the file says (`slurm_job_id`, which the job's environment sets)."""
        directory_job, gpu, uuid = where
        communicators: set[tuple[str, str]] = set()
        bad = 0
        for line in text.splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            try:
                (family,) = text_string_to_metric_families(line + "\n")
                (sample,) = family.samples
            except ValueError:
                bad += 1
                continue
            source = SOURCES.get(sample.name)
            labels = sample.labels
            collective = labels.get("collective", "")
            rank = labels.get("rank", "")
            if source is None or collective not in COLLECTIVES or not labels.get("comm_id") or not rank.isdigit():
                bad += 1
                continue
            job = directory_job or labels.get("slurm_job_id", "")
            key = (labels["comm_id"][:32], rank[:8])
            if key not in communicators and len(communicators) >= self.max_communicators:
                bad += 1
                continue
            communicators.add(key)
            series = (job if job.isdigit() else "", key[0], key[1], collective, gpu, uuid)
            spec, multiplier, divisor = source
            if (spec.name, *series) in served:
                continue
            served.add((spec.name, *series))
            out.add(spec, series, sample.value * multiplier / divisor)
            if spec is BUS_BANDWIDTH:
                size = message_bytes(labels.get("message_size", ""))
                if size is not None:
                    out.add(MESSAGE, series, size)
        if bad:
            self._skip(path, bad, "lines that are not NCCL Inspector's, or past max_communicators")

    def _skip(self, path: str, lines: int, why: str) -> None:
        self.skipped += lines
        if path not in self._told:  # once per file: a job writing nonsense is not a log flood
            self._told.add(path)
            log.warning("NCCL Inspector file %s: %d line(s) skipped: %s", path, lines, why)


REGISTRATION = register(
    Registration(
        name="nccl_inspector",
        help="NCCL Inspector's per-collective bandwidth by job, rank and GPU from its Prometheus files (default: on "
        "where dump_dir exists)",
        build=lambda options, paths: NcclInspectorCollector(
            str(options["dump_dir"]),
            float(options["max_age_seconds"]),
            int(options["max_communicators"]),
            paths.procfs,
        ),
        catalogue=C,
        options=(
            seconds("interval_seconds", 30.0, "how often the files are read (Inspector rewrites them every 30 s)"),
            DUMP_DIR,
            MAX_AGE,
            MAX_COMMUNICATORS,
        ),
        enabled_by_default=lambda paths, options: os.path.isdir(str(options["dump_dir"])),
    )
)
