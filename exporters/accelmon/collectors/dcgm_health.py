"""DCGM's health watches, where DCGM's host engine (nv-hostengine) runs: per GPU and watched system (PCIe, NVLink,
memory, SM, thermal, power, ...) whether DCGM reports it passing, warning or failing.

Example exposition line::

    accelmon_gpu_dcgm_health_state{gpu="3",system="mem",uuid="GPU-…"} 2

DCGM's health check answers with the incidents seen since the previous check (the first check only starts the
watches), each with a system, a result, an error code and a message. An incident is held for `hold_seconds` after
DCGM last reported it, so a failure seen once is not lost between two scrapes; its message (free text, never a
label) goes to the exporter's log once per incident. The host engine going away is reported
(`accelmon_dcgm_health_up 0`) and the connection retried at every sample; the other collectors go on.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from accelmon.exporter.checks import VERDICTS, Check, GpuCheck, GpuKey, View
from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import Paths, Registration, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.health import xid as catalogue
from accelmon.host.dcgm import DCGM_BINDINGS_PATH, DCGM_HOST, dcgm_connect

log = logging.getLogger("accelmon.dcgm_health")

GPU = ("gpu", "uuid")
INTERVAL = seconds("interval_seconds", 30, "how often DCGM's health watches are checked")
HOLD = seconds("hold_seconds", 3600, "how long an incident is held after DCGM last reported it")
C = Catalogue(
    "dcgm_health",
    "DCGM health watches",
    "Source: DCGM's health watches (DCGM_HEALTH_WATCH_ALL on the host engine's default group of GPUs), checked "
    f"every `interval_seconds` ({INTERVAL.default:g} s). States: 0 pass, 1 warning, 2 failure; an incident is held "
    f"for `hold_seconds` ({HOLD.default:g} s) after DCGM last reported it. Series only while the host engine answers.",
)
STATE = C.gauge(
    "accelmon_gpu_dcgm_health_state",
    "DCGM's health of one watched system of the GPU: 0 pass, 1 warning, 2 failure.",
    [*GPU, "system"],
)
INCIDENT = C.gauge(
    "accelmon_gpu_dcgm_health_incident",
    "An incident DCGM reported and accelmon holds, by DCGM error code (dcgmError_t); value: 1 warning, 2 failure.",
    [*GPU, "system", "code"],
)
UP = C.gauge("accelmon_dcgm_health_up", "1 if DCGM's host engine answers the health check, else 0.")

# dcgm_structs.DCGM_HEALTH_WATCH_* bit -> system label (dcgm_structs.py of DCGM 3 and 4).
SYSTEMS = {
    0x1: "pcie",
    0x2: "nvlink",
    0x4: "pmu",
    0x8: "mcu",
    0x10: "mem",
    0x20: "sm",
    0x40: "inforom",
    0x80: "thermal",
    0x100: "power",
    0x200: "driver",
    0x400: "nvswitch_nonfatal",
    0x800: "nvswitch_fatal",
}
WATCH_ALL = 0xFFFFFFFF
RESULT_STATE = {0: 0, 10: 1, 20: 2}  # DCGM_HEALTH_RESULT_PASS/WARN/FAIL -> 0/1/2
ENTITY_GPU = 1  # DCGM_FE_GPU


@dataclass
class Incident:
    state: int  # 1 warning, 2 failure
    message: str
    last_seen: float


class DcgmHealthCollector(Collector):
    name = "dcgm_health"

    def __init__(
        self,
        host: str = str(DCGM_HOST.default),
        bindings_paths: tuple[str, ...] = tuple(str(DCGM_BINDINGS_PATH.default).split(":")),
        hold_seconds: float = float(HOLD.default),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.bindings_paths = bindings_paths
        self.hold_seconds = hold_seconds
        self._clock = clock
        self._handle: Any = None
        self._group: Any = None
        self._uuids: dict[int, str] = {}
        self._incidents: dict[tuple[int, str, int], Incident] = {}

    def hardware_answering(self) -> bool:
        return self._group is not None

    def start(self) -> None:
        self._connect()

    def _connect(self) -> bool:
        try:
            _, self._handle, self._group, self._uuids = dcgm_connect(self.bindings_paths, self.host, "accelmon-health")
            self._group.health.Set(WATCH_ALL)
            self._group.health.Check()  # the first check starts the watches' state; it reports nothing yet
        except Exception as error:  # noqa: BLE001 - the bindings raise their own exception classes
            log.info("DCGM host engine at %s not usable for health watches: %s", self.host, error)
            self.stop()
            return False
        log.info("DCGM health watches on %d GPU(s) at %s", len(self._uuids), self.host)
        return True

    def stop(self) -> None:
        for thing, method in ((self._group, "Delete"), (self._handle, "Shutdown")):
            if thing is not None:
                try:
                    getattr(thing, method)()
                except Exception:  # noqa: BLE001 - best effort on a connection that may be gone
                    log.debug("DCGM %s failed", method)
        self._handle = self._group = None

    def sample(self) -> Samples:
        out = Samples()
        if self._group is None and not self._connect():
            out.add(UP, [], 0)
            return out
        try:
            response = self._group.health.Check()
        except Exception as error:  # noqa: BLE001 - the host engine went away
            log.warning("DCGM health check failed: %s (reconnecting at the next sample)", error)
            self.stop()
            out.add(UP, [], 0)
            return out
        now = self._clock()
        self._take(response, now)
        self._incidents = {k: v for k, v in self._incidents.items() if now - v.last_seen < self.hold_seconds}
        for gpu, uuid in sorted(self._uuids.items()):
            labels = [str(gpu), uuid]
            for system in SYSTEMS.values():
                held = [i.state for (g, s, _), i in self._incidents.items() if g == gpu and s == system]
                out.add(STATE, [*labels, system], max(held, default=0))
            for (g, system, code), incident in sorted(self._incidents.items()):
                if g == gpu:
                    out.add(INCIDENT, [*labels, system, str(code)], incident.state)
        out.add(UP, [], 1)
        return out

    def _take(self, response: Any, now: float) -> None:
        for number in range(int(response.incidentCount)):
            incident = response.incidents[number]
            if int(incident.entityInfo.entityGroupId) != ENTITY_GPU:
                continue  # NVSwitches and CPUs: the kernel log's SXids cover the switches
            gpu = int(incident.entityInfo.entityId)
            system = SYSTEMS.get(int(incident.system))
            state = RESULT_STATE.get(int(incident.health))
            if gpu not in self._uuids or system is None or not state:
                continue
            code = int(incident.error.code)
            message = _text(incident.error.msg)
            key = (gpu, system, code)
            if key not in self._incidents:
                log.warning("DCGM: GPU %d %s %s: %s", gpu, system, "failure" if state == 2 else "warning", message)
            self._incidents[key] = Incident(state, message, now)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _bindings_installed(paths: Paths, options: dict[str, Any]) -> bool:
    """On by default where DCGM's Python bindings are installed: DCGM is there, its host engine likely too."""
    paths_ = [p for p in str(options["dcgm_bindings_path"]).split(":") if p]
    return any(os.path.exists(os.path.join(path, "pydcgm.py")) for path in paths_)


# What a failing or warning DCGM health system asks for: link faults are the fabric's, memory and engine faults want
# a reset, the board's sensors and firmware a service case, the driver a reboot.
DCGM_SYSTEM_ACTIONS = {
    "pcie": "hardware_service",
    "nvlink": "check_fabric",
    "pmu": "reset_gpu",
    "mcu": "reset_gpu",
    "mem": "reset_gpu",
    "sm": "reset_gpu",
    "inforom": "hardware_service",
    "thermal": "hardware_service",
    "power": "hardware_service",
    "driver": "reboot_node",
    "nvswitch_nonfatal": "check_fabric",
    "nvswitch_fatal": "check_fabric",
}


def check_dcgm(view: View, gpu: GpuKey, now: float) -> Check:
    """DCGM's own health watches, where its host engine runs: their worst system decides (messages are in the
    exporter's log; docs/health.md)."""
    states = [(labels["system"], value) for labels, value in view.of(STATE, gpu)]
    if not states:
        return Check("dcgm", "ok", "DCGM health watches not running")
    worst_state = max(value for _, value in states)
    if worst_state == 0:
        return Check("dcgm", "ok", f"DCGM: {len(states)} systems pass")
    verdict = VERDICTS[int(worst_state)]
    systems = sorted(system for system, value in states if value == worst_state)
    action = catalogue.most_disruptive([DCGM_SYSTEM_ACTIONS.get(system, "hardware_service") for system in systems])
    return Check("dcgm", verdict, f"DCGM health {verdict}: {', '.join(systems)}", action)


REGISTRATION = register(
    Registration(
        name="dcgm_health",
        help="DCGM health watches per GPU and system, where DCGM's host engine runs",
        build=lambda options, paths: DcgmHealthCollector(
            host=options["dcgm_host"],
            bindings_paths=tuple(p for p in options["dcgm_bindings_path"].split(":") if p),
            hold_seconds=options["hold_seconds"],
        ),
        catalogue=C,
        options=(INTERVAL, HOLD, DCGM_HOST, DCGM_BINDINGS_PATH),
        enabled_by_default=_bindings_installed,
        # DCGM installed without a running host engine (dcgm-exporter embeds its own) is a choice, not a fault:
        # accelmon_dcgm_health_up says whether it answers.
        gpu_checks=(
            GpuCheck(
                "dcgm",
                check_dcgm,
                source="`accelmon_gpu_dcgm_health_state` (collector `dcgm_health`, where DCGM's host engine runs)",
                failure=(
                    "a watched system fails (the system's action: memory, SM, PMU, MCU `reset_gpu`; NVLink, NVSwitch "
                    "`check_fabric`; PCIe, thermal, power, InfoROM `hardware_service`; driver `reboot_node`)"
                ),
                warning="a watched system warns (same actions)",
            ),
        ),
    )
)
