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
    options: dict[str, Any]  # option name -> default value (and so its type)
    catalogue: Callable[[], Catalogue]


def _nvml(options: dict[str, Any], paths: Paths) -> Collector:
    from accelmon.collectors.nvml import NvmlCollector

    return NvmlCollector(pcie_interval=options["pcie_interval_seconds"], xid_events=options["xid_events"])


def _nvml_catalogue() -> Catalogue:
    from accelmon.collectors.nvml import CATALOGUE

    return CATALOGUE


REGISTRY: dict[str, Registration] = {}


def register(registration: Registration) -> None:
    REGISTRY[registration.name] = registration


register(
    Registration(
        name="nvml",
        help="NVIDIA GPU device counters through NVML",
        build=_nvml,
        # On by default: without an NVIDIA driver it exports nothing and costs nothing.
        enabled_by_default=lambda paths: True,
        options={"interval_seconds": 1.0, "pcie_interval_seconds": 10.0, "xid_events": True},
        catalogue=_nvml_catalogue,
    )
)


def exists(path: str) -> bool:
    return os.path.exists(path)
