"""What the dashboards ask of the data, for whoever checks a Prometheus-compatible store against them (the test
suite, the Molecule scenarios, the capacity benchmark): every panel query, made concrete with match-all template
variables, and the metric names a query or rule reads."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

import generate

# accelmon_*/node_* metrics, recording rules (level:metric:operations) and `up{...}`.
METRIC = re.compile(
    r"\b((?:accelmon|node)_[a-zA-Z0-9_]+|(?:node|cluster|job_id|job_gpu|job|gpu|account):[a-z0-9_:]+[a-z0-9_]|up(?=\{))"
)

# Grafana's template variables, as a user who picked "All" sends them.
VARIABLES = {
    "$__rate_interval": "1m",
    "$__range_s": "3600",  # before $__range, which it starts with
    "$__range": "1h",
    "$node": ".*",
    "$gpu": ".*",
    "$device": ".*",
    "$runtime_tag": ".*",
    "$job_id": ".*",
}


class PanelQuery(NamedTuple):
    dashboard: str  # the dashboard's uid
    panel: str  # the panel's title
    expr: str  # as the dashboard holds it, variables included
    expect_data: bool  # False where an empty answer is a healthy fleet's (no XIDs, no throttling)


def concrete(expr: str) -> str:
    """The query Grafana sends for `expr` with every variable at "All"."""
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def panel_queries() -> Iterator[PanelQuery]:
    for dashboard in generate.DASHBOARDS:
        for panel in dashboard.panels:
            for expr, _ in panel.queries:
                yield PanelQuery(dashboard.uid, panel.title, expr, panel.expect_data)
