"""Whether NVIDIA Fabric Manager runs on this node, read from procfs: for the fabric collector's series and for the
Slurm repair loop, which resets a GPU of an NVSwitch system only with Fabric Manager there to register it again."""

from __future__ import annotations

import os

FABRIC_MANAGER_PROCESS = "nv-fabricmanager"


def fabric_manager_running(procfs: str) -> bool:
    """Whether a process named nv-fabricmanager runs (its comm; the unit's name varies by distribution)."""
    try:
        entries = os.listdir(procfs)
    except OSError:
        return False
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(procfs, entry, "comm"), encoding="utf-8", errors="replace") as comm:
                if comm.read().strip() == FABRIC_MANAGER_PROCESS:
                    return True
        except OSError:
            continue  # the process ended meanwhile
    return False
