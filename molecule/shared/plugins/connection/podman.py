"""The podman connection Molecule's podman driver names (`ansible_connection: podman`), run through nsenter.

containers.podman's connection runs each module as files: mount the container, write the module into a temporary
directory, then one `podman exec` to run it and another to remove it. Each `podman exec` is podman's CLI, conmon and
runc: about 0.36 s and 0.1-0.2 s of CPU before the module starts (measured on our 2-core machine). This one enters
the container's namespaces with nsenter instead (7 ms), as root on the host may: each module is piped to the
container's Python (pipelining) in one process, with the environment `podman exec` gives (PATH, HOME,
container=podman), and files are copied in and out through the same entry. The container's init PID is asked of
podman once per container and kept in a small file, checked against the process's start time before each use.
Used by the Molecule scenarios only (their provisioner's env puts this directory first); a user's deploy over SSH
is not concerned. A remote user other than root falls back to containers.podman's `podman exec`.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

from ansible.errors import AnsibleConnectionFailure
from ansible.module_utils.common.text.converters import to_bytes, to_native
from ansible.plugins.connection import ConnectionBase
from ansible_collections.containers.podman.plugins.connection.podman import Connection as PodmanConnection

DOCUMENTATION = """
name: podman
short_description: Run tasks in a running podman container through nsenter, modules piped to its Python
description:
  - containers.podman's podman connection entering the container with nsenter, for accelmon's Molecule scenarios.
options:
  remote_addr:
    description: The container's name or ID.
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
      - name: ansible_podman_host
  remote_user:
    description: The user in the container (its default user when unset).
    vars:
      - name: ansible_user
  podman_executable:
    description: The podman command.
    default: podman
    vars:
      - name: ansible_podman_executable
  podman_extra_args:
    description: Arguments given to podman before its subcommand.
    default: ""
    vars:
      - name: ansible_podman_extra_args
"""

# What `podman exec` sets in a Debian image without ENV of its own.
ENVIRONMENT = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "container=podman"]
PIDS = Path(tempfile.gettempdir()) / "accelmon-molecule-pids"


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): a PID reused is told apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


class Connection(PodmanConnection):
    has_pipelining = True

    def _connect(self):
        # The parent mounts the container here, for every task: nothing here needs the mount.
        self._connected = True
        return self

    def _as_root(self) -> bool:
        return not self.user or self.user == "root"

    def _pid(self) -> int:
        """The container's init process as the host sees it."""
        PIDS.mkdir(mode=0o700, exist_ok=True)
        cached = PIDS / f"{self._container_id}.json"
        try:
            known = json.loads(cached.read_text())
            if start_time(known["pid"]) == known["start"]:
                return int(known["pid"])
        except (OSError, ValueError, KeyError):
            pass
        rc, out, err = self._podman(["inspect", "--format", "{{.State.Pid}}"])
        pid = int(out.strip() or 0) if rc == 0 and out.strip().isdigit() else 0
        if pid <= 0:
            raise AnsibleConnectionFailure(f"container {self._container_id} is not running: {to_native(err)}")
        temporary = cached.with_suffix(f".{os.getpid()}")
        temporary.write_text(json.dumps({"pid": pid, "start": start_time(pid)}))
        temporary.replace(cached)
        return pid

    def _podman(self, cmd, cmd_args=None, in_data=None, use_container_id=True):
        if in_data is not None and isinstance(cmd, list) and cmd[:1] == ["exec"]:
            cmd = ["exec", "-i", *cmd[1:]]
        return super()._podman(cmd, cmd_args, in_data, use_container_id)

    def _enter(self, argv: list[str], in_data: bytes | None = None) -> tuple[int, bytes, bytes]:
        """argv run in the container, as `podman exec` would run it (root, its init's namespaces, root and cwd)."""
        command = ["nsenter", "--target", str(self._pid()), "--all", "--root", "--wd", "env", "-i", *ENVIRONMENT]
        process = subprocess.run(
            [to_bytes(a, errors="surrogate_or_strict") for a in command + argv],
            input=in_data,
            capture_output=True,
        )
        return process.returncode, process.stdout, process.stderr

    def exec_command(self, cmd, in_data=None, sudoable=False):
        if not self._as_root():
            return super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        return self._enter(shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data)

    def put_file(self, in_path, out_path):
        if not self._as_root():
            PodmanConnection._connect(self)
            return super().put_file(in_path, out_path)
        ConnectionBase.put_file(self, in_path, out_path)
        with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as source:
            data = source.read()
        rc, _, err = self._enter(["/bin/sh", "-c", 'cat > "$1"', "sh", out_path], data)
        if rc != 0:
            raise AnsibleConnectionFailure(f"could not write {out_path} in {self._container_id}: {to_native(err)}")

    def fetch_file(self, in_path, out_path):
        if not self._as_root():
            PodmanConnection._connect(self)
            return super().fetch_file(in_path, out_path)
        ConnectionBase.fetch_file(self, in_path, out_path)
        rc, data, err = self._enter(["cat", in_path])
        if rc != 0:
            raise AnsibleConnectionFailure(f"could not read {in_path} in {self._container_id}: {to_native(err)}")
        with open(to_bytes(out_path, errors="surrogate_or_strict"), "wb") as target:
            target.write(data)
