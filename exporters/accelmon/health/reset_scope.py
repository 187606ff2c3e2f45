"""Which GPUs one GPU reset must take, or why a reboot must do instead (docs/health.md, "Which GPUs a reset takes").

What the driver allows, from nvidia-smi(1), `-r, --gpu-reset` (the R550 manual):
- Starting with the Ampere architecture, a GPU with NVLink connections can be reset on its own. On Ampere NVSwitch
  systems that needs the Fabric Manager running; on Hopper and later NVSwitch systems it does not.
- Where the Fabric Manager is not running, or a GPU being reset is older than Ampere, every GPU with an NVLink
  connection to a GPU being reset must be reset in the same command; nvidia-smi refuses otherwise, naming the GPUs
  missing. Through an NVSwitch, that is every GPU on the switches.
- A reset needs no process on the GPUs it resets, and MIG's GPU and compute instances do not survive it.

So the repair loop resets the failing GPUs with every GPU linked to them where the platform needs it, in one
command, and reboots instead where a reset cannot be right: a GPU in MIG mode (its instances are lost: a reboot
goes through the site's boot, which recreates them, as nvidia-mig-manager does, and Slurm then checks the GPUs it
finds against its gres), a linked GPU that does not answer (it cannot be named in the command), or a
`gpu_reset_command` that resets one GPU at a time while several must go together.

The wiring comes from the scan (the fabric collector's `accelmon_gpu_nvlink_remote_info`), the architecture from
the CUDA compute capability (Ampere 8.x, Hopper 9.x), the Fabric Manager from the process list.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelmon.health import GpuHealth, NodeHealth
from accelmon.host.gpu_holders import same_bus

AMPERE, HOPPER = 8, 9  # CUDA compute capability majors
MANY = "{pci_bus_ids}"  # the reset command's placeholder for every GPU of one reset, comma separated


@dataclass(frozen=True)
class Scope:
    gpus: tuple[GpuHealth, ...] = ()  # what one reset takes: the failing GPUs, then the linked ones it must take
    together: bool = False  # the platform resets these GPUs in one command only
    reboot: str = ""  # why a reboot must do instead, "" when a reset can


def major(gpu: GpuHealth) -> int:
    """The compute capability's major number; 0 where the scan did not say (then treated as the oldest: the reset
    takes every linked GPU, which is never wrong, only wider)."""
    head = gpu.compute_capability.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def resets_alone(gpu: GpuHealth, fabric_manager: bool) -> bool:
    """Whether the driver resets this GPU without the GPUs linked to it."""
    if not gpu.nvlink_remotes:
        return True
    return major(gpu) >= HOPPER or (major(gpu) >= AMPERE and fabric_manager)


def of(node: NodeHealth, failing_bus_ids: list[str], fabric_manager: bool, reset_command: str) -> Scope:
    """The reset of the GPUs at `failing_bus_ids` (as the scan names them): which GPUs it takes, or why a reboot."""
    by_bus = {same_bus(gpu.pci_bus_id): gpu for gpu in node.gpus if gpu.pci_bus_id}
    taken = [by_bus[same_bus(bus)] for bus in failing_bus_ids if same_bus(bus) in by_bus]
    if len(taken) < len(failing_bus_ids):
        return Scope(reboot="a failing GPU has no PCI bus id in the scan: it cannot be named in a reset")
    on_switches = [gpu for gpu in node.gpus if any(kind == "switch" for kind, _ in gpu.nvlink_remotes)]
    together = False
    grown = True
    while grown:  # the GPUs a reset takes are "GPUs being reset" in turn: their own links count too
        grown = False
        if all(resets_alone(gpu, fabric_manager) for gpu in taken):
            break
        together = True
        for gpu in list(taken):
            for kind, bus in gpu.nvlink_remotes:
                if kind == "gpu" and same_bus(bus) not in by_bus:
                    return Scope(tuple(taken), True, f"GPU {gpu.index}'s NVLink peer {bus} is not in the scan")
                linked = [by_bus[same_bus(bus)]] if kind == "gpu" else on_switches if kind == "switch" else []
                for peer in linked:
                    if peer not in taken:
                        taken.append(peer)
                        grown = True
    named = ", ".join(gpu.index for gpu in taken)
    in_mig = [gpu.index for gpu in taken if gpu.mig_mode]
    if in_mig:
        return Scope(tuple(taken), together, f"GPU {', '.join(in_mig)} in MIG mode: a reset loses its instances")
    if together and len(taken) > 1 and MANY not in reset_command:
        return Scope(
            tuple(taken), True, f"GPU {named} must be reset together and gpu_reset_command takes one GPU ({MANY})"
        )
    return Scope(tuple(taken), together)
