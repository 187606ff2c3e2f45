"""Slurm's view of its nodes, read from `scontrol show node(s) --oneliner` (one line a node): the one parsing of
a node's State= field for every part of accelmon that reads it (the scheduler collector's state for the ledger, the
health check's circuit breaker and repair loop).

Slurm prints a base state and flags joined by `+` (`IDLE+DRAIN`, `MIXED+DRAIN`, `DOWN*+DRAIN`,
`IDLE+DRAIN+REBOOT_REQUESTED`), with a suffix for a node not responding (`*`), powered down or powering (`~`, `#`,
`!`, `%`, `$`): the suffixes are dropped, the flags kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REASON_PREFIX = "accelmon"  # every drain reason accelmon writes starts with it: the breaker counts only those
# The bounded states the scheduler collector serves for a node (docs/ledger.md).
STATES = ("idle", "allocated", "mixed", "drained", "draining", "down", "reserved", "unknown")
BUSY = {"ALLOCATED", "ALLOC", "MIXED", "COMPLETING"}  # running a job
DRAINED = {"DRAIN", "DRAINED", "DRAINING"}


def flags_of(state: str) -> set[str]:
    """Slurm's State= field as its base state and flags, without the power and responding suffixes."""
    return set(re.sub(r"[*~#!%$@^]", "", state.upper()).split("+"))


def ledger_state(state: str) -> str:
    """One of STATES for Slurm's State= field."""
    flags = flags_of(state)
    if flags & {"DOWN", "FAIL"}:
        return "down"
    if flags & (DRAINED | {"FAILING"}):
        return "draining" if flags & (BUSY | {"DRAINING", "FAILING"}) else "drained"
    if flags & {"RESERVED", "MAINT"}:
        return "reserved"
    if flags & {"ALLOCATED", "ALLOC", "COMPLETING"}:
        return "allocated"
    if "MIXED" in flags:
        return "mixed"
    if "IDLE" in flags:
        return "idle"
    return "unknown"


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # as scontrol prints it, e.g. IDLE+DRAIN, MIXED+DRAIN, DOWN*+DRAIN, IDLE+DRAIN+REBOOT_REQUESTED
    reason: str  # the reason text, without Slurm's [user@time] stamp

    @property
    def flags(self) -> set[str]:
        return flags_of(self.state)

    @property
    def takes_jobs(self) -> bool:
        return not self.flags & (DRAINED | {"DOWN", "FAIL", "FAILING", "MAINT"})

    @property
    def out(self) -> bool:
        """Drained, draining or down: what the breaker counts (when accelmon wrote the reason)."""
        return bool(self.flags & (DRAINED | {"DOWN", "FAIL", "FAILING"}))

    @property
    def drained_idle(self) -> bool:
        """Drained and running no job (Slurm's DRAINED, not DRAINING): what the repair loop may touch."""
        flags = self.flags
        return bool(flags & {"DRAIN", "DRAINED"}) and not flags & BUSY

    @property
    def reboot_pending(self) -> bool:
        return bool(self.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"})

    @property
    def accelmons(self) -> bool:
        return self.reason.startswith(REASON_PREFIX)


def parse_nodes(text: str) -> list[SlurmNode]:
    """Every node in `scontrol show node(s) --oneliner`'s output (one line a node); other lines are skipped."""
    nodes = []
    for line in text.splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        state = re.search(r"(?:^|\s)State=(\S+)", line)
        if not name or not state:
            continue
        reason = re.search(r"\sReason=(.*?)(?:\s+\[[^\]]*@[^\]]*\])?\s*$", line)
        nodes.append(SlurmNode(name.group(1), state.group(1), reason.group(1).strip() if reason else ""))
    return nodes
