"""docs/metrics.md is generated from the code, and the code exports only catalogued names."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from accelmon.catalogue import catalogues, checks_markdown, markdown, with_checks
from accelmon.collectors import collectors
from tests.support.paths import GOLDEN, ROOT


def test_metrics_doc_is_up_to_date():
    assert (ROOT / "docs" / "metrics.md").read_text() == markdown(), (
        "docs/metrics.md is stale: python -m accelmon.catalogue > docs/metrics.md"
    )


def test_every_exported_name_is_catalogued_and_unique():
    specs = {id(spec): spec for catalogue in catalogues() for spec in catalogue.specs}.values()
    names = [spec.name for spec in specs]
    # A name two collectors serve (NVIDIA's and AMD's accelmon_gpu_*) is one spec, shared: the same type, labels
    # and help wherever it comes from.
    assert len(names) == len(set(names)), "two collectors declare the same metric name apart"
    exported = set()
    for golden in GOLDEN.rglob("*.prom"):
        for family in text_string_to_metric_families(golden.read_text()):
            exported.add(family.name + ("_total" if family.type == "counter" else ""))
    assert exported, "no golden files found"
    assert exported <= set(names), exported - set(names)


def test_the_health_docs_table_of_checks_is_generated():
    """docs/health.md's table of checks is made from the checks the collectors declare (their text included)."""
    text = (ROOT / "docs" / "health.md").read_text()
    assert text == with_checks(text), "docs/health.md's checks are stale: python -m accelmon.catalogue --checks"
    # And the table is the checks: one row each.
    declared = {c.name for r in collectors().values() for c in (*r.gpu_checks, *r.node_checks)}
    assert checks_markdown().count("\n| `") == len(declared)
