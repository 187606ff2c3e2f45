"""The podman connection Molecule's podman driver names (`ansible_connection: podman`), with pipelining.

containers.podman's connection runs each module as files: mount the container, write the module into a temporary
directory, then one `podman exec` to run it and another to remove it. Its `podman exec` has no `-i`, so it cannot
take a module on stdin and declares no pipelining. This one passes `-i` where there is input, so Ansible pipes each
module to the container's Python in one `podman exec`, and mounts the container only when a file is copied: most
tasks cost one podman command instead of three or four (the scenarios' idempotence runs took about 40 % less).
Used by the Molecule scenarios only (their provisioner's env puts this directory first); a user's deploy over SSH
is not concerned.
"""

from __future__ import annotations

from ansible_collections.containers.podman.plugins.connection.podman import Connection as PodmanConnection

DOCUMENTATION = """
name: podman
short_description: Run tasks in a running podman container, modules piped to its Python
description:
  - containers.podman's podman connection with pipelining, for accelmon's Molecule scenarios.
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


class Connection(PodmanConnection):
    has_pipelining = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._mounted = False

    def _connect(self):
        # The parent mounts the container here, for every task: only file transfers need the mount (put_file).
        self._connected = True
        return self

    def _mount(self) -> None:
        if not self._mounted:
            PodmanConnection._connect(self)
            self._mounted = True

    def _podman(self, cmd, cmd_args=None, in_data=None, use_container_id=True):
        if in_data is not None and isinstance(cmd, list) and cmd[:1] == ["exec"]:
            cmd = ["exec", "-i", *cmd[1:]]
        return super()._podman(cmd, cmd_args, in_data, use_container_id)

    def put_file(self, in_path, out_path):
        self._mount()
        super().put_file(in_path, out_path)

    def fetch_file(self, in_path, out_path):
        self._mount()
        super().fetch_file(in_path, out_path)
