"""`accelmon-drill nccl`: rehearse a hung NCCL job whose rank stops answering, end to end (docs/health.md, "Game day").

    accelmon-drill nccl --job JOB [--gpu INDEX] [--dead] [--minutes N]

On the node that asks NCCL's RAS for job JOB (the job's record says so: its first node), the drill stands in for
the job's NCCL on the job's own RAS socket (`localhost:<nccl_ras_port>`, the port accelmon's TaskProlog gives the
job) and answers the `nccl` collector as NCCL 2.28.7+ does, in JSON: one communicator with a rank on each of the
job's GPUs on this node, every rank's collective count moving on but the rank on GPU INDEX (default: the job's
first GPU on this node), which is missing
(unresponsive; considered dead after 60 s, as RAS says, or at once with --dead). So the collector, the rules, the
alert `AccelmonNcclRankMissing` and the hang judgement act on it as on a real one. Everything a person sees says
DRILL: the answer carries `accelmon_drill`, the collector serves `accelmon_nccl_drill_active{job_id}`, the alert is
labelled drill="true" and its summary starts with DRILL. The missing rank's process is the drill's own.

Nothing is fooled: a job whose NCCL holds its RAS port already is refused (the drill never stands in for a real
RAS), nothing is written to the job or the GPUs. The drill runs in the foreground and ends by itself (30 minutes by
default), at Ctrl-C or SIGTERM, or at `accelmon-drill stop`, which removes its file in `drill_dir`.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any, Optional

from accelmon.collectors.nccl import local_addresses
from accelmon.health import drill_store
from accelmon.host.nvidia import driver_gpus
from accelmon.job_sources.slurm import STATE_DIR, read_record

CHECK = "nccl"  # how `accelmon-drill stop --check` and `status` name these drills
PREFIX = f"{CHECK}-job"  # the drill's file in drill_dir: nccl-jobJOB.json
DEAD_AFTER_SECONDS = 60.0  # RAS considers a missing process dead after 60 s (docs/jobs.md, "NCCL RAS")
COLLECTIVES_PER_QUERY = 100  # how far the answering ranks move on between two queries
MAX_COMMAND_BYTES = 4096


class DrillRefusedError(Exception):
    """The drill cannot start; nothing was changed."""


@dataclass(frozen=True)
class NcclDrill:
    job: str
    gpu: str  # the NVML index of the missing rank's GPU
    gpus: tuple[str, ...]  # the job's GPUs on this node (NVML indices), one rank each, in order
    port: int
    host: str  # this node's address, as RAS names a rank's host
    started: float
    expires: float
    dead_at_start: bool = False

    @property
    def rank(self) -> int:
        return self.gpus.index(self.gpu)


def file_name(job: str) -> str:
    return f"{PREFIX}{job}.json"


def job_record(state_dir: str, job: str) -> dict[str, str]:
    for name in (f"slurm-{job}", job):
        try:
            record, _ = read_record(os.path.join(state_dir, name))
        except OSError:
            continue
        if record.get("job_id") == job:
            return record
    raise DrillRefusedError(f"--job {job}: no record of that job on this node ({state_dir}): is it running here?")


def job_gpus(record: dict[str, str], procfs: str, node_gpus: list[str]) -> list[str]:
    """The job's GPUs on this node as NVML indices (its record names minors or UUIDs, as the jobs collector reads
    them); the node's GPUs where the record names none this node can resolve."""
    by_minor, by_uuid = driver_gpus(procfs)
    found = []
    for token in filter(None, (t.strip() for t in record.get("gpus", "").split(","))):
        gpu = by_minor.get(token) if token.isdigit() else by_uuid.get(token)
        if gpu is not None and gpu.index not in found:
            found.append(gpu.index)
    return sorted(found, key=int) if found else list(node_gpus)


def node_address(procfs: str) -> str:
    """This node's address as RAS writes a rank's host: its first address that is not loopback (the collector's own
    reading of the node's addresses, so that it finds the rank on this node and names its GPU's UUID)."""
    addresses = sorted(a for a in local_addresses(procfs) if not a.startswith("127.") and a != "::1")
    return next((a for a in addresses if ":" not in a), addresses[0] if addresses else "127.0.0.1")


def plan(
    job: str, gpu: Optional[str], dead: bool, minutes: float,
    state_dir: str, procfs: str, node_gpus: list[str], now: float,
) -> NcclDrill:  # fmt: skip
    """The drill these arguments ask for on this node, or DrillRefusedError saying why not."""
    if not job.isdigit():
        raise DrillRefusedError(f"--job {job!r}: a job id is a number")
    record = job_record(state_dir, job)
    port = record.get("nccl_ras_port", "")
    if not port.isdigit():
        raise DrillRefusedError(
            f"job {job} has no RAS port in its record: accelmon's Slurm prolog and TaskProlog give each job one "
            "(docs/jobs.md, 'NCCL RAS')"
        )
    if record.get("nccl_ras_query", "1") == "0":
        raise DrillRefusedError(f"this node does not ask RAS for job {job}: its first node does: run the drill there")
    gpus = job_gpus(record, procfs, node_gpus)
    gpu = gpus[0] if gpu is None and gpus else gpu
    if gpu is None or gpu not in gpus:
        raise DrillRefusedError(f"--gpu {gpu}: job {job}'s GPUs on this node are {', '.join(gpus) or 'none'}")
    return NcclDrill(job, gpu, tuple(gpus), int(port), node_address(procfs), now, now + minutes * 60, dead)


def answer(drill: NcclDrill, now: float, queries: int) -> str:
    """RAS's JSON status (NCCL 2.28.7+, as src/ras/client_support.cc writes it) of the rehearsed job at `now`."""
    ranks, missing = [], []
    for number, index in enumerate(drill.gpus):
        entry: dict[str, Any] = {
            "rank": number, "host": drill.host, "pid": os.getpid(), "cuda_dev": number, "nvml_dev": int(index),
        }  # fmt: skip
        if index == drill.gpu:
            dead = drill.dead_at_start or now - drill.started >= DEAD_AFTER_SECONDS
            missing.append({**entry, "status": {"unresponsive": True, "considered_dead": dead}})
            continue
        entry["status"] = {"init_state": 0, "async_error": 0, "finalize_called": False, "destroy_flag": False,
                           "abort_flag": False}  # fmt: skip
        entry["collective_counts"] = {"AllReduce": 1000 + COLLECTIVES_PER_QUERY * queries}
        ranks.append(entry)
    communicator = {
        "hash": f"0x{int(drill.job):016x}", "size": len(drill.gpus), "ranks_count": len(ranks),
        "missing_ranks_count": len(missing), "ranks": ranks, "missing_ranks": missing,
    }  # fmt: skip
    return json.dumps(
        {
            "nccl_version": "accelmon-drill", "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now)),
            "communicators_count": 1, "communicators": [communicator],
            "accelmon_drill": {"gpu": drill.gpu, "rank": drill.rank, "expires": drill.expires},
        },
        indent=2,
    )  # fmt: skip


def bind(port: int) -> list[socket.socket]:
    """The job's RAS socket on every address `localhost` resolves to (NCCL binds the first that getaddrinfo gives,
    ::1 on many hosts, and the collector tries them in that order); DrillRefusedError where something holds any of
    them (the job's own NCCL, most likely: a drill never stands in beside a real RAS). An address this host cannot
    bind (no IPv6 loopback) is left out."""
    servers: list[socket.socket] = []
    try:
        addresses = socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)
    except OSError:
        addresses = []
    if not any(family == socket.AF_INET for family, *_ in addresses):
        addresses.append((socket.AF_INET, socket.SOCK_STREAM, 0, "", ("127.0.0.1", port)))
    for family, kind, protocol, _, address in addresses:
        if any(server.family == family for server in servers):
            continue  # one socket a family: getaddrinfo may list an address once per protocol
        try:
            server = socket.socket(family, kind, protocol)
        except OSError:
            continue  # a family this kernel has not (IPv6 off)
        try:
            if family == socket.AF_INET6:
                server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            server.bind(address)
            server.listen(4)
        except OSError as error:
            server.close()
            if error.errno == errno.EADDRNOTAVAIL:
                continue
            for opened in servers:
                opened.close()
            if error.errno == errno.EADDRINUSE:
                raise DrillRefusedError(
                    f"localhost:{port} ({address[0]}) is taken: the job's own NCCL answers there (a drill never stands "
                    "in for a real RAS)"
                ) from error
            raise DrillRefusedError(f"localhost:{port} ({address[0]}): {error}") from error
        servers.append(server)
    return servers


def talk(connection: socket.socket, drill: NcclDrill, queries: int) -> None:
    """One client, as NCCL's RAS thread answers it: a command a line, STATUS answered and the socket closed."""
    connection.settimeout(5)
    reader = connection.makefile("rb")
    while True:
        raw = reader.readline(MAX_COMMAND_BYTES)
        if not raw:
            return
        command = raw.decode(errors="replace").strip().upper()
        if command.startswith("CLIENT PROTOCOL"):
            connection.sendall(b"SERVER PROTOCOL 2\n")
        elif command.startswith("TIMEOUT") or command == "SET FORMAT JSON":
            connection.sendall(b"OK\n")
        elif command in ("STATUS", "VERBOSE STATUS"):
            connection.sendall(answer(drill, time.time(), queries).encode())
            return
        else:
            connection.sendall(f"ERROR: Unknown command {command[:80]}\n".encode())


def serve(drill: NcclDrill, servers: list[socket.socket], drill_file: str, stop: Optional[Any] = None) -> str:
    """Answers RAS queries on every socket until the drill expires, its file is removed or `stop()` says so; returns
    why it ended."""
    queries = 0
    while True:
        if stop is not None and stop():
            return "stopped"
        if time.time() >= drill.expires:
            return "expired"
        if not os.path.exists(drill_file):
            return "stopped (accelmon-drill stop)"
        ready, _, _ = select.select(servers, [], [], 0.5)
        if not ready:
            continue
        try:
            connection, _ = ready[0].accept()
        except OSError:
            continue
        with connection:
            try:
                talk(connection, drill, queries)
                queries += 1
            except OSError:
                pass  # a client that went away: the next one is answered


def write_file(drill_dir: str, drill: NcclDrill) -> str:
    record = {"check": CHECK, "job": drill.job, "gpu": drill.gpu, "rank": drill.rank, "port": drill.port,
              "pid": os.getpid(), "started": drill.started, "expires": drill.expires}  # fmt: skip
    return drill_store.write_record(drill_dir, file_name(drill.job), record)


def read_files(drill_dir: str) -> list[dict[str, Any]]:
    """The NCCL drills' files in `drill_dir` (for status and stop), each with its path."""
    return [{**record, "path": os.path.join(drill_dir, name)} for name, record in drill_store.files(drill_dir, PREFIX)]


def run(drill: NcclDrill, drill_dir: str, say: Any = print) -> int:
    """Binds the job's RAS socket, writes the drill's file and answers until the drill ends; the file is removed at
    the end whatever ends it."""
    servers = bind(drill.port)
    stopping: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    path = write_file(drill_dir, drill)
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(drill.expires))
    say(
        f"NCCL drill started: job {drill.job}'s RAS socket localhost:{drill.port} answers as NCCL would, rank "
        f"{drill.rank} (GPU {drill.gpu}, process {os.getpid()}) missing, until {until} ({path})."
    )
    say("The exporter's nccl collector reads it at its interval; Ctrl-C or `accelmon-drill stop` ends it now.")
    try:
        why = serve(drill, servers, path, stop=lambda: bool(stopping))
    except KeyboardInterrupt:
        why = "stopped (Ctrl-C)"
    finally:
        for server in servers:
            server.close()
        signal.signal(signal.SIGTERM, previous)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    say(f"NCCL drill of job {drill.job} ended: {why}.")
    return 0


def state_dir_of(options: dict[str, Any]) -> str:
    return str(options.get("state_dir", STATE_DIR.default))
