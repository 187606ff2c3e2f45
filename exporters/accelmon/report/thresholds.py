"""The live judgements' thresholds, as the report applies them: the ones the deployed rules use, read from
Prometheus's rules API (`/api/v1/rules`), so a site that tuned its alerts (the master role's
accelmon_master_live_jobs_* variables) gets a report that agrees with them; the role's defaults where a rule is
not there to read (a Prometheus without accelmon's live rules, an older release).

The rules are the master role's template (ansible/roles/accelmon_master/templates/accelmon-live-jobs.yml.j2), whose
expressions put each threshold in a known place; Prometheus returns an expression re-printed from its parse tree, so
they are matched with whitespace left free. A test renders the template at other values and reads them back.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from accelmon.report.query import ReportError

NUMBER = r"([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)"


@dataclass(frozen=True)
class Thresholds:
    """At the master role's defaults (a test keeps them equal to ansible/roles/accelmon_master/defaults/main.yml)."""

    # AccelmonJobStraggler: a GPU's SM clock or power under these shares of its job's median at the same moment,
    # while the job's median utilization is at least busy_utilization and the GPU's own at least active_utilization,
    # for straggler_for_seconds without a break.
    straggler_sm_clock_ratio: float = 0.9
    straggler_power_ratio: float = 0.8
    busy_utilization: float = 0.3
    active_utilization: float = 0.05
    straggler_for_seconds: float = 300.0
    # Its reason host_cpu: the job's CPUs on the straggler's node throttled by their quota more than this many
    # seconds a second.
    straggler_cpu_throttled: float = 0.1
    # AccelmonJobGpuIdle: a held GPU under this utilization counts as idle.
    idle_utilization: float = 0.05
    # AccelmonJobInputBound: GPUs under this mean utilization while the job's cores are this busy.
    input_gpu_utilization: float = 0.3
    input_cpu_ratio: float = 0.9
    # AccelmonJobMemoryNearLimit: the job's memory at this share of its cgroup limit.
    memory_ratio: float = 0.95

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


DEFAULTS = Thresholds()

# Where each threshold sits: (the rule, by its record or alert name; a pattern over its expression, or "for").
PLACES: dict[str, tuple[str, str]] = {
    "straggler_sm_clock_ratio": ("job_gpu:straggling:bool", rf"sm_clock_hertz:ratio_to_job_median\s*<\s*{NUMBER}"),
    "straggler_power_ratio": ("job_gpu:straggling:bool", rf"power_watts:ratio_to_job_median\s*<\s*{NUMBER}"),
    "busy_utilization": (
        "job_gpu:straggling:bool",
        rf"quantile\s+by\s*\(job_id\)\s*\(\s*0\.5\s*,\s*job_gpu:utilization:ratio\s*\)\s*\)?\s*>=\s*{NUMBER}",
    ),
    "active_utilization": ("job_gpu:straggling:bool", rf"and\s+\(?\s*job_gpu:utilization:ratio\s*>=\s*{NUMBER}"),
    "straggler_for_seconds": ("AccelmonJobStraggler", "for"),
    "straggler_cpu_throttled": ("AccelmonJobStraggler", rf"throttled_seconds_total\[5m\]\)\s*>\s*{NUMBER}"),
    "idle_utilization": ("AccelmonJobGpuIdle", rf"job_gpu:utilization:ratio\s*<\s*{NUMBER}"),
    "input_gpu_utilization": ("AccelmonJobInputBound", rf"job_gpu:utilization:ratio\s*\)\s*<\s*{NUMBER}"),
    "input_cpu_ratio": ("AccelmonJobInputBound", rf"accelmon_job_cpus_allocated\s*\)\s*>=\s*{NUMBER}"),
    "memory_ratio": ("AccelmonJobMemoryNearLimit", rf"accelmon_job_memory_limit_bytes\s*\)\s*>=\s*{NUMBER}"),
}


def from_rules(groups: list[dict[str, Any]]) -> tuple[Thresholds, list[str]]:
    """The thresholds the rules in `groups` (the rules API's `data.groups`) use, and the names of those read from
    them; each one not found keeps its default."""
    rules: dict[str, list[dict[str, Any]]] = {}
    for group in groups:
        for rule in group.get("rules", ()):
            rules.setdefault(str(rule.get("name", "")), []).append(rule)  # the straggler's reasons share one name
    found: dict[str, float] = {}
    for name, (rule_name, place) in PLACES.items():
        named = rules.get(rule_name, [])
        if not named:
            continue
        if place == "for":
            if isinstance(named[0].get("duration"), (int, float)) and named[0]["duration"] > 0:
                found[name] = float(named[0]["duration"])
            continue
        match = next((m for rule in named if (m := re.search(place, str(rule.get("query", ""))))), None)
        if match:
            found[name] = float(match.group(1))
    return replace(Thresholds(), **found), sorted(found)


def deployed(prometheus: Any) -> tuple[Thresholds, str]:
    """The thresholds of the rules `prometheus` evaluates, and where they came from, in words for the report."""
    try:
        groups = prometheus.get("/api/v1/rules")["groups"]
    except (ReportError, KeyError, TypeError) as error:  # the report goes on at the defaults, and says so
        return Thresholds(), f"the master role's defaults (the rules API did not answer: {error})"
    thresholds, read = from_rules(groups)
    if not read:
        return thresholds, "the master role's defaults (no accelmon live rules on this Prometheus)"
    if len(read) < len(fields(Thresholds)):
        missing = sorted(set(PLACES) - set(read))
        return thresholds, f"the deployed rules (defaults for {', '.join(missing)})"
    return thresholds, "the deployed rules"
