"""The collectors of accelmon-exporter, one module each, registered here by name."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from accelmon.core import Catalogue, Collector


@dataclass(frozen=True)
class Paths:
    sysfs: str = "/sys"
    procfs: str = "/proc"
    devfs: str = "/dev"


@dataclass(frozen=True)
class Registration:
    """How to build a collector and whether it is on when neither flag nor config says."""

    name: str
    help: str
    build: Callable[[dict[str, Any], Paths], Collector]
    enabled_by_default: Callable[[Paths], bool]
    # Whether the host shows this collector's hardware (a loaded driver, a device class): if so, hardware that
    # does not answer is a fault (accelmon_collector_hardware_expected).
    hardware_present: Callable[[Paths], bool]
    options: dict[str, Any]  # option name -> default value (and so its type)
    catalogue: Callable[[], Catalogue]


def _nvml(options: dict[str, Any], paths: Paths) -> Collector:
    from accelmon.collectors.nvml import NvmlCollector

    return NvmlCollector(
        slow_interval=options["slow_interval_seconds"],
        pcie_interval=options["pcie_interval_seconds"],
        xid_events=options["xid_events"],
    )


def _nvml_catalogue() -> Catalogue:
    from accelmon.collectors.nvml import CATALOGUE

    return CATALOGUE


def _infiniband(options: dict[str, Any], paths: Paths) -> Collector:
    from accelmon.collectors.infiniband import InfinibandCollector

    return InfinibandCollector(sysfs=paths.sysfs)


def _infiniband_catalogue() -> Catalogue:
    from accelmon.collectors.infiniband import CATALOGUE

    return CATALOGUE


def _neuron(options: dict[str, Any], paths: Paths) -> Collector:
    from accelmon.collectors.neuron import NeuronCollector

    return NeuronCollector(monitor=options["monitor_path"], period_seconds=options["period_seconds"])


def _neuron_catalogue() -> Catalogue:
    from accelmon.collectors.neuron import CATALOGUE

    return CATALOGUE


def _has_neuron(paths: Paths) -> bool:
    from accelmon.collectors.neuron import find_monitor

    devices = [name for name in _listdir(paths.devfs) if name.startswith("neuron")]
    return bool(devices) or find_monitor("neuron-monitor") is not None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _profiling(options: dict[str, Any], paths: Paths) -> Collector:
    from accelmon.collectors.profiling import ProfilingCollector

    return ProfilingCollector(
        backend=options["backend"],
        dcgm_host=options["dcgm_host"],
        dcgm_bindings_paths=tuple(p for p in options["dcgm_bindings_path"].split(":") if p),
        interval=options["interval_seconds"],
    )


def _profiling_catalogue() -> Catalogue:
    from accelmon.collectors.profiling import CATALOGUE

    return CATALOGUE


DCGM_BINDINGS = ("/usr/share/datacenter-gpu-manager-4/bindings/python3", "/usr/local/dcgm/bindings/python3")
REGISTRY: dict[str, Registration] = {}


def register(registration: Registration) -> None:
    REGISTRY[registration.name] = registration


register(
    Registration(
        name="nvml",
        help="NVIDIA GPU device counters through NVML (default: on; no driver, no data)",
        build=_nvml,
        # On by default: without an NVIDIA driver it exports nothing and costs nothing.
        enabled_by_default=lambda paths: True,
        # The kernel module is loaded: NVML should answer (a broken library or driver otherwise).
        hardware_present=lambda paths: os.path.exists(os.path.join(paths.procfs, "driver", "nvidia", "version")),
        # Cheap values every second; counters and slow values (energy alone: 4 ms CPU per read on an H100) every
        # 30 s, as dcgm-exporter collects by default; PCIe throughput (0.7 ms CPU per direction) every 30 s.
        options={
            "interval_seconds": 1.0,
            "slow_interval_seconds": 30.0,
            "pcie_interval_seconds": 30.0,
            "xid_events": True,
        },
        catalogue=_nvml_catalogue,
    )
)

register(
    Registration(
        name="infiniband",
        help="InfiniBand, RoCE and OmniPath port counters from sysfs (default: on where class/infiniband exists)",
        build=_infiniband,
        enabled_by_default=lambda paths: os.path.isdir(os.path.join(paths.sysfs, "class", "infiniband")),
        hardware_present=lambda paths: os.path.isdir(os.path.join(paths.sysfs, "class", "infiniband")),
        options={"interval_seconds": 5.0},
        catalogue=_infiniband_catalogue,
    )
)

register(
    Registration(
        name="neuron",
        help="AWS Neuron devices through neuron-monitor, run and supervised by the exporter (default: on where "
        "/dev/neuron* or neuron-monitor exists)",
        build=_neuron,
        enabled_by_default=_has_neuron,
        hardware_present=lambda paths: any(name.startswith("neuron") for name in _listdir(paths.devfs)),
        options={"interval_seconds": 5.0, "period_seconds": 5.0, "monitor_path": "neuron-monitor"},
        catalogue=_neuron_catalogue,
    )
)

register(
    Registration(
        name="profiling",
        help="GPU profiling counters from DCGM or NVML GPM (default: off: profiling has a cost)",
        build=_profiling,
        enabled_by_default=lambda paths: False,
        hardware_present=lambda paths: False,  # no backend is a choice, not a fault: the backend_info says which
        options={
            # One GPM read of one GPU costs ~2.3 ms of CPU on an H100: 5 s keeps it under 0.5 ms per GPU per second.
            "interval_seconds": 5.0,
            "backend": "auto",
            "dcgm_host": "localhost:5555",
            # DCGM 4, then DCGM 3: where the bindings that ship with DCGM live.
            "dcgm_bindings_path": ":".join(DCGM_BINDINGS),
        },
        catalogue=_profiling_catalogue,
    )
)
