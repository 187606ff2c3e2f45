"""accelmon-slurm-health: Slurm's HealthCheckProgram. It runs the exporter's health scan (`--scan`: the same checks
the served verdicts and the alerts use) and drains this node when a check fails, with a reason naming the GPUs,
the checks and the actions, within the fleet's circuit breaker (accelmon.slurm.fleet). In `act` mode it repairs a
node it drained and resumes it once every check passes (accelmon.slurm.repair); a node drained by anyone else, for
any other reason, is left as it is.

It always exits 0: slurmd logs a health check's failure but some Slurm versions keep a node from registering
until the program succeeds, and a monitoring fault must never take a node out. docs/health.md has the slurm.conf
lines; the role installs it (accelmon_exporter_slurm_health_check).

With `--diag` it is a prolog instead: DCGM's quick diagnostic (`dcgmi diag -r 1`) before each job. Tests that fail
drain the node (the reason names them) within the same breaker and the prolog fails, so Slurm requeues the job
elsewhere; a missing or unreachable DCGM only logs (it never blocks a job), and a drain the breaker holds back lets
the job run (the breaker holds for the fleet: a diagnostic that fails everywhere is the mass event it exists for).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from typing import Callable, Sequence

from accelmon.config import ConfigError, load
from accelmon.scan import hook_scan, scan_health
from accelmon.slurm.fleet import Fleet, Limits
from accelmon.slurm.nodes import node_name
from accelmon.slurm.repair import Options, SlurmRepair, diagnose, holding_lock, in_background

log = logging.getLogger("accelmon.slurm")

SCONTROL_TIMEOUT_SECONDS = 20  # slurmd kills a health check after 60 s
DIAG_TIMEOUT_SECONDS = 300  # `dcgmi diag -r 1` takes seconds; a hung host engine must not hold a job for long

Run = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    timeout = DIAG_TIMEOUT_SECONDS if "diag" in command else SCONTROL_TIMEOUT_SECONDS
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


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
    node = node_name(args.node or "")[0]
    if args.diag:
        return prolog_diag(args, node, runner)
    try:
        options = Options.of(load(args.config))
    except ConfigError as error:
        log.error("%s: no health check run, nothing drained", error)
        return 0
    # One thing at a time on a node: a repair under way (a GPU reset, DCGM's diagnostic) must not meet a scan that
    # opens the GPUs, nor a check that resumes or reboots the node under it.
    lock = holding_lock(options.journal + ".lock")
    if lock is None:
        print("remediation: a repair is running on this node: this check does nothing until it ends")
        return 0
    try:
        scanned = hook_scan(args.config, log, "nothing drained")
        if scanned is None:
            return 0
        verdict = scanned[1]
        detach = None
        if not args.foreground and options.mode == "act":
            # Relayed as given: a foreground run is this same check, carrying the repair out itself.
            relayed = list(argv if argv is not None else sys.argv[1:])
            detach = lambda: in_background(relayed, lock)  # noqa: E731
        loop = SlurmRepair(options, node, args.scontrol, runner, args.dry_run, dcgmi=args.dcgmi, detach=detach)
        loop.run(verdict, lambda resets: scan_health(load(args.config), resets))
    finally:
        os.close(lock)
    return 0


def prolog_diag(args: argparse.Namespace, node: str, runner: Run) -> int:
    """The prolog's diagnostic: 1 (Slurm requeues the job) only when tests failed and the node is drained."""
    failed = diagnose(args.dcgmi, runner)
    if not failed:
        if failed == []:
            log.info("dcgmi diag -r 1 passed")
        return 0
    reason = ("accelmon: dcgmi diag -r 1 failed: " + ", ".join(failed))[:200]
    try:
        limits = Options.of(load(args.config)).limits
    except ConfigError as error:
        log.error("%s: the breaker's defaults hold", error)
        limits = Limits()
    fleet = Fleet(args.scontrol, runner, limits)
    node_now = fleet.node(node)
    if node_now is not None and not node_now.takes_jobs:
        log.info("node %s is already %s: left as it is", node, node_now.state)
        return 1  # out already: this job goes elsewhere
    if args.dry_run:
        log.warning("would drain %s within the circuit breaker: %s", node, reason)
        return 0
    decision = fleet.drain(node, reason)
    log.warning("%s", decision.words)
    if not decision.claimed:
        log.warning("node %s not drained (%s): the job runs", node, decision.outcome)
        return 0
    log.warning("drained node %s: %s", node, reason)
    return 1


if __name__ == "__main__":
    sys.exit(main())
