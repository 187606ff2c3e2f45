"""PCIe ACS on the bridges NCCL's traffic crosses, as the Slurm or OAR health check's root pass left it
(accelmon.host.pcie_acs: the exporter cannot read a bridge's extended configuration space itself).

Example exposition line::

    accelmon_gpu_pcie_p2p_bridge_info{bridge="0000:02:00.0",gpu="0",peer_gpu="1",uuid="GPU-..."} 1

Serves each bridge's P2P redirect, the bridges on each GPU's path to the NICs NCCL uses for it (a PXN GPU: its
NVLink peer's path), and the bridges between two GPUs NVLink does not join that NCCL joins by PCIe P2P; or, where
the state is missing, stale, untrusted or malformed, that ACS is not checked and why. The master's
`accelmon:gpu_path_fault` makes `pcie_path`/`acs_redirect` of a redirecting bridge on either (docs/jobs.md).
"""

from __future__ import annotations

import os
import time
from typing import Callable

from accelmon.exporter.metrics import Catalogue, Samples
from accelmon.exporter.registry import Registration, register, seconds
from accelmon.exporter.runtime import Collector
from accelmon.exporter.validation import MIN_SECONDS, Option
from accelmon.host import pcie_acs

STATE_FILE = Option(
    "pcie_acs_state",
    pcie_acs.STATE_PATH,
    "where the Slurm or OAR health check (root) leaves the ACS control of the PCIe bridges on each GPU's NCCL paths "
    "(to its NICs, to GPUs it reaches by PCIe P2P); served only if root's and writable by nobody else",
    shared=True,  # the infiniband collector, which served it before, still accepts it
)
MAX_AGE = Option(
    "pcie_acs_max_age_seconds",
    3600.0,
    "an ACS state older than this is not served (ACS then reads as not checked)",
    minimum=MIN_SECONDS,
    shared=True,
)
CATALOGUE = Catalogue(
    "pcie_acs",
    "PCIe ACS on NCCL's paths (the health check's root pass)",
    "Source: the state file the Slurm or OAR health check (root) writes after its scan (accelmon.host.pcie_acs): "
    "each bridge's ACS Control register from its configuration space, and the bridges on each GPU's NCCL paths. "
    "Served where the NVIDIA driver lists GPUs.",
)
C = CATALOGUE
STATE_READ = "when the root pass's state file changes (each health check, every few minutes)"
CHECKED = C.gauge(
    "accelmon_pcie_acs_checked",
    "1 if the ACS state the health check (root) left was read (reason read); 0 if not checked: missing, stale, "
    "untrusted (not root's, or writable by others) or malformed. Served where the node has GPUs.",
    ["reason"],
)
REFUSED = C.counter("accelmon_pcie_acs_state_refused_total", "ACS state files refused: untrusted or malformed.", [])
SKIPPED = C.gauge("accelmon_pcie_acs_state_entries_skipped", "Entries of the ACS state refused (bad names).", [])
AGE = C.gauge("accelmon_pcie_acs_state_age_seconds", "Seconds since the health check read the bridges.", [])
REDIRECT = C.gauge(
    "accelmon_pcie_acs_redirect",
    "1 if ACS P2P Request or Completion Redirect is on at this PCIe bridge (peer-to-peer traffic sent up to the root "
    "complex), 0 if off or no ACS; not served for a bridge that could not be read (accelmon_pcie_acs_unknown).",
    ["bridge"],
    read=STATE_READ,
)
UNKNOWN = C.gauge(
    "accelmon_pcie_acs_unknown",
    "1 if the health check could not read this bridge's ACS control, else 0.",
    ["bridge"],
    read=STATE_READ,
)
GPU_PATH_BRIDGE = C.gauge(
    "accelmon_gpu_pcie_path_bridge_info",
    "A PCIe bridge on the path between a GPU and an RDMA device NCCL uses for it (a GPU that reaches the device "
    "through an NVLink peer, PXN: the peer's path); value 1.",
    ["gpu", "uuid", "device", "bridge"],
    read=STATE_READ,
)
GPU_P2P_BRIDGE = C.gauge(
    "accelmon_gpu_pcie_p2p_bridge_info",
    "A PCIe bridge between a GPU and a peer GPU that NCCL joins to it by PCIe P2P (no NVLink between them, their "
    "path within NCCL_P2P_LEVEL: PXB by default); value 1.",
    ["gpu", "uuid", "peer_gpu", "bridge"],
    read=STATE_READ,
)


class PcieAcsCollector(Collector):
    name = "pcie_acs"

    def __init__(
        self, procfs: str = "/proc", state: str = pcie_acs.STATE_PATH, max_age: float = 3600.0, owner: int = 0,
        wall: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.procfs, self._wall = procfs, wall
        self.acs = pcie_acs.StateReader(state, max_age, owner)

    def sample(self) -> Samples:
        """The root pass's ACS state, or why ACS is not checked: a bridge it could not read is unknown, never 0.
        Nothing where the driver lists no GPU (no NCCL path to judge)."""
        out = Samples()
        if not _gpus_listed(self.procfs):
            return out
        now = self._wall()
        state = self.acs.current(now)
        out.add(CHECKED, [state.problem or "read"], 0 if state.problem else 1)
        out.add(REFUSED, [], self.acs.refused)
        if state.problem is None:
            out.add(AGE, [], now - state.written)
            out.add(SKIPPED, [], state.skipped)
            for bridge, control in sorted(state.bridges.items()):
                out.add(UNKNOWN, [bridge], 1 if control is None else 0)
                if control is not None:
                    out.add(REDIRECT, [bridge], 1 if control & pcie_acs.REDIRECT else 0)
            for spec, entries in ((GPU_PATH_BRIDGE, state.paths), (GPU_P2P_BRIDGE, state.p2p)):
                for gpu, uuid, other, bridges in entries:
                    for bridge in bridges:
                        out.add(spec, [gpu, uuid, other, bridge], 1)
        return out


def _gpus_listed(procfs: str) -> bool:
    """Whether the NVIDIA driver lists a GPU (`<procfs>/driver/nvidia/gpus/<bus id>`): only then has NCCL a path."""
    try:
        return bool(os.listdir(os.path.join(procfs, "driver", "nvidia", "gpus")))
    except OSError:
        return False


REGISTRATION = register(
    Registration(
        name="pcie_acs",
        help="PCIe ACS on the bridges of NCCL's paths, from the health check's root pass (default: on where the "
        "NVIDIA driver lists GPUs)",
        build=lambda options, paths: PcieAcsCollector(
            procfs=paths.procfs,
            state=str(options["pcie_acs_state"]),
            max_age=float(options["pcie_acs_max_age_seconds"]),
        ),
        catalogue=CATALOGUE,
        options=(
            seconds("interval_seconds", 30, "how often the state file is looked at (read again only when it changed)"),
            STATE_FILE,
            MAX_AGE,
        ),
        enabled_by_default=lambda paths, options: _gpus_listed(paths.procfs),
    )
)
