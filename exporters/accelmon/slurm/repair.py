"""The Slurm side of "from verdict to repair" (docs/health.md): what accelmon-slurm-health does after its scan, through
Slurm's own primitives only (`scontrol show node`, `show nodes`, `update`, `reboot`), deciding with
accelmon.remediation's rules and keeping its journal.

Each run of the health check, on its node:
1. a failing node that still takes jobs is drained, unless the circuit breaker holds the drain back (then the node
   keeps taking jobs and the output, the journal and the exporter say so); a drain that could not count the nodes
   drains as before (a broken controller must not keep a bad GPU in service) and says so. A GPU that fails again
   within the repeat window of a repair is drained for hardware_service, naming the earlier repair;
2. a node that accelmon drained and that runs no job is repaired (mode `act`) or the repair is said (`observe`):
   a reboot through Slurm's RebootProgram, Slurm resuming it after boot; a GPU reset then a fresh scan (and DCGM's
   `dcgmi diag -r 2` where it is installed), resumed only when every check passes, else left for hardware service;
3. nothing else: a node drained by anyone else, or for anything else, is left as it is.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from accelmon import health, remediation
from accelmon.config import Settings
from accelmon.remediation import FailingGpu, Journal, Record, RepairPlan
from accelmon.slurm.nodes import SlurmNode, parse_nodes

log = logging.getLogger("accelmon.slurm.health")

Run = Callable[[list[str]], "subprocess.CompletedProcess[str]"]
Scan = Callable[[dict[str, float]], health.NodeHealth]  # a fresh scan, given the GPU resets to apply
RESET_TIMEOUT_SECONDS = 120  # nvidia-smi --gpu-reset takes seconds; a GPU that hangs it is not reset
DIAG_TIMEOUT_SECONDS = 600  # dcgmi diag -r 2: a few minutes on an H100


@dataclass
class Options:
    mode: str
    journal: str
    repeat_window_seconds: float
    breaker_min_nodes: float
    breaker_fraction: float
    reset_command: str

    @classmethod
    def of(cls, settings: Settings) -> Options:
        chosen = settings.collector("health").options
        value = {option.name: chosen.get(option.name, option.default) for option in remediation.OPTIONS}
        return cls(
            str(value["remediation"]),
            str(value["remediation_journal"]),
            float(value["repeat_window_days"]) * 86400,
            float(value["breaker_min_nodes"]),
            float(value["breaker_fraction"]),
            str(value["gpu_reset_command"]),
        )


def failing_gpus(node: health.NodeHealth) -> list[FailingGpu]:
    return [
        FailingGpu(
            gpu.index,
            gpu.uuid,
            gpu.serial,
            gpu.action,
            tuple(c.name for c in gpu.checks if c.verdict == "failure"),
            any(c.drill for c in gpu.checks if c.verdict == "failure"),
        )
        for gpu in node.gpus
        if gpu.verdict == "failure"
    ]


class SlurmRepair:
    """One run of the loop on node `node` (Slurm's name), `scontrol` through `runner`."""

    def __init__(
        self, options: Options, node: str, scontrol: str, runner: Run, dry_run: bool = False,
        now: Optional[float] = None, dcgmi: str = "dcgmi", detach: Optional[Callable[[], bool]] = None,
    ) -> None:  # fmt: skip
        self.options, self.node, self.scontrol, self.runner = options, node, scontrol, runner
        self.dry_run = dry_run
        # Starts the repair in a process of its own (a reset and DCGM's diagnostic may outlast slurmd's limit on a
        # health check); None: carry it out here.
        self.detach = detach
        self.now = time.time() if now is None else now
        self.dcgmi = dcgmi
        self.journal = Journal.read(options.journal)
        if self.journal.problem:
            log.error("%s: no repair until it is fixed or moved away (drains go on)", self.journal.problem)

    # --- Slurm --------------------------------------------------------------------------------------------------
    def scontrol_run(self, *args: str) -> Optional[subprocess.CompletedProcess[str]]:
        try:
            return self.runner([self.scontrol, *args])
        except (OSError, subprocess.TimeoutExpired) as error:
            log.error("scontrol failed (%s): %s", " ".join(args[:2]), error)
            return None

    def show_node(self) -> Optional[SlurmNode]:
        result = self.scontrol_run("show", "node", self.node, "--oneliner")
        found = parse_nodes(result.stdout) if result is not None and result.returncode == 0 else []
        return next((n for n in found if n.name == self.node), found[0] if found else None)

    def update(self, *fields: str) -> bool:
        if self.dry_run:
            log.warning("would run: scontrol update NodeName=%s %s", self.node, " ".join(fields))
            return False
        result = self.scontrol_run("update", f"NodeName={self.node}", *fields)
        if result is None or result.returncode != 0:
            detail = (result.stderr or result.stdout).strip() if result is not None else "did not run"
            what = "drain" if "State=DRAIN" in fields else "resume" if "State=RESUME" in fields else "update"
            log.error("scontrol could not %s %s (%s): %s", what, self.node, " ".join(fields)[:120], detail)
            return False
        return True

    def note(self, event: str, action: str = "none", outcome: str = "none", gpus: tuple[FailingGpu, ...] = (),
             detail: str = "", breaker: tuple[int, int, int] = (0, 0, 0), once: bool = False) -> None:  # fmt: skip
        """Journals a decision (`once`: unless it is the node's latest record already: a decision repeated every
        health check is journalled when it is first made)."""
        record = Record(self.now, self.node, event, action, outcome, remediation.gpus_of(gpus), detail, breaker)
        if once:
            latest = next((r for r in reversed(self.journal.records) if r.node == self.node), None)
            same = latest is not None and (latest.event, latest.action, latest.gpus, latest.detail) == (
                record.event, record.action, record.gpus, record.detail,
            )  # fmt: skip
            if same:
                return
        if self.dry_run or self.journal.problem:
            return
        problem = self.journal.append(record)
        if problem:
            log.error("%s: the decision (%s) is not kept", problem, event)

    # --- the loop -------------------------------------------------------------------------------------------------
    def run(self, verdict: health.NodeHealth, rescan: Scan) -> None:
        failing = failing_gpus(verdict)
        node_failing = [(c.name, c.action) for c in verdict.checks if c.verdict == "failure"]
        open_drain = self.journal.last_event(self.node, ("drained", "escalated", "resumed"))
        if not failing and not node_failing and (open_drain is None or open_drain.event == "resumed"):
            return  # healthy and nothing of accelmon's open: Slurm is not even asked
        state = self.show_node()
        if state is None:
            log.error("cannot read the state of node %s from Slurm: nothing done", self.node)
            return
        if failing or node_failing:
            if state.takes_jobs:
                self.drain(verdict, failing)
                return
            if not (state.accelmons and state.drained_idle):
                log.info("node %s is already %s: left as it is", self.node, state.state)
                return
        elif state.takes_jobs:
            self.note("resumed", detail="taking jobs again (resumed by someone or something else)", once=True)
            return
        if state.accelmons and state.drained_idle:
            self.repair(state, failing, node_failing, rescan)

    def drain(self, verdict: health.NodeHealth, failing: list[FailingGpu]) -> None:
        repeat = remediation.repeat_offender(failing, self.journal, self.options.repeat_window_seconds, self.now)
        reason = verdict.drain_reason()
        action = max((g.action for g in failing), key=remediation.disruption, default="hardware_service")
        if repeat is not None:
            gpu, earlier = repeat
            reason = self.repeat_reason(gpu, earlier)
            action = "hardware_service"
        listing = self.scontrol_run("show", "nodes", "--oneliner")
        if listing is not None and listing.returncode == 0 and parse_nodes(listing.stdout):
            count = remediation.breaker(
                parse_nodes(listing.stdout), self.options.breaker_min_nodes, self.options.breaker_fraction
            )
            if not count.allows:
                words = f"circuit breaker: {count.words()}: node {self.node} not drained, it keeps taking jobs"
                print(words)
                log.warning("%s (would drain: %s)", words, reason)
                self.note("breaker_held", action, gpus=tuple(failing), detail=reason,
                          breaker=(count.out, count.listed, count.limit), once=True)  # fmt: skip
                return
            print(f"circuit breaker: {count.words()}: drain allowed")
        else:
            log.error("cannot count the drained nodes (scontrol show nodes failed): draining %s anyway", self.node)
        if self.dry_run:
            log.warning("would drain %s: %s", self.node, reason)
            return
        if self.update("State=DRAIN", f"Reason={reason}"):
            log.warning("drained node %s: %s", self.node, reason)
            self.note("escalated" if repeat else "drained", action, gpus=tuple(failing), detail=reason)

    def repeat_reason(self, gpu: FailingGpu, earlier: Record) -> str:
        when = time.strftime("%Y-%m-%d", time.gmtime(earlier.time))
        return (
            f"accelmon: GPU {gpu.index} {'+'.join(gpu.checks)}: hardware_service "
            f"(failed again after {earlier.action} on {when})"
        )[:200]

    def repair(
        self, state: SlurmNode, failing: list[FailingGpu], node_failing: list[tuple[str, str]], rescan: Scan
    ) -> None:
        opened = self.journal.last_event(self.node, ("drained", "escalated", "resumed"))
        if self.journal.problem or self.journal.missing or opened is None or opened.event == "resumed":
            why = self.journal.problem or (
                f"the journal {self.options.journal} is missing"
                if self.journal.missing
                else f"the journal {self.options.journal} holds no open drain of {self.node} (emptied or replaced?)"
            )
            print(f"remediation: no repair: {why}")
            return
        plan = remediation.plan_repair(
            failing, node_failing, self.journal, state, self.options.repeat_window_seconds, self.now
        )
        if plan.step in ("wait", "leave"):
            print(f"remediation: node {self.node} left drained: {plan.why}")
            if plan.step == "leave":
                self.note("left_for_person", plan.action, gpus=plan.gpus, detail=plan.why, once=True)
            return
        if plan.step == "escalate":
            if "hardware_service" not in state.reason and plan.earlier is not None:
                reason = self.repeat_reason(plan.gpus[0], plan.earlier)
                if self.options.mode == "act" and self.update(f"Reason={reason}"):
                    self.note("escalated", "hardware_service", gpus=plan.gpus, detail=plan.why)
            print(f"remediation: node {self.node} left for hardware_service: {plan.why}")
            return
        if plan.drill:
            print(f"remediation: DRILL, nothing done: {remediation.would(plan)} ({plan.why})")
            self.note("would_repair", plan.action, "drill", plan.gpus, f"DRILL: {plan.why}", once=True)
            return
        if self.options.mode != "act" or self.dry_run:
            print(f"remediation (observe): {remediation.would(plan)} ({plan.why})")
            self.note("would_repair", plan.action, "observed", plan.gpus, plan.why, once=True)
            return
        if plan.step == "reboot":
            self.reboot(plan)
        elif plan.step == "reset" and self.detach is not None:
            started = self.detach()
            print(f"remediation: {'reset started in the background' if started else 'a repair is already running'}")
        elif plan.step == "reset":
            self.reset(plan, rescan)
        elif plan.step == "resume":
            if self.update("State=RESUME"):
                print(f"remediation: resumed node {self.node}: {plan.why}")
                self.note("resumed", plan.action, "resolved", detail=plan.why)

    def reboot(self, plan: RepairPlan) -> None:
        reason = f"accelmon: reboot_node for GPU {', '.join(g.index for g in plan.gpus)}"[:200]
        result = self.scontrol_run("reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", self.node)
        if result is None or result.returncode != 0:
            detail = (result.stderr or result.stdout).strip() if result is not None else "did not run"
            log.error("scontrol reboot %s failed: %s", self.node, detail)
            self.note("repair", "reboot_node", "failed", plan.gpus, f"scontrol reboot failed: {detail}"[:200])
            return
        print(f"remediation: asked Slurm to reboot node {self.node} (it resumes the node after boot)")
        self.note("repair", "reboot_node", "requested", plan.gpus, plan.why)

    def reset(self, plan: RepairPlan, rescan: Scan) -> None:
        failed = []
        for gpu in plan.gpus:
            command = shlex.split(self.options.reset_command.format(index=gpu.index))
            try:
                result = subprocess.run(command, capture_output=True, text=True, timeout=RESET_TIMEOUT_SECONDS)
                if result.returncode != 0:
                    failed.append(f"GPU {gpu.index} reset: {(result.stderr or result.stdout).strip()[-120:]}")
            except (OSError, subprocess.TimeoutExpired) as error:
                failed.append(f"GPU {gpu.index} reset: {error}")
        resets = {**self.journal.resets(), **{gpu.uuid: time.time() for gpu in plan.gpus if gpu.uuid}}
        if not failed:
            after = rescan(resets)
            still = [f"GPU {g.index} {c.name}" for g in after.gpus for c in g.checks if c.verdict == "failure"]
            still += [c.name for c in after.checks if c.verdict == "failure"]
            failed += [f"{what} still fails" for what in still]
        if not failed and shutil.which(self.dcgmi):
            tests = diagnose(self.dcgmi, run_long, level="2")
            if tests:
                failed.append("dcgmi diag -r 2 failed: " + ", ".join(tests))
        if failed:
            detail = "; ".join(failed)[:200]
            print(f"remediation: the reset did not repair node {self.node}: {detail}")
            self.note("repair", "reset_gpu", "failed", plan.gpus, detail)
            gpu = plan.gpus[0]
            reason = f"accelmon: GPU {gpu.index} hardware_service: reset_gpu did not clear it ({detail})"[:200]
            if self.update(f"Reason={reason}"):
                self.note("escalated", "hardware_service", gpus=plan.gpus, detail=reason)
            return
        self.note("repair", "reset_gpu", "resolved", plan.gpus, plan.why)
        if self.update("State=RESUME"):
            print(f"remediation: reset GPU {', '.join(g.index for g in plan.gpus)}, every check passes: resumed")
            self.note("resumed", "reset_gpu", "resolved", plan.gpus, "every check passed after the reset")


def run_long(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=DIAG_TIMEOUT_SECONDS, check=False)


def failed_tests(report: Any) -> list[str]:
    """The names of the tests that failed in `dcgmi diag -j`'s report: every object with a `name` and `results`
    whose result status is Fail (DCGM 3 and 4 nest them differently; both keep these keys)."""
    failed: list[str] = []
    if isinstance(report, dict):
        results = report.get("results")
        if isinstance(report.get("name"), str) and isinstance(results, list):
            statuses = [str(r.get("status", "")).lower() for r in results if isinstance(r, dict)]
            if "fail" in statuses:
                failed.append(report["name"])
        for value in report.values():
            failed += failed_tests(value)
    elif isinstance(report, list):
        for value in report:
            failed += failed_tests(value)
    return failed


def diagnose(dcgmi: str, runner: Run, level: str = "1") -> Optional[list[str]]:
    """The tests `dcgmi diag -r LEVEL` failed ([] when all passed), or None when the diagnostic could not run."""
    try:
        result = runner([dcgmi, "diag", "-r", level, "-j"])
    except (OSError, subprocess.TimeoutExpired) as error:
        log.info("dcgmi diag could not run: %s", error)
        return None
    try:
        report = json.loads(result.stdout)
    except ValueError:
        log.info(
            "dcgmi diag gave no report (status %d): %s", result.returncode, (result.stderr or result.stdout)[-300:]
        )
        return None
    failed = sorted(set(failed_tests(report)))
    if result.returncode != 0 and not failed:
        log.info("dcgmi diag ended with status %d and no failed test: not judged", result.returncode)
        return None
    return failed


def in_background(argv: list[str], lock_path: str) -> bool:
    """Starts this health check again, detached, to carry out a repair that may outlast slurmd's 60 s limit on a
    health check (a reset, then `dcgmi diag -r 2`); False if a repair is already running (its lock is held)."""
    try:
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(lock, fcntl.LOCK_UN)
    except OSError:
        return False
    subprocess.Popen(
        [sys.executable, "-m", "accelmon.slurm.health", *argv, "--foreground"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    return True


def holding_lock(lock_path: str) -> Optional[int]:
    """The repair lock, held by this process (a file descriptor), or None if another repair holds it."""
    os.makedirs(os.path.dirname(lock_path) or ".", exist_ok=True)
    descriptor = os.open(lock_path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        return None
    return descriptor
