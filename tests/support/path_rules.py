"""The master's path rules (accelmon:gpu_path_fault, accelmon-recording.yml) evaluated by `promtool test rules` over a
collector's own expositions: each exposition one scrape, a minute apart, every series labelled as Prometheus labels a
node's (instance, job, node)."""

from __future__ import annotations

import shutil
import subprocess

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.rules import master_rules

SCRAPED = {"instance": "n1:19470", "job": "accelmon", "node": "n1"}


def _selector(name: str, labels: dict[str, str]) -> str:
    body = ",".join(f'{key}="{value}"' for key, value in sorted({**labels, **SCRAPED}.items()))
    return f"{name}{{{body}}}"


def input_series(expositions: list[str]) -> list[dict[str, str]]:
    """promtool's input series for scrapes a minute apart; `_` where a scrape lacks a series."""
    values: dict[str, list[str]] = {}
    for index, text in enumerate(expositions):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                value = sample.value
                row = values.setdefault(_selector(sample.name, sample.labels), ["_"] * index)
                row.append(repr(value) if value % 1 else str(int(value)))
        for row in values.values():
            row.extend(["_"] * (index + 1 - len(row)))
    return [{"series": key, "values": " ".join(row)} for key, row in values.items()]


def path_faults_test(expositions: list[str], expected: list[dict[str, object]], tmp_path) -> str:
    """Runs promtool over the scrapes, expecting `expected` (exp_samples) of accelmon:gpu_path_fault a minute after
    the last; returns promtool's output, '' when it passed."""
    test = {
        "rule_files": [str(master_rules() / "rules" / "accelmon-recording.yml")],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": input_series(expositions),
            "promql_expr_test": [{
                "expr": "accelmon:gpu_path_fault",
                "eval_time": f"{len(expositions)}m",
                "exp_samples": expected,
            }],
        }],
    }  # fmt: skip
    path = tmp_path / "path-faults-test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Debian's prometheus package (.ci/run does)"
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    return "" if done.returncode == 0 else done.stdout + done.stderr
