"""Reading an exporter's exposition: one sample's value, golden files, `promtool check metrics`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Optional

from prometheus_client.parser import text_string_to_metric_families

from accelmon.exporter.metrics import Samples, render
from accelmon.exporter.runtime import Collector
from tests.support.paths import GOLDEN

# Self-metrics whose values change from run to run; left out of golden comparisons.
VOLATILE = ("accelmon_collector_duration_seconds", "accelmon_collector_last_sample_timestamp_seconds")


# The health collector's families with one series per check: split by the collector that declares the check.
CHECK_FAMILIES = (
    "accelmon_gpu_health_check_state",
    "accelmon_node_health_check_state",
    "accelmon_gpu_health_drill_active",
)


def stable_lines(exposition: str) -> str:
    return "".join(line + "\n" for line in exposition.splitlines() if not line.startswith(VOLATILE))


def by_collector(exposition: str) -> dict[str, str]:
    """The exposition split by the collector that serves each family (its catalogue's specs); the self-metrics
    labelled `collector` go with the collector they are about; the process's own (build info, scrape counts) are
    `exporter`'s. Each part keeps the HELP and TYPE lines of its families, in exposition order."""
    from accelmon.collectors import collectors

    owner = {spec.name: name for name, r in collectors().items() for spec in r.catalogue.specs}
    # A health check's series go with the collector that declares the check (health.<collector>): a collector's
    # judgement changes its own golden file. A check two collectors declare (the GPU device checks: nvml and amd)
    # goes with the one running here (its self-metrics are in the exposition).
    running = set(re.findall(r'accelmon_collector_success\{collector="([a-z_0-9]+)"\}', exposition))
    declared: dict[str, list[str]] = {}
    for name, registration in collectors().items():
        for check in (*registration.gpu_checks, *registration.node_checks):
            declared.setdefault(check.name, []).append(name)
    check_owner = {
        check: next((name for name in names if name in running), names[0]) for check, names in declared.items()
    }
    parts: dict[str, list[str]] = {}
    family_of_part: dict[str, str] = {}  # the family each part's latest line belongs to
    headers: dict[str, list[str]] = {}  # family -> its HELP and TYPE lines
    family = ""
    for line in exposition.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            family = line.split()[2]
            headers.setdefault(family, []).append(line)
            continue
        if not line or line.startswith("#"):
            continue
        labelled = line.split('collector="', 1)
        part = owner.get(family) or (labelled[1].split('"', 1)[0] if len(labelled) == 2 else "exporter")
        checked = re.search(r'check="([a-z_0-9]+)"', line) if family in CHECK_FAMILIES else None
        if checked and checked.group(1) in check_owner:
            part = f"health.{check_owner[checked.group(1)]}"
        lines = parts.setdefault(part, [])
        if family_of_part.get(part) != family:
            lines.extend(headers.get(family, []))
            family_of_part[part] = family
        lines.append(line)
    return {part: "".join(line + "\n" for line in lines) for part, lines in parts.items()}


def check_golden(name: str, exposition: str, collector: str = "") -> None:
    """Compare with tests/golden/NAME/, one file per collector (`by_collector`), so that a new collector adds its
    own file and changes no other; UPDATE_GOLDEN=1 rewrites them. With `collector`, the exposition is that one
    collector's sample, whichever catalogue declares its series (AMD's accelmon_gpu_* are NVIDIA's specs)."""
    directory = GOLDEN / name.removesuffix(".prom")
    parts = {collector: stable_lines(exposition)} if collector else by_collector(stable_lines(exposition))
    if os.environ.get("UPDATE_GOLDEN") == "1":
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.prom"):
            if stale.stem not in parts:
                stale.unlink()
        for part, text in parts.items():
            (directory / f"{part}.prom").write_text(text)
    assert directory.is_dir(), f"{directory} missing: run with UPDATE_GOLDEN=1 once and review it"
    golden = {path.stem: path.read_text() for path in directory.glob("*.prom")}
    differing = sorted(part for part in set(golden) | set(parts) if golden.get(part) != parts.get(part))
    assert not differing, (
        f"exposition differs from {directory} in: {', '.join(differing)} (UPDATE_GOLDEN=1 to accept after review)"
    )


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


def text_of(source: Collector | Samples) -> str:
    """The text exposition of a collector's sample taken now, or of `Samples`: what its part of a scrape says."""
    return render(source.sample() if isinstance(source, Collector) else source).decode()


def series(exposition: str, metric: str) -> list[tuple[dict[str, str], float]]:
    """Every sample named `metric`: (labels, value)."""
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == metric
    ]


def promtool_check(exposition: str, allowed: tuple[str, ...] = ()) -> None:
    """`promtool check metrics` passes, but for the findings in `allowed` (each line ending in one of them)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: scripts/setup.sh unpacks it into .tools/usr/bin"
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
    findings = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    left = [line for line in findings if not allowed or not line.endswith(allowed)]
    assert result.returncode == 0 or (allowed and not left), result.stdout + result.stderr
