"""NCCL's own view of each job on this node (its RAS socket, NCCL 2.24+): which communicators answer, which ranks
are missing or dead, and which ranks stand behind on their collective count while the others move on: the rank a
hung job waits for (docs/jobs.md, "NCCL RAS").

Example exposition lines::

    accelmon_nccl_communicator_ranks{job_id="4242",communicator="0xae94423cfbb2ef4a",state="missing"} 1.0
    accelmon_nccl_rank_missing{job_id="4242",communicator="0xae94...",rank="21",host="10.0.0.13",pid="3487984",
        nvml_dev="5",uuid="",dead="true"} 1.0

Which sockets: each job record of this node (the jobs collector's `state_dir`) that carries `nccl_ras_port` (the
role's prolog chooses a port no other job of the node holds and records it, its TaskProlog gives the job
NCCL_RAS_ADDR=localhost:PORT; a job that set its own has its port in `nccl-ras/JOB.own` beside `state_dir`), and the
`addresses` always asked. A job's port is asked only while a socket of the job's user listens on it here (its NCCL
runs on this node), by the node that keeps asking for the step: the lowest address among the hosts RAS names for
its ranks, else the job's first node (`nccl_ras_query=1`); every node asks once when the step starts listening on
it, and again every RECHECK_ROUNDS intervals or more for a large job (RAS gathers from every process of the job
at each query: one asker per step). Each query is in the form sized to the job (JSON, the verbose or the short
text: NCCL makes the whole answer on its one RAS thread before sending it), bounded by `timeout_seconds` and
MAX_ANSWER_BYTES; a query past its deadline is awaited before the job is asked again. Every query's result is counted
(`accelmon_nccl_queries_total{result}`); `refused` (a socket seen listening that refuses) is an error. A job's port
is asked, and its answer believed, only while every socket listening on it is the job's user's (procfs's net/tcp
uid against the record's `uid`; accelmon.host.tcp_sockets): another user's is `foreign_socket`.
Series are summaries plus outliers: per communicator (at most `max_communicators` an answer, the
most troubled; the rest counted) its size and ranks answering and missing, its status and highest collective
count; per rank only the missing or dead ones and those behind, at most `max_ranks` of each per communicator. A
rank on this node (its host one of this node's addresses) carries its GPU's UUID. The job's user and account come
from joining `accelmon_gpu_job_info` on `job_id`: no label here. The node's job series, with Inspector's, fit in
`max_job_series` (accelmon.exporter.job_series_budget): each job's summary always, the largest jobs' detail
dropped first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import time
from collections import Counter
from dataclasses import dataclass
from typing import Optional, Protocol

from accelmon.exporter import job_series_budget
from accelmon.exporter.metrics import Catalogue, MetricSpec, Samples
from accelmon.exporter.registry import Option, Paths, Registration, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.host import nccl_ras
from accelmon.host.nccl_ras import JobStatus, Pending, Rank, RasError
from accelmon.host.nccl_ras_client import asked_address, is_local, local_addresses, parse_address
from accelmon.host.nvidia import NVML_DEVICES, NvmlSession
from accelmon.host.tcp_sockets import listening_sockets, listening_uids
from accelmon.job_sources import has_job_records
from accelmon.job_sources.slurm import STATE_DIR, read_record, record_names

log = logging.getLogger("accelmon.nccl")

# A rank is about 535 bytes of JSON in each of its communicators: a 4,096-rank job with one communicator answers about
# 2 MiB, a 16k-rank job with six about 50 MiB, too much to parse in an exporter's memory. Past this, the text form
# (only the ranks that stand out) is asked instead (accelmon.host.nccl_ras.ask). JSON is asked only where expected under
# JSON_FAST_BYTES (4 MiB), so 8 MiB leaves it room to grow twofold; what a job's socket sends up to the cap is built
# into objects (as much as 7 times its size, in the worst case nccl_ras allows), within the unit's MemoryMax=256M.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
RESULTS = ("ok", "refused", "timeout", "cut_short", "malformed", "protocol", "too_large", "foreign_socket",
           "owner_unknown", "pending", "deferred")  # fmt: skip
# The form each job is asked in (accelmon.host.nccl_ras_client.FORMS), from its latest answer: NCCL makes an answer
# whole before sending it, in a buffer grown 4 KiB at a time (quadratic: 9 MB took 4.6 s, 18.5 MB 19.1 s with its format
# strings), on the job's one RAS thread. JSON while it is expected under JSON_FAST_BYTES (about a second), the verbose
# text up to VERBOSE_RANKS rank places, else the short text (a few KiB at any size). A job not answered yet is asked
# the short form first, which sizes it, and then, in the same interval, JSON if it is small.
JSON_FAST_BYTES = 4 << 20
RANK_JSON_BYTES = 535  # a rank in one communicator, in JSON (tests/support/ras_corpus.py renders NCCL's strings)
VERBOSE_RANKS = 8192
PENDING_SECONDS = 600  # a query NCCL has not answered in this long is given up (the connection closed)
# Which node asks a step (docs/jobs.md, "Which socket, which node asks"): only where a socket of the job's user listens
# on the step's port (its NCCL runs here); the node of the lowest address among the hosts RAS names for its ranks
# (every node reads the same global view), else the job's first node; every node asks once when the step starts
# listening on it (the first node at once, the others spread over SPREAD_ROUNDS intervals), and again every
# RECHECK_ROUNDS intervals, so that a step no asker reads is found.
SPREAD_ROUNDS = 10
# ... or, in a job of more nodes (the prolog's nccl_ras_nodes), over its node count / SPREAD_NODES intervals: a step
# of 2,000 nodes starting was asked 200 times an interval for its first 10 (each a collection from every process).
SPREAD_NODES = 10
RECHECK_ROUNDS = 60
# ... or, where the job's answer says how many nodes it runs on, that many times RECHECK_NODE_ROUNDS: every asking node
# makes RAS gather every rank's data to it, from every process of the job, so a 2,000-node job's nodes rechecking
# every 60 intervals made 33 full collections an interval; now about half one job-wide.
RECHECK_NODE_ROUNDS = 2
RANK_LABELS = ["job_id", "communicator", "rank", "host", "pid", "nvml_dev", "uuid"]

C = Catalogue(
    "nccl",
    "NCCL's view of running jobs (RAS)",
    "Source: each NCCL job's RAS socket on this node (NCCL 2.24+; JSON from 2.28.7, else the text answer's Errors "
    "and Warnings), asked every interval_seconds by one node of the job; docs/jobs.md. Job series carry `job_id` "
    "only: join `accelmon_gpu_job_info` for user and account.",
)
COMM_SIZE = C.gauge(
    "accelmon_nccl_communicator_size", "Ranks of the communicator (its size).", ["job_id", "communicator"]
)
COMM_RANKS = C.gauge(
    "accelmon_nccl_communicator_ranks",
    "Ranks of the communicator that answered RAS (state answering), that could not be reached (missing), and whose "
    "process answered without this communicator (left: destroyed there; served only when some are).",
    ["job_id", "communicator", "state"],
)
COMM_STATUS = C.gauge(
    "accelmon_nccl_communicator_status",
    "The communicator's status, value 1: ok, init (a rank still initialising), mismatch (ranks at different "
    "collective counts, or ranks that left it), incomplete (ranks missing), error (a rank's NCCL error or abort; "
    "ncclInProgress is none).",
    ["job_id", "communicator", "status"],
)
COMM_COLLECTIVES = C.gauge(
    "accelmon_nccl_communicator_collectives_max",
    "The highest count of collective operations any rank of the communicator launched (all kinds): a hung "
    "communicator's stands still.",
    ["job_id", "communicator"],
)
RANK_MISSING = C.gauge(
    "accelmon_nccl_rank_missing",
    "A rank that did not answer RAS (dead: unreachable for 60 s, RAS considers its process dead), with its host, "
    "process and GPU (NVML index; UUID where it runs on this node); value is 1. At most max_ranks a communicator.",
    [*RANK_LABELS, "dead"],
)
RANK_BEHIND = C.gauge(
    "accelmon_nccl_rank_collectives_behind",
    "A rank whose collective count stands below its communicator's highest: by how many operations (of one kind, "
    "the kind it is furthest behind on, where RAS counts by kind). The rank the others wait for when it stays so. "
    "At most max_ranks a communicator, the furthest behind first.",
    RANK_LABELS,
)
RANK_COLLECTIVES = C.gauge(
    "accelmon_nccl_rank_collectives",
    "The collective operations a rank that stands behind has launched (all kinds): stands still while it is stuck.",
    RANK_LABELS,
)
DEAD_PROCESS = C.gauge(
    "accelmon_nccl_process_dead",
    "A process of the job RAS considers dead (NCCL's text answer names processes, not ranks); value is 1.",
    ["job_id", "host", "pid", "nvml_dev", "uuid"],
)
QUERIES = C.counter(
    "accelmon_nccl_queries_total",
    "RAS queries by result: ok; refused (a socket of the job was seen listening and refused the connection), "
    "timeout (no answer within timeout_seconds), cut_short, malformed, protocol (not a RAS server, or a protocol "
    "version this does not read), too_large (an answer over the cap, late ones included): errors; pending (an "
    "interval the job was not asked: NCCL is still making the answer to the query that timed out); deferred (an "
    "interval the job was not asked: the interval's queries had taken timeout_seconds, and its latest query was not "
    "answered); "
    "foreign_socket (a socket of another user than the job's listens on the job's port: its answer is not "
    "believed), owner_unknown (the job's user, or who listens on its port, cannot be told: not believed).",
    ["result"],
)
COLLECTION_TIMEOUTS = C.gauge(
    "accelmon_nccl_collection_timeouts",
    "Legs of RAS's own collection that timed out while it gathered the job's latest answer (NCCL's timeouts_count, "
    "or its text's TIMEOUT warning): ranks it then names missing but not dead may be slow to answer, not gone.",
    ["job_id"],
)
COMM_DROPPED = C.gauge(
    "accelmon_nccl_communicators_dropped",
    "Communicators of the job's latest RAS answer not served: past max_communicators (the most troubled, then the "
    "largest, are served).",
    ["job_id"],
)
GARBLED = C.gauge(
    "accelmon_nccl_communicators_garbled",
    "Communicators NCCL made up in the job's latest RAS answer, not served, by reason: missing_rank_walk (NCCL "
    "2.26.2-2.28.9's text answer after a communicator with a missing rank: as many real ones were never read).",
    ["job_id", "reason"],
)
DRILL_ACTIVE = C.gauge(
    "accelmon_nccl_drill_active",
    "1 while the job's RAS answer is a drill's (accelmon-drill nccl), not NCCL's: its missing rank is no real fault.",
    ["job_id"],
)
JOB_COMMUNICATORS = C.gauge(
    "accelmon_nccl_job_communicators",
    "The job's communicators in its latest RAS answers (every step's), by status (as "
    "accelmon_nccl_communicator_status; only those some have): the job's summary, served even where the node's "
    "max_job_series drops its per-communicator series.",
    ["job_id", "status"],
)
JOB_RANKS_MISSING = C.gauge(
    "accelmon_nccl_job_ranks_missing",
    "The most ranks missing from one communicator of the job in its latest RAS answers (0: none): the job's summary, "
    "served even where max_job_series drops its per-rank series.",
    ["job_id"],
)
SERIES_DROPPED = C.counter(
    "accelmon_nccl_series_dropped_total",
    "Job series not served since start, by reason: node_budget (the node's job-level NCCL series, RAS and Inspector "
    "together, past max_job_series: the largest jobs' per-communicator and per-rank series dropped, their summary "
    "kept).",
    ["reason"],
)
JOBS_CUT = C.gauge(
    "accelmon_nccl_jobs_detail_dropped",
    "Jobs whose per-communicator and per-rank RAS series were dropped at the latest interval (max_job_series).",
    (),
)
JOBS_ASKED = C.gauge(
    "accelmon_nccl_jobs_asked", "RAS sockets asked at the latest interval (this node's share of the jobs).", ()
)

ADDRESSES = Option(
    "addresses",
    "",
    "RAS sockets always asked besides the jobs' own (HOST:PORT, space separated; e.g. localhost:28028, NCCL's "
    "default, where jobs do not get a port of their own): counted for the node's only job, if it has one",
    empty=True,
    several=True,
)
TIMEOUT = Option(
    "timeout_seconds",
    20.0,
    "how long one RAS query may take, connection to last byte; RAS is sent a TIMEOUT that leaves room for its one "
    "collection's 5 s x ras_timeout_factor more and 2 s: 8 s at least",
    minimum=8,
)
TIMEOUT_FACTOR = Option(
    "ras_timeout_factor", 1.0,
    "the NCCL_RAS_TIMEOUT_FACTOR the jobs run with (NCCL's default 1): RAS waits that many times longer, and is "
    "sent a shorter TIMEOUT to end within timeout_seconds", minimum=1, maximum=100, whole=True,
)  # fmt: skip
MAX_RANKS = Option(
    "max_ranks", 8.0, "ranks served per communicator, of each kind (missing, behind)", minimum=1, maximum=1024,
    whole=True,
)  # fmt: skip
MAX_COMMUNICATORS = Option(
    "max_communicators", float(nccl_ras.MAX_COMMUNICATORS),
    "communicators served per RAS answer (the most troubled first; the rest counted in "
    "accelmon_nccl_communicators_dropped)", minimum=1, maximum=4096, whole=True,
)  # fmt: skip


class Ask(Protocol):
    def __call__(
        self, host: str, port: int, timeout: float, max_bytes: int, *, want: str, factor: int, keep: bool
    ) -> tuple[str, str]: ...


@dataclass
class Seen:
    """What this node knows of one RAS socket (job, host, port) from its answers."""

    since: int  # the round its socket was first seen listening
    ranks: Optional[int] = None  # rank places of its latest answer's communicators
    json_bytes: Optional[int] = None  # its latest JSON answer's size, or a late one's
    lowest: Optional[str] = None  # the lowest host RAS named ("" none: a text answer); None: never answered here
    nodes: int = 0  # the job's nodes, as its latest answer said (0: not said)
    asked: int = -1  # the round of its latest query
    pending: Optional[Pending] = None  # a query past its deadline NCCL has not answered yet
    answered: bool = False  # its latest query was answered


def form_for(seen: Seen) -> str:
    """The form to ask a job in (accelmon.host.nccl_ras_client.FORMS), from its latest answer."""
    if seen.ranks is None and seen.json_bytes is None:
        return "short"  # not sized yet: the form that is small at any size
    expected = seen.json_bytes if seen.json_bytes is not None else (seen.ranks or 0) * RANK_JSON_BYTES
    if expected <= JSON_FAST_BYTES:
        return "json"
    return "verbose" if seen.ranks is not None and seen.ranks <= VERBOSE_RANKS else "short"


def ports_of(record: dict[str, str]) -> list[int]:
    """The RAS ports the prolog recorded for a job: `nccl_ras_port` and the `nccl_ras_ports` after it (a block, one
    port a step; 1 in records written before blocks)."""
    first, count = record.get("nccl_ras_port", ""), record.get("nccl_ras_ports", "1")
    if not first.isdigit():
        return []
    return [int(first) + step for step in range(int(count) if count.isdigit() and 0 < int(count) <= 64 else 1)]


def job_uid(record: dict[str, str]) -> Optional[int]:
    """The uid of the job's user: the prolog's `uid` (SLURM_JOB_UID), else its `user` looked up (NSS)."""
    if record.get("uid", "").isdigit():
        return int(record["uid"])
    try:
        return pwd.getpwnam(record["user"]).pw_uid if record.get("user") else None
    except KeyError:
        return None


class NcclCollector(Collector):
    name = "nccl"

    def __init__(
        self, state_dir: str, addresses: str, timeout: float, max_ranks: int, procfs: str,
        nvml: Optional[NvmlSession] = None, asker: Ask = nccl_ras.ask,
        max_communicators: int = nccl_ras.MAX_COMMUNICATORS, factor: int = 1, max_bytes: int = MAX_ANSWER_BYTES,
        max_job_series: int = job_series_budget.DEFAULT, ledger: Optional[job_series_budget.Ledger] = None,
    ) -> None:  # fmt: skip
        self.max_job_series = max_job_series
        self.ledger = (
            ledger if ledger is not None else job_series_budget.Ledger()
        )  # the exporter's: job_series_budget.LEDGER
        self.dropped = 0  # series, since start (node_budget)
        self.state_dir = state_dir
        self.max_bytes = max_bytes
        self.seen: dict[tuple[str, str, int], Seen] = {}
        self.first: set[str] = set()  # jobs whose first node this is (the prolog's nccl_ras_query=1)
        self.nodes: dict[str, int] = {}  # jobs' node counts (the prolog's nccl_ras_nodes), where more than one
        self.rounds = 0
        self.factor = factor
        self.max_communicators = max_communicators
        self.owners: dict[str, Optional[int]] = {}  # job -> its user's uid, from targets()
        self.addresses = [parse_address(a) for a in addresses.split()]
        self.timeout = timeout
        self.max_ranks = max_ranks
        self.procfs = procfs
        self.nvml = nvml
        self.asker = asker
        self.results: Counter[str] = Counter({result: 0 for result in RESULTS})
        self._told: dict[str, set[str]] = {}

    def targets(self) -> list[tuple[str, str, int]]:
        """(job id, host, port) of every RAS socket of this node: every job's own ports (whichever node this is of
        the job: `due` says whether it is asked now), then the configured addresses (counted for the node's job
        where it has exactly one)."""
        records = []
        for name in record_names(self.state_dir):
            try:
                records.append(read_record(os.path.join(self.state_dir, name))[0])
            except OSError:
                continue  # the job ended between the listing and the read
        records = [r for r in records if r.get("job_id")]
        self.owners = {r["job_id"]: job_uid(r) for r in records}
        self.first = {r["job_id"] for r in records if r.get("nccl_ras_query", "1") != "0"}
        self.nodes = {
            r["job_id"]: int(r["nccl_ras_nodes"][:7]) for r in records if r.get("nccl_ras_nodes", "").isdigit()
        }
        held = {str(port) for r in records for port in ports_of(r)}
        jobs = [(r["job_id"], "localhost", port) for r in records for port in self.ports_asked(r, held)]
        owner = records[0]["job_id"] if len(records) == 1 else ""
        taken = {(host, port) for _, host, port in jobs}
        return jobs + [(owner, host, port) for host, port in self.addresses if (host, port) not in taken]

    def due(self, key: tuple[str, str, int], local: set[str]) -> bool:
        """Whether this node asks the socket this round (RECHECK_ROUNDS, SPREAD_ROUNDS): a socket nothing listens on
        here is not asked (this step's NCCL does not run here, or not yet)."""
        job, host, port = key
        holders = listening_uids(self.procfs, port) if is_local(host) else None
        if holders is not None and not holders:
            return False
        seen = self.seen.setdefault(key, Seen(self.rounds))
        if seen.pending is not None or not job:
            return True
        if seen.lowest is None:  # never answered here: the first node at once, the others spread
            spread = max(SPREAD_ROUNDS, self.nodes.get(job, 0) // SPREAD_NODES)
            phase = int(hashlib.sha256(repr((key, sorted(local))).encode()).hexdigest()[:8], 16) % spread
            return job in self.first or self.rounds >= seen.since + phase
        asker = seen.lowest in local if seen.lowest else job in self.first
        return asker or self.rounds - seen.asked >= max(RECHECK_ROUNDS, RECHECK_NODE_ROUNDS * seen.nodes)

    def ports_asked(self, record: dict[str, str], held: set[str]) -> list[int]:
        """The ports the job's NCCL listens on: the block the prolog gave it (one a step, for steps that run at
        once), or the job's own NCCL_RAS_ADDR port that the TaskProlog wrote beside it (a file the job's user may
        write: a port another job of this node holds is not taken from it, so no job is served another's answers)."""
        given = ports_of(record)
        try:
            own_file = os.path.join(os.path.dirname(self.state_dir), nccl_ras.PORTS_DIR, f"{record['job_id']}.own")
            with open(own_file) as stream:
                own = stream.read(16).strip()
        except OSError:
            own = ""
        if own.isdigit() and 0 < int(own) < 65536 and (int(own) in given or own not in held):
            # Only a port the job's user's own socket listens on (net/tcp's uid): the file is the user's to write,
            # and any port named there would otherwise be asked, its answer served as the job's.
            holders = listening_uids(self.procfs, int(own))
            uid = job_uid(record)
            if holders and uid is not None and holders == {uid}:
                return [int(own)]
        return given

    def believed(self, job: str, host: str, port: int, before: bool) -> str:
        """RasError unless every socket listening on the job's port is its user's (or root's: the drill). `before`
        the query, a port nothing listens on yet passes (the connection is refused, or checked after); after it,
        the socket that answered must be there. An answer is labelled with a job only once this passes. Returns the
        address to ask: the one the job's socket listens on (`asked_address`)."""
        if not job:
            return host  # `addresses` with no job: labelled with none
        uid = self.owners.get(job)
        if uid is None or not is_local(host):
            raise RasError("owner_unknown", f"job {job}: its user's uid, or who holds {host}:{port}, is unknown")
        sockets = listening_sockets(self.procfs, port)
        if sockets is None or (not sockets and not before):
            raise RasError("owner_unknown", f"no listening socket on port {port} in {self.procfs}/net/tcp{{,6}}")
        foreign = {owner for _, owner in sockets} - {uid, 0}
        if foreign:
            raise RasError("foreign_socket", f"port {port} is held by uid {min(foreign)}, not job {job}'s user {uid}")
        return asked_address(host, {address for address, _ in sockets})

    def uuids(self) -> dict[int, str]:
        found = self.nvml.gpus() if self.nvml is not None else None
        return {index: uuid for index, _, uuid in found or []}

    def sample(self) -> Samples:
        out = Samples()
        self.rounds += 1
        targets = self.targets()
        self._told = {job: kinds for job, kinds in self._told.items() if any(t[0] == job for t in targets)}
        for gone in set(self.seen) - set(targets):  # ended jobs: their late answers are not awaited
            pending = self.seen.pop(gone).pending
            if pending is not None:
                pending.close()
        local, uuids = (local_addresses(self.procfs), self.uuids()) if targets else (set(), {})
        asked, began = 0, time.monotonic()
        totals: dict[tuple[MetricSpec, tuple[str, ...]], int] = {}  # each job's own series, over its answers
        jobs: dict[str, tuple[Samples, Samples]] = {}  # job -> its summary, its detail (job_series_budget)
        # Jobs whose latest query was answered first, then the others by their latest query, oldest first; past one
        # timeout_seconds, only the first are asked this interval: a socket that accepts and never answers costs a
        # whole timeout (every interval: no late answer to await), and a user's many such sockets held every other
        # job's read. Each job not answered yet is asked within as many intervals as there are such jobs.
        due = sorted(
            (key for key in targets if self.due(key, local)),
            key=lambda key: (not self.seen[key].answered, self.seen[key].asked),
        )
        for key in due:
            job, host, port = key
            seen = self.seen[key]
            if not seen.answered and seen.pending is None and time.monotonic() - began > self.timeout:
                self.results["deferred"] += 1
                continue
            try:
                if not self.settled(seen):
                    continue
                asked += 1
                seen.answered = False
                status = self.query(key)
                seen.answered = True
            except RasError as error:
                self.results[error.kind] += 1
                if error.kind not in self._told.get(job, ()):
                    self._told.setdefault(job, set()).add(error.kind)  # once per job and kind: no log flood
                    log.warning("NCCL RAS of job %s at %s:%d: %s", job or "?", host, port, error)
                continue
            self.results["ok"] += 1
            self.serve(jobs.setdefault(job, (Samples(), Samples()))[1], job, status, local, uuids, totals)
        for (spec, labels), value in totals.items():
            if spec is not DRILL_ACTIVE or value:
                jobs.setdefault(labels[0], (Samples(), Samples()))[0].add(spec, labels, value)
        kept, dropped, cut = self.ledger.fit(self.name, self.max_job_series, jobs)
        out.extend(kept)
        self.dropped += dropped
        out.add(SERIES_DROPPED, ("node_budget",), self.dropped)
        out.add(JOBS_CUT, (), cut)
        out.add(JOBS_ASKED, (), asked)
        for result, count in self.results.items():
            out.add(QUERIES, (result,), count)
        return out

    def settled(self, seen: Seen) -> bool:
        """False while the job's query that timed out is still being answered (counted `pending`): a second query
        would wait behind it on the RAS thread. A late answer sizes the next query (and counts too_large over the
        cap)."""
        if seen.pending is None:
            return True
        size = seen.pending.settle()
        if size is None and time.monotonic() - seen.pending.started < PENDING_SECONDS:
            self.results["pending"] += 1
            return False
        seen.pending.close()  # answered, or given up
        if seen.pending.form == "json":
            seen.json_bytes = max(size or 0, JSON_FAST_BYTES + 1)  # too slow to make: a text form next
        if size is not None and size > self.max_bytes:
            self.results["too_large"] += 1
        seen.pending = None
        return True

    def query(self, key: tuple[str, str, int]) -> JobStatus:
        """The socket's answer in the form sized to the job; a job not sized yet is asked the short form first and,
        where that shows it small, JSON at once."""
        job, host, port = key
        seen = self.seen[key]
        want = form_for(seen)
        while True:
            address = self.believed(job, host, port, before=True)
            seen.asked = self.rounds
            try:
                form, text = self.asker(address, port, self.timeout, self.max_bytes, want=want, factor=self.factor,
                                        keep=True)  # fmt: skip
            except RasError as error:
                seen.pending = error.pending
                raise
            self.believed(job, host, port, before=False)
            status = nccl_ras.parse(form, text, self.max_ranks, self.max_communicators)
            seen.ranks, seen.json_bytes = status.ranks, len(text) if status.format == "json" else None
            seen.lowest = status.lowest if status.format == "json" else ""
            seen.nodes = status.nodes
            sized = form_for(seen)
            if want != "short" or sized == "short":
                return status
            want = sized

    def serve(
        self, out: Samples, job: str, status: JobStatus, local: set[str], uuids: dict[int, str], totals: dict
    ) -> None:
        """The answer's communicators and ranks (the job's detail) into `out`; its job's own series (its summary)
        are summed in `totals` (one job's steps that run at once answer on ports of their own: each job series
        once, never one an answer)."""
        for spec, value in ((DRILL_ACTIVE, int(status.drill)), (COMM_DROPPED, status.dropped),
                            (GARBLED, status.phantoms), (COLLECTION_TIMEOUTS, status.timeouts)):  # fmt: skip
            key = (spec, (job, "missing_rank_walk") if spec is GARBLED else (job,))
            totals[key] = totals.get(key, 0) + value
        missing = (JOB_RANKS_MISSING, (job,))
        totals[missing] = totals.get(missing, 0)
        for comm in status.communicators:  # the summary kept when the detail below is not (job_series_budget)
            by_status = (JOB_COMMUNICATORS, (job, comm.status))
            totals[by_status] = totals.get(by_status, 0) + 1
            unreached = comm.size - comm.answering - comm.left if comm.size else 0
            totals[missing] = max(totals[missing], len(comm.missing), unreached)

        def labels(comm: str, rank: Rank) -> list[str]:
            uuid = uuids.get(rank.nvml_dev, "") if rank.host in local else ""
            return [job, comm, str(rank.rank), rank.host, str(rank.pid), str(rank.nvml_dev), uuid]

        for comm in status.communicators:
            if comm.size:
                out.add(COMM_SIZE, (job, comm.hash), comm.size)
                out.add(COMM_RANKS, (job, comm.hash, "answering"), comm.answering)
                unreached = comm.size - comm.answering - comm.left
                out.add(COMM_RANKS, (job, comm.hash, "missing"), max(len(comm.missing), unreached))
                if comm.left:
                    out.add(COMM_RANKS, (job, comm.hash, "left"), comm.left)
            out.add(COMM_STATUS, (job, comm.hash, comm.status), 1)
            if comm.max_collectives is not None:
                out.add(COMM_COLLECTIVES, (job, comm.hash), comm.max_collectives)
            for rank in comm.missing:
                out.add(RANK_MISSING, [*labels(comm.hash, rank), "true" if rank.dead else "false"], 1)
            for rank in comm.behind:
                if rank.collectives is not None and comm.max_collectives is not None:
                    # JSON: its largest shortfall on one kind of operation; text: against the group's launch count.
                    shortfall = (
                        rank.behind_by if rank.behind_by is not None else comm.max_collectives - rank.collectives
                    )
                    out.add(RANK_BEHIND, labels(comm.hash, rank), shortfall)
                    out.add(RANK_COLLECTIVES, labels(comm.hash, rank), rank.collectives)
        for process in status.dead_processes:
            uuid = uuids.get(process.nvml_dev, "") if process.host in local else ""
            out.add(DEAD_PROCESS, [job, process.host, str(process.pid), str(process.nvml_dev), uuid], 1)

    def stop(self) -> None:
        for seen in self.seen.values():
            if seen.pending is not None:
                seen.pending.close()
        if self.nvml is not None:
            self.nvml.close()


def _build(options: dict[str, object], paths: Paths) -> NcclCollector:
    return NcclCollector(
        str(options["state_dir"]),
        str(options["addresses"]),
        float(options["timeout_seconds"]),  # type: ignore[arg-type]
        int(options["max_ranks"]),  # type: ignore[call-overload]
        paths.procfs,
        NvmlSession("no GPU UUID for the ranks on this node", retry_seconds=300),
        max_communicators=int(options["max_communicators"]),  # type: ignore[call-overload]
        factor=int(options["ras_timeout_factor"]),  # type: ignore[call-overload]
        max_job_series=int(options["max_job_series"]),  # type: ignore[call-overload]
        ledger=job_series_budget.LEDGER,
    )


def _jobs_or_addresses(paths: Paths, options: dict[str, object]) -> bool:
    """On where job records are kept (the ports come from them) or addresses are given."""
    return bool(options["addresses"]) or has_job_records(paths, {**options, "oar_runtime_dir": ""})


REGISTRATION = register(
    Registration(
        name="nccl",
        help="NCCL's RAS view of the node's jobs: missing and dead ranks, ranks behind (default: on where job "
        "records are kept)",
        build=_build,
        catalogue=C,
        options=(
            seconds("interval_seconds", 30.0, "how often each job's RAS socket is asked"),
            TIMEOUT,
            TIMEOUT_FACTOR,
            ADDRESSES,
            MAX_RANKS,
            MAX_COMMUNICATORS,
            job_series_budget.MAX_JOB_SERIES,
            STATE_DIR,
        ),
        enabled_by_default=_jobs_or_addresses,
        devices=NVML_DEVICES,  # NVML is opened to name the GPUs of the ranks on this node
    )
)
