"""accelmon-slurm-health: Slurm's HealthCheckProgram. It runs the exporter's health scan (`--scan`: the same checks
the served verdicts and the alerts use) and drains this node when a check fails, with a reason naming the GPUs,
the checks and the actions. It never resumes a node: whether a repaired GPU may take jobs again is the operator's
call (`scontrol update NodeName=... State=RESUME`), and a node drained by anyone, for any reason, is left as it is.

It always exits 0: slurmd logs a health check's failure but some Slurm versions keep a node from registering
until the program succeeds, and a monitoring fault must never take a node out. docs/health.md has the slurm.conf
lines; the role installs it (accelmon_exporter_slurm_health_check).

With `--diag` it is a prolog instead: DCGM's quick diagnostic (`dcgmi diag -r 1`) before each job. Tests that fail
drain the node (the reason names them) and the prolog fails, so Slurm requeues the job elsewhere; a missing or
unreachable DCGM only logs (it never blocks a job).
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

from accelmon.config import load
from accelmon.scan import hook_scan, scan_health
from accelmon.slurm.repair import Options, SlurmRepair, diagnose, holding_lock, in_background

log = logging.getLogger("accelmon.slurm.health")

SCONTROL_TIMEOUT_SECONDS = 20  # slurmd kills a health check after 60 s
DIAG_TIMEOUT_SECONDS = 300  # `dcgmi diag -r 1` takes seconds; a hung host engine must not hold a job for long
# Node states in which the node already takes no new jobs (scontrol prints e.g. IDLE+DRAIN, DOWN*, MIXED+DRAIN).
TAKES_NO_JOBS = re.compile(r"\b(DRAIN|DRAINING|DRAINED|DOWN|FAIL|FAILING)\b")

Run = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def node_name() -> str:
    """Slurm's name of this node: slurmd passes SLURMD_NODENAME; without it, the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    timeout = DIAG_TIMEOUT_SECONDS if "diag" in command else SCONTROL_TIMEOUT_SECONDS
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


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
    parser.add_argument(
        "--diag", action="store_true", help="as a prolog: run `dcgmi diag -r 1`; failed tests drain and fail it"
    )
    parser.add_argument("--dcgmi", default="dcgmi", help="the dcgmi command (default: dcgmi on PATH)")
    parser.add_argument(
        "--foreground",
        action="store_true",
        help="carry a repair out in this process (the health check starts one in the background, since slurmd "
        "kills a health check after 60 s; tests and a person at the console use this)",
    )
    return parser


def main(argv: Sequence[str] | None = None, runner: Run = run) -> int:
    args = parser().parse_args(argv)
    # Its own decisions at INFO; the collectors' start-up chatter only from WARNING (slurmd logs every line).
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="accelmon-slurm-health: %(message)s")
    log.setLevel(logging.INFO)
    node = args.node or node_name()
    if args.diag:
        return prolog_diag(args, node, runner)
    scanned = hook_scan(args.config, log, "nothing drained")
    if scanned is None:
        return 0
    settings, verdict = scanned
    options = Options.of(settings)
    lock = None
    if args.foreground:  # the repair started in the background: one at a time
        lock = holding_lock(options.journal + ".lock")
        if lock is None:
            log.info("another repair is running: nothing done")
            return 0
    detach = None
    if not args.foreground and options.mode == "act":
        # Relayed as given: a foreground run is this same check, carrying the repair out itself.
        relayed = list(argv if argv is not None else sys.argv[1:])
        detach = lambda: in_background(relayed, options.journal + ".lock")  # noqa: E731
    loop = SlurmRepair(options, node, args.scontrol, runner, args.dry_run, dcgmi=args.dcgmi, detach=detach)
    loop.run(verdict, lambda resets: scan_health(load(args.config), resets))
    if lock is not None:
        os.close(lock)
    return 0


def drain_unless_dry_run(args: argparse.Namespace, node: str, reason: str, runner: Run) -> None:
    if args.dry_run:
        log.warning("would drain %s: %s", node, reason)
        return
    try:
        drain(args.scontrol, node, reason, runner)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.error("scontrol failed: %s", error)


def prolog_diag(args: argparse.Namespace, node: str, runner: Run) -> int:
    """The prolog's diagnostic: 1 (Slurm requeues the job) only when tests failed and the node is drained."""
    failed = diagnose(args.dcgmi, runner)
    if not failed:
        if failed == []:
            log.info("dcgmi diag -r 1 passed")
        return 0
    drain_unless_dry_run(args, node, ("accelmon: dcgmi diag -r 1 failed: " + ", ".join(failed))[:200], runner)
    return 0 if args.dry_run else 1


if __name__ == "__main__":
    sys.exit(main())
