"""The collectors of accelmon-exporter, one module each.

Each module declares everything it knows in one `accelmon.exporter.registry.Registration` and registers itself when
imported; `collectors()` here imports every module of this package. Nothing else lists the collectors. The list
lives here, not in the registry, so that the registry (which every collector imports) imports no collector.
"""

from __future__ import annotations

import importlib
import pkgutil

from accelmon.exporter.metrics import MetricSpec
from accelmon.exporter.registry import REGISTRY, Registration


def collectors() -> dict[str, Registration]:
    """Every collector, by name: each module of this package registers itself when imported."""
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    return dict(sorted(REGISTRY.items()))


def known_metrics() -> dict[str, MetricSpec]:
    """Every metric a collector may export, by name."""
    return {spec.name: spec for registration in collectors().values() for spec in registration.catalogue.specs}
