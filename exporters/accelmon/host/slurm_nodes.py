"""Slurm's view of its nodes: the one reading of `scontrol show node(s)` for every part of accelmon that asks (the
scheduler collector's state for the ledger, the health check's circuit breaker, repair pace, pause switch and repair
loop). docs/slurm.md has what a real Slurm printed, which this module relies on.

Two forms, the JSON one preferred where the installed scontrol has it (`--json`: Slurm 23.02 and later; Debian 12's
22.05 answers `unrecognized option '--json'`, and a 23.02+ built without json-c `fatal: JSON plugin load failure`),
the one-line text form otherwise:

- text: `NodeName=gpu-7 ... State=IDLE+DRAIN ... Reason=accelmon: GPU 2 xid: reboot_node [root@2026-11-27T11:54:03]
  Comment=...`: a base state and flags joined by `+`, with a suffix for a node not responding (`*`) or powered down
  or powering (`~`, `#`, `!`, `%`, `$`): the suffixes are dropped, the flags kept. The line is read by Slurm's own
  layout (`slurm_sprint_node_table`, docs/slurm.md): Slurm's fixed fields, then Reason, Comment, Extra and a few
  later ones, each printed only when set. A free-text value runs up to the next field Slurm prints after it, never
  up to any ` Word=` it holds (`Comment=rack R12 Asset=SN12345` is one Comment), and the reason ends at Slurm's
  `[user@time]` stamp (a ` Comment=` inside a reason is the reason's). scontrol prints the stamp in its own
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
import shutil
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
FIELD = re.compile(r"\s[A-Z][A-Za-z_]*=")  # the start of the next of Slurm's fixed fields on a one-line node
# What `scontrol show node --oneliner` prints after a node's fixed fields, in the order Slurm prints them, each only
# when set (slurm_sprint_node_table in src/api/node_info.c, 22.05 to 25.11: docs/slurm.md). The fixed fields before
# them are Slurm's own formatting, whose values hold no ` Word=`; these hold what anyone wrote, so each runs up to
# the next of them that Slurm prints after it, never up to any ` Word=` it holds. The Reason ends at its stamp.
TAIL = (
    "Reason", "Comment", "Extra", "InstanceId", "InstanceType", "ReservationName", "TLSCertTokenSet",
    "TLSCertLastRenewal", "Topology", "Parameters",
)  # fmt: skip
TAIL_START = re.compile(r"\s(?:" + "|".join(TAIL) + r")=")  # where the first of them is (the fixed fields end)
TAIL_KEY = {name: re.compile(rf"\s+{name}=") for name in TAIL}
LATER = {name: re.compile(r"\s(?:" + "|".join(TAIL[i + 1 :]) + r")=") for i, name in enumerate(TAIL[:-1])}
CONTINUED = " " * 8  # a reason's further lines, one-line form: the line break as a space, then 7 spaces (node_info.c)
# What scontrol says when it cannot give JSON at all (docs/slurm.md): 22.05's getopt refusal of the option, and
# 23.02+'s serializer or data_parser plugin that did not load (Slurm built without json-c). Only these decide the
# text form: a call that timed out or did not reach the controller says nothing of what this scontrol can print.
NO_JSON = re.compile(
    r"unrecognized option|invalid option|JSON plugin load failure|could not find plugin for application/json"
    r"|Unable to load serializer plugins|output not supported by data_parser"
    r"|data_parser_g_new\w*: (?:failure loading plugins|plugin \S+ not found|unable to find plugin)"
)
# Where Slurm's commands are installed when scontrol is not on the PATH a program runs with: slurmd gives its
# HealthCheckProgram only SLURMD_NODENAME, with a daemon's PATH; the packages install to /usr/bin, a source build to
# /usr/local/bin by default, and sites commonly build to a prefix of their own under /opt/slurm or /usr/local/slurm.
SCONTROL_PLACES = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/local/slurm/bin")

Run = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def run_scontrol(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`command` (scontrol, or another command the health check runs) with SCONTROL_ENV, killed after `timeout`."""
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, env={**os.environ, **SCONTROL_ENV}
    )


SCONTROL_HELP = "the scontrol command (default: scontrol on PATH, else in " + ", ".join(SCONTROL_PLACES) + ")"


def find_scontrol(configured: str) -> str:
    """The scontrol to run: `configured` where it is a path, else the first executable of that name (scontrol when
    none is configured) on the PATH, else in SCONTROL_PLACES; else the bare name (running it then fails, and says
    so)."""
    name = configured or "scontrol"
    if "/" in name:
        return name
    found = shutil.which(name)
    if found:
        return found
    for place in SCONTROL_PLACES:
        candidate = os.path.join(place, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return name


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


@dataclass(frozen=True)
class NodeLine:
    """One line of `scontrol show node(s) --oneliner`, read by Slurm's layout."""

    fixed: str  # Slurm's fixed fields: the line up to the first of TAIL
    fields: dict[str, str]  # those of TAIL the line has; the Reason without its stamp (its lines joined by "\n")
    reason_user: str = ""
    reason_time: Optional[float] = None  # the reason's stamp, None when it has none


def reason_stamp(line: str, start: int) -> Optional[re.Match[str]]:
    """The stamp that ends the reason starting at `start`: the last `[user@time]` followed by what Slurm prints after
    one (the line's end, a field Slurm prints after the Reason, or the reason's next line). Nothing after the Reason
    is stamped, so one inside the reason's text comes before it."""
    chosen = None
    for found in STAMP.finditer(line, start):
        end = found.end()
        if not line[end:].strip() or line.startswith(CONTINUED, end) or LATER["Reason"].match(line, end):
            chosen = found
    return chosen


def read_line(line: str) -> NodeLine:
    """`line` split by Slurm's layout: its fixed fields, then each of TAIL present, up to the next that follows."""
    first = TAIL_START.search(line)
    if first is None:
        return NodeLine(line, {})
    fields: dict[str, str] = {}
    user, when, at = "", None, first.start()
    for name in TAIL:
        key = TAIL_KEY[name].match(line, at)
        if key is None:
            continue  # not printed (not set): the next of TAIL may be
        start, later = key.end(), LATER.get(name)
        stamp = reason_stamp(line, start) if name == "Reason" else None
        following = later.search(line, stamp.end() if stamp else start) if later else None
        at = following.start() if following else len(line)
        if stamp:
            user, when = stamp.group(1), stamp_time(stamp.group(2))
            lines = [line[start : stamp.start()], *line[stamp.end() : at].split(CONTINUED)]
            fields[name] = "\n".join(part.strip() for part in lines if part.strip())
        else:
            fields[name] = line[start:at].strip()
    return NodeLine(line[: first.start()], fields, user, when)


def fixed_value(fixed: str, name: str) -> Optional[str]:
    """The value of one of Slurm's fixed fields: up to the next field (values may hold spaces, as OS= does)."""
    match = re.search(rf"(?:^|\s){name}=", fixed)
    if not match:
        return None
    rest = fixed[match.end() :]
    following = FIELD.search(rest)
    return (rest[: following.start()] if following else rest).strip()


def field_value(line: str, name: str) -> Optional[str]:
    """The value of field `name` on a one-line node, read by Slurm's layout (`read_line`); None when not printed."""
    read = read_line(line)
    return read.fields.get(name) if name in TAIL else fixed_value(read.fixed, name)


def parse_nodes(text: str) -> list[SlurmNode]:
    """Every node in `scontrol show node(s) --oneliner`'s output (one line a node); other lines are skipped."""
    nodes = []
    for line in text.splitlines():
        read = read_line(line)
        name = re.search(r"(?:^|\s)NodeName=(\S+)", read.fixed)
        state = re.search(r"(?:^|\s)State=(\S+)", read.fixed)
        if not name or not state:
            continue
        comment = read.fields.get("Comment", "")
        gres = fixed_value(read.fixed, "Gres") or ""
        nodes.append(
            SlurmNode(
                name.group(1),
                state.group(1),
                read.fields.get("Reason", ""),
                read.reason_time,
                read.reason_user,
                "" if comment == "(null)" else comment,
                fixed_value(read.fixed, "NodeHostName") or "",
                "" if gres == "(null)" else gres,
                listed(fixed_value(read.fixed, "Partitions")),
                listed(fixed_value(read.fixed, "AvailableFeatures")),
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
    listing that scontrol answers or refuses --json with NO_JSON, then kept for this process; one that times out or
    finds no controller decides nothing)."""

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
            if self.json is None and result.returncode != 0 and NO_JSON.search(result.stderr):
                self.json = False  # this scontrol has no JSON (22.05, or no JSON plugin): the text form from now on
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
