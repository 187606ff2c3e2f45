"""What the repair loop must see before it acts on a node (accelmon.schedulers.slurm.repair; docs/health.md, "The
invariants"): what fails in a scan, whether a node's reason is still the one accelmon wrote, and whether a scan after a
repair can vouch for the node (the same GPUs, answering, every collector sampled). A check over data that was never read
passes nothing.
"""

from __future__ import annotations

import re
from typing import Optional

from accelmon import health
from accelmon.health.remediation import FailingGpu
from accelmon.host import gpu_holders
from accelmon.host.slurm_nodes import BUSY, DRAINED, OUT_SINCE, SlurmNode
from accelmon.schedulers.slurm.fleet import gres_names

REBOOT_PENDING = "accelmon: reboot pending"  # the reason through a reboot (Slurm appends ": reboot issued")


def failing_gpus(node: health.NodeHealth) -> list[FailingGpu]:
    return [
        FailingGpu(
            gpu.index,
            gpu.uuid,
            gpu.serial,
            gpu.action,
            tuple(c.name for c in gpu.checks if c.verdict == "failure"),
            any(c.drill for c in gpu.checks if c.verdict == "failure"),
            gpu.pci_bus_id,
        )
        for gpu in node.gpus
        if gpu.verdict == "failure"
    ]


def still_failing(node: health.NodeHealth) -> str:
    """What fails in a scan, for a reason: "GPU 3 ecc, GPU 5 xid" (the GPUs whose checks failed), or ""."""
    named = [f"GPU {g.index} {'+'.join(c.name for c in g.checks if c.verdict == 'failure')}"
             for g in node.gpus if g.verdict == "failure"]  # fmt: skip
    named += [c.name for c in node.checks if c.verdict == "failure"]
    return ", ".join(named)


def joining_fabric(node: health.NodeHealth) -> str:
    """The GPUs whose NVLink fabric registration is still in progress ("GPU 2, GPU 5"), or "": a warning that is no
    pass: until it completes, CUDA programs on the GPU fail to start (accelmon.collectors.fabric)."""
    return ", ".join(
        f"GPU {gpu.index}" for gpu in node.gpus
        if any(c.name == "fabric" and c.verdict == "warning" and "in progress" in c.detail for c in gpu.checks)
    )  # fmt: skip


# What Slurm appends to the reason accelmon gave its reboot (docs/slurm.md): the reason is still accelmon's.
SLURM_SUFFIX = re.compile(r"(\s*:\s*reboot (issued|timed out|complete))+\s*$")


# The reasons of accelmon's own repair claims (accelmon.schedulers.slurm.repair: reboot and reset), without their key.
REPAIR_CLAIM = re.compile(
    r"accelmon: (reboot pending: reboot_node for GPU [0-9, ]+|resetting GPU [0-9, ]+ \(reset_gpu\))"
)


def reason_body(reason: str) -> str:
    """A reason without accelmon's "(out since ...)" key and Slurm's reboot suffixes, its spaces normalised."""
    return " ".join(SLURM_SUFFIX.sub("", OUT_SINCE.sub("", reason)).split())


def same_reason(shown: str, written: str) -> bool:
    """Whether Slurm's reason `shown` is the reason accelmon `written`, its "(out since ...)" key and Slurm's reboot
    suffixes aside."""
    return reason_body(shown) == reason_body(written)


def repair_claim(reason: str) -> bool:
    """Whether `reason` is one of accelmon's repair claims, in its own words."""
    return REPAIR_CLAIM.fullmatch(reason_body(reason)) is not None


def inventory_of(node: health.NodeHealth) -> tuple[tuple[str, str], ...]:
    """The node's GPUs as (PCI bus id, UUID): what must be there again after a repair."""
    return tuple(sorted((gpu.pci_bus_id, gpu.uuid) for gpu in node.gpus))


def gres_gpus(gres: str) -> Optional[int]:
    """How many GPUs Slurm's Gres= gives the node (`gpu:h100:8(S:0-1)` -> 8), None where it says no count."""
    counts = []
    for part in gres_names(gres):
        fields = part.split("(")[0].split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            counts.append(int(fields[-1]))
    return sum(counts) if counts else None


def not_back(before: tuple[tuple[str, str], ...], after: health.NodeHealth, expected: Optional[int]) -> str:
    """Why a scan after a repair cannot vouch for the node, "" when it can: every collector expected here sampled,
    every GPU answers its driver library, the GPUs it had before the repair are there with the same UUIDs, and as
    many as Slurm's gres says. A check over data that was never read passes nothing (docs/health.md)."""
    problems = []
    if after.unsampled:
        problems.append(f"{', '.join(after.unsampled)} did not sample")
    if not after.gpus:
        problems.append("no GPU found (no driver loaded?)")
    silent = [gpu.index for gpu in after.gpus if not gpu.answers]
    if silent:
        problems.append(f"GPU {', '.join(silent)} not answering its driver library")
    by_bus = {gpu_holders.same_bus(gpu.pci_bus_id): gpu.uuid for gpu in after.gpus if gpu.pci_bus_id}
    uuids = {gpu.uuid for gpu in after.gpus}
    gone = [
        bus or uuid for bus, uuid in before
        if (bus and gpu_holders.same_bus(bus) not in by_bus) or (not bus and uuid and uuid not in uuids)
    ]  # fmt: skip
    if gone:
        problems.append(f"{', '.join(gone)} missing")
    changed = [bus for bus, uuid in before if bus and uuid and by_bus.get(gpu_holders.same_bus(bus), uuid) != uuid]
    if changed:
        problems.append(f"another GPU at {', '.join(changed)}")
    if expected is not None and len(after.gpus) < expected:
        problems.append(f"{len(after.gpus)} GPU(s) found, Slurm's gres has {expected}")
    return "; ".join(problems)


def back_from_reboot(state: SlurmNode) -> bool:
    """accelmon's reboot (its reason), no longer in Slurm's reboot states."""
    return state.reason.startswith(REBOOT_PENDING) and not state.reboot_pending


def reboot_timed_out(state: SlurmNode) -> bool:
    """accelmon's reboot, which Slurm gave up waiting for (ResumeTimeout): out of its reboot states, not drained."""
    return back_from_reboot(state) and not state.flags & DRAINED


def held_after_reboot(state: SlurmNode) -> bool:
    """accelmon's reboot timed out and the node drained again: DOWN+DRAIN until it registers (or for good where
    ReturnToService is 0 or 1); the repair loop judges it as after any reboot (a resume makes it IDLE)."""
    flags = state.flags
    return back_from_reboot(state) and bool(flags & DRAINED) and "DOWN" in flags and not flags & BUSY
