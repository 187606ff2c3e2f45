"""AWS's neuron-monitor, the tool the `neuron` collector reads: the report groups asked of it, where to find it, and
what its reports say, added up (`NeuronState`: the latest report and the per-period counts, thread-safe; malformed
lines skipped and counted). The report format is AWS's neuron-monitor user guide's (shared/seeds); the collector
supervises the process and turns the state into metrics.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections import defaultdict
from typing import Any

log = logging.getLogger("accelmon.neuron")

ALL_GROUPS_CONFIG = {
    "neuron_runtimes": [
        {
            "tag_filter": ".*",
            "metrics": [
                {"type": "neuroncore_counters"},
                {"type": "memory_used"},
                {"type": "neuron_runtime_vcpu_usage"},
                {"type": "execution_stats"},
            ],
        }
    ],
    "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"}, {"type": "neuron_hw_counters"}],
}
MAX_LINE_BYTES = 32 * 1024 * 1024  # a report of a big trn instance is far smaller; a longer line is garbage
# One warning for a malformed line, then at most one a minute with the count since: garbage from the monitor
# wrote 75 MB of log a minute when every line was a warning.
MALFORMED_LOG_SECONDS = 60.0
SEARCH_PATH = ("/opt/aws/neuron/bin",)


def find_monitor(command: str) -> str | None:
    if os.sep in command:
        return command if os.access(command, os.X_OK) else None
    found = shutil.which(command)
    if found:
        return found
    for directory in SEARCH_PATH:
        candidate = os.path.join(directory, command)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class NeuronState:
    """What the reports say: the latest report, and the per-period counts added up. Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.report: dict[str, Any] | None = None
        self.report_time = 0.0  # monotonic
        self.report_wall_time = 0.0
        self.reports = 0
        self.malformed = 0
        self.restarts = 0
        self.group_errors: dict[str, int] = defaultdict(int)
        # (runtime tag or "" for system, group) -> period value of the capture last added
        self._last_capture: dict[tuple[str, str], float] = {}
        self.exec_errors: dict[tuple[str, str], float] = defaultdict(float)
        self.exec_status: dict[tuple[str, str], float] = defaultdict(float)
        self.ecc: dict[tuple[str, str], float] = defaultdict(float)
        self.context_switches = 0.0
        self._malformed_logged_at = -MALFORMED_LOG_SECONDS
        self._malformed_unlogged = 0

    def add_malformed(self, now: float, why: str, line: bytes) -> None:
        """Count a skipped line; log it unless one was logged less than MALFORMED_LOG_SECONDS ago."""
        with self.lock:
            self.malformed += 1
            if now - self._malformed_logged_at < MALFORMED_LOG_SECONDS:
                self._malformed_unlogged += 1
                return
            self._malformed_logged_at, unlogged, self._malformed_unlogged = now, self._malformed_unlogged, 0
        more = f"; {unlogged} more since the last warning" if unlogged else ""
        log.warning("skipped a malformed neuron-monitor line (%s%s): %.80r", why, more, line)

    def add_line(self, line: bytes, now: float, wall: float) -> bool:
        try:
            report = json.loads(line)
            if not isinstance(report, dict):
                raise ValueError("not an object")
            self._accumulate(report)
        except (ValueError, TypeError, AttributeError, KeyError) as error:
            self.add_malformed(now, str(error), line)
            return False
        with self.lock:
            self.report, self.report_time, self.report_wall_time = report, now, wall
            self.reports += 1
        return True

    def _new_capture(self, runtime: str, group: str, data: dict[str, Any], pending: dict[tuple[str, str], Any]) -> bool:
        period = data.get("period")
        key = (runtime, group)
        if period is not None and self._last_capture.get(key) == period:
            return False
        pending[key] = period
        return True

    def _accumulate(self, report: dict[str, Any]) -> None:
        """Validate the report's shape and add its per-period counts (all under the lock, all or nothing)."""
        runtimes = report.get("neuron_runtime_data") or []
        system = report.get("system_data") or {}
        if not isinstance(runtimes, list) or not isinstance(system, dict):
            raise ValueError("unexpected report structure")
        additions: list[tuple[dict[tuple[str, str], float], tuple[str, str], float]] = []
        switches = 0.0
        pending: dict[tuple[str, str], Any] = {}
        live = set()
        groups_in_error = []
        for runtime in runtimes:
            tag = runtime_tag(runtime)
            live.add(tag)
            for group, data in (runtime.get("report") or {}).items():
                if not isinstance(data, dict):
                    raise ValueError(f"group {group} is not an object")
                if data.get("error"):
                    groups_in_error.append(group)
                    continue
                if group == "execution_stats" and self._new_capture(tag, group, data, pending):
                    for kind, count in (data.get("error_summary") or {}).items():
                        if number(count) is not None:
                            additions.append((self.exec_errors, (tag, kind), float(count)))
                    for kind, count in (data.get("execution_summary") or {}).items():
                        if number(count) is not None:
                            additions.append((self.exec_status, (tag, kind), float(count)))
        for group, data in system.items():
            if not isinstance(data, dict):
                raise ValueError(f"group {group} is not an object")
            if data.get("error"):
                groups_in_error.append(group)
                continue
            if group == "neuron_hw_counters" and self._new_capture("", group, data, pending):
                for device in data.get("neuron_devices") or []:
                    index = str(device.get("neuron_device_index"))
                    for event in (
                        "mem_ecc_corrected",
                        "mem_ecc_uncorrected",
                        "sram_ecc_corrected",
                        "sram_ecc_uncorrected",
                    ):
                        if number(device.get(event)) is not None:
                            additions.append((self.ecc, (index, event), float(device[event])))
            if group == "vcpu_usage" and self._new_capture("", group, data, pending):
                switches += number(data.get("context_switch_count")) or 0.0
        with self.lock:
            self._last_capture.update(pending)
            for table, key, value in additions:
                table[key] += value
            self.context_switches += switches
            for group in groups_in_error:
                self.group_errors[group] += 1
            # Runtimes that are gone take their counters with them: no stale series, no growth as pids churn.
            for table in (self.exec_errors, self.exec_status):
                for key in [k for k in table if k[0] not in live]:
                    del table[key]
            for key in [k for k in self._last_capture if k[0] and k[0] not in live]:
                del self._last_capture[key]


def runtime_tag(runtime: dict[str, Any]) -> str:
    tag = runtime.get("neuron_runtime_tag")
    return str(tag) if tag not in (None, "") else str(runtime.get("pid", ""))
