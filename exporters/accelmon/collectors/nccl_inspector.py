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

NCCL 2.30 (plugins/profiler/inspector, tests/support/inspector_corpus.py) writes another form into the same files:
what completed during the dump interval, in buckets by communicator name, size, message size range ("4-5GB") and
algorithm, each with its bus bandwidth's geometric mean and its execution time's mean, and point to point
(`nccl_p2p_*`); no communicator id, no rank, no algorithm bandwidth. Of each communicator's collective the bucket
of the largest messages is served (every rank of the communicator has it), under the communicator's name made a
bounded label value with its size (`DP_Group_0/16`) and an empty `rank`: the GPU (`gpu`, `uuid`, and the node)
names the rank's place. Its default dump interval is "at teardown only": accelmon's TaskProlog sets 30 s where the
job asks for Prometheus files and sets no interval.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import os
import re
import stat
import time
from dataclasses import dataclass
from typing import Callable, Optional, Union

from prometheus_client.parser import text_string_to_metric_families

from accelmon.exporter import job_series_budget
from accelmon.exporter.metrics import Catalogue, MetricSpec, Samples
from accelmon.exporter.registry import Option, Registration, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.host.nvidia import driver_gpus

log = logging.getLogger("accelmon.nccl_inspector")

FILE = re.compile(r"^nccl_inspector_metrics_([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.prom$")
MAX_FILE_BYTES = 1 << 20  # 3 lines of about 400 bytes a communicator: hundreds of communicators a GPU
COLLECTIVES = ("AllGather", "AllReduce", "Broadcast", "Recv", "Reduce", "ReduceScatter", "SendRecv", "Send")
SIZE = re.compile(r"^(\d+(?:\.\d+)?)(B|KB|MB|GB|TB)$")
# 2.30's message_size: a range, "4-5GB" (inspectorPromFormatMessageSizeRange).
SIZE_RANGE = re.compile(r"^(\d+)-\d+(B|KB|MB|GB|TB)$")
NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/-]")
# 2.30's metrics: collectives and point-to-point (nccl_p2p_*, with p2p_operation for collective).
V2_30 = {
    "nccl_bus_bandwidth_gbs": "collective", "nccl_collective_exec_time_microseconds": "collective",
    "nccl_p2p_bus_bandwidth_gbs": "p2p", "nccl_p2p_exec_time_microseconds": "p2p",
}  # fmt: skip
UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}  # inspectorFormatHumanReadableSize
# message_size and algorithm: what the slow-rank rule compares like with like (AccelmonNcclRankLate): the message size
# class in bytes (2.29: the size rounded down to a power of two; 2.30: its bucket's lower bound) and 2.30's algo_proto
# (2.29 names none).
LABELS = ["job_id", "communicator", "rank", "collective", "message_size", "algorithm", "gpu", "uuid"]
# Inspector times a collective by the GPU's clock where it has both of a kernel's timestamps, else silently by the
# CPU's (calculateMaxKernelExecTimeUsecs: inspectorTimingSourceKernelCpu, or the whole collective's CPU time;
# inspector.cc v2.29.3-1:1650-1679, v2.30.7-1:1551-1580), which does not show who was late. A line that says how it
# was timed (`coll_timing_source`, as its README lists for these metrics) other than kernel_gpu is skipped.
GPU_TIMING = "kernel_gpu"

C = Catalogue(
    "nccl_inspector",
    "NCCL Inspector's per-collective bandwidth (its Prometheus files)",
    "Source: NCCL Inspector's Prometheus files (NCCL 2.29+ profiler plugin, `NCCL_INSPECTOR_PROM_DUMP=1`) in "
    "dump_dir: each GPU's communicators' latest completed collective (2.29), or its means over the dump interval "
    "for the largest message size (2.30: no rank, no algorithm bandwidth), rewritten every 30 s or more by the job; "
    "docs/jobs.md. Job series carry `job_id` only: join `accelmon_gpu_job_info` for user and account.",
)
BUS_BANDWIDTH = C.gauge(
    "accelmon_nccl_bus_bandwidth_bytes_per_second",
    "Bus bandwidth of the rank's latest completed collective in the communicator (NCCL's busBw), by its message size "
    "class (bytes: 2.29's size rounded down to a power of two, 2.30's bucket's lower bound) and algorithm (2.30's "
    "algo_proto): it grows with the message size, so ranks compare only within one class. A rank far above its "
    "communicator's others reaches the collectives last (AccelmonNcclRankLate).",
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
    "Inspector files found, by state: fresh (read), stale (older than max_age_seconds: left out), unknown_gpu (named "
    "by the UUID of no GPU of this node, as the driver's procfs lists them: not read).",
    ["state"],
)
DROPPED = C.counter(
    "accelmon_nccl_inspector_series_dropped_total",
    "Series not served since start, by reason: node_budget (the node's job-level NCCL series, RAS and Inspector "
    "together, past max_job_series: the largest jobs' series dropped whole; accelmon.exporter.job_series_budget).",
    ["reason"],
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


# NCCL's message sizes are size_t: a size of 2^64 bytes or more (or an infinite one: "1e400TB" parses so) is no
# NCCL's, and its line is skipped (int() of it raised OverflowError out of the sample; a 200-digit size was a label).
MAX_MESSAGE_BYTES = float(1 << 64)


def message_bytes(text: str) -> Optional[float]:
    """Inspector's message size in bytes; None where there is none, NaN where it is none NCCL can write."""
    found = SIZE.match(text)
    if not found:
        return None
    size = float(found.group(1)) * UNITS[found.group(2)]
    return size if size < MAX_MESSAGE_BYTES else math.nan


def size_class(size: float) -> str:
    """2.29's message size as a bounded label value: rounded down to a power of two, in bytes."""
    return str(1 << (int(size).bit_length() - 1)) if size >= 1 else "0"


def communicator_of(name: str, nranks: str) -> str:
    """2.30's communicator label: the name the application gave it (free text, "DP Group 0"), as a bounded label
    value (letters, digits and ._:/- kept, anything else _, at most 32 characters; a longer or emptied name by a short
    hash), with its size: communicators without a name ("unknown") are told apart by it."""
    kept = NAME_UNSAFE.sub("_", name.strip())[:33]
    if len(kept) > 32 or not kept.strip("_"):
        kept = "name-" + hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{kept}/{nranks}"


@dataclass
class Bucket:
    """What NCCL 2.30 wrote of one (communicator, collective) in a GPU's file: of its buckets by message size range
    and algorithm, the one of the largest messages (the bandwidth a slow link shows in, and the same bucket on every
    rank of the communicator)."""

    communicator: str
    collective: str
    size: float  # the size range's lower bound, bytes
    bus: Optional[float] = None  # bytes per second: the geometric mean over the dump interval
    duration: Optional[float] = None  # seconds: the arithmetic mean
    range: tuple[str, str] = ("", "")  # (message_size, algo_proto): the bucket the values are of

    def take(self, other: Bucket) -> None:
        """Keeps the larger size range's values; a second line of the same bucket adds its metric."""
        if other.size > self.size:
            self.size, self.bus, self.duration, self.range = other.size, other.bus, other.duration, other.range
        elif other.range == self.range:
            self.bus = other.bus if other.bus is not None else self.bus
            self.duration = other.duration if other.duration is not None else self.duration


def bucket_of(metric: str, labels: dict[str, str], value: float) -> Optional[Bucket]:
    """A line of NCCL 2.30's format as a Bucket, None if it is not one (tests/support/inspector_corpus.py)."""
    kind = V2_30.get(metric)
    collective = labels.get("collective" if kind != "p2p" else "p2p_operation", "")
    found = SIZE_RANGE.match(labels.get("message_size", ""))
    nranks = labels.get("nranks", "")
    if kind is None or collective not in COLLECTIVES or not found or not nranks.isdigit():
        return None
    size = float(found.group(1)) * UNITS[found.group(2)]
    if not size < MAX_MESSAGE_BYTES:
        return None
    nodes = labels.get("n_nodes", "")
    name = communicator_of(labels.get("comm_name", ""), nranks[:8]) + (f"/{nodes[:8]}" if nodes.isdigit() else "")
    bucket = Bucket(name, collective, size, range=(labels["message_size"], labels.get("algo_proto", "")[:32]))
    if metric.endswith("_gbs"):
        bucket.bus = value * 1e9
    else:
        bucket.duration = value / 1e6
    return bucket


def read_regular(path: str, since: float) -> Union[bytes, str, None]:
    """The file's first MAX_FILE_BYTES + 1 bytes; None when it was last written before `since` (stale); why not,
    when it is no regular file. The job's directory is its user's: between the listing and this read they may put a
    FIFO there (opening one waits for a writer: the sample hung for good) or a link to a file only the exporter may
    read. So it is opened without following a link or waiting, and read only if it is a regular file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "a symbolic link: not read"
        raise
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            return "not a regular file: not read"
        if status.st_mtime < since:
            return None
        parts, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(descriptor, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        return b"".join(parts)
    finally:
        os.close(descriptor)


class NcclInspectorCollector(Collector):
    name = "nccl_inspector"

    def __init__(
        self, dump_dir: str, max_age: float, max_communicators: int, procfs: str,
        clock: Callable[[], float] = time.time, max_job_series: int = job_series_budget.DEFAULT,
        ledger: Optional[job_series_budget.Ledger] = None,
    ) -> None:  # fmt: skip
        self.max_job_series = max_job_series
        self.ledger = ledger if ledger is not None else job_series_budget.Ledger()  # the exporter passes its LEDGER
        self.dropped = 0  # series, since start (node_budget)
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
        out, read = Samples(), Samples()
        fresh = stale = 0
        files = self.files()
        by_uuid = driver_gpus(self.procfs)[1] if files else {}
        now = self.clock()
        served: set[tuple[str, ...]] = set()  # a GPU's file in two places (a job's directory and dump_dir): once
        unknown = 0
        for path, uuid, job in files:
            if uuid not in by_uuid:  # a name the job's user chose: no label of it, nothing read
                unknown += 1
                continue
            try:
                raw = read_regular(path, now - self.max_age)
            except OSError:
                continue  # removed with its job's directory
            if raw is None:
                stale += 1
                continue
            if isinstance(raw, str):
                self._skip(path, 0, raw)
                continue
            fresh += 1
            if len(raw) > MAX_FILE_BYTES:
                self._skip(path, raw.count(b"\n"), f"over {MAX_FILE_BYTES} bytes")
                continue
            gpu = by_uuid[uuid].index
            self.read_file(read, raw.decode(errors="replace"), (job, gpu, uuid), path, served)
        self._told &= {path for path, _, _ in files}  # forget the files of ended jobs
        # Every series here is a job's detail (its first label the job id): fitted with the nccl collector's in the
        # node's max_job_series, the largest jobs' dropped whole (accelmon.exporter.job_series_budget).
        jobs: dict[str, tuple[Samples, Samples]] = {}
        for spec, rows in read.rows.items():
            for values, value in rows:
                jobs.setdefault(values[0], (Samples(), Samples()))[1].add(spec, values, value)
        kept, dropped, _ = self.ledger.fit(self.name, self.max_job_series, jobs)
        out.extend(kept)
        self.dropped += dropped
        out.add(DROPPED, ("node_budget",), self.dropped)
        out.add(FILES, ("fresh",), fresh)
        out.add(FILES, ("stale",), stale)
        out.add(FILES, ("unknown_gpu",), unknown)
        out.add(SKIPPED, (), self.skipped)
        return out

    def read_file(
        self, out: Samples, text: str, where: tuple[str, str, str], path: str, served: set[tuple[str, ...]]
    ) -> None:
        """Serves a GPU's file; `where` is (job id of its directory or empty, GPU index, GPU UUID): the directory's
        job id wins over what the file says (`slurm_job_id`, which the job's environment sets)."""
        directory_job, gpu, uuid = where
        communicators: set[tuple[str, str]] = set()
        # 2.30's, by (job, communicator, collective, algorithm): the largest messages' bucket
        buckets: dict[tuple[str, str, str, str], Bucket] = {}
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
            labels = sample.labels
            job = directory_job or labels.get("slurm_job_id", "")
            job = job if job.isdigit() and len(job) <= 20 else ""
            if "comm_name" in labels:  # NCCL 2.30: buckets of the dump interval, no communicator id, no rank
                found = bucket_of(sample.name, labels, sample.value)
                if found is None:
                    bad += 1
                    continue
                key = (found.communicator, "")
                if key not in communicators and len(communicators) >= self.max_communicators:
                    bad += 1
                    continue
                communicators.add(key)
                slot = (job, found.communicator, found.collective, found.range[1])
                chosen = buckets.get(slot)
                if chosen is None:
                    buckets[slot] = found
                else:
                    chosen.take(found)
                continue
            source = SOURCES.get(sample.name)
            collective = labels.get("collective", "")
            rank = labels.get("rank", "")
            timed = labels.get("coll_timing_source", GPU_TIMING)
            if source is None or collective not in COLLECTIVES or not labels.get("comm_id") or not rank.isdigit():
                bad += 1
                continue
            if timed != GPU_TIMING:
                bad += 1  # timed by the CPU: not who was late
                continue
            key = (labels["comm_id"][:32], rank[:8])
            if key not in communicators and len(communicators) >= self.max_communicators:
                bad += 1
                continue
            communicators.add(key)
            size = message_bytes(labels.get("message_size", ""))
            if size is not None and math.isnan(size):
                bad += 1
                continue
            series = (job, key[0], key[1], collective, size_class(size) if size is not None else "", "", gpu, uuid)
            spec, multiplier, divisor = source
            self._serve(out, served, spec, series, sample.value * multiplier / divisor)
            if spec is BUS_BANDWIDTH and size is not None:
                self._serve(out, served, MESSAGE, series, size)
        for (job, communicator, collective, algorithm), bucket in buckets.items():
            series = (job, communicator, "", collective, str(int(bucket.size)), algorithm, gpu, uuid)
            for spec, value in ((BUS_BANDWIDTH, bucket.bus), (DURATION, bucket.duration), (MESSAGE, bucket.size)):
                if value is not None:
                    self._serve(out, served, spec, series, value)
        if bad:
            self._skip(path, bad, "lines that are not NCCL Inspector's, or past max_communicators")

    @staticmethod
    def _serve(
        out: Samples, served: set[tuple[str, ...]], spec: MetricSpec, series: tuple[str, ...], value: float
    ) -> None:
        if (spec.name, *series) not in served:
            served.add((spec.name, *series))
            out.add(spec, series, value)

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
            max_job_series=int(options["max_job_series"]),
            ledger=job_series_budget.LEDGER,
        ),
        catalogue=C,
        options=(
            seconds("interval_seconds", 30.0, "how often the files are read (Inspector rewrites them every 30 s)"),
            DUMP_DIR,
            MAX_AGE,
            MAX_COMMUNICATORS,
            job_series_budget.MAX_JOB_SERIES,
        ),
        enabled_by_default=lambda paths, options: os.path.isdir(str(options["dump_dir"])),
    )
)
