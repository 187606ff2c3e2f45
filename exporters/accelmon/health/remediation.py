"""From verdict to repair, safely: the circuit breaker on draining, the repair decision for a node accelmon drained,
and the journal of what was decided and done (docs/health.md, "From verdict to repair").

The Slurm health check (accelmon.schedulers.slurm.health) acts through Slurm's own primitives; this module holds what it
decides with, free of Slurm's command line so that each rule is tested on its own:

- the options of the circuit breaker and the repair pace, which accelmon.schedulers.slurm.fleet keeps over the whole
  fleet: no more than max(breaker_min_nodes, ceil(breaker_fraction x the nodes Slurm lists)) nodes out by accelmon's
  drains of the last breaker_window_hours, and no more than max_repairs_per_hour repairs. A mass event (a bad driver, a
  kernel log replayed at boot, a threshold set wrong) then takes out a few nodes, not the fleet.
- `plan_repair`: what a node that accelmon drained, and that runs no job, gets: Slurm's reboot for `reboot_node`, a
  GPU reset then a fresh scan for `reset_gpu`, a resume once the check passes for `restart_app`; never anything for
  `hardware_service`, `check_fabric` or an action it does not know, nor for a GPU that failed again within
  `repeat_window_days` of a repair (that one is left for hardware service), nor for a drill (which says what it
  would have done). In `observe` mode (the default) every decision is said and journalled, nothing is done.
- `Journal`: one JSON record a line in `remediation_journal` on the node (root's, readable by the exporter, kept
  across reboots), keyed by GPU serial: a re-seated or swapped GPU is another GPU. Append-only under a lock (the
  periodic check and a background repair may both write); a repair is journalled when it starts and when it ends. A
  line that is not a record is skipped and counted; a journal that cannot be read or written stops every repair (it
  could not say whether a GPU is a repeat offender), never the health check.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Protocol

from accelmon.exporter.validation import Option
from accelmon.health.xid import ACTIONS

log = logging.getLogger("accelmon.remediation")

MODES = ("observe", "act")
# What the repair loop may do, by the action a failing check asks for; anything else stays with a person.
REPAIRS = ("reboot_node", "reset_gpu", "restart_app")
MAX_RECORDS = 5000  # the journal keeps the newest records (years of repairs on one node); older ones are dropped
# The systemd units that may hold a GPU open (a reset is refused while any process does): the exporter itself, DCGM's
# host engine (Debian/Ubuntu and RHEL name it nvidia-dcgm) and dcgm-exporter.
GPU_HOLDERS = "accelmon-exporter.service nvidia-dcgm.service dcgm-exporter.service"

REMEDIATION = Option(
    "remediation",
    "observe",
    "what the Slurm health check does with a node it drained that runs no job: observe (say and journal what it "
    "would do: reboot, reset a GPU, resume) or act (do it through Slurm's reboot and resume)",
    choices=MODES,
)
JOURNAL = Option(
    "remediation_journal",
    "/var/lib/accelmon/remediation.jsonl",
    "the node's journal of drains and repairs, by GPU serial (root's; the exporter reads it and serves its counts)",
)
REPEAT_WINDOW_DAYS = Option(
    "repeat_window_days",
    7.0,
    "a GPU that fails again within this many days of a repair is not repaired again: it is left for hardware service",
    minimum=0.01,
    maximum=3650,
)
BREAKER_MIN_NODES = Option(
    "breaker_min_nodes",
    3.0,
    "the circuit breaker lets accelmon's drains through while fewer nodes than max(this, breaker_fraction x the "
    "nodes it checks (breaker_nodes)) are drained, draining or down with a reason accelmon wrote",
    minimum=1,
    maximum=1_000_000,
    whole=True,
)
BREAKER_FRACTION = Option(
    "breaker_fraction",
    0.1,
    "the circuit breaker's share of the nodes it checks (see breaker_min_nodes)",
    maximum=1.0,
)
BREAKER_NODES = Option(
    "breaker_nodes",
    "gres:gpu",
    "the nodes the breaker's share is of, space separated, any of them matching: gres:NAME (a node with that gres), "
    "partition:NAME, feature:NAME, or all; powered-down nodes and nodes down for another reason never count",
    words=(r"all|(gres|partition|feature):[^\s:]+", "gres:NAME, partition:NAME, feature:NAME or all"),
    several=True,
)
BREAKER_MAX_NODES = Option(
    "breaker_max_nodes",
    1_000_000.0,
    "at most this many nodes out by accelmon whatever the share (the default caps nothing)",
    minimum=1,
    maximum=1_000_000,
    whole=True,
)
BREAKER_WINDOW_HOURS = Option(
    "breaker_window_hours",
    24.0,
    "the circuit breaker counts accelmon's drains of this many hours that are still out (older ones, sent for "
    "service, no longer use the budget)",
    minimum=0.1,
    maximum=8760,
)
MAX_REPAIRS_PER_HOUR = Option(
    "max_repairs_per_hour",
    3.0,
    "repairs (reboots, GPU resets) over the whole fleet in any hour, counted from what Slurm shows",
    minimum=1,
    maximum=100_000,
    whole=True,
)
GPU_RESET_COMMAND = Option(
    "gpu_reset_command",
    "nvidia-smi --gpu-reset -i {pci_bus_ids}",
    "the command that resets GPUs, by {pci_bus_ids} (every GPU of one reset, comma separated: the failing ones and, "
    "where the platform needs it, the GPUs NVLink joins them to), or one GPU at a time by {pci_bus_id} or {uuid} "
    "(an index shifts when a GPU falls off the bus); run by the Slurm health check in act mode once the GPUs' "
    "holders are stopped",
    must_contain=("{pci_bus_ids}", "{pci_bus_id}", "{uuid}"),
)
GPU_HOLDERS_OPTION = Option(
    "gpu_holders",
    GPU_HOLDERS,
    "the systemd units stopped before a GPU reset and started again after it, whatever its outcome (space "
    "separated; those not running are left alone): a reset is refused while any process holds the GPU",
    empty=True,
    several=True,
)
OPTIONS = (
    REMEDIATION, JOURNAL, REPEAT_WINDOW_DAYS, BREAKER_MIN_NODES, BREAKER_FRACTION, BREAKER_NODES, BREAKER_MAX_NODES,
    BREAKER_WINDOW_HOURS, MAX_REPAIRS_PER_HOUR, GPU_RESET_COMMAND, GPU_HOLDERS_OPTION,
)  # fmt: skip

# The journal's events, bounded (they become label values).
EVENTS = (
    "claimed", "drained", "breaker_held", "repair", "repair_held", "would_repair", "left_for_person", "escalated",
    "resumed",
)  # fmt: skip
# claimed: journalled (and fsynced) just before a drain is sent, so that a check killed after it leaves a trace; the
# next check settles it (drained, or breaker_held with outcome failed).
# A repair: started (journalled before it runs), then requested (Slurm took the reboot), resolved or failed, or
# timed_out (Slurm gave up waiting for the reboot: the node drained again). A hold
# (breaker_held, repair_held): held (the limit was reached), ranked_out (claimed, then taken back), paused, uncounted
# (the controller could not be read). A drain is `unverified` (event drained) when it is out in Slurm but was never
# ranked within the limit (an answer lost, a take-back that failed, a claim whose check was killed): the only drain
# the breaker ever takes back (accelmon.schedulers.slurm.fleet). A drain journalled with outcome none was granted: it
# stays until its node passes, whatever the limit becomes later.
OUTCOMES = (
    "started", "requested", "resolved", "failed", "timed_out", "observed", "drill", "held", "ranked_out", "paused",
    "uncounted", "unverified", "none",
)  # fmt: skip
REPAIRED = ("requested", "resolved")  # what the repeat rule counts: a command that failed is no repair


@dataclass(frozen=True)
class FailingGpu:
    index: str
    uuid: str
    serial: str
    action: str  # the most disruptive action of its failing checks
    checks: tuple[str, ...]  # the names of its failing checks
    drill: bool = False
    pci_bus_id: str = ""  # what the reset names it by (an index shifts when a GPU falls off the bus)


@dataclass(frozen=True)
class Record:
    time: float
    node: str
    event: str  # one of EVENTS
    action: str = "none"
    outcome: str = "none"  # one of OUTCOMES
    gpus: tuple[dict[str, str], ...] = ()  # {index, uuid, serial}
    detail: str = ""  # for people
    breaker: tuple[int, int, int] = (0, 0, 0)  # breaker_held: (nodes out by accelmon, nodes listed, limit)
    # The reason accelmon set on the node with this decision ("" when it set none): accelmon acts on a node only while
    # Slurm still shows it (an administrator's edit makes the node theirs).
    reason: str = ""
    # A repair's start: the GPUs the node had before it, as (PCI bus id, UUID): after the repair the same must answer.
    inventory: tuple[tuple[str, str], ...] = ()

    def as_json(self) -> str:
        extra: dict[str, Any] = {"reason": self.reason} if self.reason else {}
        if self.inventory:
            extra["inventory"] = [list(gpu) for gpu in self.inventory]
        return json.dumps(
            {
                **extra,
                "time": self.time,
                "node": self.node,
                "event": self.event,
                "action": self.action,
                "outcome": self.outcome,
                "gpus": list(self.gpus),
                "detail": self.detail,
                "breaker": list(self.breaker),
            },
            sort_keys=True,
        )


def record_of(line: str) -> Record:
    """A journal line as a record; ValueError (or KeyError, TypeError) when it is not one."""
    raw = json.loads(line)
    event = str(raw["event"])
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}")
    gpus = tuple(
        {"index": str(g.get("index", "")), "uuid": str(g.get("uuid", "")), "serial": str(g.get("serial", ""))}
        for g in raw.get("gpus", ())
    )
    when = float(raw["time"])
    if not math.isfinite(when):
        raise ValueError("time is not a number")
    outcome = str(raw.get("outcome", "none"))
    counts = [int(n) for n in raw.get("breaker", (0, 0, 0))]
    if len(counts) != 3:
        raise ValueError("breaker: expected three counts")
    inventory = tuple((str(bus), str(uuid)) for bus, uuid in raw.get("inventory", ()))
    return Record(
        when, str(raw["node"]), event, str(raw.get("action", "none")), outcome if outcome in OUTCOMES else "none",
        gpus, str(raw.get("detail", "")), (counts[0], counts[1], counts[2]), str(raw.get("reason", "")), inventory,
    )  # fmt: skip


@dataclass
class Journal:
    """The node's journal. `records` holds what could be read; `malformed` counts the lines that were not records;
    `problem` says why the journal cannot be trusted (unreadable, or a line that is not a record), None if it can."""

    path: str
    records: list[Record] = field(default_factory=list)
    malformed: int = 0
    problem: Optional[str] = None
    missing: bool = False

    @classmethod
    def read(cls, path: str) -> Journal:
        journal = cls(path)
        try:
            with open(path, encoding="utf-8", errors="replace") as stream:
                lines = stream.read().splitlines()
        except FileNotFoundError:
            journal.missing = True
            return journal
        except OSError as error:
            journal.problem = f"the journal {path} cannot be read: {error.strerror or error}"
            return journal
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                journal.records.append(record_of(line))
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                journal.malformed += 1
                if journal.problem is None:
                    journal.problem = f"the journal {path} has a line that is not a record (line {number}: {error})"
        return journal

    def append(self, record: Record) -> Optional[str]:
        """Appends `record` as one line under an exclusive lock of the file (two writers never lose a record; a
        reader never sees half a line); past twice MAX_RECORDS lines the newest MAX_RECORDS are kept, rewritten
        under the same lock. Why it could not be written, or None."""
        self.records.append(record)
        directory = os.path.dirname(self.path) or "."
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            while True:
                descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX)
                    if os.fstat(descriptor).st_ino != os.stat(self.path).st_ino:
                        continue  # compacted by another writer while this one waited: append to the new file
                    os.fchmod(descriptor, 0o644)  # the exporter (another user) reads it; no secret in it
                    os.write(descriptor, (record.as_json() + "\n").encode())
                    # On disk before anything else is done: the repeat rule and the claim's trace must survive a hard
                    # reboot, the very repair this journal records.
                    os.fsync(descriptor)
                    if os.fstat(descriptor).st_size > 2 * MAX_RECORDS * 200:
                        self.compact(directory)
                    break
                finally:
                    os.close(descriptor)  # releases the lock
        except OSError as error:
            return f"the journal {self.path} cannot be written: {error.strerror or error}"
        self.missing = False
        return None

    def compact(self, directory: str) -> None:
        """Keeps the newest MAX_RECORDS lines (called holding the journal's lock)."""
        with open(self.path, encoding="utf-8", errors="replace") as stream:
            lines = stream.read().splitlines()
        if len(lines) <= MAX_RECORDS:
            return
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".remediation-")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write("".join(line + "\n" for line in lines[-MAX_RECORDS:]))
                out.flush()
                os.fsync(out.fileno())  # the new file's records on disk before its name replaces the old one's
            os.chmod(temporary, 0o644)
            os.replace(temporary, self.path)
        except BaseException:
            os.unlink(temporary)
            raise
        # The rename itself survives a power cut only once the directory is on disk too.
        directory_handle = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(directory_handle)
        finally:
            os.close(directory_handle)

    def last_repair_of(self, serial: str, since: float) -> Optional[Record]:
        """The newest repair (carried out, not observed) of the GPU with this serial since `since`."""
        for record in reversed(self.records):
            if record.time < since:
                break
            if (
                record.event == "repair"
                and record.outcome in REPAIRED
                and any(g.get("serial") == serial for g in record.gpus)
            ):
                return record
        return None

    def reason_written(self, node: str) -> Optional[str]:
        """The reason accelmon last set on `node` while its drain is open (None: none journalled since the last
        resume or hold, or a journal older than this field)."""
        for record in reversed(self.records):
            if record.node != node:
                continue
            if record.event in ("resumed", "breaker_held"):
                return None
            if record.reason:
                return record.reason
        return None

    def inventory(self, node: str) -> tuple[tuple[str, str], ...]:
        """The GPUs `node` had when accelmon last recorded them (its drain, a repair's start): what a scan must find
        again before the node is resumed; () where none is journalled (a journal older than this field)."""
        for record in reversed(self.records):
            if record.node == node and record.inventory:
                return record.inventory
        return ()

    def last_event(self, node: str, events: Iterable[str]) -> Optional[Record]:
        wanted = set(events)
        for record in reversed(self.records):
            if record.node == node and record.event in wanted:
                return record
        return None

    def resets(self) -> dict[str, float]:
        """GPU uuid -> when its latest GPU reset that resolved it started (for the xid check: a critical XID whose
        action is reset_gpu, logged before the reset started, has been acted on; one logged during it has not)."""
        found: dict[str, float] = {}
        started: dict[str, float] = {}
        for record in self.records:
            if record.event != "repair" or record.action != "reset_gpu":
                continue
            for gpu in record.gpus:
                uuid = gpu.get("uuid")
                if not uuid:
                    continue
                if record.outcome == "started":
                    started[uuid] = record.time
                elif record.outcome == "resolved":
                    found[uuid] = max(found.get(uuid, 0.0), min(started.pop(uuid, record.time), record.time))
        return found


@dataclass(frozen=True)
class RepairPlan:
    """What to do with a drained, idle node: `step` one of reboot, reset, resume, escalate, leave, wait, none."""

    step: str
    action: str = "none"
    gpus: tuple[FailingGpu, ...] = ()
    why: str = ""
    drill: bool = False
    earlier: Optional[Record] = None  # escalate: the repair the GPU failed again after
    # reset: the GPUs the reset takes beside the failing ones (linked by NVLink where the platform resets them
    # together: accelmon.health.reset_scope)
    linked: tuple[FailingGpu, ...] = ()


def repeat_offender(
    failing: list[FailingGpu], journal: Journal, repeat_window_seconds: float, now: float
) -> Optional[tuple[FailingGpu, Record]]:
    """The first failing GPU that was repaired within the repeat window, with that repair; None if there is none,
    or for a drill (a rehearsal never sends a GPU to hardware service)."""
    if any(gpu.drill for gpu in failing):
        return None
    for gpu in failing:
        earlier = journal.last_repair_of(gpu.serial, now - repeat_window_seconds) if gpu.serial else None
        if earlier is not None:
            return gpu, earlier
    return None


class DrainedNode(Protocol):
    """What the policy reads of a node: a scheduler's node type adapts to it (accelmon.host.slurm_nodes.SlurmNode does
    as it is), so that the policy depends on no scheduler."""

    @property
    def name(self) -> str: ...

    @property
    def reboot_pending(self) -> bool: ...


def plan_repair(
    failing: list[FailingGpu], node_failing: list[tuple[str, str]], journal: Journal, node: DrainedNode,
    repeat_window_seconds: float, now: float,
) -> RepairPlan:  # fmt: skip
    """What a node accelmon drained, now running no job, gets (the mode decides whether it is done).

    `failing`: its failing GPUs (empty when every check passes now); `node_failing`: its failing node checks as
    (name, action)."""
    if node.reboot_pending:
        return RepairPlan("wait", why="a reboot is already under way")
    if not failing and not node_failing:
        drained = journal.last_event(node.name, ("drained", "escalated"))
        asked = drained.action if drained else "none"
        if drained is not None and drained.event == "drained" and asked in REPAIRS:
            return RepairPlan("resume", asked, why=f"every check passes now (drained for {asked})")
        return RepairPlan("leave", asked, why="drained for a person to look at: accelmon resumes only what it repaired")
    if node_failing:
        name, action = node_failing[0]
        return RepairPlan("leave", action, why=f"the node check {name} fails: {action} is a person's")
    drill = any(gpu.drill for gpu in failing)
    repeat = repeat_offender(failing, journal, repeat_window_seconds, now)
    if repeat is not None:
        gpu, earlier = repeat
        when = time.strftime("%Y-%m-%d", time.gmtime(earlier.time))
        return RepairPlan(
            "escalate", "hardware_service", (gpu,),
            f"GPU {gpu.index} (serial {gpu.serial}) failed again after {earlier.action} on {when}", earlier=earlier,
        )  # fmt: skip
    worst = max((gpu.action for gpu in failing), key=disruption)
    chosen = tuple(gpu for gpu in failing if gpu.action == worst)
    if worst not in REPAIRS:
        return RepairPlan("leave", worst, chosen, f"{worst} is a person's", drill)
    if any(not gpu.serial for gpu in chosen) and worst == "reset_gpu":
        return RepairPlan("leave", worst, chosen, "a GPU without a serial cannot be told from its replacement", drill)
    step = {"reboot_node": "reboot", "reset_gpu": "reset", "restart_app": "resume"}[worst]
    opened = journal.last_event(node.name, ("drained", "escalated"))
    tried = journal.last_event(node.name, ("repair",))
    if tried and tried.outcome == "failed" and tried.action == worst and opened and tried.time >= opened.time:
        # Slurm refused the command (no RebootProgram, say): the next check would only fail the same way.
        why = f"{worst} failed on this drain ({tried.detail}): a person's now"
        return RepairPlan("leave", worst, chosen, why, drill)
    if step == "resume":
        return RepairPlan("wait", worst, chosen, "restart_app: the job was the problem; resumed once the check passes")
    return RepairPlan(step, worst, chosen, f"{worst} for GPU {', '.join(g.index for g in chosen)}", drill)


def disruption(action: str) -> int:
    """How disruptive an action is, in the catalogue's order (least first); one the catalogue does not know counts as
    the most (a person decides)."""
    return ACTIONS.index(action) if action in ACTIONS else len(ACTIONS)


def gpus_of(failing: Iterable[FailingGpu]) -> tuple[dict[str, str], ...]:
    return tuple({"index": g.index, "uuid": g.uuid, "serial": g.serial} for g in failing)


def would(plan: RepairPlan) -> str:
    """The decision in a few words, as observe mode says it ("would reset GPU 2")."""
    indices = ", ".join(g.index for g in plan.gpus)
    return {
        "reboot": "would reboot the node",
        "reset": f"would reset GPU {indices}"
        + (
            f" with GPU {', '.join(g.index for g in plan.linked)} (NVLink-linked: reset together)"
            if plan.linked
            else ""
        ),
        "resume": "would resume the node",
        "escalate": "would leave it drained for hardware_service",
    }.get(plan.step, f"would {plan.step}")


def drained_seconds(records: list[Record]) -> float:
    """Seconds each node spent drained by accelmon, from its drain to its resume (closed drains only)."""
    total, since = 0.0, {}  # node -> when its open drain began
    for record in records:
        if record.event in ("drained", "escalated") and record.node not in since:
            since[record.node] = record.time
        elif record.event in ("resumed", "breaker_held") and record.node in since:  # resumed, or taken back
            total += max(0.0, record.time - since.pop(record.node))
    return total


def summary_of(records: list[Record]) -> dict[str, Any]:
    """What the exporter serves from the journal: repairs per GPU, action and outcome; events per kind."""
    repairs: dict[tuple[str, str, str, str, str], int] = {}
    events: dict[tuple[str, str], int] = {}
    for record in records:
        events[(record.event, record.action)] = events.get((record.event, record.action), 0) + 1
        if record.event == "repair":
            for gpu in record.gpus:
                key = (gpu.get("index", ""), gpu.get("uuid", ""), gpu.get("serial", ""), record.action, record.outcome)
                repairs[key] = repairs.get(key, 0) + 1
    return {"repairs": repairs, "events": events}
