"""The batch scheduler's view of this node: one `accelmon_node_scheduler_state{scheduler, state}` series, its current
state, for the fleet's ledger of GPU-hours (which GPUs could take work: docs/ledger.md).

Example exposition line::

    accelmon_node_scheduler_state{scheduler="slurm",state="mixed"} 1.0

Slurm: `scontrol show node NAME --oneliner`, asked on this collector's own slow schedule (every 30 s by default),
never on the scrape path, with a timeout; a controller that does not answer fails the sample (the collector's
success series says so, and the state is dropped as every stale sample is). Slurm prints a base state and flags
(`IDLE+DRAIN`, `MIXED+DRAIN`, `DOWN*+DRAIN`, `ALLOCATED+RESERVED`); the state served is one of STATES:

| Slurm | served |
|---|---|
| DOWN (any flags), FAIL | down |
| the DRAIN flag (or DRAINED, DRAINING), FAILING, with jobs (ALLOCATED, MIXED, COMPLETING) | draining |
| the DRAIN flag without jobs | drained |
| REBOOT_REQUESTED, REBOOT_ISSUED, MAINTENANCE (MAINT before 21.08), with jobs | draining |
| the same without jobs | drained |
| RESERVED (a reservation holds it) | reserved |
| ALLOCATED, COMPLETING | allocated |
| MIXED | mixed |
| IDLE | idle |
| anything else (FUTURE, UNKNOWN, a state this table does not know) | unknown |

The node asked for is Slurm's name of this host: the `node_name` option where given, else $SLURMD_NODENAME (set for
what slurmd starts), else the short host name; where Slurm has no node of that name, the node whose NodeHostName is
this host (listed once, then asked for by name). `accelmon_node_scheduler_node_info{source}` says which.

OAR's node states (Alive, Absent, Suspected, Dead) say nothing of jobs and are not read here: on OAR and on hosts
without a scheduler, no series (the ledger counts their GPUs without a job as free).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from typing import Any, Callable, Optional

from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import Option, Paths, Registration, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.host.slurm_nodes import STATES, Listing, SlurmNode, by_host_name, ledger_state, node_name, run_scontrol
from accelmon.host.slurm_pause import pause_of

log = logging.getLogger("accelmon.scheduler")

C = Catalogue(
    "scheduler",
    "The batch scheduler's view of the node",
    "Source: Slurm's `scontrol show node NAME --oneliner`, every interval_seconds, off the scrape path; states: "
    + ", ".join(STATES)
    + " (docs/ledger.md).",
)
STATE = C.gauge(
    "accelmon_node_scheduler_state",
    "The node's state in its batch scheduler: one series, value 1, its state one of " + ", ".join(STATES) + ".",
    ["scheduler", "state"],
)
OUT_SINCE = C.gauge(
    "accelmon_node_out_by_accelmon_since_seconds",
    "While Slurm shows the node drained, draining or down with a reason accelmon wrote: when accelmon first took it "
    "out (the controller's stamp of that drain, kept in accelmon's later reasons; Unix seconds). The circuit "
    "breaker's count over the fleet, for its overrun alert.",
    ["scheduler"],
)
PAUSED = C.gauge(
    "accelmon_remediation_paused",
    "1 while this node's Slurm Comment carries accelmon's pause switch (accelmon-remediation pause: every node's "
    "drains and repairs stop), else 0; the fleet is paused while any node serves 1.",
    ["scheduler"],
)
NODE_INFO = C.gauge(
    "accelmon_node_scheduler_node_info",
    "Which scheduler node this host is, and where the name came from: configured (the node_name option), "
    "SLURMD_NODENAME, NodeHostName (the node whose NodeHostName is this host), or hostname (the short host name); "
    "value is 1.",
    ["scheduler", "scheduler_node", "source"],
)
INTERVAL = seconds("interval_seconds", 30.0, "how often the scheduler is asked for this node's state")
SCONTROL = Option("scontrol", "scontrol", "Slurm's scontrol command (a name on PATH or a path)")
NODE_NAME = Option(
    "node_name",
    "",
    "Slurm's name of this node; empty: $SLURMD_NODENAME where the exporter's environment has it (a NodeName that "
    "differs from the host's name), else the host's short name",
    empty=True,
)
TIMEOUT = seconds("timeout_seconds", 10.0, "how long scontrol may take before the sample fails")

Run = Callable[[list[str], float], "subprocess.CompletedProcess[str]"]


def run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return run_scontrol(command, timeout)  # in UTC and the standard time format, as every part of accelmon reads it


class SchedulerCollector(Collector):
    name = "scheduler"

    def __init__(self, scontrol: str = "scontrol", node: str = "", timeout: float = 10.0, runner: Run = run) -> None:
        self.scontrol = scontrol
        self.node, self.source = node_name(node)
        log.info("Slurm's name of this node: %s (from %s)", self.node, self.source)
        self.timeout = timeout
        self.runner = runner
        self.listing = Listing(scontrol, lambda command: self.runner(command, self.timeout))

    def hardware_answering(self) -> Optional[bool]:
        return None  # not hardware: a controller that does not answer fails the sample instead

    def sample(self) -> Samples:
        try:
            found = self.listing.read(self.node)
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(f"scontrol did not answer in {self.timeout:g} s") from error
        if found is None and self.source == "hostname" and "not found" in self.listing.problem:
            found = self.find_by_host_name()
        if found is None:
            raise RuntimeError(f"scontrol show node {self.node}: {self.listing.problem}")
        node = next((n for n in found if n.name == self.node), found[0] if found else None)
        out = Samples()
        out.add(STATE, ["slurm", ledger_state(node.state) if node else "unknown"], 1)
        if node is not None and node.out and node.accelmons and node.out_since is not None:
            out.add(OUT_SINCE, ["slurm"], node.out_since)
        out.add(PAUSED, ["slurm"], 1 if node is not None and pause_of([node]) else 0)
        out.add(NODE_INFO, ["slurm", self.node, self.source], 1)
        return out

    def find_by_host_name(self) -> Optional[list[SlurmNode]]:
        """No node of the host's name: the one whose NodeHostName is this host, asked for by name from then on."""
        every = self.listing.read()
        node = by_host_name(every or [])
        if node is None:
            return None
        log.info("Slurm's name of this node: %s (its NodeHostName is this host)", node.name)
        self.node, self.source = node.name, "NodeHostName"
        return [node]


def _slurm_here(paths: Paths, options: dict[str, Any]) -> bool:
    """On by default where Slurm's scontrol is installed (a Slurm node)."""
    return shutil.which(str(options["scontrol"])) is not None


REGISTRATION = register(
    Registration(
        name="scheduler",
        help="the node's state in its batch scheduler (Slurm), for the fleet's ledger of GPU-hours",
        build=lambda options, paths: SchedulerCollector(
            str(options["scontrol"]), str(options["node_name"]), float(options["timeout_seconds"])
        ),
        catalogue=C,
        options=(INTERVAL, SCONTROL, NODE_NAME, TIMEOUT),
        enabled_by_default=_slurm_here,
    )
)
