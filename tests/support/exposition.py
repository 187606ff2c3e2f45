"""Reading an exporter's exposition: one sample's value, golden files, `promtool check metrics`."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Optional

from prometheus_client.parser import text_string_to_metric_families

from tests.support.paths import GOLDEN

# Self-metrics whose values change from run to run; left out of golden comparisons.
VOLATILE = ("accelmon_collector_duration_seconds", "accelmon_collector_last_sample_timestamp_seconds")


def stable_lines(exposition: str) -> str:
    return "".join(line + "\n" for line in exposition.splitlines() if not line.startswith(VOLATILE))


def check_golden(name: str, exposition: str) -> None:
    """Compare with tests/golden/NAME; UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / name
    text = stable_lines(exposition)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text(), f"exposition differs from {path} (UPDATE_GOLDEN=1 to accept after review)"


def sample_value(exposition: str, metric: str, /, **labels: str) -> Optional[float]:
    """The value of the first sample named `metric` whose labels include `labels`, or None."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


# dcgm-exporter's own names that promtool's lint objects to (collector dcgm_compat copies them so that dcgm-exporter's
# dashboards and rules work): its label modelName, and DCGM_FI_DEV_PCIE_REPLAY_COUNTER. Only these are let through.
DCGM_EXPORTER_NAMES = (
    "label names should be written in 'snake_case' not 'camelCase'",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'",
)


def promtool_check(exposition: str, allowed: tuple[str, ...] = ()) -> None:
    """`promtool check metrics` passes, but for the findings in `allowed` (each line ending in one of them)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: scripts/setup.sh unpacks it into .tools/usr/bin"
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
    findings = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    left = [line for line in findings if not allowed or not line.endswith(allowed)]
    assert result.returncode == 0 or (allowed and not left), result.stdout + result.stderr
