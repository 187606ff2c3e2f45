"""Processes a test or benchmark starts: a free loopback port, the exporter run as a user runs it, and what a
process costs (CPU seconds, resident and peak memory, read from procfs)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional, Sequence

from tests.support.paths import ROOT
from tests.support.waiting import wait_until


def free_port() -> int:
    """A TCP port free on loopback now, for a server a test starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """CPU time of a running process, every thread's (those that ended too), to the nanosecond: the process's CPU
    clock (Linux's CPUCLOCK_SCHED for the pid, readable by any process of the same user or root), which the
    kernel keeps exactly. /proc/PID/stat's utime and stime, the fallback, count in clock ticks (10 ms): too coarse
    for an exporter that uses a few ms a second (docs/benchmarks.md)."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(f"/proc/{pid}/status has no {field}")


def rss_kib(pid: int) -> int:
    """Resident memory now (VmRSS)."""
    return _status_kib(pid, "VmRSS")


def peak_rss_kib(pid: int) -> int:
    """The most resident memory the process ever had (VmHWM)."""
    return _status_kib(pid, "VmHWM")


def exporter_env(fake_nvml_dir: Optional[Path], config: Optional[Path]) -> dict[str, str]:
    """This environment with the fake driver (if given) found first, and its configuration file."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FAKE_NVML_CONFIG")}
    # The package from this checkout even where it is not installed (bench on the GPU machine, the 3.9 venv).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "exporters"), env.get("PYTHONPATH")]))
    if fake_nvml_dir is not None:
        env["LD_LIBRARY_PATH"] = str(fake_nvml_dir)
    if config is not None:
        env["FAKE_NVML_CONFIG"] = str(config)
    return env


def exporter_command(*args: str) -> list[str]:
    """accelmon-exporter as this interpreter runs it."""
    return [sys.executable, "-m", "accelmon", *args]


def on_fixtures(root: Path, *running: str) -> list[str]:
    """Flags that make a run of the exporter independent of the machine it runs on: the host's filesystems at
    fixture trees under `root` (empty unless a test fills them, or given by a later --path.* flag, which wins), the
    collectors `running` left at `auto` (as a user leaves them: on a host like the fixtures, they run) and every other
    one off (a collector's `auto` reads more of the host than its paths: a DCGM install, a state directory)."""
    from accelmon.collectors import collectors

    for tree in ("sys", "proc", "dev"):
        (root / tree).mkdir(parents=True, exist_ok=True)
    paths = [f"--path.sysfs={root / 'sys'}", f"--path.procfs={root / 'proc'}", f"--path.devfs={root / 'dev'}"]
    # The health collector's files too (the drills in force, the repair journal): none, unless the test adds them.
    settings = root / "accelmon.yml"
    health = {"drill_dir": str(root / "drills"), "remediation_journal": str(root / "remediation.jsonl")}
    settings.write_text(json.dumps({"collectors": {"health": health}}))
    paths.append(f"--config={settings}")
    unknown = set(running) - set(collectors())
    assert not unknown, f"no such collector: {unknown}"
    chosen = [f"--no-collector.{name}" for name in collectors() if name not in running]
    return [*paths, *chosen]


def run_once(args: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `accelmon-exporter --once` as a user would, in a fresh process."""
    return subprocess.run(exporter_command("--once", *args), env=env, capture_output=True, text=True, timeout=60)


def start_exporter(args: Sequence[str], env: dict[str, str], **popen: object) -> subprocess.Popen[bytes]:
    """accelmon-exporter in its own process; the caller stops it (see `stop`)."""
    return subprocess.Popen(exporter_command(*args), env=env, **popen)  # type: ignore[call-overload]


def wait_until_serving(port: int, timeout: float = 30.0, path: str = "/metrics") -> None:
    """Until a server started in another process answers `path` on the loopback port (bounded by `timeout`)."""

    def answers() -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).read()
            return True
        except OSError:
            return False

    wait_until(answers, timeout=timeout, every=0.2, what=f"an answer on 127.0.0.1:{port}{path}")


def stop(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Terminate, then kill if it does not leave within `timeout`."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)


def start_node_exporter(binary: str, web_config: Path) -> tuple[subprocess.Popen, int]:
    """A real node_exporter serving one cheap collector on a free loopback port with `web_config` (TLS, basic auth):
    the process, to stop, and its port."""
    port = free_port()
    process = subprocess.Popen(
        [binary, "--collector.disable-defaults", "--collector.loadavg", f"--web.listen-address=127.0.0.1:{port}",
         f"--web.config.file={web_config}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return process, port
