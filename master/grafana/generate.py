"""Generates accelmon's Grafana dashboards (master/grafana/dashboards/*.json) from this file.

    python master/grafana/generate.py          # rewrite the JSON files
    python master/grafana/generate.py --check  # exit 1 if the committed JSON differs (CI)

What each dashboard shows is declared as plain data in its own module of `boards/` (one per dashboard, on the
shared `panels.py`), every panel a (title, unit, queries) triple that the tests run against a real Prometheus;
the Grafana JSON is built from it with Grafana's own SDK (grafana-foundation-sdk, pinned to the build for the
Grafana image we deploy, so the schema version is that Grafana's). Fixed uids, a datasource variable used by
every panel, and a unit on every panel.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, heatmap, prometheus, stat, statushistory, table, timeseries
from grafana_foundation_sdk.builders import dashboard as sdk_dashboard
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prometheus_model
from panels import Dashboard, Panel

OUT = Path(__file__).resolve().parent / "dashboards"
# Panels Grafana asks at one moment (the dashboard's end), not as a range: a table of what is at fault now, bars of
# the present (the instant queries below; contract.panel_queries and the capacity bench ask them so).
INSTANT_KINDS = ("table", "bargauge")
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")


def dashboards() -> list[Dashboard]:
    """Every module of boards/ declares one DASHBOARD: a new dashboard is a new module, nothing else edited."""
    import boards

    found = [importlib.import_module(f"boards.{m.name}").DASHBOARD for m in pkgutil.iter_modules(boards.__path__)]
    return sorted(found, key=lambda dashboard: dashboard.uid)


DASHBOARDS = dashboards()


# The panel kinds used here and their SDK builders.
KINDS = {
    "timeseries": timeseries.Panel,
    "stat": stat.Panel,
    "heatmap": heatmap.Panel,
    "table": table.Panel,
    "bargauge": bargauge.Panel,
    "statushistory": statushistory.Panel,
}


def build_panel(panel: Panel, panel_id: int, x: int, y: int) -> Builder:
    built = (
        KINDS[panel.kind]()
        .id(panel_id)
        .title(panel.title)
        .description(panel.description)
        .datasource(DATASOURCE)
        .grid_pos(model.GridPos(h=panel.height, w=panel.width, x=x, y=y))
        .unit(panel.unit)
    )
    if panel.max is not None:
        built = built.min(0).max(panel.max)
    for number, (expr, legend) in enumerate(panel.queries):
        query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + number))
        if panel.kind in INSTANT_KINDS:
            query = query.instant()
        if panel.kind == "table":
            query = query.format(prometheus_model.PromQueryFormat.TABLE)
        elif panel.kind == "heatmap":  # cumulative `le` buckets from a recording rule, as Grafana reads histograms
            query = query.format(prometheus_model.PromQueryFormat.HEATMAP)
        built = built.with_target(query.datasource(DATASOURCE))
    if panel.kind == "heatmap":
        # How many GPUs sit at each utilization, from buckets the fleet rules count: Grafana draws them as they are.
        built = built.calculate(False).y_axis(heatmap.YAxisConfig().unit(panel.unit))
    return built


def build_dashboard(dashboard: Dashboard) -> Builder:
    built = (
        sdk_dashboard.Dashboard(dashboard.title)
        .uid(dashboard.uid)
        .description(dashboard.description)
        .tags(dashboard.tags)
        .timezone("browser")
        .readonly()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("30s")
        .link(
            sdk_dashboard.DashboardLink("accelmon")
            .type(model.DashboardLinkType.DASHBOARDS)
            .tags(["accelmon"])
            .as_dropdown(True)
        )
        .with_variable(sdk_dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    for name, query in dashboard.variables:
        built = built.with_variable(
            sdk_dashboard.QueryVariable(name)
            .label(name)
            .datasource(DATASOURCE)
            .query({"query": query, "refId": f"{name}-var"})
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .include_all(True)
            .multi(True)
            .all_value(".*")
            .sort(model.VariableSort.NUMERICAL_ASC)
        )
    x, y, row_height = 0, 0, 0
    for number, panel in enumerate(dashboard.panels, start=1):
        if x + panel.width > 24:
            x, y, row_height = 0, y + row_height, 0
        built = built.with_panel(build_panel(panel, number, x, y))
        x += panel.width
        row_height = max(row_height, panel.height)
    return built


# The interval variable's fields, which the SDK writes on every variable; Grafana 11.6's dashboard model (the
# @grafana/schema 11.6.0 types that tests/test_master.py checks each dashboard against) has none of them.
INTERVAL_ONLY = ("auto", "auto_count", "auto_min")


def to_grafana_model(built: Any) -> Any:
    """The SDK's dashboard as Grafana 11.6's model has it: no interval fields on a variable (we use none)."""
    document = json.loads(JSONEncoder(sort_keys=True).encode(built))
    for variable in document.get("templating", {}).get("list", []):
        if variable.get("type") == "interval":
            raise ValueError(f"{variable['name']}: an interval variable needs its auto fields; keep them for it")
        for key in INTERVAL_ONLY:
            variable.pop(key, None)
    return document


def render_all() -> dict[str, str]:
    return {
        f"{d.uid}.json": json.dumps(to_grafana_model(build_dashboard(d).build()), sort_keys=True, indent=2) + "\n"
        for d in DASHBOARDS
    }


def main(argv: list[str]) -> int:
    rendered = render_all()
    if "--check" in argv:
        stale = [
            name for name, text in rendered.items() if not (OUT / name).exists() or (OUT / name).read_text() != text
        ]
        extra = [p.name for p in OUT.glob("*.json") if p.name not in rendered]
        if stale or extra:
            print(f"dashboards out of date: {', '.join(stale + extra)}; run python master/grafana/generate.py")
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (OUT / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
