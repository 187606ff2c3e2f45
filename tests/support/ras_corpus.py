"""NCCL RAS's JSON answer as each release writes it, rendered from that release's own format strings (NVIDIA/nccl,
`src/ras/client_support.cc`, the `jsonWrite*` functions; the line numbers are of the file at each tag, read with
`git show TAG:src/ras/client_support.cc`). Each `rasOutAppend` is one `out(...)` here, in the same order, so an answer
differs from NCCL's only in the values given.

- v2.28.7-1, v2.28.9-1 (lines 1890-1987): `jsonWriteMissingRank` writes `"nvml_dev": %d\n` with no comma (1963), so
  the answer is not JSON whenever a rank is missing;
- v2.29.2-1 (1937-2034): the comma is there (2010);
- v2.30.7-1 (1919-2016): the same text.

`collective_counts` has NCCL_NUM_FUNCTIONS (5) entries in ncclFunc_t's order, named by ncclFuncToString
(src/include/nccl_common.h:58-64, src/collectives.cc:13-25 at v2.28.7-1): Broadcast, Reduce, AllGather, ReduceScatter,
AllReduce. `init_state` and `async_error` are ncclResult_t values: 7 is ncclInProgress (src/nccl.h.in:49 at v2.28.7-1).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field
from typing import Callable

OPERATIONS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
BROKEN_MISSING_RANK = ("v2.28.7-1", "v2.28.9-1")  # jsonWriteMissingRank without the comma after nvml_dev
RELEASES = ("v2.28.7-1", "v2.28.9-1", "v2.29.2-1", "v2.30.7-1")


@dataclass
class RankData:
    rank: int
    host: str
    pid: int
    nvml_dev: int
    counts: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)  # by OPERATIONS
    init_state: int = 0
    async_error: int = 0
    abort: bool = False


@dataclass
class MissingRank:
    rank: int
    host: str
    pid: int
    nvml_dev: int
    unresponsive: bool = True  # False: the process answered, without this communicator (NCCL's NOCOMM)
    dead: bool = False


@dataclass
class Comm:
    hash: int
    host_hash: int
    pid_hash: int
    size: int
    ranks: list[RankData] = field(default_factory=list)
    missing: list[MissingRank] = field(default_factory=list)


def answer(tag: str, comms: list[Comm], timeouts: int = 0) -> str:
    """The STATUS answer of release `tag` in JSON for these communicators."""
    parts: list[str] = []
    out = parts.append
    # jsonWriteHeader (v2.28.7-1:1890-1899)
    out("{\n")
    out(f'  "nccl_version": "{tag[1:].split("-")[0]}",\n')
    out('  "cuda_runtime_version": 12080,\n')
    out('  "cuda_driver_version": 12080,\n')
    out('  "timestamp": "2026-11-28 01:50:00",\n')
    out(f'  "communicators_count": {len(comms)},\n')
    out('  "communicators": [\n')
    for number, comm in enumerate(comms):
        # jsonStartCommunicator (v2.28.7-1:1902-1912)
        if number:
            out(",\n")
        out("    {\n")
        out(f'      "hash": "0x{comm.hash:x}",\n')
        out(f'      "secondary_hash": "0x{comm.host_hash:x}:0x{comm.pid_hash:x}",\n')
        out(f'      "size": {comm.size},\n')
        out(f'      "ranks_count": {len(comm.ranks)},\n')
        out(f'      "missing_ranks_count": {len(comm.missing)},\n')
        out('      "ranks": [\n')
        for index, rank in enumerate(comm.ranks):
            # jsonWriteRankData (v2.28.7-1:1915-1944)
            opening(out, index, rank.rank, rank.host, rank.pid, rank.nvml_dev, ",\n")
            out('          "status": {\n')
            out(f'            "init_state": {rank.init_state},\n')
            out(f'            "async_error": {rank.async_error},\n')
            out('            "finalize_called": false,\n')
            out('            "destroy_flag": false,\n')
            out(f'            "abort_flag": {"true" if rank.abort else "false"}\n')
            out("          },\n")
            out('          "collective_counts": {\n')
            for op, name in enumerate(OPERATIONS):
                out(f'            "{name}": {rank.counts[op]}')
                if op < len(OPERATIONS) - 1:
                    out(",")
                out("\n")
            out("          }\n")
            out("        }")
        # jsonStartMissingRanks (v2.28.7-1:1947-1952)
        out("\n      ],\n")
        out('      "missing_ranks": [\n')
        for index, missing in enumerate(comm.missing):
            # jsonWriteMissingRank (v2.28.7-1:1955-1971; v2.29.2-1:2002-2018)
            after = "\n" if tag in BROKEN_MISSING_RANK else ",\n"
            opening(out, index, missing.rank, missing.host, missing.pid, missing.nvml_dev, after)
            out('          "status": {\n')
            out(f'            "unresponsive": {"true" if missing.unresponsive else "false"},\n')
            out(f'            "considered_dead": {"true" if missing.dead else "false"}\n')
            out("          }\n")
            out("        }")
        # jsonEndCommunicator (v2.28.7-1:1974-1977)
        out("\n      ]\n")
        out("    }")
    # jsonWriteFooter (v2.28.7-1:1980-1987)
    out("\n  ],\n")
    out('  "ras": {\n')
    out('    "collection_time_sec": 0.012,\n')
    out(f'    "timeouts_count": {timeouts}\n')
    out("  }\n")
    out("}\n")
    return "".join(parts)


def opening(out: Callable[[str], None], index: int, rank: int, host: str, pid: int, device: int, after: str) -> None:
    """A rank's first lines, the same in jsonWriteRankData and jsonWriteMissingRank but for what follows nvml_dev."""
    if index:
        out(",\n")
    out("        {\n")
    out(f'          "rank": {rank},\n')
    out(f'          "host": "{host}",\n')
    out(f'          "pid": {pid},\n')
    out(f'          "cuda_dev": {device},\n')
    out(f'          "nvml_dev": {device}' + after)


# The text answer (every release before 2.28.7, and on request after), from v2.26.2-1's client_support.cc: the job
# summary 553-559, "Communicators..." 729 and its time 926, the summary table 1110-1111 and its rows 1149-1153, Errors
# 1161 (DEAD 1231-1260: "Process %d on node %s managing GPU%s %s" 1249; INCOMPLETE 1272-1295), Warnings 1332 (MISMATCH
# 1349, its kinds 1485-1560).
@dataclass
class Kind:
    """One kind of operation whose counts differ: the groups of ranks at each count, most ranks first, and the ranks
    NCCL lists (a group small enough to be an outlier, rasCountIsOutlier)."""

    name: str  # ncclFuncStr: Broadcast, AllReduce, ...
    groups: list[tuple[int, int, list[tuple[int, int, int, str]]]]  # (ranks, count, listed [(rank, gpu, pid, host)])


@dataclass
class TextComm:
    hash: int
    ranks: int
    status: str = "RUNNING"
    errors: str = "OK"  # OK, or INCOMPLETE, ERROR, MISMATCH joined by commas (errorStr, 903-912)
    missing: list[tuple[int, int, int, str]] = field(default_factory=list)  # (rank, gpu, pid, host)
    kinds: list[Kind] = field(default_factory=list)


# 2.24 and 2.25 print an INCOMPLETE communicator's missing ranks as one list built in a static 1,024-byte buffer with
# snprintf (v2.24.3-1 and v2.25.1-1 client_support.cc: `lineBuf` 82, the list 1156-1173; `Missing communicator data
# from %d rank%s` 1158-1160 counts commNRanks - nRanks): past 1,023 characters the list is cut, mid-number.
LIST_RELEASES = ("v2.24.3-1", "v2.25.1-1")
LINE_BUFFER = 1024


def c_buffer(entries: list[str], size: int = LINE_BUFFER) -> str:
    """What successive snprintf(buf + strlen(buf), size - strlen(buf), ...) calls leave in a buffer of `size`."""
    text = ""
    for entry in entries:
        text += entry[: max(0, size - 1 - len(text))]
    return text


def devices(cuda: list[int], nvml: list[int] | None = None) -> str:
    """rasGpuDevsToString (v2.26.2-1:1826-1845): a process's CUDA devices, and its NVML ones where they differ (a
    job that sets CUDA_VISIBLE_DEVICES: `0 (NVML 5)`), each list in ascending order (bits of a mask)."""
    text = ",".join(map(str, sorted(cuda)))
    if nvml is not None and sorted(nvml) != sorted(cuda):
        text += " (NVML " + ",".join(map(str, sorted(nvml))) + ")"
    return text


def text_answer(
    comms: list[TextComm], dead: tuple[tuple[int, str, list[int]] | tuple[int, str, list[int], list[int]], ...] = (),
    tag: str = "v2.26.2-1", nodes: int = 2,
) -> str:  # fmt: skip
    """The STATUS answer in text of release `tag` (2.26.2's layout; 2.24/2.25 list missing ranks by number); `dead`:
    processes as (pid, host, their CUDA devices[, their NVML devices])."""
    parts: list[str] = []
    out = parts.append
    version = tag[1:].split("-")[0]
    out(f"NCCL version {version} compiled with CUDA 12.8\nCUDA runtime version 12080, driver version 12080\n\n")
    out("Job summary\n===========\n\n")
    out("  Nodes  Processes         GPUs  Processes     GPUs\n(total)   per node  per process    (total)  (total)\n")
    out(f"{nodes:7d}  {4:9d}  {1:11d}  {4 * nodes:9d}  {4 * nodes:7d}\n")
    out("\nCommunicators... (0.05s)\n=============\n\n")
    out("Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n")
    out("    #  in group  per comm  per node  per comm  in group\n")
    for group, comm in enumerate(comms):
        row = f"{group:5d}  {1:8d}  {2:8d}  {'4':>8s}  {comm.ranks:8d}  {comm.ranks:8d}"
        out(f"{row}  {comm.status:>8s}  {comm.errors:>6s}\n")
    out("\nErrors\n======\n\n")
    if dead:
        out(f"DEAD\n  {len(dead)} job process{'es are' if len(dead) > 1 else ' is'} considered dead (unreachable via "
            "the RAS network)\n")  # fmt: skip
        for pid, host, gpus, *nvml in dead:
            out(f"  Process {pid} on node {host} managing GPU{'s' if len(gpus) > 1 else ''} {devices(gpus, *nvml)}\n")
        out("\n")
    for group, comm in enumerate(comms):
        if comm.missing:
            count = len(comm.missing)
            out(f"#{group}-0 ({comm.hash:016x}) INCOMPLETE\n  Missing communicator data from {count} rank"
                f"{'s' if count > 1 else ''}\n")  # fmt: skip
            if tag in LIST_RELEASES:  # every rank number, comma separated (v2.24.3-1:1162-1173)
                numbers = [f"{',' if n else ''}{rank}" for n, (rank, _, _, _) in enumerate(comm.missing)]
                out(f"  The missing rank{'s' if count > 1 else ''}: {c_buffer(numbers)}\n")
            else:
                for rank, gpu, pid, host in comm.missing:  # a rank rasPeerFind does not know: 1288
                    out(f"  Rank {rank} -- GPU {gpu} managed by process {pid} on node {host}\n" if host
                        else f"  Rank {rank} -- [process information not found]\n")  # fmt: skip
            out("\n")
    out("Warnings\n========\n\n")
    for group, comm in enumerate(comms):
        if not comm.kinds:
            continue
        out(f"#{group}-0 ({comm.hash:016x}) MISMATCH\n")
        for kind in comm.kinds:
            out(f"  Communicator ranks have different {kind.name} operation counts\n")
            for ranks, count, listed in kind.groups:
                if ranks > 1:
                    out(f"  {ranks} ranks have launched up to operation {count}\n" if count > 0
                        else f"  {ranks} ranks have not launched any operations\n")  # fmt: skip
                for rank, gpu, pid, host in listed:
                    place = f"GPU {gpu} managed by process {pid} on node {host}"
                    if ranks > 1:
                        out(f"  Rank {rank} -- {place}\n")
                    elif count > 0:
                        out(f"  Rank {rank} has launched up to operation {count} -- {place}\n")
                    else:
                        out(f"  Rank {rank} has not launched any operations -- {place}\n")
            out("\n")
    return "".join(parts)


# NCCL 2.26.2-2.28.9's walk over the collected communicators (rasClientRunComms, client_support.cc v2.26.2-1:939-945,
# v2.28.7-1 and v2.28.9-1:988-994) steps over each one's ranks but not its missing-rank array; 2.29.2 steps over both
# (v2.29.2-1:1035-1041; the JSON writer of 2.28.7 already did, v2.28.7-1:2126-2127). The collected data are laid out
# as ras_internal.h says (v2.26.2-1:279-314): `nComms`, then each communicator sorted by commId (hash, host hash, pid
# hash) as a 40-byte header (three uint64 hashes; commNRanks, nRanks, nMissingRanks), its ranks (56 bytes each) and
# its missing ranks (40 bytes, aligned as rasCollComms: commRank, a 28-byte ncclSocketAddress, cudaDev, nvmlDev), in
# a buffer allocated zeroed and "pessimistically" (collectives.cc v2.26.2-1:761-762): past the data, zeros.
HEADER, RANK, MISSING = struct.Struct("<QQQiii4x"), 56, struct.Struct("<iHH4s20xbb6x")


def collected(comms: list[TextComm], port: int = 28028) -> bytes:
    """The RAS collection's data for these communicators (IPv4 peers, RAS listening on `port`)."""
    data = struct.pack("<i4x", len(comms))
    for comm in sorted(comms, key=lambda c: c.hash):
        data += HEADER.pack(comm.hash, 0, 0, comm.ranks, comm.ranks - len(comm.missing), len(comm.missing))
        data += bytes(RANK * (comm.ranks - len(comm.missing)))
        for rank, gpu, _, host in comm.missing:
            data += MISSING.pack(rank, socket.AF_INET, socket.htons(port), socket.inet_aton(host), gpu, gpu)
    return data + bytes(len(data))


def walked(comms: list[TextComm], tag: str = "v2.26.2-1") -> list[TextComm]:
    """The communicators rasClientRunComms prints at `tag`: at 2.26.2-2.28.9 each after the first with missing ranks is
    read from that one's missing-rank array (a phantom: its hash is a missing rank's commRank, address family and
    port; its counts are the address's bytes and the rank's GPU), and as many real ones, the last by commId, are never
    read. A phantom's missing ranks are read from what follows it (every one unanswered: INCOMPLETE)."""
    if tag not in GARBLED_WALK:
        return comms
    data, seen, offset = collected(comms), [], 8
    places = {rank: (gpu, pid, host) for comm in comms for rank, gpu, pid, host in comm.missing}
    real = {comm.hash: comm for comm in comms}
    for _ in comms:
        commhash, _, _, size, n_ranks, n_missing = HEADER.unpack_from(data.ljust(offset + HEADER.size, b"\0"), offset)
        if commhash in real and size == real[commhash].ranks:
            seen.append(real[commhash])
        else:
            listed = []
            for slot in range(n_missing):
                at = offset + HEADER.size + n_ranks * RANK + slot * MISSING.size
                rank = MISSING.unpack_from(data.ljust(at + MISSING.size, b"\0"), at)[0]
                gpu, pid, host = places.get(rank, (-1, -1, ""))
                listed.append((rank, gpu, pid, host))
            seen.append(TextComm(commhash, size, errors="INCOMPLETE" if n_missing else "OK", missing=listed))
        offset += HEADER.size + n_ranks * RANK  # the bug: + n_missing * MISSING.size is not added
    return seen


GARBLED_WALK = ("v2.26.2-1", "v2.27.7-1", "v2.28.3-1", "v2.28.7-1", "v2.28.9-1")
