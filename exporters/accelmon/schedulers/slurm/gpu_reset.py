"""The GPU reset itself, for the repair loop (accelmon.schedulers.slurm.repair): the processes that hold the GPUs
stopped and waited for, the reset command run (once for every GPU where it takes them all), the services started again.

The driver refuses a reset while any process holds a GPU (nvidia-smi(1), `-r`): the units configured as holders are
stopped, then whoever still has a GPU's device file open is found (accelmon.host.gpu_holders) and, where it is root's
process in a system service that may be stopped (never Slurm's daemons, sshd, systemd's own or the health check's
unit) and systemd confirms that the unit holds its cgroup, stopped too; anything else (a job's process, a user's,
this one) is named instead, and no reset is run. Every unit name reaches systemctl after `--`: never as an option.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import time

from accelmon.health import reset_scope
from accelmon.health.remediation import FailingGpu
from accelmon.host import gpu_holders
from accelmon.schedulers.slurm.fleet import Fleet

log = logging.getLogger("accelmon.slurm")

RESET_TIMEOUT_SECONDS = 120  # nvidia-smi --gpu-reset takes seconds; a GPU that hangs it is not reset
HOLDERS_EXIT_SECONDS = 10.0  # how long the units stopped before a reset have to let the GPU go


class GpuReset:
    def __init__(self, fleet: Fleet, command: str, procfs: str) -> None:
        self.fleet = fleet  # its call (systemctl) and sleep, which tests replace
        self.command = command  # gpu_reset_command
        self.procfs = procfs

    def stop_holders(self, units: tuple[str, ...]) -> list[str]:
        """Stops those of `units` that run; the ones stopped (to start again)."""
        stopped = []
        for unit in units:
            active = self.fleet.call(["systemctl", "is-active", "--quiet", "--", unit])
            if active.returncode != 0:
                continue
            result = self.fleet.call(["systemctl", "stop", "--", unit])
            if result.returncode != 0:
                log.error("could not stop %s before the reset: %s", unit, (result.stderr or result.stdout).strip())
            stopped.append(unit)
        return stopped

    def start_holders(self, stopped: list[str]) -> None:
        for unit in stopped:
            result = self.fleet.call(["systemctl", "start", "--", unit])
            if result.returncode != 0:
                log.error(
                    "could not start %s again after the reset: %s", unit, (result.stderr or result.stdout).strip()
                )

    def let_go(self, gpus: tuple[FailingGpu, ...], stopped: list[str]) -> str:
        """Makes every process let the GPUs go before their reset: the services found holding their device files that
        may be stopped (stoppable) are stopped too (added to `stopped`, started again after), then waited for.
        Whatever still holds one, in words ("" when none, or when the driver does not list the GPUs: the reset is
        tried and says)."""
        devices = set(gpu_holders.device_files(self.procfs, [gpu.pci_bus_id for gpu in gpus]).values())
        if not devices:
            return ""
        found = gpu_holders.holders(self.procfs, devices)
        stopped.extend(self.stop_holders(self.stoppable(found, stopped)))
        deadline = time.monotonic() + HOLDERS_EXIT_SECONDS
        while found and time.monotonic() < deadline:
            self.fleet.sleep(0.5)
            found = gpu_holders.holders(self.procfs, devices)
        if found:
            log.error("GPU %s still held before its reset: %s", ", ".join(g.index for g in gpus),
                      ", ".join(holder.words() for holder in found))  # fmt: skip
        return ", ".join(holder.words() for holder in found)

    def stoppable(self, found: list[gpu_holders.Holder], stopped: list[str]) -> tuple[str, ...]:
        """The units of `found` to stop (those not in `stopped` already): every one of its holders root's process in
        a unit that may be stopped (gpu_holders.not_stopped), and systemd confirming that the unit holds each one's
        cgroup. Any other holder is left running (the reset waits, then names it), the reason logged."""
        own = gpu_holders.own_unit(self.procfs)
        units: dict[str, str] = {}  # unit: why not stopped, "" when it is
        groups: dict[str, str] = {}  # unit: its ControlGroup as systemd gives it
        for holder in found:
            if holder.unit in stopped:
                continue
            why = gpu_holders.not_stopped(holder, own)
            if not why and holder.unit not in groups:
                groups[holder.unit] = self.control_group(holder.unit)
            if not why and not confirmed(holder, groups[holder.unit]):
                why = f"systemd does not confirm that {holder.unit} holds {holder.cgroup}"
            if why:
                log.warning("pid %d (%s) holds a GPU to reset and is not stopped: %s", holder.pid, holder.command, why)
            if holder.unit:
                units[holder.unit] = units.get(holder.unit) or why
        return tuple(sorted(unit for unit, why in units.items() if not why))

    def control_group(self, unit: str) -> str:
        """The cgroup systemd runs `unit` in, "" when it runs none or systemctl does not answer."""
        result = self.fleet.call(["systemctl", "show", "--property=ControlGroup", "--value", "--", unit])
        return result.stdout.strip() if result.returncode == 0 else ""

    def run(self, gpus: tuple[FailingGpu, ...]) -> list[str]:
        """The reset command: once for every GPU where it takes them all ({pci_bus_ids}: GPUs linked by NVLink must
        go in one command where the platform resets them together), else once a GPU; what failed, in words."""
        template = self.command
        if reset_scope.MANY in template:
            buses = ",".join(gpu.pci_bus_id for gpu in gpus)
            commands = [(", ".join(gpu.index for gpu in gpus), template.replace(reset_scope.MANY, buses))]
        else:
            commands = [(gpu.index, template.format(pci_bus_id=gpu.pci_bus_id, uuid=gpu.uuid)) for gpu in gpus]
        failed = []
        for indices, command in commands:
            try:
                result = subprocess.run(
                    shlex.split(command), capture_output=True, text=True, timeout=RESET_TIMEOUT_SECONDS
                )
                if result.returncode != 0:
                    failed.append(f"GPU {indices} reset: {(result.stderr or result.stdout).strip()[-120:]}")
            except (OSError, subprocess.TimeoutExpired) as error:
                failed.append(f"GPU {indices} reset: {error}")
        return failed


def confirmed(holder: gpu_holders.Holder, group: str) -> bool:
    """Whether systemd places the holder's unit where /proc puts the holder: the unit's ControlGroup (`group`) is
    ROOT/system.slice/UNIT, ROOT systemd's own root ("" on a host; a container's cgroup where systemd runs in a
    container that sees the host's tree: podman on cgroup v1 gives /libpod_parent/libpod-ID), and the holder's cgroup
    is it or one below it. A unit that does not run, or a systemctl that does not answer (""), confirms nothing."""
    root, found, rest = group.rpartition(f"/system.slice/{holder.unit}")
    if not found or rest or not gpu_holders.systemd_root(root):
        return False
    return holder.cgroup == group or holder.cgroup.startswith(group + "/")
