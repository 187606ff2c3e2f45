"""The scenarios' verifiers (testinfra, `podman://NAME` hosts) reach the containers through nsenter.

testinfra's podman backend runs each command with `podman exec`: podman's CLI, conmon and runc, about 0.36 s and a
tenth of a CPU-second before the command starts, and the verifiers poll Prometheus, Slurm and the exporters for
minutes. nsenter enters the container's namespaces in 7 ms (root on the host may), with the environment `podman
exec` gives. The container's init PID is asked of podman once per container, checked against the process's start
time before each use. Commands as another user keep testinfra's own `podman exec -u`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from testinfra.backend import base
from testinfra.backend.podman import PodmanBackend

ENVIRONMENT = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "container=podman")
_pids: dict[str, tuple[int, str | None]] = {}


def start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def container_pid(name: str) -> int:
    known = _pids.get(name)
    if known is not None and start_time(known[0]) == known[1]:
        return known[0]
    out = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.Pid}}", name], capture_output=True, text=True, check=False
    ).stdout.strip()
    pid = int(out) if out.isdigit() else 0
    if pid <= 0:
        raise RuntimeError(f"container {name} is not running")
    _pids[name] = (pid, start_time(pid))
    return pid


_podman_run = PodmanBackend.run


def _run(self: PodmanBackend, command: str, *args: str, **kwargs: Any) -> base.CommandResult:
    if self.user is not None:
        return _podman_run(self, command, *args, **kwargs)
    cmd = self.get_command(command, *args)
    enter = "nsenter --target %s --all --root --wd env -i" + " %s" * len(ENVIRONMENT) + " /bin/sh -c %s"
    out = self.run_local(enter, str(container_pid(self.name)), *ENVIRONMENT, cmd)
    out.command = self.encode(cmd)
    return out


PodmanBackend.run = _run  # type: ignore[method-assign]
