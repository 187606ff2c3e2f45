"""Slurm's view of its nodes: the one reading of `scontrol show node(s)` for every part of accelmon that asks (the
scheduler collector's state for the ledger, the health check's circuit breaker, repair pace, pause switch and repair
loop). docs/slurm.md has what a real Slurm printed, which this module relies on.

Two forms, the JSON one preferred where the installed scontrol has it (`--json`: Slurm 23.02 and later; Debian 12's
22.05 answers `unrecognized option '--json'`), the one-line text form otherwise:

- text: `NodeName=gpu-7 ... State=IDLE+DRAIN ... Reason=accelmon: GPU 2 xid: reboot_node [root@2026-11-27T11:54:03]
  Comment=...`: a base state and flags joined by `+`, with a suffix for a node not responding (`*`) or powered down
  or powering (`~`, `#`, `!`, `%`, `$`): the suffixes are dropped, the flags kept. The reason ends at Slurm's
  `[user@time]` stamp (fields such as `Comment=` follow it on the line). scontrol prints the stamp in its own
  process's time zone and SLURM_TIME_FORMAT: accelmon runs it with TZ=UTC and SLURM_TIME_FORMAT=standard
  (`run_scontrol`) and reads the stamp as UTC, so neither a node's local zone, nor the repeated hour of a DST change,
  nor a site's `relative` format moves it.
- JSON: `{"nodes": [{"name", "state": ["IDLE", "DRAIN"], "reason", "reason_changed_at", "reason_set_by_user",
  "comment"}]}`, `reason_changed_at` an integer (23.02) or `{"set", "infinite", "number"}` (23.11 and later); the
  22.05 shape (`"state": "idle"` and `"state_flags": [...]`) is read too.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

REASON_PREFIX = "accelmon"  # every drain reason accelmon writes starts with it: the breaker counts only those
# The bounded states the scheduler collector serves for a node (docs/ledger.md).
STATES = ("idle", "allocated", "mixed", "drained", "draining", "down", "reserved", "unknown")
BUSY = {"ALLOCATED", "ALLOC", "MIXED", "COMPLETING"}  # running a job
DRAINED = {"DRAIN", "DRAINED", "DRAINING"}
# Slurm 21.08 and later print MAINTENANCE (a maintenance reservation holds the node); older ones MAINT.
MAINTENANCE = {"MAINT", "MAINTENANCE"}
REBOOTING = {"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"}
# A cloud node powered down (or going down, or coming up) runs no health check: it is not part of the checked fleet.
POWERED_DOWN = {"POWERED_DOWN", "POWER_DOWN", "POWERING_DOWN", "POWERING_UP"}
# How scontrol is run, whatever the site's or the node's settings: stamps in UTC, ISO 8601 (docs/slurm.md).
SCONTROL_ENV = {"TZ": "UTC", "SLURM_TIME_FORMAT": "standard"}
# accelmon writes when its node first went out into every reason it writes on a node already out (a repair claim, an
# escalation, a hold): Slurm's stamp moves with each edit, this does not, so the breaker ranks by it.
OUT_SINCE = re.compile(r"\s*\(out since (\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})Z\)")
STAMP = re.compile(r"\s\[([^\s\[\]@]+)@(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\]")
FIELD = re.compile(r"\s[A-Z][A-Za-z_]*=")  # the start of the next field on a one-line node

Run = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def run_scontrol(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`command` (scontrol, or another command the health check runs) with SCONTROL_ENV, killed after `timeout`."""
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, env={**os.environ, **SCONTROL_ENV}
    )


def node_name(configured: str = "") -> tuple[str, str]:
    """Slurm's name of this node and where it came from: `configured` if set, else $SLURMD_NODENAME (slurmd sets it
    for the programs it runs; a NodeName may differ from the host's name), else the short host name."""
    if configured:
        return configured, "configured"
    if os.environ.get("SLURMD_NODENAME"):
        return os.environ["SLURMD_NODENAME"], "SLURMD_NODENAME"
    return socket.gethostname().split(".")[0], "hostname"


def by_host_name(nodes: list[SlurmNode]) -> Optional[SlurmNode]:
    """The node whose NodeHostName is this host (short or fully qualified): how a process that slurmd did not start
    (the exporter) finds a NodeName that differs from the host's name."""
    names = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
    return next((node for node in nodes if node.host and node.host in names), None)


def flags_of(state: str) -> set[str]:
    """Slurm's State= field as its base state and flags, without the power and responding suffixes."""
    return set(re.sub(r"[*~#!%$@^]", "", state.upper()).split("+"))


def ledger_state(state: str) -> str:
    """One of STATES for Slurm's State= field. A node being rebooted or held for maintenance takes no new jobs:
    drained, as a drained node (the ledger counts its GPUs out of service, not free)."""
    flags = flags_of(state)
    if flags & {"DOWN", "FAIL"}:
        return "down"
    if flags & (DRAINED | {"FAILING"}):
        return "draining" if flags & (BUSY | {"DRAINING", "FAILING"}) else "drained"
    if flags & (REBOOTING | MAINTENANCE):
        return "draining" if flags & BUSY else "drained"
    if "RESERVED" in flags:
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
    reason_time: Optional[float] = None  # when the controller set the reason (epoch seconds), None if not stamped
    reason_user: str = ""
    comment: str = ""  # the node's Comment ("" when unset)
    host: str = ""  # NodeHostName: the host's name, where it differs from the NodeName ("" when not given)
    gres: str = ""  # Gres=, e.g. gpu:h100:8(S:0-1) ("" when none)
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()  # its available features

    @property
    def flags(self) -> set[str]:
        return flags_of(self.state)

    @property
    def takes_jobs(self) -> bool:
        return not self.flags & (DRAINED | MAINTENANCE | REBOOTING | {"DOWN", "FAIL", "FAILING"})

    @property
    def out(self) -> bool:
        """Drained, draining or down: what the breaker counts (when accelmon wrote the reason)."""
        return bool(self.flags & (DRAINED | {"DOWN", "FAIL", "FAILING"}))

    @property
    def drained_idle(self) -> bool:
        """Drained and running no job (Slurm's DRAINED, not DRAINING): what the repair loop may touch."""
        flags = self.flags
        return bool(flags & {"DRAIN", "DRAINED"}) and not flags & BUSY and "DOWN" not in flags

    @property
    def reboot_pending(self) -> bool:
        return bool(self.flags & REBOOTING)

    @property
    def accelmons(self) -> bool:
        return self.reason.startswith(REASON_PREFIX)

    @property
    def powered_down(self) -> bool:
        return bool(self.flags & POWERED_DOWN)

    @property
    def out_since(self) -> Optional[float]:
        """When accelmon first took this node out: the time its reason carries (written there by accelmon whenever it
        edits the reason of a node already out), else the reason's stamp (a first drain, unedited since)."""
        found = OUT_SINCE.search(self.reason)
        if found:
            return stamp_time(found.group(1))
        return self.reason_time


def keyed_reason(reason: str, since: Optional[float], limit: int = 200) -> str:
    """`reason` carrying `since` (when the node first went out), within `limit` characters: where it carries one
    already (Slurm appends ": reboot issued" after it), as it is; else at its end."""
    if OUT_SINCE.search(reason) and len(reason) <= limit:
        return reason
    body = OUT_SINCE.sub("", reason).strip()
    if since is None:
        return body[:limit]
    mark = f" (out since {time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(since))}Z)"
    return body[: limit - len(mark)] + mark


def stamp_time(text: str) -> Optional[float]:
    """Slurm's reason stamp, printed in UTC (SCONTROL_ENV), to the second, as epoch seconds."""
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, OverflowError):
        return None


def field_value(line: str, name: str) -> Optional[str]:
    """The value of field `name` on a one-line node: up to the next field (values may hold spaces)."""
    match = re.search(rf"(?:^|\s){name}=", line)
    if not match:
        return None
    rest = line[match.end() :]
    following = FIELD.search(rest)
    return (rest[: following.start()] if following else rest).strip()


def parse_nodes(text: str) -> list[SlurmNode]:
    """Every node in `scontrol show node(s) --oneliner`'s output (one line a node); other lines are skipped."""
    nodes = []
    for line in text.splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        state = re.search(r"(?:^|\s)State=(\S+)", line)
        if not name or not state:
            continue
        reason, when, user = "", None, ""
        found = re.search(r"\sReason=", line)
        if found:
            rest = line[found.end() :]
            stamp = STAMP.search(rest)
            if stamp:  # the reason is everything before its stamp, whatever it holds
                reason, user, when = rest[: stamp.start()].strip(), stamp.group(1), stamp_time(stamp.group(2))
            else:
                reason = field_value(line, "Reason") or ""
        comment = field_value(line, "Comment") or ""
        host = field_value(line, "NodeHostName") or ""
        comment = "" if comment == "(null)" else comment
        gres = field_value(line, "Gres") or ""
        nodes.append(
            SlurmNode(
                name.group(1),
                state.group(1),
                reason,
                when,
                user,
                comment,
                host,
                "" if gres == "(null)" else gres,
                listed(field_value(line, "Partitions")),
                listed(field_value(line, "AvailableFeatures")),
            )
        )
    return nodes


def listed(value: Any) -> tuple[str, ...]:
    """A comma-separated field (text form) or a list of strings (JSON) as a tuple; (null) and "" as ()."""
    if isinstance(value, list):
        return tuple(str(v) for v in value if isinstance(v, str) and v)
    if not isinstance(value, str) or value in ("", "(null)"):
        return ()
    return tuple(part for part in value.split(",") if part)


def number(value: Any) -> Optional[float]:
    """Slurm's JSON numbers: a plain integer (23.02) or {"set": true, "infinite": false, "number": N} (23.11+)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def parse_json(text: str) -> list[SlurmNode]:
    """Every node in `scontrol show nodes --json`'s output; ValueError when it is not Slurm's JSON."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ValueError("no nodes list")
    nodes = []
    for raw in data["nodes"]:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            continue
        state = raw.get("state", [])
        flags = [state] if isinstance(state, str) else [str(s) for s in state if isinstance(s, str)]
        flags += [str(s) for s in raw.get("state_flags", []) or [] if isinstance(s, str)]  # the 22.05 shape
        nodes.append(
            SlurmNode(
                raw["name"],
                "+".join(flag.upper() for flag in flags) or "UNKNOWN",
                str(raw.get("reason") or ""),
                number(raw.get("reason_changed_at")),
                str(raw.get("reason_set_by_user") or ""),
                str(raw.get("comment") or ""),
                str(raw.get("hostname") or ""),
                str(raw.get("gres") or ""),
                listed(raw.get("partitions")),
                listed(raw.get("features")),
            )
        )
    return nodes


class Listing:
    """Reads the nodes through `scontrol`: JSON where this scontrol has it, else the text form (decided at the first
    listing, then kept for this process)."""

    def __init__(self, scontrol: str, runner: Run) -> None:
        self.scontrol, self.runner = scontrol, runner
        self.json: Optional[bool] = None  # unknown until asked
        self.problem = ""  # what scontrol said when it last failed

    def read(self, *which: str) -> Optional[list[SlurmNode]]:
        """`which`: () for every node, (NAME,) for one; None when the controller did not answer."""
        what = ["show", "node", *which] if which else ["show", "nodes"]
        if self.json is not False:
            result = self.runner([self.scontrol, *what, "--json"])
            if result.returncode == 0:
                try:
                    found = parse_json(result.stdout)
                    self.json = True
                    return found
                except ValueError:
                    pass
            if self.json is None and "--json" in (result.stderr + result.stdout):  # this scontrol has no --json
                self.json = False
            elif self.json is None and result.returncode == 0:
                self.json = False  # it answered something that is not JSON: the text form from now on
            else:
                self.problem = (result.stderr or result.stdout).strip()[-200:]
                return None  # a controller that does not answer
        result = self.runner([self.scontrol, *what, "--oneliner"])
        if result.returncode != 0:
            self.problem = (result.stderr or result.stdout).strip()[-200:]
            return None
        return parse_nodes(result.stdout)
