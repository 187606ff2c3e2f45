"""A stand-in for an NCCL process's RAS socket on loopback, speaking the client protocol as NCCL's RAS thread does
(NVIDIA/nccl src/ras/client_support.cc: one command a line; CLIENT PROTOCOL -> SERVER PROTOCOL 2, TIMEOUT -> OK,
SET FORMAT json -> OK from 2.28.7 and "ERROR: Unknown command ..." before, STATUS -> the answer, then the socket
closed), and misbehaving on demand: silent (accepts, never answers), cut (closes after the handshake line), flood
(an endless answer), or another protocol version."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

from tests.support.ras_corpus import TextComm, text_answer


class FakeRas:
    def __init__(
        self, answer: str = "", json_format: bool = True, behaviour: str = "normal", protocol: int = 2, port: int = 0,
        text: str = "", json_seconds: float = 0.0, host: str = "127.0.0.1",
    ) -> None:  # fmt: skip
        self.answer = answer
        # The text form's answer for a client that set no format: given, or the summary of the JSON answer's
        # communicators (what NCCL's STATUS says of a healthy job), or `answer` itself where it is no JSON.
        self.text = text or summary_text(answer)
        # NCCL makes its JSON answer whole before it sends a byte, on its one RAS thread: this long, during which
        # nothing else is answered (this stand-in serves one connection at a time, as that thread does).
        self.json_seconds = json_seconds
        self.answered = threading.Event()  # set when a delayed JSON answer has been sent
        self.connections = 0
        self.json_format = json_format
        self.behaviour = behaviour
        self.protocol = protocol
        self.commands: list[str] = []
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.server = socket.create_server((host, port), family=family)
        self.port = self.server.getsockname()[1]
        self.server.settimeout(0.2)  # here, not in the thread: a server stopped at once is closed before it runs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.server.accept()
            except OSError:
                continue
            self.connections += 1
            with connection:
                try:
                    self._talk(connection)
                except OSError:
                    pass

    def _talk(self, connection: socket.socket) -> None:
        reader = connection.makefile("rb")
        as_json = False
        for raw in reader:
            command = raw.decode().strip()
            self.commands.append(command)
            if self.behaviour == "silent":
                self._stop.wait(30)
                return
            if self.behaviour == "cut":
                return
            upper = command.upper()
            if upper.startswith("CLIENT PROTOCOL"):
                connection.sendall(f"SERVER PROTOCOL {self.protocol}\n".encode())
            elif upper.startswith("TIMEOUT"):
                connection.sendall(b"OK\n")
            elif upper == "SET FORMAT JSON" and self.json_format:
                as_json = True
                connection.sendall(b"OK\n")
            elif upper in ("STATUS", "VERBOSE STATUS"):
                if self.behaviour == "flood":
                    block = b"x" * (1 << 20)
                    for _ in range(100):  # 100 MiB, unless the client stops reading first
                        connection.sendall(block)
                    return
                delayed = as_json and self.json_seconds > 0
                if delayed:
                    self._stop.wait(self.json_seconds)
                try:
                    connection.sendall((self.answer if as_json else self.text).encode())
                finally:
                    if delayed:
                        self.answered.set()
                return
            else:
                connection.sendall(f"ERROR: Unknown command {command}\n".encode())

    def stop(self) -> None:
        self._stop.set()
        self.server.close()
        self._thread.join(5)


def listen(procfs: Path, listening: dict[int, int]) -> None:
    """procfs's net/tcp as get_tcp4_sock (net/ipv4/tcp_ipv4.c) prints sockets listening (state 0A) on 127.0.0.1:
    port -> the uid of its owner, which the collector checks against the job's user."""
    lines = ["  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"]
    for number, (port, uid) in enumerate(sorted(listening.items())):
        lines.append(f"{number:4d}: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000 "
                     f"{uid:5d}        0 {48151 + number} 1 0000000000000000 100 0 0 10 0")  # fmt: skip
    (procfs / "net").mkdir(parents=True, exist_ok=True)
    (procfs / "net" / "tcp").write_text("\n".join(lines) + "\n")


def rank(number: int, count: int, host: str = "10.0.0.12", pid: int = 1000, dev: int = 0) -> dict[str, Any]:
    """One rank of RAS's JSON, as NCCL 2.29 writes it; `count` AllReduces launched."""
    return {
        "rank": number, "host": host, "pid": pid + number, "cuda_dev": dev, "nvml_dev": dev,
        "status": {"init_state": 0, "async_error": 0, "finalize_called": False, "destroy_flag": False,
                   "abort_flag": False},
        "collective_counts": {"Broadcast": 0, "Reduce": 0, "AllGather": 0, "ReduceScatter": 0, "AllReduce": count},
    }  # fmt: skip


def json_answer(communicators: list[dict[str, Any]]) -> str:
    """RAS's JSON status (NCCL 2.28.7+) of these communicators."""
    return json.dumps(
        {
            "nccl_version": "2.29.1", "cuda_runtime_version": 13000, "cuda_driver_version": 13000,
            "timestamp": "2026-11-27 14:00:00", "communicators_count": len(communicators),
            "communicators": communicators, "ras": {"collection_time_sec": 0.01, "timeouts_count": 0},
        },
        indent=2,
    )  # fmt: skip


def communicator(hash_: str, ranks: list[dict[str, Any]], missing: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "hash": hash_, "secondary_hash": "0x1:0x2", "size": len(ranks) + len(missing), "ranks_count": len(ranks),
        "missing_ranks_count": len(missing), "ranks": ranks, "missing_ranks": missing,
    }  # fmt: skip


def missing_rank(number: int, host: str, pid: int, dev: int, dead: bool) -> dict[str, Any]:
    return {"rank": number, "host": host, "pid": pid, "cuda_dev": dev, "nvml_dev": dev,
            "status": {"unresponsive": True, "considered_dead": dead}}  # fmt: skip


# NCCL 2.26's text answer (docs/userguide/source/troubleshooting/ras.rst's excerpts, one job): communicator #0-0 of
# 32 ranks with rank 21 missing and its process dead; #1-0 with 6 ranks behind at operation 6649.
TEXT_ANSWER = """NCCL version 2.26.2 compiled with CUDA 12.8
CUDA runtime version 12080, driver version 12080

Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      4          8            1         32       32

Communicators... (2.05s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         4       7-8        32        32   RUNNING  INCOMPLETE
    1         1         4         8        32        32   RUNNING  MISMATCH

Errors
======

DEAD
  1 job process is considered dead (unreachable via the RAS network)
  Process 3487984 on node 172.16.64.213 managing GPU 5

#0-0 (cf264af53edbe986) INCOMPLETE
  Missing communicator data from 1 rank
  The missing rank: 21

Warnings
========

#1-0 (27a079b828ff1a75) MISMATCH
  Communicator ranks have different collective operation counts
  26 ranks have launched up to operation 6650
  6 ranks have launched up to operation 6649
  Rank 0 -- GPU 0 managed by process 483072 on node 172.16.64.210
  Rank 2 -- GPU 2 managed by process 483074 on node 172.16.64.210
  Rank 3 -- GPU 3 managed by process 483075 on node 172.16.64.210
  Rank 4 -- GPU 4 managed by process 483076 on node 172.16.64.210
  Rank 5 -- GPU 5 managed by process 483077 on node 172.16.64.210
  Rank 7 -- GPU 7 managed by process 483079 on node 172.16.64.210

TIMEOUT
  Encountered 2 communication timeouts while gathering communicator data
"""


def summary_text(answer: str) -> str:
    """The text STATUS of a job whose JSON answer is `answer`: its communicators' summary rows (sizes), as NCCL
    prints a job's summary table (tests/support/ras_corpus.text_answer); `answer` itself where it is not JSON."""
    try:
        comms = json.loads(answer)["communicators"]
        return text_answer([TextComm(int(c["hash"], 16), int(c["size"])) for c in comms], tag="v2.29.2-1")
    except (ValueError, KeyError, TypeError, RecursionError):
        return answer
