"""What every dashboard is made of, as plain data: a panel is (title, unit, queries), a dashboard its panels and
variables; the template variables and label selectors the dashboards share. generate.py builds the Grafana JSON."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Panel:
    title: str
    unit: str
    queries: list[tuple[str, str]]  # (PromQL, legend)
    kind: str = "timeseries"  # timeseries, stat, heatmap, table, bargauge, statushistory
    width: int = 12
    height: int = 8
    description: str = ""
    max: float | None = None
    expect_data: bool = True  # the contract test expects data on the simulated fleet


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    panels: list[Panel]
    variables: list[tuple[str, str]] = field(default_factory=list)  # (name, label_values query)
    tags: list[str] = field(default_factory=lambda: ["accelmon"])


def node_vars() -> list[tuple[str, str]]:
    return [("node", "label_values(accelmon_exporter_build_info, node)")]


def gpu_vars() -> list[tuple[str, str]]:
    return [*node_vars(), ("gpu", 'label_values(accelmon_gpu_up{node=~"$node"}, gpu)')]


G = 'node=~"$node",gpu=~"$gpu"'
N = 'node=~"$node"'
