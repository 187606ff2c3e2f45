"""accelmon-slurm-health: Slurm's HealthCheckProgram. It runs the exporter's health scan (`--scan`: the same checks
the served verdicts and the alerts use) and drains this node when a check fails, with a reason naming the GPUs,
the checks and the actions, within the fleet's circuit breaker (accelmon.schedulers.slurm.fleet). In `act` mode it
repairs a node it drained and resumes it once every check passes (accelmon.schedulers.slurm.repair); a node drained by
anyone else, for any other reason, is left as it is.

It always exits 0: slurmd logs a health check's failure but some Slurm versions keep a node from registering
until the program succeeds, and a monitoring fault must never take a node out. docs/health.md has the slurm.conf
lines; the role installs it (accelmon_exporter_slurm_health_check).

A check ends by itself within slurmd's 60 s whatever the controller's latency (accelmon.schedulers.slurm.fleet.Budget):
every scontrol call's timeout is cut to what is left, and no drain is started that the check could not verify in time.

With `--diag` it is a prolog instead: DCGM's quick diagnostic (`dcgmi diag -r 1`) before each job. Tests that fail
drain the node (the reason names them) within the same breaker and journal, and only then does the prolog fail: Slurm
then drains the node with "Prolog error" on top (its reason replaces accelmon's, so accelmon's drain is journalled
first) and requeues the job held, unless SchedulerParameters has nohold_on_prolog_fail (docs/slurm.md). A node out
for another reason (a MAINTENANCE reservation, a reboot asked for, an administrator's drain), a drain the breaker
holds back, and a missing or unreachable DCGM never fail it: the job runs (the breaker holds for the fleet: a
diagnostic that fails everywhere is the mass event it exists for).
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import subprocess
import sys
import time
from typing import Callable, Optional, Sequence

from accelmon.config import ConfigError, load
from accelmon.health.remediation import Journal, Record
from accelmon.host.slurm_nodes import SCONTROL_HELP, find_scontrol, node_name, run_scontrol
from accelmon.host.slurm_pause import PauseMemory, paused_path
from accelmon.scan import hook_scan, scan_health
from accelmon.schedulers.slurm.diag import diagnose
from accelmon.schedulers.slurm.fleet import CALL_TIMEOUT_SECONDS, CHECK_BUDGET_SECONDS, Budget, Fleet, Limits
from accelmon.schedulers.slurm.repair import Options, SlurmRepair

log = logging.getLogger("accelmon.slurm")

DIAG_TIMEOUT_SECONDS = 300  # `dcgmi diag -r 1` takes seconds; a hung host engine must not hold a job for long

Run = Callable[[list[str], float], "subprocess.CompletedProcess[str]"]


def run(command: list[str], timeout: float = CALL_TIMEOUT_SECONDS) -> subprocess.CompletedProcess[str]:
    """scontrol (in UTC, the standard time format) or another command; DCGM's diagnostic gets its own time."""
    return run_scontrol(command, DIAG_TIMEOUT_SECONDS if "diag" in command else timeout)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accelmon-slurm-health", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="the exporter's config file (its paths and collector settings)")
    parser.add_argument("--node", help="Slurm's name of this node (default: $SLURMD_NODENAME, else the host name)")
    parser.add_argument("--scontrol", default="scontrol", help=SCONTROL_HELP)
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
    budget = Budget(CHECK_BUDGET_SECONDS)  # from the start: the scan's time counts against slurmd's 60 s too
    args = parser().parse_args(argv)
    # slurmd gives its programs little more than SLURMD_NODENAME: scontrol is looked for where sites install it too.
    args.scontrol = find_scontrol(args.scontrol)
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
        # A repair carried out in the background is not under slurmd's limit: its calls keep their own timeouts.
        budget = Budget() if args.foreground else budget
        loop = SlurmRepair(
            options, node, args.scontrol, runner, args.dry_run, dcgmi=args.dcgmi, detach=detach, budget=budget
        )
        loop.run(verdict, lambda resets: scan_health(load(args.config), resets))
    finally:
        os.close(lock)
    return 0


def prolog_diag(args: argparse.Namespace, node: str, runner: Run) -> int:
    """The prolog's diagnostic: 1 (Slurm drains the node with "Prolog error" and requeues the job) only when tests
    failed and accelmon's own drain of the node was claimed now, within the breaker and journalled; 0 otherwise."""
    failed = diagnose(args.dcgmi, lambda command: runner(command, DIAG_TIMEOUT_SECONDS))
    if not failed:
        if failed == []:
            log.info("dcgmi diag -r 1 passed")
        return 0
    reason = ("accelmon: dcgmi diag -r 1 failed: " + ", ".join(failed))[:200]
    try:
        loaded = Options.of(load(args.config))
        options: Options | None = loaded
        limits = loaded.limits
    except ConfigError as error:
        log.error("%s: the breaker's defaults hold, nothing journalled", error)
        options, limits = None, Limits()
    memory = PauseMemory(paused_path(options.journal)) if options else None
    fleet = Fleet(args.scontrol, runner, limits, memory=memory)
    journal = Journal.read(options.journal) if options and not args.dry_run else None

    def note(event: str, outcome: str, detail: str, counts: tuple[int, int, int] = (0, 0, 0)) -> None:
        if journal is None:
            return
        if journal.problem:  # never silently: the exporter serves the journal's state
            log.error("%s: the decision (%s) is not journalled", journal.problem, event)
            return
        journal.append(Record(time.time(), node, event, "hardware_service", outcome, (), detail[:200], counts))

    node_now = fleet.node(node)
    if node_now is None or not node_now.takes_jobs or "RESERVED" in node_now.flags:
        # A MAINTENANCE reservation (an administrator's validation job), any other reservation (ALLOCATED+RESERVED:
        # the job runs in it on purpose, and a drain would fail it and requeue it out of its reservation), a reboot
        # asked for, a drain already set: the job was placed here on purpose, and failing the prolog would only
        # replace the node's reason with "Prolog error", which neither the breaker nor the repair loop counts. The
        # failure is said and journalled (the periodic check does not run the diagnostic: a person looks); the job
        # runs.
        state = node_now.state if node_now else "unknown (scontrol show node failed)"
        log.warning("%s; node %s is %s: not drained by the prolog, the job runs", reason, node, state)
        if node_now is None:
            note("breaker_held", "uncounted", f"{reason}: cannot read node {node} from Slurm, not drained")
        else:
            note("left_for_person", "none", f"{reason}: node {state}, not drained by the prolog")
        return 0
    if args.dry_run:
        log.warning("would drain %s within the circuit breaker: %s", node, reason)
        return 0

    decision = fleet.drain(node, reason, claiming=lambda: note("claimed", "started", reason))
    log.warning("%s", decision.words)
    if not decision.claimed and not decision.still_out:
        log.warning("node %s not drained (%s): the job runs", node, decision.outcome)
        note("breaker_held", decision.outcome, decision.words, decision.counts)
        return 0
    note("drained", "none", reason)
    log.warning("drained node %s: %s", node, reason)
    return 1


LOCK_FD = "ACCELMON_REPAIR_LOCK_FD"  # a background repair inherits the check's lock through this descriptor


def in_background(argv: list[str], lock: int) -> bool:
    """Starts this health check again, detached, to carry out a repair that may outlast slurmd's 60 s limit on a
    health check (a reset, then `dcgmi diag -r 2`). The node's lock passes to it (the same open file, inherited): no
    check nor scan can slip in between this check's end and the repair's start."""
    subprocess.Popen(
        [sys.executable, "-m", "accelmon.schedulers.slurm.health", *argv, "--foreground"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        pass_fds=(lock,), env={**os.environ, LOCK_FD: str(lock)},
    )  # fmt: skip
    return True


def holding_lock(lock_path: str) -> Optional[int]:
    """The node's lock (one thing at a time: the periodic check, a background repair, a scan), held by this process
    (a file descriptor): inherited from the check that started this repair, or taken now; None if another holds it."""
    inherited = os.environ.pop(LOCK_FD, "")
    if inherited.isdigit():
        try:
            fcntl.flock(int(inherited), fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already: the same open file
            return int(inherited)
        except OSError:
            pass
    os.makedirs(os.path.dirname(lock_path) or ".", exist_ok=True)
    descriptor = os.open(lock_path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        return None
    return descriptor


if __name__ == "__main__":
    sys.exit(main())
