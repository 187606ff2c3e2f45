"""Who holds a GPU open: the processes with its device file (`/dev/nvidiaN`, N its minor number) open, found in
`/proc/PID/fd`, each with the systemd unit it runs in (from `/proc/PID/cgroup`).

The NVIDIA driver refuses a GPU reset while any process holds the GPU (`nvidia-smi --gpu-reset`: "the GPU is
currently in use by another process"; nvidia-smi(1), `-r`). A fixed list of units to stop misses who really holds it:
nvidia-persistenced, another exporter, a user's process that outlived its job, and the resetting process itself when
its own scan did not let NVML go. So the repair loop asks this module before a reset, stops the units found, asks
again, and names in the journal whatever still holds the GPU instead of running a reset that cannot succeed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from accelmon.nvidia import driver_gpu_entries

# A unit systemd runs as a service (the cgroup path's last part); a user's session or a Slurm step is a scope, which
# accelmon never stops.
SERVICE = re.compile(r"/([^/]+\.service)(?:/|$)")


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str  # its comm
    unit: str  # the systemd service it runs in, "" when none (a job's step, a session)

    def words(self) -> str:
        where = f", {self.unit}" if self.unit else ""
        itself = ", this process" if self.pid == os.getpid() else ""
        return f"pid {self.pid} ({self.command}{where}{itself})"


def device_files(procfs: str, bus_ids: list[str]) -> dict[str, str]:
    """The device file of each GPU by its PCI bus id (as NVML or the driver prints it, any case), from the driver's
    information file under procfs: {bus id: /dev/nvidiaN}. A GPU the driver does not list is left out."""
    wanted = {same_bus(bus): bus for bus in bus_ids}
    found = {}
    for bus, _, fields in driver_gpu_entries(procfs):
        minor = fields.get("Device Minor", "")
        if minor.isdigit() and same_bus(bus) in wanted:
            found[wanted[same_bus(bus)]] = f"/dev/nvidia{minor}"
    return found


def same_bus(bus_id: str) -> tuple[int, str]:
    """A PCI bus id comparable whatever its domain's width: NVML prints 00000000:18:00.0, the driver 0000:18:00.0."""
    parts = bus_id.lower().split(":")
    if len(parts) == 3 and all(c in "0123456789abcdef" for c in parts[0]) and parts[0]:
        return int(parts[0], 16), f"{parts[1]}:{parts[2]}"
    return 0, ":".join(parts[-2:])


def holders(procfs: str, devices: set[str]) -> list[Holder]:
    """Every process with one of `devices` open, by pid. A process that ends while it is read is skipped; one whose
    descriptors cannot be read (another user's, without the right) cannot be judged and is skipped too: the
    health check runs as root, which reads them all."""
    found = []
    for entry in os.listdir(procfs):
        if not entry.isdigit():
            continue
        directory = os.path.join(procfs, entry)
        try:
            descriptors = os.listdir(os.path.join(directory, "fd"))
        except OSError:
            continue
        opened = set()
        for descriptor in descriptors:
            try:
                opened.add(os.readlink(os.path.join(directory, "fd", descriptor)))
            except OSError:
                continue
        if opened & devices:
            found.append(Holder(int(entry), read(os.path.join(directory, "comm")), unit_of(directory)))
    return sorted(found, key=lambda holder: holder.pid)


def unit_of(directory: str) -> str:
    """The systemd service a process runs in, from its cgroup (v1 or v2), "" when none."""
    for line in read(os.path.join(directory, "cgroup")).splitlines():
        found = SERVICE.search(line.rsplit(":", 1)[-1])
        if found:
            return found.group(1)
    return ""


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            return stream.read().strip()
    except OSError:
        return ""
