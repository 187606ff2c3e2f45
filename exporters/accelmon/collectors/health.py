"""The health verdict served as metrics: every interval, the checks every collector declares (`accelmon.health`)
over the latest samples of the other collectors (the same code as `--scan` and the Slurm and OAR hooks).

Example exposition lines::

    accelmon_gpu_health_verdict{gpu="2",uuid="GPU-..."} 2.0
    accelmon_gpu_health_check_state{action="reboot_node",check="xid",gpu="2",uuid="GPU-..."} 2.0

States are 0 ok, 1 warning, 2 failure. `action` is the catalogue's (`none` while a check passes), so an alert
carries what to do; it changes only with the check's state.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from accelmon import drill_store, health
from accelmon.core import Catalogue, Collector, Sampler, Samples
from accelmon.registry import Paths, Registration, collectors, register, seconds

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
INTERVAL = seconds("interval_seconds", 5.0, "how often the checks run over the latest samples")


class HealthCollector(Collector):
    name = "health"
    reads_other_samples = True

    def __init__(
        self, drill_dir: str = str(drill_store.DRILL_DIR.default), wall_clock: Callable[[], float] = time.time
    ) -> None:
        self._wall_clock = wall_clock
        self.drill_dir = drill_dir
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
        return served(health.evaluate(latest, now, self.registrations, drills))


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
        build=lambda options, paths: HealthCollector(str(options["drill_dir"])),
        catalogue=C,
        options=(INTERVAL, drill_store.DRILL_DIR),
        enabled_by_default=_always,
    )
)
