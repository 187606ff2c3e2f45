"""accelmon-slurm-health: Slurm's HealthCheckProgram. It runs the exporter's health scan (`--scan`: the same checks
the served verdicts and the alerts use) and drains this node when a check fails, with a reason naming the GPUs,
the checks and the actions. It never resumes a node: whether a repaired GPU may take jobs again is the operator's
call (`scontrol update NodeName=... State=RESUME`), and a node drained by anyone, for any reason, is left as it is.

It always exits 0: slurmd logs a health check's failure but some Slurm versions keep a node from registering
until the program succeeds, and a monitoring fault must never take a node out. docs/health.md has the slurm.conf
lines; the role installs it (accelmon_exporter_slurm_health_check).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
import subprocess
import sys
from typing import Callable, Optional, Sequence

from accelmon.cli import scan_health
from accelmon.config import ConfigError, load

log = logging.getLogger("accelmon.slurm_health")

SCONTROL_TIMEOUT_SECONDS = 20  # slurmd kills a health check after 60 s
# Node states in which the node already takes no new jobs (scontrol prints e.g. IDLE+DRAIN, DOWN*, MIXED+DRAIN).
TAKES_NO_JOBS = re.compile(r"\b(DRAIN|DRAINING|DRAINED|DOWN|FAIL|FAILING)\b")

Run = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def node_name() -> str:
    """Slurm's name of this node: slurmd passes SLURMD_NODENAME; without it, the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_SECONDS, check=False)


def node_state(scontrol: str, node: str, runner: Run) -> Optional[str]:
    result = runner([scontrol, "show", "node", node, "--oneliner"])
    match = re.search(r"\bState=(\S+)", result.stdout) if result.returncode == 0 else None
    return match.group(1) if match else None


def drain(scontrol: str, node: str, reason: str, runner: Run) -> bool:
    """Drain `node` with `reason` unless it already takes no jobs; whether this call drained it."""
    state = node_state(scontrol, node, runner)
    if state is None:
        log.error("cannot read the state of node %s from Slurm: not drained", node)
        return False
    if TAKES_NO_JOBS.search(state.upper()):
        log.info("node %s is already %s: left as it is", node, state)
        return False
    result = runner([scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
    if result.returncode != 0:
        log.error("scontrol could not drain %s: %s", node, (result.stderr or result.stdout).strip())
        return False
    log.warning("drained node %s: %s", node, reason)
    return True


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accelmon-slurm-health", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="the exporter's config file (its paths and collector settings)")
    parser.add_argument("--node", help="Slurm's name of this node (default: $SLURMD_NODENAME, else the host name)")
    parser.add_argument("--scontrol", default="scontrol", help="the scontrol command (default: scontrol on PATH)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be drained, change nothing")
    return parser


def main(argv: Sequence[str] | None = None, runner: Run = run) -> int:
    args = parser().parse_args(argv)
    # Its own decisions at INFO; the collectors' start-up chatter only from WARNING (slurmd logs every line).
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="accelmon-slurm-health: %(message)s")
    log.setLevel(logging.INFO)
    try:
        settings = load(args.config)
    except ConfigError as error:
        log.error("%s: no health check run, nothing drained", error)
        return 0
    verdict = scan_health(settings)
    sys.stdout.write(verdict.table())
    if verdict.verdict != "failure":
        return 0
    node = args.node or node_name()
    reason = verdict.drain_reason()
    if args.dry_run:
        log.warning("would drain %s: %s", node, reason)
        return 0
    try:
        drain(args.scontrol, node, reason, runner)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.error("scontrol failed: %s", error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
