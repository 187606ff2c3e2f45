"""NCCL's RAS socket: the client protocol and its answers, read into what the `nccl` collector serves.

Every NCCL process since 2.24 runs a RAS thread that answers on a local TCP socket (`localhost:28028`, or the job's
`NCCL_RAS_ADDR`) with the job's global view. The protocol is plain text, one command a line (NVIDIA/nccl
src/ras/client.cc and client_support.cc; docs/jobs.md, "NCCL RAS"):

    -> CLIENT PROTOCOL 2            <- SERVER PROTOCOL 2
    -> TIMEOUT 4                    <- OK            (how long RAS waits for each leg of its own collection)
    -> SET FORMAT json              <- OK            (2.28.7+; older: "ERROR: Unknown command ...": text instead)
    -> STATUS                       <- the answer, until the socket closes

JSON (2.28.7+) lists every communicator with its ranks (host, pid, nvml_dev, collective counts by operation) and its
missing ranks (unresponsive, considered dead). The text form (2.24-2.28) names only what is wrong: the `Errors` and
`Warnings` sections (a dead process, a communicator missing ranks, ranks behind on their collective count); that is
what is read from it. Everything here is bounded: a deadline for the whole exchange, a cap on the answer's bytes.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from accelmon.host import nccl_ras_client as client

# The client's names, where its callers have always found them.
RasError = client.RasError
Pending = client.Pending
ask = client.ask
ras_timeout = client.ras_timeout
FORMS = client.FORMS
RAS_EXTRA_SECONDS = client.RAS_EXTRA_SECONDS
MARGIN_SECONDS = client.MARGIN_SECONDS

DEFAULT_PORT = 28028
# Ports for jobs that share a node: the role's prolog gives each job the lowest block of STEP_PORTS ports of
# JOB_PORT_BASE to JOB_PORT_BASE + JOB_PORTS - 1 that no other job of the node holds and no socket uses, records it,
# and writes it in PORTS_DIR (beside the jobs' state_dir) for its TaskProlog, which sets
# NCCL_RAS_ADDR=localhost:PORT + step id modulo STEP_PORTS. NCCL binds that address with SO_REUSEADDR and
# SO_REUSEPORT (src/ras/client_support.cc, rasClientInitSocket): jobs or steps given one port would share it or lose
# it.
JOB_PORT_BASE = 28100
JOB_PORTS = 1000
STEP_PORTS = 4  # a job's block: steps that run at once on a node get a port each (step id modulo this)
PORTS_DIR = "nccl-ras"
STATUSES = ("ok", "init", "mismatch", "incomplete", "error")
IN_PROGRESS = 7  # ncclInProgress (nccl.h): a non-blocking communicator's call under way, not an error
# NCCL 2.28.7-2.28.9 write a missing rank's "nvml_dev" with no comma after it (src/ras/client_support.cc:1963 at
# v2.28.7-1, fixed in 2.29.2): the answer is invalid exactly when a rank is missing. The comma is put back.
MISSING_COMMA = re.compile(r'("nvml_dev": -?\d{1,19})(\s*\n\s*"status")')
# Communicators kept of one answer: the most troubled (by STATUSES, then the largest), the rest counted as dropped. An
# answer is parsed communicator by communicator, never held whole as objects: 400,000 communicators in 7.5 MB (a
# socket another user answers on, or a job that makes communicators without end) became 400,008 series and 437 MiB.
MAX_COMMUNICATORS = 64
# What is built of an answer stays within the unit's memory (MemoryMax=256M) whatever a job's socket sends up to the
# cap. NCCL's JSON has a value every 30 bytes or so (a comma every 36, an object every 179: tests/support/ras_corpus.py
# at 2.29.2): one denser than a value (comma, object or array) every VALUE_BYTES is no NCCL's (1.5 million small keys
# in 16 MiB made 220 MiB of objects; a value every 16 bytes of 8 MiB, the answer's cap now, makes 58 MiB). The text is
# asked only of jobs up to 8,192 rank places (collector nccl, VERBOSE_RANKS: a few MiB at most); a longer one is
# too_large (330,000 rank lines in 16 MiB made 133 MiB).
VALUE_BYTES = 16
MAX_TEXT_BYTES = 4 << 20


@dataclass
class Rank:
    rank: int
    host: str = ""
    pid: int = -1
    nvml_dev: int = -1
    collectives: Optional[int] = None  # collective operations launched (all kinds), where RAS said
    dead: bool = False  # missing for 60 s or more: RAS considers the process dead
    behind_by: Optional[int] = None  # its largest shortfall on one kind of operation against the communicator's


@dataclass
class Communicator:
    hash: str
    size: int = 0
    answering: int = 0
    missing: list[Rank] = field(default_factory=list)  # unresponsive: NCCL could not reach the process
    left: int = 0  # ranks whose process answered without this communicator (NCCL's NOCOMM: destroyed there)
    behind: list[Rank] = field(default_factory=list)  # ranks whose collective count stands below the others'
    max_collectives: Optional[int] = None
    status: str = "ok"  # one of STATUSES
    missing_count: Optional[int] = None  # NCCL's own count of ranks it has no data from (text form), where it says
    secondary: str = ""  # JSON's secondary_hash: host and process hash of its creation
    lowest: str = ""  # the lowest address among its ranks' hosts (JSON names every rank's)
    hosts: set[str] = field(default_factory=set)  # its ranks' hosts (JSON), merged into the answer's count


@dataclass
class JobStatus:
    format: str  # json or text
    communicators: list[Communicator]
    dead_processes: list[Rank]  # processes RAS considers dead (text form; in JSON they are the dead missing ranks)
    drill: bool = False  # the answer is accelmon-drill's stand-in (accelmon.drills.nccl_drill), not NCCL's
    repaired: bool = False  # NCCL 2.28.7-2.28.9's invalid JSON, read after putting its missing comma back
    timeouts: int = 0  # RAS's own legs that timed out while collecting this answer (`timeouts_count`)
    dropped: int = 0  # communicators of the answer past max_communicators, not kept
    phantoms: int = 0  # communicators NCCL 2.26.2-2.28.9's walk made up (PHANTOM_WALK), not served
    ranks: int = 0  # the answer's communicators' sizes summed (dropped ones too): what sizes the next query
    lowest: str = ""  # the lowest address among the hosts of every rank the answer names (JSON)
    nodes: int = 0  # the job's nodes: the text's Job summary, JSON's distinct hosts (0: not said)


class Kept:
    """The communicators of one answer as they are read: at most `limit`, the most troubled, in the answer's order."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.items: list[tuple[int, Communicator]] = []
        self.seen = 0
        self.ranks = 0
        self.lowest = ""
        self.hosts: set[str] = set()

    def add(self, comm: Communicator) -> None:
        self.items.append((self.seen, comm))
        self.seen += 1
        self.ranks += comm.size
        self.lowest = lower(self.lowest, comm.lowest)
        self.hosts |= comm.hosts
        comm.hosts = set()
        if len(self.items) >= 2 * self.limit:
            self.cut()

    def cut(self) -> None:
        worst = sorted(self.items, key=lambda item: (-STATUSES.index(item[1].status), -item[1].size, item[0]))
        self.items = sorted(worst[: self.limit], key=lambda item: item[0])

    def communicators(self) -> list[Communicator]:
        self.cut()
        return [comm for _, comm in self.items]


def parse(form: str, text: str, max_ranks: int, max_communicators: int = MAX_COMMUNICATORS) -> JobStatus:
    """The answer read as what it is: NCCL's text begins with its version line, JSON with its brace (a stand-in
    such as accelmon-drill answers JSON whatever is asked)."""
    try:
        if form == "json" or text.lstrip().startswith("{"):
            return parse_json(text, max_ranks, max_communicators)
        return parse_text(text, max_ranks, max_communicators)
    except (ValueError, RecursionError, OverflowError) as error:
        # What no NCCL writes (nesting past the decoder's recursion limit, a number past int's digit limit): that
        # job's answer is malformed, never an exception that empties the collector for every job of the node.
        raise RasError("malformed", f"{type(error).__name__}: {str(error)[:120]}") from error


def lower(first: str, second: str) -> str:
    """The lower of two addresses as RAS writes a rank's host (IPv4 before IPv6, then by number); what is not an
    address is never the lower."""
    keys = []
    for host in (first, second):
        try:
            address = ipaddress.ip_address(host)
            keys.append((address.version, int(address), host))
        except ValueError:
            pass
    return min(keys)[2] if keys else ""


def _int(value: Any, default: int = -1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def bounded_int(digits: str) -> int:
    """A JSON integer as NCCL writes one (64 bits at most: 20 digits and a sign). Python 3.9 before 3.9.14 has no
    limit on int's digits and converts them in quadratic time: 16 MiB of digits would hold the collector for hours."""
    if len(digits) > 21:
        raise ValueError(f"an integer of {len(digits)} digits")
    return int(digits)


def decode(body: str, max_ranks: int, max_communicators: int) -> tuple[Any, Kept]:
    """The answer's top level, each communicator read as the decoder meets it (json's object_hook: inner objects
    first) into at most `max_communicators` kept, its place in the list left None."""
    kept = Kept(max_communicators)

    def hook(raw: dict[str, Any]) -> Any:
        if not isinstance(raw.get("hash"), str):
            return raw
        comm = parse_communicator(raw, max_ranks)
        if comm is not None:
            kept.add(comm)
        return None

    data, _ = json.JSONDecoder(object_hook=hook, parse_int=bounded_int).raw_decode(body)
    return data, kept


def parse_json(text: str, max_ranks: int, max_communicators: int = MAX_COMMUNICATORS) -> JobStatus:
    """RAS's JSON answer (2.28.7+), judged as NCCL judges it (docs/jobs.md, "What each release gives"); RasError
    ("malformed") when it is not that."""
    start = text.find("{")
    body = text[start:] if start >= 0 else ""
    values = body.count(",") + body.count("{") + body.count("[")
    if values > len(body) // VALUE_BYTES + 4096:
        raise RasError("malformed", f"{values} values in {len(body)} bytes: denser than any NCCL answer")
    repaired = False
    try:
        data, kept = decode(body, max_ranks, max_communicators)
    except ValueError as error:
        fixed, repairs = MISSING_COMMA.subn(r"\1,\2", body)
        try:
            if not repairs:
                raise
            data, kept = decode(fixed, max_ranks, max_communicators)
        except ValueError:
            raise RasError("malformed", f"not JSON: {error}") from error
        repaired = True
    if not isinstance(data, dict) or not isinstance(data.get("communicators"), list):
        raise RasError("malformed", "no communicators list")
    communicators = kept.communicators()
    # The hash alone is not unique (src/ras/ras_internal.h: a communicator is its hash with the host and process
    # hash of its creation): two of one hash are told apart by `secondary_hash`, and gave one series before.
    seen = Counter(comm.hash for comm in communicators)
    for comm in communicators:
        if seen[comm.hash] > 1 and comm.secondary:
            comm.hash = f"{comm.hash}:{comm.secondary}"
    ras = data["ras"] if isinstance(data.get("ras"), dict) else {}
    return JobStatus(
        "json", communicators, [], drill=isinstance(data.get("accelmon_drill"), dict), repaired=repaired,
        timeouts=max(0, _int(ras.get("timeouts_count"), 0)), dropped=kept.seen - len(communicators),
        ranks=kept.ranks, lowest=kept.lowest, nodes=len(kept.hosts),
    )  # fmt: skip


def parse_communicator(raw: Any, max_ranks: int) -> Optional[Communicator]:
    """One communicator of the JSON answer, by its hash."""
    if not isinstance(raw, dict) or not isinstance(raw.get("hash"), str):
        return None
    comm = Communicator(raw["hash"][:32], size=max(0, _int(raw.get("size"), 0)))
    secondary = raw.get("secondary_hash")
    comm.secondary = secondary[:48] if isinstance(secondary, str) else ""
    ranks = [r for r in raw.get("ranks") or [] if isinstance(r, dict)]
    comm.answering = len(ranks)
    states = set()
    counted: list[tuple[Rank, dict[str, int]]] = []
    for entry in ranks:
        status = entry["status"] if isinstance(entry.get("status"), dict) else {}
        init = _int(status.get("init_state"), 0)
        failed = _int(status.get("async_error"), 0) not in (0, IN_PROGRESS)
        if failed or status.get("abort_flag") is True or init not in (0, IN_PROGRESS):
            states.add("error")
        elif init == IN_PROGRESS:
            states.add("init")
        raw_counts = entry.get("collective_counts")
        counts = {str(k): _int(v, 0) for k, v in raw_counts.items()} if isinstance(raw_counts, dict) else None
        rank = Rank(_int(entry.get("rank")), str(entry.get("host", ""))[:64], _int(entry.get("pid")),
                    _int(entry.get("nvml_dev")), sum(counts.values()) if counts is not None else None)  # fmt: skip
        counted.append((rank, counts or {}))
    for entry in [m for m in raw.get("missing_ranks") or [] if isinstance(m, dict)]:
        status = entry["status"] if isinstance(entry.get("status"), dict) else {}
        if status.get("unresponsive") is False:  # answered, without this communicator: NCCL's MISMATCH, not dead
            comm.left += 1
            states.add("mismatch")
            continue
        comm.missing.append(
            Rank(_int(entry.get("rank")), str(entry.get("host", ""))[:64], _int(entry.get("pid")),
                 _int(entry.get("nvml_dev")), dead=status.get("considered_dead") is True)
        )  # fmt: skip
    for rank in [rank for rank, _ in counted] + comm.missing:
        comm.lowest = lower(comm.lowest, rank.host)
        comm.hosts.add(rank.host)
    # A rank's place is judged kind by kind, as NCCL's own text does: AllReduce against AllReduce (a sum over kinds
    # set one kind's lead against another's shortfall).
    tops: dict[str, int] = {}
    for _, counts in counted:
        for kind, value in counts.items():
            tops[kind] = max(tops.get(kind, 0), value)
    totals = [rank.collectives for rank, _ in counted if rank.collectives is not None]
    comm.max_collectives = max(totals) if totals else None
    for rank, counts in counted:
        shortfall = max((tops[kind] - counts.get(kind, 0) for kind in tops), default=0)
        if shortfall > 0:
            rank.behind_by = shortfall
            comm.behind.append(rank)
    comm.behind = sorted(comm.behind, key=lambda r: (-(r.behind_by or 0), r.rank))[:max_ranks]
    if comm.behind:
        states.add("mismatch")
    comm.missing = sorted(comm.missing, key=lambda r: (not r.dead, r.rank))[:max_ranks]
    listed = len(comm.missing) + comm.left
    if comm.missing or _int(raw.get("missing_ranks_count"), listed) > listed:
        states.add("incomplete")
    comm.status = next((s for s in reversed(STATUSES) if s in states), "ok")
    return comm


# The text answer (2.24-2.28.6), as src/ras/client_support.cc formats it (v2.26.2-1: the summary 1110-1150, Errors
# 1161-1330, Warnings 1332-1560; tests/support/ras_corpus.py renders it).
# A process's GPUs: its CUDA devices, then its NVML ones where they differ (rasGpuDevsToString, v2.26.2-1:1826-1845;
# `managing GPU 0 (NVML 5)` for a job given CUDA_VISIBLE_DEVICES=5). UUIDs are found by NVML index.
# Numbers are read only as NCCL prints them (%d, %ld: 19 digits at most) and a hash as %016lx: a line with a longer one
# is not NCCL's and is left out (an int of 100,000 digits raised out of the sample; a 5,000-digit hash was a label).
PROCESS = re.compile(r"Process (\d{1,19}) on node (\S+) managing GPUs? ([\d,]{1,64})(?: \(NVML ([\d,]{1,64})\))?")
PLACE = re.compile(r"GPU (\d{1,19})(?: \(NVML (\d{1,19})\))? managed by process (\d{1,19}) on node (\S+)")
COMM = re.compile(r"^#(\d{1,19})-(\d{1,19}) \(([0-9a-fA-F]{1,16})\) (.+)$")
KIND = re.compile(r"Communicator ranks have different (\w+) operation counts")
GROUP = re.compile(r"(\d{1,19}) ranks have (?:launched up to operation (\d{1,19})|not launched any operations)")
ALONE = re.compile(r"Rank (\d{1,19}) has (?:launched up to operation (\d{1,19})|not launched any operations) -- (.*)")
LISTED = re.compile(r"Rank (\d{1,19}) -- (.*)")
# Its summary row: group, comms, nodes, ranks per node (N or N-M), ranks per comm, ranks in group, status, errors
# (OK, or several of INCOMPLETE, ERROR, MISMATCH joined by commas).
SUMMARY = re.compile(
    r"^\s*(\d{1,19})\s+(\d{1,19})\s+(\d{1,19})\s+\S+\s+(\d{1,19})\s+(\d{1,19})\s+([A-Z_]+)\s+([A-Z_,]+)\s*$"
)
# An INCOMPLETE communicator's count, in every release: "Missing communicator data from %d rank%s" (v2.24.3-1 and
# v2.25.1-1:1158-1160, commNRanks - nRanks; v2.26.2-1:1272-1274 to v2.30.7-1:1366-1368, nIncompleteRanks: the ranks
# whose process gave RAS no answer). The ranks listed after it may be fewer (rasCountIsOutlier) and are cut to
# max_ranks here: the counts come from this line.
MISSING_COUNT = re.compile(r"Missing communicator data from (\d{1,19}) ranks?$")
# 2.24/2.25 list them by number, built in a static 1,024-byte buffer (`lineBuf`, v2.24.3-1:82) with snprintf: a list
# of 1,023 characters was cut, its last number possibly mid-way.
OLD_LIST = re.compile(r"The missing ranks?: ([\d,]*)$")
LINE_BUFFER = 1024
# The Job summary's row under its "(total)" header, where every node runs as many processes and GPUs (v2.24.3-1:530,
# v2.26.2-1:558, v2.29.2-1:649-652, v2.30.7-1:634: "%7d  %9d  %11d  %9d  %7d": totalNodes first); otherwise NCCL
# prints a table by node instead, and the node count is not read.
JOB_TOTALS = "(total)   per node  per process    (total)  (total)"
JOB_ROW = re.compile(r"^\s*(\d{1,9})\s+\d{1,9}\s+\d{1,9}\s+\d{1,9}\s+\d{1,9}\s*$")
# RAS's own legs that timed out while collecting (the Warnings' TIMEOUT, every release: v2.24.3-1:1211-1213,
# v2.26.2-1:1336-1338, v2.30.7-1:1427-1429); JSON's `timeouts_count` from 2.28.7.
TIMEOUTS = re.compile(r"Encountered (\d{1,19}) communication timeouts? while gathering communicator data")


# NCCL 2.26.2-2.28.9's text answer walks the collected communicators stepping over each one's ranks but not its
# missing-rank array (rasClientRunComms, src/ras/client_support.cc v2.26.2-1:939-945, v2.28.7-1 and v2.28.9-1:988-994;
# fixed in v2.29.2-1:1035-1041; 2.28.7's JSON writer steps right, v2.28.7-1:2126-2127). After the first communicator
# (by commId) with a missing rank, each entry is read from that array (ras_internal.h v2.26.2-1:279-314): a phantom
# whose hash is a missing rank's commRank, address family (AF_INET 2, AF_INET6 10) and port, whose size is bytes of
# its address (0 for IPv4, millions for IPv6) and whose missing-rank count its GPU's numbers (cudaDev + 256 x nvmlDev),
# and as many real communicators, the last by commId, are never read. The version is the answer's first line.
VERSION = re.compile(r"NCCL version (\d{1,19})\.(\d{1,19})\.(\d{1,19})")
PHANTOM_WALK = ((2, 26, 2), (2, 29, 2))  # from, before
PLAUSIBLE_RANKS = 1 << 20


def release(text: str) -> Optional[tuple[int, int, int]]:
    found = VERSION.search(text[:200])
    return (int(found.group(1)), int(found.group(2)), int(found.group(3))) if found else None


def phantom(comm: Communicator, sized: bool) -> bool:
    """A communicator of a 2.26.2-2.28.9 text answer that the walk made up: counts no communicator can have, or a
    hash that is a missing rank's commRank, address family and port."""
    unreached = comm.missing_count if comm.missing_count is not None else len(comm.missing)
    if sized and (comm.size == 0 or comm.size > PLAUSIBLE_RANKS or unreached > comm.size):
        return True
    value = int(comm.hash, 16)
    return unreached > 0 and (value >> 32) & 0xFFFF in (2, 10) and value & 0xFFFFFFFF < PLAUSIBLE_RANKS


def placed(number: int, where: str) -> Rank:
    """A rank from `Rank N -- GPU g (NVML n) managed by process P on node H` (or `[process information not
    found]`: its number alone)."""
    found = PLACE.search(where)
    if not found:
        return Rank(number)
    nvml = int(found.group(2) or found.group(1))
    return Rank(number, found.group(4)[:64], int(found.group(3)), nvml)


def text_hash(raw: str) -> str:
    """The text form prints a hash as %016lx, JSON as 0x%lx: one label either way."""
    return "0x" + (raw.lower().lstrip("0") or "0")


def parse_text(text: str, max_ranks: int, max_communicators: int = MAX_COMMUNICATORS) -> JobStatus:
    """RAS's text answer (2.24-2.28.6): the communicators named in its Errors and Warnings sections and the dead
    processes, read as each release writes them (docs/jobs.md). The text is meant for people: what is not recognised
    is left out."""
    if "Communicators" not in text and "Job summary" not in text:
        raise RasError("malformed", "not a RAS status answer")
    if len(text) > MAX_TEXT_BYTES:
        raise RasError("too_large", f"a text answer of {len(text)} characters: NCCL's is a few MiB at most")
    sizes: dict[int, int] = {}
    ranks_total = 0  # the summary's 'ranks in group' summed
    garbled = PHANTOM_WALK[0] <= (release(text) or (0, 0, 0)) < PHANTOM_WALK[1]
    nodes, previous = 0, ""
    for line in text.splitlines():
        totals = JOB_ROW.match(line) if previous.strip() == JOB_TOTALS else None
        previous = line
        if totals:
            nodes = int(totals.group(1))
        row = SUMMARY.match(line)
        if row:
            sizes[int(row.group(1))] = int(row.group(4))
            ranks_total += int(row.group(5))
    communicators: dict[str, Communicator] = {}
    counts: dict[str, dict[str, dict[int, tuple[Rank, int]]]] = {}  # comm -> kind -> rank -> (rank, its count)
    tops: dict[str, dict[str, int]] = {}  # comm -> kind -> the highest count any group of ranks reached
    dead: list[Rank] = []
    dropped: set[str] = set()
    sized: set[str] = set()  # communicators whose size the summary table gave
    current: Optional[Communicator] = None
    section, block, kind = "", "", ""
    launched: Optional[int] = None  # the count of the group whose ranks are listed next
    timeouts = 0
    for line in text.splitlines():
        stripped = line.strip()
        timed_out = TIMEOUTS.match(stripped)
        if timed_out:
            timeouts = int(timed_out.group(1))
            continue
        if stripped in ("Errors", "Warnings"):
            section, current = stripped, None
            continue
        found = COMM.match(stripped)
        if found:
            key = text_hash(found.group(3))
            if key not in communicators and len(communicators) >= max_communicators:
                dropped.add(key)  # Errors come first: the troubled ones are kept
                current = None
                continue
            current = communicators.setdefault(key, Communicator(key, size=sizes.get(int(found.group(1)), 0)))
            if int(found.group(1)) in sizes:
                sized.add(key)
            for word in re.split(r"[\s,]+", found.group(4)):
                if word.lower() in STATUSES:
                    current.status = max(current.status, word.lower(), key=STATUSES.index)
            block, kind, launched = found.group(4).split()[0].upper(), "", None
            continue
        if stripped == "DEAD" and section == "Errors":
            current, section = None, "DEAD"
            continue
        process = PROCESS.search(stripped)
        if process and section == "DEAD" and len(dead) < max_ranks:
            first = (process.group(4) or process.group(3)).split(",")[0]  # its first GPU, by NVML index
            gpu = int(first) if 0 < len(first) <= 9 else -1
            dead.append(Rank(-1, process.group(2)[:64], int(process.group(1)), gpu, dead=True))
            continue
        if current is None:
            continue
        counted = MISSING_COUNT.match(stripped)
        if counted:
            current.missing_count = int(counted.group(1))
            continue
        old_form = OLD_LIST.match(stripped)  # 2.24 and 2.25
        if old_form:
            numbers = old_form.group(1).split(",")
            if len(old_form.group(1)) >= LINE_BUFFER - 1:
                numbers = numbers[:-1]  # cut by NCCL's buffer: the last may be part of a number (or a whole one)
            current.missing += [Rank(int(n)) for n in numbers if 0 < len(n) <= 19]
            continue
        new_kind = KIND.search(stripped)
        if new_kind:
            kind, launched = new_kind.group(1), None
            counts.setdefault(current.hash, {}).setdefault(kind, {})
            continue
        if stripped.startswith("Communicator ranks have different status"):
            kind, launched = "", None
            continue
        group = GROUP.match(stripped)
        if group and kind:
            launched = int(group.group(2) or 0)  # "have not launched any operations": 0, for the ranks listed next
            top = tops.setdefault(current.hash, {})
            top[kind] = max(top.get(kind, 0), launched)
            continue
        alone = ALONE.match(stripped)
        if alone and kind:
            value = int(alone.group(2) or 0)
            counts[current.hash][kind][int(alone.group(1))] = (placed(int(alone.group(1)), alone.group(3)), value)
            top = tops.setdefault(current.hash, {})
            top[kind] = max(top.get(kind, 0), value)
            continue
        listed = LISTED.match(stripped)
        if listed and block == "INCOMPLETE":
            current.missing.append(placed(int(listed.group(1)), listed.group(2)))
        elif listed and kind and launched is not None:
            counts[current.hash][kind][int(listed.group(1))] = (placed(int(listed.group(1)), listed.group(2)), launched)
    phantoms = 0
    for key, comm in list(communicators.items()):
        if garbled and phantom(comm, key in sized):
            del communicators[key]  # no one's counts: never served, counted
            phantoms += 1
    for comm in communicators.values():
        behind: dict[int, Rank] = {}
        for kind_name, ranks in counts.get(comm.hash, {}).items():
            highest = tops.get(comm.hash, {}).get(kind_name, 0)
            for number, (rank, value) in ranks.items():
                if value < highest and (number not in behind or highest - value > (behind[number].behind_by or 0)):
                    rank.collectives, rank.behind_by = value, highest - value
                    behind[number] = rank
        comm.max_collectives = max(tops.get(comm.hash, {}).values(), default=None)
        comm.behind = sorted(behind.values(), key=lambda r: (-(r.behind_by or 0), r.rank))[:max_ranks]
        unreached = comm.missing_count if comm.missing_count is not None else len(comm.missing)
        comm.missing = comm.missing[:max_ranks]
        comm.answering = max(0, comm.size - unreached) if comm.size else 0
        if comm.missing and comm.status == "ok":
            comm.status = "incomplete"
    return JobStatus("text", list(communicators.values()), dead, timeouts=timeouts, dropped=len(dropped),
                     phantoms=phantoms, ranks=ranks_total, nodes=nodes)  # fmt: skip
