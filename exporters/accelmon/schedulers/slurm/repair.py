"""The Slurm side of "from verdict to repair" (docs/health.md): what accelmon-slurm-health does after its scan, through
Slurm's own primitives only (`scontrol show node(s)`, `update`, `reboot`), deciding with accelmon.health.remediation's
rules, keeping the fleet's limits with accelmon.schedulers.slurm.fleet and keeping its journal.

Each run of the health check, on its node (one at a time: the check, a background repair and a scan never overlap):
1. a failing node that still takes jobs is drained within the circuit breaker (accelmon.schedulers.slurm.fleet): a drain
   the breaker holds back, the pause switch stops or a controller that cannot be counted leaves the node taking jobs,
   and the output, the journal and the exporter say why. A GPU that fails again within the repeat window of a
   repair is drained for hardware_service, naming the earlier repair;
2. a node that accelmon drained and that runs no job is repaired (mode `act`) or the repair is said (`observe`),
   within the fleet's repair pace: a reboot through Slurm's RebootProgram, the node drained through the boot and
   resumed by this check only once every check passes after it; a GPU reset, with what holds the GPU stopped and
   started again, then a fresh scan (and DCGM's `dcgmi diag -r 2` where it is installed), resumed only when every
   check passes, else drained for hardware_service naming the GPU that still fails;
3. nothing else: a node drained by anyone else, or for anything else, is left as it is.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from accelmon import health
from accelmon.config import Settings
from accelmon.health import remediation, reset_scope
from accelmon.health.remediation import FailingGpu, Journal, Record, RepairPlan
from accelmon.host import gpu_holders
from accelmon.host.fabric_manager import fabric_manager_running
from accelmon.host.slurm_nodes import SlurmNode, keyed_reason
from accelmon.host.slurm_pause import PauseMemory, paused_path
from accelmon.schedulers.slurm.diag import DIAG_READY_SECONDS, diagnose_when_ready
from accelmon.schedulers.slurm.evidence import (
    REBOOT_PENDING,
    failing_gpus,
    gres_gpus,
    held_after_reboot,
    inventory_of,
    joining_fabric,
    not_back,
    reboot_timed_out,
    repair_claim,
    same_reason,
    still_failing,
)  # fmt: skip
from accelmon.schedulers.slurm.fleet import Budget, Decision, Fleet, Limits, Run, drained_by_accelmon
from accelmon.schedulers.slurm.gpu_reset import GpuReset

log = logging.getLogger("accelmon.slurm")

Scan = Callable[[dict[str, float]], health.NodeHealth]  # a fresh scan, given the GPU resets to apply
FABRIC_READY_SECONDS = 60.0  # how long a reset GPU has to join its NVLink fabric again before a person looks
# The journal's events that say whether accelmon has a drain of this node open: a claim (journalled before the drain,
# so a check killed after it leaves a trace), the drain kept, an escalation; closed by a resume or a hold (a claim
# held back or taken back leaves the node taking jobs).
OPENING = ("claimed", "drained", "escalated")
CLOSING = ("resumed", "breaker_held")


@dataclass
class Options:
    mode: str
    journal: str
    repeat_window_seconds: float
    limits: Limits
    reset_command: str
    gpu_holders: tuple[str, ...] = ()
    procfs: str = "/proc"  # where the GPUs' device files and who holds them are read

    @classmethod
    def of(cls, settings: Settings) -> Options:
        chosen = settings.collector("health").options
        value = {option.name: chosen.get(option.name, option.default) for option in remediation.OPTIONS}
        return cls(
            str(value["remediation"]),
            str(value["remediation_journal"]),
            float(value["repeat_window_days"]) * 86400,
            Limits(
                float(value["breaker_min_nodes"]),
                float(value["breaker_fraction"]),
                float(value["breaker_window_hours"]) * 3600,
                float(value["max_repairs_per_hour"]),
                str(value["breaker_nodes"]),
                float(value["breaker_max_nodes"]),
            ),
            str(value["gpu_reset_command"]),
            tuple(str(value["gpu_holders"]).split()),
            settings.paths.procfs,
        )


class SlurmRepair:
    """One run of the loop on node `node` (Slurm's name), `scontrol` through `runner`."""

    def __init__(
        self, options: Options, node: str, scontrol: str, runner: Run, dry_run: bool = False,
        now: Optional[float] = None, dcgmi: str = "dcgmi", detach: Optional[Callable[[], bool]] = None,
        fleet: Optional[Fleet] = None, budget: Optional[Budget] = None,
    ) -> None:  # fmt: skip
        self.options, self.node, self.scontrol, self.runner = options, node, scontrol, runner
        self.dry_run = dry_run
        # Starts the repair in a process of its own (a reset and DCGM's diagnostic may outlast slurmd's limit on a
        # health check); None: carry it out here.
        self.detach = detach
        self.now = time.time() if now is None else now  # the run's time, for its decisions
        self.started = time.monotonic()
        self.dcgmi = dcgmi
        self.say: Callable[[str], None] = print  # its decisions, for slurmd's log (a test collects them)
        self.fleet = fleet or Fleet(
            scontrol, runner, options.limits, now=lambda: self.now, dry_run=dry_run, budget=budget,
            memory=PauseMemory(paused_path(options.journal)),
        )  # fmt: skip
        self.journal = Journal.read(options.journal)
        if self.journal.problem:
            log.error("%s: no repair until it is fixed or moved away (drains go on)", self.journal.problem)

    # --- Slurm --------------------------------------------------------------------------------------------------
    def update(self, *fields: str) -> bool:
        failed = self.fleet.update(self.node, *fields)
        if failed:
            if not self.dry_run:
                what = "drain" if "State=DRAIN" in fields else "resume" if "State=RESUME" in fields else "update"
                log.error("scontrol could not %s %s (%s): %s", what, self.node, " ".join(fields)[:120], failed)
            return False
        return True

    def note(self, event: str, action: str = "none", outcome: str = "none", gpus: tuple[FailingGpu, ...] = (),
             detail: str = "", breaker: tuple[int, int, int] = (0, 0, 0), once: bool = False, reason: str = "",
             inventory: tuple[tuple[str, str], ...] = ()) -> None:  # fmt: skip
        """Journals a decision (`once`: unless it is the node's latest record already: a decision repeated every
        health check is journalled when it is first made); `reason`: the reason it set on the node, if any."""
        record = Record(self.clock(), self.node, event, action, outcome, remediation.gpus_of(gpus), detail, breaker,
                        reason, inventory)  # fmt: skip
        if once:
            latest = next((r for r in reversed(self.journal.records) if r.node == self.node), None)
            same = latest is not None and (latest.event, latest.action, latest.outcome, latest.gpus, latest.detail) == (
                record.event, record.action, record.outcome, record.gpus, record.detail,
            )  # fmt: skip
            if same:
                return
        if self.dry_run:
            return
        if self.journal.problem:  # never silently: the drain goes on, its record does not (the exporter serves it)
            log.error("%s: the decision (%s) is not journalled", self.journal.problem, event)
            return
        problem = self.journal.append(record)
        if problem:
            log.error("%s: the decision (%s) is not kept", problem, event)

    def clock(self) -> float:
        """Now, on the run's clock: each journal record carries the time it was made, not the run's start."""
        return self.now + (time.monotonic() - self.started)

    # --- the loop -------------------------------------------------------------------------------------------------
    def run(self, verdict: health.NodeHealth, rescan: Scan) -> None:
        failing = failing_gpus(verdict)
        node_failing = [(c.name, c.action) for c in verdict.checks if c.verdict == "failure"]
        last = self.journal.last_event(self.node, OPENING + CLOSING)
        if not failing and not node_failing and (last is None or last.event in CLOSING):
            self.healthy_check()
            return
        state = self.fleet.node(self.node)
        if state is None:
            self.could_not_act(failing, node_failing)
            return
        # A timed-out reboot: DOWN without its drain (22.05 clears it). The journal's open reboot says it is
        # accelmon's where the node is not DOWN; a reason alone on a node that takes jobs says nothing (23.11+).
        if reboot_timed_out(state) and ("DOWN" in state.flags or self.reboot_open()):
            self.hold_after_timed_out_reboot(state)
            return
        if last is not None and last.event == "claimed":
            self.settle_claim(state, last)
        if state.out and state.accelmons and not self.still_ours(state):
            return
        in_reboot = state.reboot_pending or "DOWN" in state.flags  # its drain stays whatever the rank (Fleet.keep)
        unverified = self.drain_unverified()
        if state.out and state.accelmons and not in_reboot and not self.dry_run and unverified and self.converge():
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
        if state.accelmons and (state.drained_idle or held_after_reboot(state)):
            self.repair(state, failing, node_failing, verdict, rescan)

    def healthy_check(self) -> None:
        """A healthy node with nothing of accelmon's open in its journal reads its own node only (one small call, not
        the fleet's listing): to remember the pause switch its Comment carries (so that a `NodeName=ALL Comment=`
        that erases every carrier does not end the pause unseen: Fleet.paused), and to say when Slurm shows it
        drained by accelmon while the journal knows no such drain (a journal lost or replaced): left for a person."""
        state = self.fleet.node(self.node)
        if state is None:
            return  # nothing to act on: a controller that does not answer is said by the checks that must act
        self.fleet.remember_pause(state)
        if drained_by_accelmon(state) and not self.dry_run:
            detail = "drained by accelmon in Slurm, but the journal has no open drain of it (lost or replaced?)"
            self.say(f"remediation: node {self.node} left drained: {detail}")
            self.note("left_for_person", detail=detail, once=True)

    def could_not_act(self, failing: list[FailingGpu], node_failing: list[tuple[str, str]]) -> None:
        """Slurm could not be read (the controller down or failing over, scontrol missing or refusing): nothing is
        done, and that is journalled at every run while it lasts (the exporter serves a fresh record whatever its own
        verdict, and AccelmonDrainBreakerCannotCount names the node): a check that cannot act must never look like a
        node with nothing to do."""
        why = f"cannot read node {self.node} from Slurm ({self.fleet.listing.problem or 'no answer'}): nothing done"
        log.error("%s", why)
        self.say(f"remediation: {why}")
        if failing or node_failing:
            action = max((g.action for g in failing), key=remediation.disruption, default=node_failing[0][1]
                         if node_failing else "none")  # fmt: skip
            self.note("breaker_held", action, "uncounted", tuple(failing), why[:200])
        else:  # accelmon's drain open, its repair or resume not judged
            self.note("repair_held", "none", "uncounted", detail=why[:200])

    def reboot_open(self) -> bool:
        """Whether accelmon's journal has a reboot of this node asked for and not yet ended: Slurm 23.11 to 25.x
        without AccountingStorageType keep the reason on RESUME, so "accelmon: reboot pending" on a node that takes
        jobs says nothing by itself (docs/slurm.md)."""
        last = self.journal.last_event(self.node, ("repair", "resumed", "drained", "escalated", "breaker_held"))
        return (
            last is not None and last.event == "repair" and last.action == "reboot_node"
            and last.outcome in ("started", "requested")
        )  # fmt: skip

    def still_ours(self, state: SlurmNode) -> bool:
        """Whether the node's reason is still the one accelmon last set, as its journal recorded it (Slurm's own
        suffixes and accelmon's "(out since ...)" key aside), or a repair claim in accelmon's own words (a claim
        whose answer was lost and whose take-back failed: the journal never recorded it). An administrator who edits
        it ("... RMA INC-881, do not resume") makes the node theirs: nothing is ranked, repaired or resumed; said and
        journalled once."""
        written = self.journal.reason_written(self.node)
        if written is None or same_reason(state.reason, written) or repair_claim(state.reason):
            return True
        who = state.reason_user or "someone"
        detail = f"reason edited by {who} since accelmon set it: left as it is"
        self.say(f"remediation: node {self.node}: {detail} ({state.reason[:120]})")
        self.note("left_for_person", detail=detail[:200], once=True)
        return False

    def drain_unverified(self) -> bool:
        """Whether this node's open drain was never ranked within the breaker's limit (answers lost, a take-back that
        failed, a check killed before it ranked): the only drain the breaker takes back. A drain granted within the
        limit at its time stays until its node passes, whatever the limit becomes (nodes powered down, removed)."""
        opened = self.journal.last_event(self.node, OPENING + CLOSING)
        return opened is not None and opened.event == "drained" and opened.outcome == "unverified"

    def settle_claim(self, state: SlurmNode, claim: Record) -> None:
        """A claim journalled with nothing after it: the check that made it ended before it could say what came of
        it (slurmd killed it, the controller never answered). Slurm says: the drain is there (it is adopted, and
        ranked by `converge` as every drain is), or it is not (the claim is closed)."""
        if state.out and state.accelmons:
            detail = f"{claim.detail} (a claim whose check ended before it was verified)"[:200]
            self.journal_record(Record(self.clock(), self.node, "drained", claim.action, "unverified", claim.gpus,
                                       detail, reason=claim.reason or claim.detail))  # fmt: skip
            self.say(f"remediation: node {self.node} is out by an earlier check's drain, never verified: ranked now")
        else:
            detail = "a claim whose check ended before it was verified left no drain"
            self.journal_record(Record(self.clock(), self.node, "breaker_held", claim.action, "failed", claim.gpus,
                                       detail))  # fmt: skip

    def journal_record(self, record: Record) -> None:
        if self.dry_run:
            return
        if self.journal.problem:
            log.error("%s: the decision (%s) is not journalled", self.journal.problem, record.event)
            return
        problem = self.journal.append(record)
        if problem:
            log.error("%s: the decision (%s) is not kept", problem, record.event)

    def converge(self) -> bool:
        """The breaker's rank taken again at this check (accelmon.schedulers.slurm.fleet.Fleet.keep): a node out by
        accelmon ranked at or past the limit takes its drain back and says so. True when it did (or tried): nothing else
        is done this run. One ranked within the limit is granted now: journalled as a drain like any (outcome none), it
        is never taken back later, whatever the limit becomes."""
        decision = self.fleet.keep(self.node)
        if decision is None:
            return False
        opened = self.journal.last_event(self.node, ("drained", "escalated"))
        action = opened.action if opened else "none"
        if decision.claimed:
            if opened is not None:
                granted = f"{opened.detail[:150]} (granted: {decision.words})"[:200]
                self.journal_record(replace(opened, time=self.clock(), outcome="none", detail=granted))
            return False
        self.say(decision.words)
        log.warning("%s", decision.words)
        if not decision.still_out:
            gpus = opened.gpus if opened else ()
            record = Record(self.clock(), self.node, "breaker_held", action, decision.outcome, gpus,
                            decision.words[:200], decision.counts)  # fmt: skip
            self.journal_record(record)
        return True

    def hold_after_timed_out_reboot(self, state: SlurmNode) -> None:
        """Drains again a node whose reboot Slurm timed out: Slurm 22.05 then sets it DOWN and clears its drain
        (measured, docs/slurm.md), so that its next registration (ReturnToService=2) would put it back in service
        before any check. Not through the breaker or the pause switch: the node is out already, and this keeps it out.
        The check that runs at slurmd's start, before it registers, does this as the periodic one does."""
        if self.dry_run:
            log.warning("would drain %s again: its reboot timed out (%s)", self.node, state.reason)
            return
        keyed = keyed_reason(state.reason, state.out_since)
        if self.update("State=DRAIN", f"Reason={keyed}"):
            self.say(f"remediation: node {self.node} drained again: Slurm timed its reboot out and cleared the drain")
            self.note("repair", "reboot_node", "timed_out", detail=f"Slurm: {state.reason}"[:200], reason=keyed)

    def drain(self, verdict: health.NodeHealth, failing: list[FailingGpu]) -> None:
        repeat = remediation.repeat_offender(failing, self.journal, self.options.repeat_window_seconds, self.now)
        reason = verdict.drain_reason()
        action = max((g.action for g in failing), key=remediation.disruption, default="hardware_service")
        if repeat is not None:
            gpu, earlier = repeat
            reason = self.repeat_reason(gpu, earlier)
            action = "hardware_service"
        if self.dry_run:
            nodes = self.fleet.nodes()
            count = f"{len(nodes)} node(s) listed" if nodes else "the nodes cannot be listed"
            log.warning("would drain %s within the circuit breaker (%s): %s", self.node, count, reason)
            return
        claim = lambda: self.note("claimed", action, "started", tuple(failing), reason, reason=reason)  # noqa: E731
        decision = self.fleet.drain(self.node, reason, claiming=claim)
        self.say(decision.words)
        if decision.claimed:
            log.warning("drained node %s: %s", self.node, reason)
            self.note("escalated" if repeat else "drained", action, gpus=tuple(failing), detail=reason, reason=reason,
                      inventory=inventory_of(verdict))  # fmt: skip
        elif decision.still_out:
            log.error("%s", decision.words)
            self.note("drained", action, "unverified", tuple(failing),
                      f"{reason} ({decision.outcome}, still out)"[:200], reason=reason,
                      inventory=inventory_of(verdict))  # fmt: skip
        elif decision.outcome == "failed":
            log.error("%s", decision.words)
            self.note("breaker_held", action, "failed", tuple(failing), decision.words[:200])
        else:
            held = f"node {self.node} not drained, it keeps taking jobs"
            log.warning("%s: %s (would drain: %s)", decision.words, held, reason)
            self.say(f"{held}: {decision.outcome}")
            self.note("breaker_held", action, decision.outcome, tuple(failing), reason, decision.counts, once=True)

    def repeat_reason(self, gpu: FailingGpu, earlier: Record) -> str:
        when = time.strftime("%Y-%m-%d", time.gmtime(earlier.time))
        return (
            f"accelmon: GPU {gpu.index} {'+'.join(gpu.checks)}: hardware_service "
            f"(failed again after {earlier.action} on {when})"
        )[:200]

    def escalate(self, reason: str, gpus: tuple[FailingGpu, ...], state: SlurmNode, written: str) -> None:
        """Drains for hardware_service, keeping when the node first went out, only while its reason is still
        `written` (accelmon's, as this run last saw or set it): a drain someone else set meanwhile is theirs."""
        keyed = keyed_reason(reason, state.out_since)
        result = self.fleet.clear(self.node, written, "State=DRAIN", f"Reason={keyed}")
        if result == "done":
            self.say(f"remediation: node {self.node} drained for hardware_service: {reason}")
            self.note("escalated", "hardware_service", gpus=gpus, detail=keyed, reason=keyed)
        elif result == "not_ours":
            self.say(f"remediation: node {self.node} not escalated: someone else changed its drain ({reason})")
        else:
            log.error("could not drain %s for hardware_service (%s): %s", self.node, reason, result)

    def repair(
        self, state: SlurmNode, failing: list[FailingGpu], node_failing: list[tuple[str, str]],
        verdict: health.NodeHealth, rescan: Scan,
    ) -> None:  # fmt: skip
        opened = self.journal.last_event(self.node, ("drained", "escalated", "resumed"))
        if self.journal.problem or self.journal.missing or opened is None or opened.event == "resumed":
            why = self.journal.problem or (
                f"the journal {self.options.journal} is missing"
                if self.journal.missing
                else f"the journal {self.options.journal} holds no open drain of {self.node} (emptied or replaced?)"
            )
            self.say(f"remediation: no repair: {why}")
            return
        if state.reason.startswith(REBOOT_PENDING) and self.options.mode == "act":
            self.after_reboot(state, failing, node_failing, verdict)
            return
        plan = remediation.plan_repair(
            failing, node_failing, self.journal, state, self.options.repeat_window_seconds, self.now
        )
        if plan.step == "reset":
            plan = self.scoped(plan, failing, node_failing, verdict, state)
        if plan.step in ("wait", "leave"):
            self.say(f"remediation: node {self.node} left drained: {plan.why}")
            if plan.step == "leave":
                self.note("left_for_person", plan.action, gpus=plan.gpus, detail=plan.why, once=True)
            return
        if plan.step == "escalate":
            if "hardware_service" not in state.reason and plan.earlier is not None and self.options.mode == "act":
                self.escalate(self.repeat_reason(plan.gpus[0], plan.earlier), plan.gpus, state, state.reason)
            self.say(f"remediation: node {self.node} left for hardware_service: {plan.why}")
            return
        if plan.drill:
            self.say(f"remediation: DRILL, nothing done: {remediation.would(plan)} ({plan.why})")
            self.note("would_repair", plan.action, "drill", plan.gpus, f"DRILL: {plan.why}", once=True)
            return
        if self.options.mode != "act" or self.dry_run:
            self.say(f"remediation (observe): {remediation.would(plan)} ({plan.why})")
            self.note("would_repair", plan.action, "observed", plan.gpus, plan.why, once=True)
            return
        if plan.step == "resume":
            # Every check passes: only on data actually read, of the GPUs the node had when it was drained.
            missing = not_back(self.journal.inventory(self.node), verdict, gres_gpus(state.gres))
            if missing:
                why = f"not resumed: the scan cannot vouch for it: {missing}"
                self.say(f"remediation: node {self.node} {why}")
                self.note("left_for_person", plan.action, detail=why[:200], once=True)
                return
            self.resume(plan.action, plan.gpus, plan.why, state.reason)
        elif plan.step == "reboot":
            self.reboot(state, plan, verdict)
        elif self.detach is not None:
            started = self.detach()
            self.say(f"remediation: {'reset started in the background' if started else 'a repair is already running'}")
        else:
            self.reset(state, plan, rescan, verdict)

    def scoped(
        self, plan: RepairPlan, failing: list[FailingGpu], node_failing: list[tuple[str, str]],
        verdict: health.NodeHealth, state: SlurmNode,
    ) -> RepairPlan:  # fmt: skip
        """The reset as the platform allows it (accelmon.health.reset_scope): with the GPUs NVLink joins to the failing
        ones where they must be reset together, or a reboot where a reset cannot be right (planned as a reboot_node, so
        a reboot Slurm refused is not asked again on this drain)."""
        scope = reset_scope.of(
            verdict, [gpu.pci_bus_id for gpu in plan.gpus], fabric_manager_running(self.options.procfs),
            self.options.reset_command,
        )  # fmt: skip
        if scope.reboot:
            chosen = {gpu.uuid for gpu in plan.gpus}
            rebooting = [replace(gpu, action="reboot_node") if gpu.uuid in chosen else gpu for gpu in failing]
            instead = remediation.plan_repair(
                rebooting, node_failing, self.journal, state, self.options.repeat_window_seconds, self.now
            )
            return replace(instead, why=f"{instead.why}, not a reset: {scope.reboot}")
        failing_buses = {gpu_holders.same_bus(gpu.pci_bus_id) for gpu in plan.gpus}
        linked = tuple(
            FailingGpu(gpu.index, gpu.uuid, gpu.serial, "none", (), False, gpu.pci_bus_id)
            for gpu in scope.gpus if gpu_holders.same_bus(gpu.pci_bus_id) not in failing_buses
        )  # fmt: skip
        if not linked:
            return plan
        together = ", ".join(gpu.index for gpu in linked)
        return replace(plan, linked=linked, why=f"{plan.why}, with GPU {together} (NVLink-linked: reset together)")

    def resume(self, action: str, gpus: tuple[FailingGpu, ...], why: str, written: str) -> None:
        """Returns the node to service, unless the pause switch is on (it stops every change accelmon makes), and only
        while its reason is still `written` (accelmon's, as this run last saw or set it): an administrator's drain set
        during a long repair (an RMA) is theirs to lift."""
        nodes = self.fleet.nodes()
        pause = self.fleet.paused(nodes) if nodes else None
        if not nodes or pause is not None:
            self.say(
                f"remediation: node {self.node} not resumed: " + (pause.words() if pause else "cannot list the nodes")
            )
            return
        result = self.fleet.clear(self.node, written, "State=RESUME")
        if result == "done":
            self.say(f"remediation: resumed node {self.node}: {why}")
            self.note("resumed", action, "resolved", gpus, why)
        elif result == "not_ours":
            self.say(f"remediation: node {self.node} not resumed: someone else has drained it since ({why})")
            self.note("left_for_person", action, "none", gpus, "drained by someone else during the repair", once=True)
        else:
            log.error("scontrol could not resume %s: %s", self.node, result)

    def held(self, decision: Decision, plan: RepairPlan) -> None:
        self.say(f"remediation: no {plan.action} on {self.node} now: {decision.words}")
        self.note("repair_held", plan.action, decision.outcome, plan.gpus, decision.words[:200], decision.counts,
                  once=True)  # fmt: skip

    def reboot(self, state: SlurmNode, plan: RepairPlan, verdict: health.NodeHealth) -> None:
        """Through Slurm's RebootProgram, without nextstate: the node stays drained through the boot (its reason says
        the reboot is pending) and this check resumes it only once every check passes after it. Not `ASAP`: that
        makes Slurm 22.05 set NextState=RESUME by itself (docs/slurm.md); the node is drained and idle already."""
        reason = keyed_reason(f"{REBOOT_PENDING}: reboot_node for GPU {', '.join(g.index for g in plan.gpus)}",
                              state.out_since, 150)  # fmt: skip
        decision = self.fleet.claim_repair(state, reason)
        if not decision.claimed:
            self.held(decision, plan)
            return
        reason = keyed_reason(reason, state.out_since)  # as the claim wrote it
        self.note("repair", "reboot_node", "started", plan.gpus, plan.why, reason=reason,
                  inventory=inventory_of(verdict))  # fmt: skip
        result = self.fleet.call([self.scontrol, "reboot", f"reason={reason}", self.node])
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip() or f"status {result.returncode}"
            log.error("scontrol reboot %s failed: %s", self.node, detail)
            # The drain as it was: the next check tries again.
            as_it_was = keyed_reason(state.reason, state.out_since)
            self.note("repair", "reboot_node", "failed", plan.gpus, f"scontrol reboot failed: {detail}"[:200],
                      reason=as_it_was)  # fmt: skip
            self.fleet.clear(self.node, reason, "State=DRAIN", f"Reason={as_it_was}")
            return
        self.say(f"remediation: asked Slurm to reboot node {self.node}: it stays drained until every check passes")
        self.note("repair", "reboot_node", "requested", plan.gpus, plan.why)

    def after_reboot(
        self, state: SlurmNode, failing: list[FailingGpu], node_failing: list[tuple[str, str]],
        verdict: health.NodeHealth,
    ) -> None:  # fmt: skip
        """The node is back from accelmon's reboot: resumed if every check passes, else drained for
        hardware_service naming the reboot and what still fails."""
        if state.reboot_pending:
            self.say(f"remediation: node {self.node} left drained: the reboot is under way")
            return
        gpus = tuple(failing)
        if not failing and not node_failing and joining_fabric(verdict):
            self.say(f"remediation: node {self.node} left drained: {joining_fabric(verdict)} not in the NVLink fabric "
                     "yet; the next check judges it")  # fmt: skip
            return
        if not failing and not node_failing:
            missing = not_back(self.journal.inventory(self.node), verdict, gres_gpus(state.gres))
            if missing:  # a driver not loaded yet, a GPU gone: never a pass; the next check judges again
                why = f"left drained after the reboot: {missing}"
                self.say(f"remediation: node {self.node} {why}")
                self.note("left_for_person", "reboot_node", detail=why[:200], once=True)
                return
        if failing or node_failing:
            self.note("repair", "reboot_node", "failed", gpus, f"{still_failing(verdict)} still fails after the reboot")
            self.escalate(f"accelmon: {still_failing(verdict)}: hardware_service (still fails after reboot_node)", gpus,
                          state, state.reason)  # fmt: skip
            return
        self.note("repair", "reboot_node", "resolved", detail="every check passed after the reboot")
        self.resume("reboot_node", (), "every check passed after the reboot", state.reason)

    def reset(self, state: SlurmNode, plan: RepairPlan, rescan: Scan, verdict: health.NodeHealth) -> None:
        indices = ", ".join(g.index for g in plan.gpus)
        claimed = keyed_reason(f"accelmon: resetting GPU {indices} (reset_gpu)", state.out_since)
        decision = self.fleet.claim_repair(state, claimed)
        if not decision.claimed:
            self.held(decision, plan)
            return
        self.note("repair", "reset_gpu", "started", plan.gpus, plan.why, reason=claimed,
                  inventory=inventory_of(verdict))  # fmt: skip
        # The reset's time is taken before it starts: a kernel log line written during the reset is one it answers.
        reset_at = time.time()
        failed = []
        taken = plan.gpus + plan.linked
        resetting = GpuReset(self.fleet, self.options.reset_command, self.options.procfs)
        stopped = resetting.stop_holders(self.options.gpu_holders)
        try:
            held = resetting.let_go(taken, stopped)
            if held:
                failed.append(f"not reset: still held by {held}")
            else:
                failed.extend(resetting.run(taken))
        finally:
            resetting.start_holders(stopped)
        blamed = plan.gpus
        if not failed:
            resets = {**self.journal.resets(), **{gpu.uuid: reset_at for gpu in taken if gpu.uuid}}
            after = rescan(resets)
            deadline = time.monotonic() + FABRIC_READY_SECONDS
            while not still_failing(after) and joining_fabric(after) and time.monotonic() < deadline:
                self.fleet.sleep(5.0)  # the Fabric Manager registers a reset GPU again: a pass only once it has
                after = rescan(resets)
            if joining_fabric(after) and not still_failing(after):
                failed.append(
                    f"{joining_fabric(after)} still joining the NVLink fabric {FABRIC_READY_SECONDS:g} s after"
                )
            elif still_failing(after):
                failed.append(f"{still_failing(after)} still fails")
                blamed = tuple(failing_gpus(after)) or plan.gpus
            else:  # a rescan that could not read the GPUs is no pass (NVML not starting yet, a GPU gone)
                missing = not_back(inventory_of(verdict), after, gres_gpus(state.gres))
                if missing:
                    failed.append(f"the rescan cannot vouch for it: {missing}")
        if not failed and shutil.which(self.dcgmi):
            tests = diagnose_when_ready(self.dcgmi, self.fleet.sleep)
            if tests is None:
                failed.append(f"dcgmi diag -r 2 could not run within {DIAG_READY_SECONDS:g} s of the reset")
            elif tests:
                failed.append("dcgmi diag -r 2 failed: " + ", ".join(tests))
        if failed:
            detail = "; ".join(failed)[:200]
            self.say(f"remediation: the reset did not repair node {self.node}: {detail}")
            self.note("repair", "reset_gpu", "failed", plan.gpus, detail)
            named = ", ".join(f"GPU {g.index}" for g in blamed)
            self.escalate(f"accelmon: {named} hardware_service: reset_gpu did not clear it ({detail})", blamed, state,
                          claimed)  # fmt: skip
            return
        self.note("repair", "reset_gpu", "resolved", plan.gpus, plan.why)
        done = ", ".join(gpu.index for gpu in plan.gpus + plan.linked)
        self.resume("reset_gpu", plan.gpus, f"reset GPU {done}, every check passed after it", claimed)
