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
| RESERVED or MAINT (a reservation holds it) | reserved |
| ALLOCATED, COMPLETING | allocated |
| MIXED | mixed |
| IDLE | idle |
| anything else (FUTURE, UNKNOWN, a state this table does not know) | unknown |

OAR's node states (Alive, Absent, Suspected, Dead) say nothing of jobs and are not read here: on OAR and on hosts
without a scheduler, no series (the ledger counts their GPUs without a job as free).
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
from typing import Any, Callable, Optional

from accelmon.metrics import Catalogue, Samples
from accelmon.registry import Option, Paths, Registration, register, seconds
from accelmon.runtime import Collector
from accelmon.slurm.nodes import STATES, ledger_state, parse_nodes

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
INTERVAL = seconds("interval_seconds", 30.0, "how often the scheduler is asked for this node's state")
SCONTROL = Option("scontrol", "scontrol", "Slurm's scontrol command (a name on PATH or a path)")
NODE_NAME = Option(
    "node_name", "", "Slurm's name of this node; empty: the host's short name, as slurmd names it", empty=True
)
TIMEOUT = seconds("timeout_seconds", 10.0, "how long scontrol may take before the sample fails")

Run = Callable[[list[str], float], "subprocess.CompletedProcess[str]"]


def run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


class SchedulerCollector(Collector):
    name = "scheduler"

    def __init__(self, scontrol: str = "scontrol", node: str = "", timeout: float = 10.0, runner: Run = run) -> None:
        self.scontrol = scontrol
        self.node = node or socket.gethostname().split(".")[0]
        self.timeout = timeout
        self.runner = runner

    def hardware_answering(self) -> Optional[bool]:
        return None  # not hardware: a controller that does not answer fails the sample instead

    def sample(self) -> Samples:
        try:
            result = self.runner([self.scontrol, "show", "node", self.node, "--oneliner"], self.timeout)
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(f"scontrol did not answer in {self.timeout:g} s") from error
        if result.returncode != 0:
            raise RuntimeError(f"scontrol show node {self.node}: {(result.stderr or result.stdout).strip()[:200]}")
        found = parse_nodes(result.stdout)
        out = Samples()
        out.add(STATE, ["slurm", ledger_state(found[0].state) if found else "unknown"], 1)
        return out


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
