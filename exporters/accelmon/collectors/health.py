"""The health verdict served as metrics: every interval, the checks every collector declares (`accelmon.health`)
over the latest samples of the other collectors (the same code as `--scan` and the Slurm and OAR hooks).

Example exposition lines::

    accelmon_gpu_health_verdict{gpu="2",uuid="GPU-..."} 2.0
    accelmon_gpu_health_check_state{action="reboot_node",check="xid",gpu="2",uuid="GPU-..."} 2.0

States are 0 ok, 1 warning, 2 failure. `action` is the catalogue's (`none` while a check passes), so an alert
carries what to do; it changes only with the check's state.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from accelmon import health
from accelmon.collectors import collectors
from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import Paths, Registration, register, seconds
from accelmon.exporter.runtime import Collector, Sampler
from accelmon.health import drill_store, remediation
from accelmon.health.remediation import Journal
from accelmon.host.slurm_pause import PauseMemory, paused_path

C = Catalogue(
    "health",
    "Health verdicts",
    "Computed from the other collectors' latest samples by the checks each collector declares (docs/health.md); "
    "states: 0 ok, 1 warning, 2 failure.",
)
GPU_VERDICT = C.gauge(
    "accelmon_gpu_health_verdict", "The GPU's worst check: 0 ok, 1 warning, 2 failure.", ["gpu", "uuid"]
)
GPU_CHECK = C.gauge(
    "accelmon_gpu_health_check_state",
    "One health check of a GPU: 0 ok, 1 warning, 2 failure, with the action it asks for.",
    ["gpu", "uuid", "check", "action"],
)
NODE_VERDICT = C.gauge(
    "accelmon_node_health_verdict", "The node's worst GPU or node check: 0 ok, 1 warning, 2 failure."
)
NODE_CHECK = C.gauge(
    "accelmon_node_health_check_state",
    "One health check of the node itself (not of a GPU): 0 ok, 1 warning, 2 failure.",
    ["check", "action"],
)
DRILL_ACTIVE = C.gauge(
    "accelmon_gpu_health_drill_active",
    "1 while a drill (accelmon-drill) rehearses this check's failure on the GPU: its verdict is no real fault.",
    ["gpu", "uuid", "check"],
)
# From verdict to repair (accelmon.health.remediation): what the Slurm health check decided and did, from its journal.
MODE = C.gauge(
    "accelmon_remediation_mode_info",
    "The repair loop's mode (observe: say, act: do), from the health options.",
    ["mode"],
)
JOURNAL_USABLE = C.gauge(
    "accelmon_remediation_journal_usable",
    "1 if the repair journal can be read and holds only records (missing: nothing journalled yet, 1); 0 stops "
    "every repair until it is fixed or moved away.",
)
JOURNAL_MALFORMED = C.gauge(
    "accelmon_remediation_journal_malformed_lines", "Lines of the repair journal that are not records (skipped)."
)
REPAIRS = C.counter(
    "accelmon_gpu_remediation_repairs_total",
    "Repairs the Slurm health check carried out on the GPU (by serial: a swapped GPU is another), by action "
    "(reboot_node, reset_gpu) and outcome (requested, resolved, failed).",
    ["gpu", "uuid", "serial", "action", "outcome"],
)
EVENTS = C.counter(
    "accelmon_node_remediation_events_total",
    "Decisions of the Slurm health check on this node, by event (claimed, drained, breaker_held, repair, would_repair, "
    "left_for_person, escalated, resumed) and the action they were for.",
    ["event", "action"],
)
DRAINED_SECONDS = C.counter(
    "accelmon_node_remediation_drained_seconds_total",
    "Seconds this node spent drained by accelmon until it was resumed (closed drains only): over the resumes, the "
    "mean time to repair.",
)
DRAIN_HELD = C.gauge(
    "accelmon_node_drain_held_by_breaker",
    "1 while the node fails its health checks and the circuit breaker held its drain back (it keeps taking jobs), "
    "else 0.",
)
BREAKER_NODES = C.gauge(
    "accelmon_node_drain_breaker_nodes",
    "The circuit breaker's counts when it held this node's drain back: nodes out by accelmon, nodes listed, limit.",
    ["count"],
)
# Why the check holds back now (accelmon.schedulers.slurm.fleet), one series a reason: the fleet's limits as the alerts
# read them.
HOLDS = ("breaker", "uncounted", "paused", "pace")
HELD = C.gauge(
    "accelmon_node_remediation_held",
    "1 while the Slurm health check's latest decision on this failing node was a hold, by why: breaker (the circuit "
    "breaker's limit, a drain held back or taken back), uncounted (the controller could not be read: nothing "
    "drained), paused (accelmon-remediation pause), pace (the fleet's repairs of the hour); else 0.",
    ["why"],
)
PAUSE_VANISHED = C.gauge(
    "accelmon_remediation_pause_vanished",
    "1 while this node's Slurm health check holds a pause whose switch vanished from every node's Comment without "
    "accelmon-remediation resume (a `scontrol update NodeName=ALL Comment=...`): it stays paused until a resume, "
    "else 0.",
)
LIMIT = C.gauge(
    "accelmon_remediation_limit",
    "The fleet's limits this node's health check keeps, from its options: breaker_min_nodes, breaker_fraction, "
    "breaker_max_nodes, breaker_window_seconds, max_repairs_per_hour (the alerts compare the fleet's state with them).",
    ["limit"],
)
INTERVAL = seconds("interval_seconds", 5.0, "how often the checks run over the latest samples")


class HealthCollector(Collector):
    name = "health"
    reads_other_samples = True

    def __init__(
        self,
        drill_dir: str = str(drill_store.DRILL_DIR.default),
        wall_clock: Callable[[], float] = time.time,
        journal: str = str(remediation.JOURNAL.default),
        mode: str = str(remediation.REMEDIATION.default),
        limits: dict[str, float] | None = None,
    ) -> None:
        self._wall_clock = wall_clock
        self.drill_dir = drill_dir
        self.journal_path, self.mode = journal, mode
        self.limits = limits or {}
        self._journal: tuple[tuple[int, int] | None, Journal] = (None, Journal(journal, missing=True))
        self.registrations: list[Registration] = []  # whose checks run: the running collectors' (`watch`)
        self.sources: list[Sampler] = []

    def watch(self, samplers: list[Sampler]) -> None:
        """The collectors running beside it: their latest samples are judged, by their checks only (a check whose
        collector does not run here is absent, not "ok")."""
        self.sources = [sampler for sampler in samplers if sampler.collector is not self]
        running = {sampler.name for sampler in self.sources}
        self.registrations = [registration for name, registration in collectors().items() if name in running]

    def sample(self) -> Samples:
        latest = [state.latest for state in (s.state() for s in self.sources) if state.latest is not None]
        now = self._wall_clock()
        drills = drill_store.read(self.drill_dir, now)  # a listing of an empty directory when none is in force
        journal = self.journal()
        node = health.evaluate(latest, now, self.registrations, drills, journal.resets())
        out = served(node)
        serve_journal(out, journal, node.verdict == "failure", self.mode, now)
        remembered = PauseMemory(paused_path(self.journal_path)).read()
        out.add(PAUSE_VANISHED, [], 1 if remembered is not None and remembered.get("vanished") is True else 0)
        for name, value in sorted(self.limits.items()):
            out.add(LIMIT, [name], value)
        return out

    def journal(self) -> Journal:
        """The repair journal, read again only when it changed (a stat a sample)."""
        try:
            status = os.stat(self.journal_path)
            stamp: tuple[int, int] | None = (status.st_mtime_ns, status.st_size)
        except OSError:
            stamp = None
        if stamp is None or stamp != self._journal[0]:
            self._journal = (stamp, Journal.read(self.journal_path))
        return self._journal[1]


# A check that could not read Slurm journals it at every run: its record is fresh this long, whatever this exporter's
# own verdict (the check's scan may have failed where the exporter's did not: the scan's deadline).
UNCOUNTED_FRESH_SECONDS = 1800.0


def serve_journal(out: Samples, journal: Journal, failing: bool, mode: str, now: float | None = None) -> None:
    """What the repair journal says, served beside the verdicts: the mode, the journal's state, repairs and events,
    drained time, and whether the breaker holds this failing node's drain back now."""
    out.add(MODE, [mode], 1)
    out.add(JOURNAL_USABLE, [], 0 if journal.problem else 1)
    out.add(JOURNAL_MALFORMED, [], journal.malformed)
    summary = remediation.summary_of(journal.records)
    for (index, uuid, serial, action, outcome), count in sorted(summary["repairs"].items()):
        out.add(REPAIRS, [index, uuid, serial, action, outcome], count)
    for (event, action), count in sorted(summary["events"].items()):
        out.add(EVENTS, [event, action], count)
    out.add(DRAINED_SECONDS, [], remediation.drained_seconds(journal.records))
    latest = next(
        (r for r in reversed(journal.records)
         if r.event in ("drained", "escalated", "resumed", "breaker_held", "repair", "repair_held")), None,
    )  # fmt: skip
    at = time.time() if now is None else now
    uncounted = latest is not None and latest.outcome == "uncounted" and latest.time >= at - UNCOUNTED_FRESH_SECONDS
    why = hold_of(latest) if failing or uncounted or (latest is not None and latest.event == "repair_held") else None
    out.add(DRAIN_HELD, [], 1 if why == "breaker" and latest is not None and latest.event == "breaker_held" else 0)
    for name in HOLDS:
        out.add(HELD, [name], 1 if why == name else 0)
    if why == "breaker" and latest is not None and latest.event == "breaker_held":
        for name, count in zip(("out", "listed", "limit"), latest.breaker):
            out.add(BREAKER_NODES, [name], count)


def hold_of(record: remediation.Record | None) -> str | None:
    """Which of HOLDS a journal record is (a drain or a repair held back), None if it is no hold."""
    if record is None or record.event not in ("breaker_held", "repair_held"):
        return None
    if record.outcome in ("uncounted", "paused"):
        return record.outcome
    if record.outcome == "failed":  # Slurm refused the drain, or a claim left nothing: no limit held it back
        return None
    return "pace" if record.event == "repair_held" else "breaker"  # held, ranked_out (or none: an older journal)


def served(node: health.NodeHealth) -> Samples:
    out = Samples()
    for gpu in node.gpus:
        out.add(GPU_VERDICT, [gpu.index, gpu.uuid], health.VERDICTS.index(gpu.verdict))
        for check in gpu.checks:
            out.add(GPU_CHECK, [gpu.index, gpu.uuid, check.name, check.action], health.VERDICTS.index(check.verdict))
            if check.drill:
                out.add(DRILL_ACTIVE, [gpu.index, gpu.uuid, check.name], 1)
    for check in node.checks:
        out.add(NODE_CHECK, [check.name, check.action], health.VERDICTS.index(check.verdict))
    out.add(NODE_VERDICT, [], health.VERDICTS.index(node.verdict))
    return out


def _always(paths: Paths, options: dict[str, object]) -> bool:
    return True


REGISTRATION = register(
    Registration(
        name="health",
        help="health verdicts per GPU and node, from the other collectors' samples",
        build=lambda options, paths: HealthCollector(
            str(options["drill_dir"]),
            journal=str(options["remediation_journal"]),
            mode=str(options["remediation"]),
            limits={
                "breaker_min_nodes": float(options["breaker_min_nodes"]),
                "breaker_fraction": float(options["breaker_fraction"]),
                "breaker_max_nodes": float(options["breaker_max_nodes"]),
                "breaker_window_seconds": float(options["breaker_window_hours"]) * 3600,
                "max_repairs_per_hour": float(options["max_repairs_per_hour"]),
            },
        ),
        catalogue=C,
        # The repair loop's options are the Slurm health check's (it reads the exporter's config); the collector
        # serves what its journal says.
        options=(INTERVAL, drill_store.DRILL_DIR, *remediation.OPTIONS),
        enabled_by_default=_always,
    )
)
