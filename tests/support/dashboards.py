"""The dashboards' query contract (master/grafana/contract.py) for tests and benchmarks: the metric names each
panel reads, every panel query, and the dashboard variables made concrete. master/grafana holds scripts, not a
package (generate.py is run as a script by the role's users), so its folder is put on the path here, once."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.support.paths import ROOT

# The dashboards are built by grafana-foundation-sdk, in the deploy extra (Python 3.11+): without it (the exporter's
# Python 3.9 run) the modules that need the contract are skipped, saying why.
pytest.importorskip("grafana_foundation_sdk", reason="the dashboards' SDK (the deploy extra) is not installed")
sys.path.insert(0, str(ROOT / "master" / "grafana"))
import contract
import generate
from contract import METRIC, concrete, panel_queries

__all__ = ["METRIC", "concrete", "contract", "generate", "panel_params", "panel_queries", "served_or_recorded"]


def panel_params() -> Iterator[object]:
    """Every panel query as a pytest parameter (expression, whether it must return data), named by its panel."""
    for entry in panel_queries():
        yield pytest.param(entry.expr, entry.expect_data, id=f"{entry.dashboard}:{entry.panel}:{entry.expr[:40]}")


def served_or_recorded() -> set[str]:
    """Every metric a collector declares and every recording rule: where a series served only while something is so
    (contract.ONLY_WHILE) is checked, since a simulated fleet never is so."""
    import yaml

    from accelmon.collectors import collectors
    from accelmon.exporter.runtime import SELF
    from tests.support.rules import rule_files

    served = {spec.name for registration in collectors().values() for spec in registration.catalogue.specs}
    served |= {spec.name for spec in SELF.specs}  # the exporter's own (build, certificate ends, collector health)
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            served |= {rule["record"] for rule in group["rules"] if "record" in rule}
    return served
