"""The node's collectors built from its settings, and the health scan over them: what `accelmon-exporter` runs, what
`--check-config --json` plans, and the one-shot scan that `--scan`, accelmon-drill and the Slurm and OAR hooks share.

A check belongs to the collector whose series it judges, and is judged only where that collector runs: on a node
with NVIDIA GPUs only, AMD's xgmi check gives no verdict at all (absent, "no data"), never a false "ok".
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from accelmon import health
from accelmon.collectors import collectors
from accelmon.collectors.infiniband import NCCL_CONF
from accelmon.config import ConfigError, Settings, load
from accelmon.exporter.checks import Check
from accelmon.exporter.registry import Registration
from accelmon.exporter.runtime import Exporter, Sampler
from accelmon.health import drill_store
from accelmon.health.remediation import JOURNAL, Journal
from accelmon.host import pcie_acs

SCAN_FAILED = 3  # the scan's own exit status when it could not run: 0, 1 and 2 are the verdicts
# The scan's own limit: within slurmd's 60 s for a whole health check, with room for the check's calls to Slurm
# (accelmon.schedulers.slurm.fleet.CHECK_BUDGET_SECONDS). A healthy 8-GPU node scans in about a second.
SCAN_DEADLINE_SECONDS = 30.0


def runs_here(registration: Registration, settings: Settings) -> bool:
    chosen = settings.collector(registration.name)
    if chosen.enabled is not None:
        return chosen.enabled
    return registration.enabled_by_default(settings.paths, {**registration.defaults, **chosen.options})


def build_samplers(settings: Settings) -> list[Sampler]:
    samplers = []
    for name, registration in collectors().items():
        if not runs_here(registration, settings):
            continue
        chosen = settings.collector(name)
        options = {**registration.defaults, **chosen.options}
        expected = chosen.enabled is True or registration.hardware_present(settings.paths, options)
        collector = registration.build(options, settings.paths)
        samplers.append(Sampler(collector, float(options["interval_seconds"]), hardware_expected=expected))
    samplers.sort(key=lambda sampler: sampler.collector.reads_other_samples)  # stable: by name otherwise
    for sampler in samplers:
        sampler.collector.watch(samplers)
    return samplers


def plan(settings: Settings) -> dict[str, object]:
    """What --check-config --json prints: the settings resolved, for the Ansible role and for operators.

    Each collector's `hardware_markers` are the host paths whose presence shows its hardware (the role looks for
    them on a host before it installs a collector's bindings). `device_allow` holds the device nodes of every
    collector that may run, `auto` ones included: the unit must let a collector reach hardware that appears after
    the deploy (a driver installed later); `capabilities` the Linux capabilities they need (the unit's only ones).
    """
    described: dict[str, dict[str, object]] = {}
    devices: set[str] = set()
    capabilities: set[str] = set()
    for name, registration in collectors().items():
        chosen = settings.collector(name)
        described[name] = {
            "enabled": "auto" if chosen.enabled is None else chosen.enabled,
            "runs_on_this_host": runs_here(registration, settings),
            "options": {**registration.defaults, **chosen.options},
            "devices": list(registration.devices),
            "hardware_markers": registration.markers(settings.paths),
        }
        if registration.may_run(chosen.enabled):
            devices.update(registration.devices)
            capabilities.update(registration.capabilities)
    return {
        "listen_address": settings.listen_address,
        "collectors": described,
        "device_allow": sorted(devices),
        "capabilities": sorted(capabilities),
    }


def scan_health(
    settings: Settings, resets: dict[str, float] | None = None, deadline: float = SCAN_DEADLINE_SECONDS
) -> health.NodeHealth:
    """The collectors that declare `scan` (those the checks read that answer in one sample) and run on this node,
    sampled once; their checks over them. The others (profiling's window, neuron-monitor's start) would only slow
    it down, and their checks are not judged here. GPU resets are those of the repair journal unless `resets` says."""
    options = settings.collector("health").options
    drill_dir = str(options.get("drill_dir", drill_store.DRILL_DIR.default))
    if resets is None:
        resets = Journal.read(str(options.get("remediation_journal", JOURNAL.default))).resets()
    registered = collectors()
    for name, registration in registered.items():
        if not registration.scan:
            settings.collector(name).enabled = False
    samplers = build_samplers(settings)
    late = sample_within(samplers, deadline)
    # Sampled is not read: a collector whose hardware is there (its driver's files) but did not answer (NVML that
    # cannot start after a reset) "succeeds" with no series, and its checks then judge nothing.
    unread = [
        s.name for s in samplers
        if s.name not in late and s.hardware_expected
        and (not s.state().success or s.collector.hardware_answering() is False)
    ]  # fmt: skip
    if not late:  # a collector still inside a hardware call keeps its library: releasing it under the call races
        Exporter(samplers).stop()
    latest = [state.latest for state in (sampler.state() for sampler in samplers) if state.latest is not None]
    sampled = {sampler.name for sampler in samplers}
    running = [registration for name, registration in registered.items() if name in sampled]
    now = time.time()
    node = health.evaluate(latest, now, running, drills=drill_store.read(drill_dir, now), resets=resets)
    node.unsampled = tuple(late + unread)
    if late:
        # Slurm kills a health check at 60 s and logs nothing of it: a scan that cannot finish is judged, not lost.
        # A driver that slow fails jobs too; a person looks (NHC, too, takes a node offline on a check's timeout).
        detail = f"{', '.join(late)} did not answer within the scan's {deadline:g} s"
        node.checks.append(Check("scan", "failure", detail, "hardware_service"))
    return node


def sample_within(samplers: list[Sampler], seconds: float) -> list[str]:
    """Samples each collector once, in order (a collector that reads the others' samples after them), on a worker
    thread; the names of those not done when `seconds` have passed (left running: a hardware call cannot be
    interrupted)."""
    done: list[str] = []

    def sample_all() -> None:
        for sampler in samplers:
            sampler.sample_once()
            done.append(sampler.name)

    worker = threading.Thread(target=sample_all, name="scan", daemon=True)
    worker.start()
    worker.join(seconds)
    return [sampler.name for sampler in samplers if sampler.name not in done]


def hook_scan(config: str | None, log: logging.Logger, untouched: str) -> tuple[Settings, health.NodeHealth] | None:
    """A scheduler hook's scan (Slurm's health check, OAR's node check): the verdicts printed; the settings and the
    node's health, or None where the settings are bad (logged, never raised: a fault of the monitoring must not take
    a node out)."""
    try:
        settings = load(config)
    except ConfigError as error:
        log.error("%s: no health check run, %s", error, untouched)
        return None
    verdict = scan_health(load(config))  # a fresh copy: the scan turns the other collectors off in its own
    sys.stdout.write(verdict.table())
    if os.geteuid() == 0:
        refresh_pcie_acs(settings, log)
    return settings, verdict


def refresh_pcie_acs(settings: Settings, log: logging.Logger) -> None:
    """The ACS root pass (accelmon.host.pcie_acs) where the pcie_acs collector runs: the hooks run as root, and
    the exporter cannot read the bridges' extended configuration space. A failure is logged, never raised."""
    registration = collectors()["pcie_acs"]
    if not runs_here(registration, settings):
        return
    options = {**registration.defaults, **settings.collector("pcie_acs").options}
    topo_file = str(settings.collector("infiniband").options.get("nccl_topo_file") or "")  # NICs as it chooses
    paths = settings.paths
    try:
        pcie_acs.refresh(paths.sysfs, paths.procfs, NCCL_CONF, str(options["pcie_acs_state"]), time.time(), topo_file)
    except (OSError, ValueError) as error:
        log.warning("PCIe ACS not surveyed: %s", error)
