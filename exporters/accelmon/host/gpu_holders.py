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

from accelmon.host.nvidia import driver_gpu_entries

# The only services a holder's unit may be: a system service, `/system.slice/NAME.service` (or a cgroup of its own
# below it). A user's session or manager (user.slice, user@UID.service and its app.slice: a user names what it makes
# there), a Slurm step (slurmstepd.scope/job_N/...) or a unit in a nested slice is never accelmon's to stop.
# Below systemd's own root: "" on a host, the container's cgroup where systemd runs in a container that sees the
# host's cgroup tree (podman on cgroup v1: /libpod_parent/libpod-ID or /machine.slice/libpod-ID.scope). Never below a
# service or a user's slice (a user's delegated subtree lies under user.slice/.../user@UID.service, where the user
# names what it makes, /system.slice included).
SYSTEM_SERVICE = re.compile(r"(?P<root>(?:/[^/]+)*?)/system\.slice/(?P<unit>[^/]+\.service)(?:/.*)?")
# A unit name as systemd accepts it (systemd.unit(5): ASCII letters, digits, ":", "-", "_", ".", "\\", one "@"
# before an instance), at most 255 characters, and never starting with "-": systemctl would read it as an option.
UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\][A-Za-z0-9:_.\\-]*(?:@[A-Za-z0-9:_.\\-]+)?\.service")
# A Slurm job's cgroup in any hierarchy: cgroup v1's slurm/uid_U/job_N (and slurm_NODE/ where several slurmds share a
# host), v2's slurmstepd.scope/job_N. On v1 a job's process is still in slurmd.service in systemd's own hierarchy.
SLURM_JOB = re.compile(r"/slurm[^/]*/(?:.*/)?job_[0-9]+(?:/|$)")
# Services a GPU reset never stops, whatever /proc says holds the GPU: Slurm's daemons and munge (stopping them takes
# the node out of the cluster; on cgroup v1 a job's leftover process still sits in slurmd.service in systemd's
# hierarchy, so slurmd is what /proc names for a job's process), the ways in (sshd; ssh on Debian), the system bus,
# and systemd's own services (systemd-*). Nor the unit the health check itself runs in (own_unit).
NEVER_STOPPED = frozenset(
    {
        "slurmd.service", "slurmctld.service", "slurmdbd.service", "slurmrestd.service", "munge.service",
        "sshd.service", "ssh.service", "dbus.service", "dbus-broker.service",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str  # its comm
    unit: str  # the system service it runs in (SYSTEM_SERVICE), "" when none (a job's step, a session, a user's)
    cgroup: str = ""  # its cgroup path in systemd's hierarchy (v2's unified one, v1's name=systemd)
    job: bool = False  # in a Slurm job's cgroup in some hierarchy: named, never stopped

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
            groups = cgroups(read(os.path.join(directory, "cgroup")))
            path = systemd_cgroup(groups)
            job = any(SLURM_JOB.search(group) for group in groups.values())
            command = read(os.path.join(directory, "comm"))
            found.append(Holder(int(entry), command, service(path), path, job))
    return sorted(found, key=lambda holder: holder.pid)


def cgroups(text: str) -> dict[str, str]:
    """/proc/PID/cgroup (cgroups(7)) by hierarchy: {controllers: path}, "" the key of v2's unified line ("0::PATH").
    Each line is ID:CONTROLLERS:PATH split at its first two colons: a path may hold colons (a user's manager makes
    cgroups of any name); a line of another form is left out."""
    found = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[2].startswith("/"):
            found[parts[1]] = parts[2]
    return found


def systemd_cgroup(groups: dict[str, str]) -> str:
    """The cgroup path systemd places a process by (what `systemctl show -p ControlGroup` gives its unit): on cgroup
    v1 (and hybrid) its named hierarchy, `name=systemd`; on v2 the unified one. "" when neither."""
    for controllers, path in groups.items():
        if "name=systemd" in controllers.split(","):
            return path
    return groups.get("", "")


def service(path: str) -> str:
    """The system service of a cgroup path (SYSTEM_SERVICE, its name valid: UNIT_NAME), "" when none."""
    found = SYSTEM_SERVICE.fullmatch(path)
    if found is None or not systemd_root(found.group("root")):
        return ""
    unit = found.group("unit")
    return unit if len(unit) <= 255 and UNIT_NAME.fullmatch(unit) else ""


def systemd_root(prefix: str) -> bool:
    """Whether a cgroup path's part above /system.slice can be systemd's root: none of its components a service or a
    user's slice."""
    return not any(".service" in part or ":" in part or part.startswith("user") for part in prefix.split("/") if part)


def unit_of(directory: str) -> str:
    """The system service a process runs in (`directory` its /proc/PID), "" when none."""
    return service(systemd_cgroup(cgroups(read(os.path.join(directory, "cgroup")))))


def own_unit(procfs: str) -> str:
    """The system service this process (the health check) runs in, read as a holder's is."""
    return unit_of(os.path.join(procfs, "self"))


def not_stopped(holder: Holder, own: str) -> str:
    """Why the unit of a holder is not stopped for a reset, "" when it may be (once systemd confirms that the unit
    holds this process's cgroup: accelmon.schedulers.slurm.gpu_reset). `own`: the unit the health check runs in."""
    if holder.job:
        return "a Slurm job's process"
    if not holder.unit:
        return "in no system service"
    if holder.unit in NEVER_STOPPED or holder.unit.startswith("systemd-"):
        return f"{holder.unit} is never stopped"
    if holder.unit == own:
        return "the health check's own unit"
    # Whatever user its process runs as (nvidia-persistenced runs as its own user in NVIDIA's unit): a unit under
    # /system.slice is the system manager's, which only root configures; a user's own units live under user.slice.
    return ""


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            return stream.read().strip()
    except OSError:
        return ""
