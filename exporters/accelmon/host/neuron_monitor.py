"""AWS's neuron-monitor, the tool the `neuron` collector reads: the report groups asked of it, where to find it, and
what its reports say, added up (`NeuronState`: the latest report and the per-period counts, thread-safe; malformed
lines skipped and counted). The report format is AWS's neuron-monitor user guide's (shared/seeds); the collector
supervises the process and turns the state into metrics.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any, Callable

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


class MonitorSupervisor:
    """Runs `neuron-monitor -c CONFIG` (a config with every metric group and the report `period_seconds`) and keeps it
    running: a monitor that exits, or ends no line for `stall_seconds`, is restarted with exponential backoff (never
    in a busy loop), in a process group of its own that is killed whole. Each line goes to `state` (NeuronState)."""

    def __init__(
        self, monitor: str, period_seconds: float, stall_seconds: float, max_backoff_seconds: float,
        state: NeuronState, clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.monitor = monitor
        self.period_seconds = period_seconds
        self.stall_seconds = stall_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.state = state
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: str | None = None
        self.running = False  # a monitor process is running now

    def start(self) -> None:
        self._workdir = tempfile.mkdtemp(prefix="accelmon-neuron-")  # mode 0700
        config = os.path.join(self._workdir, "monitor.json")
        with open(config, "w", encoding="utf-8") as stream:
            json.dump({"period": f"{self.period_seconds:g}s", **ALL_GROUPS_CONFIG}, stream)
        self._thread = threading.Thread(target=self._supervise, args=(config,), name="neuron-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._kill()
        if self._thread is not None:
            self._thread.join(5)
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def _kill(self) -> None:
        """Stop the monitor and everything it started: it runs in a process group of its own, so no child of
        it is left holding the pipe (orphans did, after restarts)."""
        process = self._process
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(2)
            except subprocess.TimeoutExpired:
                pass
            os.killpg(process.pid, signal.SIGKILL)  # what is left of the group, children that outlived it too
        except ProcessLookupError:
            pass  # the whole group is gone
        try:
            process.wait(2)
        except subprocess.TimeoutExpired:
            log.warning("neuron-monitor (pid %d) did not exit after SIGKILL", process.pid)

    def _supervise(self, config: str) -> None:
        backoff = 1.0
        first = True
        while not self._stop.is_set():
            path = find_monitor(self.monitor)
            if path is None:
                log.info(
                    "neuron-monitor (%s) not found; looking again in %.0f s", self.monitor, self.max_backoff_seconds
                )
                self._stop.wait(self.max_backoff_seconds)
                continue
            if not first:
                with self.state.lock:
                    self.state.restarts += 1
            first = False
            started = self._clock()
            self._run_once(path, config)
            if self._stop.is_set():
                break
            # A run that produced reports for a while resets the backoff; a crash loop backs off to the max.
            backoff = 1.0 if self._clock() - started > 60 else min(backoff * 2, self.max_backoff_seconds)
            log.warning("neuron-monitor stopped; restarting in %.0f s", backoff)
            self._stop.wait(backoff)

    def _run_once(self, path: str, config: str) -> None:
        try:
            self._process = subprocess.Popen(
                [path, "-c", config],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, killed whole (see _kill)
            )
        except OSError as error:
            log.warning("cannot start %s: %s", path, error)
            return
        self.running = True
        assert self._process.stdout is not None
        stream = self._process.stdout
        selector = selectors.DefaultSelector()
        selector.register(stream, selectors.EVENT_READ)
        buffer = bytearray()
        discarding = False  # inside a line already counted as malformed for being too long
        last_line = self._clock()
        try:
            while not self._stop.is_set():
                ready = selector.select(timeout=1.0)
                # Stalled: no complete line for stall_seconds, whether it prints nothing or never ends a line.
                if self._clock() - last_line > self.stall_seconds:
                    log.warning("neuron-monitor ended no line for %.0f s; restarting it", self.stall_seconds)
                    break
                if not ready:
                    continue
                chunk = os.read(stream.fileno(), 1 << 20)
                if not chunk:
                    break  # EOF: it exited (or closed stdout); never spin on a closed pipe
                # Only the new chunk is searched and appended: a 100 MB line cost 14.8 s of quadratic copying.
                start = 0
                while (end := chunk.find(b"\n", start)) >= 0:
                    if not discarding:
                        buffer += chunk[start:end]
                        if buffer.strip():
                            self.state.add_line(bytes(buffer), self._clock(), time.time())
                    discarding = False
                    buffer.clear()
                    last_line = self._clock()
                    start = end + 1
                if not discarding:
                    buffer += chunk[start:]
                    if len(buffer) > MAX_LINE_BYTES:
                        self.state.add_malformed(
                            self._clock(), f"a line over {MAX_LINE_BYTES} bytes", bytes(buffer[:80])
                        )
                        buffer.clear()
                        discarding = True
        finally:
            selector.close()
            self.running = False
            if buffer.strip() and not discarding:
                self.state.add_malformed(self._clock(), "a truncated last line", bytes(buffer[:80]))
            self._kill()
            stream.close()
