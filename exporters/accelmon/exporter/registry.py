"""What a collector declares about itself, and the registry the collectors register in (`accelmon.collectors`
lists them).

A collector module owns everything it knows: its typed options (defaults, choices, bounds, help), how to detect
its hardware, the device nodes it needs, its metric catalogue, its help text and its health checks. It declares
them in one `Registration` and calls `register`. The command line, the config validation, the catalogue, the
health checks, `--scan` and the Ansible role (through `--check-config --json`) all read that declaration; adding a
collector, or a check, is adding to its module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from accelmon.exporter.checks import Drill, GpuCheck, NodeCheck
from accelmon.exporter.metrics import Catalogue, MetricSpec
from accelmon.exporter.runtime import Collector
from accelmon.exporter.validation import MIN_SECONDS, ConfigError, Option, OptionValue, finite, seconds

__all__ = ["MIN_SECONDS", "ConfigError", "Option", "OptionValue", "Paths", "Registration", "finite", "seconds"]


@dataclass(frozen=True)
class Paths:
    """Where the host's filesystems are mounted; tests point them at fixture trees."""

    sysfs: str = "/sys"
    procfs: str = "/proc"
    devfs: str = "/dev"
    kmsg: str = "/dev/kmsg"  # the kernel log; a file in its format for tests


def never(paths: Paths, options: dict[str, Any]) -> bool:
    return False


def markers_present(markers: tuple[str, ...], paths: Paths) -> bool:
    """Whether every one of a collector's `hardware_markers` exists on this host (none declared: False)."""
    return bool(markers) and all(os.path.exists(marker.format(**vars(paths))) for marker in markers)


@dataclass(frozen=True)
class Registration:
    """Everything the exporter, its config, its docs and its Ansible role need to know about one collector."""

    name: str
    help: str  # one line for --help
    build: Callable[[dict[str, Any], Paths], Collector]  # (options with defaults filled in, paths) -> collector
    catalogue: Catalogue
    options: tuple[Option, ...]  # interval_seconds among them
    # Whether the collector runs when the config says `enabled: auto` (the default) on this host.
    enabled_by_default: Callable[[Paths, dict[str, Any]], bool]
    # Whether the host shows this collector's hardware (a loaded driver, a device class): if so, hardware that
    # does not answer is a fault (accelmon_collector_hardware_expected).
    hardware_present: Callable[[Paths, dict[str, Any]], bool] = never
    # Host paths that together show this collector's hardware, as templates of the `Paths` ("{sysfs}/module/amdgpu"):
    # its detection reads them (`markers_present`), and --check-config --json names them resolved, so the Ansible
    # role looks for the same paths on a host before anything is installed there.
    hardware_markers: tuple[str, ...] = ()
    # systemd DeviceAllow= entries the collector needs unless it is disabled (device classes where possible, so a
    # driver installed after the deploy needs no new unit).
    devices: tuple[str, ...] = ()
    # Linux capabilities the collector needs unless it is disabled (the unit grants them, nothing else).
    capabilities: tuple[str, ...] = ()
    # Its judgement (accelmon.health): checks of each GPU and of the node over this collector's series, and the
    # series whose `gpu` labels name GPUs to judge. Served by the health collector, run by --scan and the hooks.
    gpu_checks: tuple[GpuCheck, ...] = ()
    node_checks: tuple[NodeCheck, ...] = ()
    lists_gpus: tuple[MetricSpec, ...] = ()
    # Faults of its checks an operator may rehearse (accelmon-drill): each writes the fault into the samples the
    # check judges, never into the served series.
    drills: tuple[Drill, ...] = ()
    # Whether --scan (and the Slurm and OAR hooks) sample this collector: those whose series some check reads and
    # that answer in one sample (not profiling's window, not neuron-monitor's start).
    scan: bool = False
    defaults: dict[str, OptionValue] = field(init=False)

    def __post_init__(self) -> None:
        names = [option.name for option in self.options]
        if "interval_seconds" not in names:
            raise ValueError(f"collector {self.name}: every collector has an interval_seconds option")
        if len(set(names)) != len(names) or "enabled" in names:
            raise ValueError(f"collector {self.name}: option names must be unique and not 'enabled'")
        object.__setattr__(self, "defaults", {option.name: option.default for option in self.options})

    def may_run(self, enabled: bool | None) -> bool:
        """Whether the collector may run on some host with this setting (None: auto, which can turn it on
        unless its default is never)."""
        return enabled is True or (enabled is None and self.enabled_by_default is not never)

    def markers(self, paths: Paths) -> list[str]:
        return [marker.format(**vars(paths)) for marker in self.hardware_markers]

    def option(self, name: str) -> Option:
        return next(option for option in self.options if option.name == name)


REGISTRY: dict[str, Registration] = {}


def register(registration: Registration) -> Registration:
    if registration.name in REGISTRY and REGISTRY[registration.name] is not registration:
        raise ValueError(f"two collectors are named {registration.name}")
    REGISTRY[registration.name] = registration
    return registration
