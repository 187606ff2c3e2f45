"""The master bundle: rules and config pass promtool, dashboards are generated and well-formed, and every
panel query and rule expression returns data from a real Prometheus scraping the exporter over fake devices."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.support.ansible import render_role_template
from tests.support.dashboards import METRIC, concrete, contract, generate, panel_params, served_or_recorded
from tests.support.paths import ROOT
from tests.support.rules import master_rules, rule_files
from tests.support.simulated_node import get

MASTER = ROOT / "master"
RUNBOOK_BASE = "https://github.com/accelmon/accelmon/blob/main/docs/runbooks/"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool not found: install Debian's prometheus package (.ci/run does)"
    return subprocess.run([binary, *args], capture_output=True, text=True, cwd=ROOT)


def test_rules_pass_promtool_check():
    checked = promtool("check", "rules", *map(str, rule_files()))
    assert checked.returncode == 0, checked.stdout + checked.stderr


# One test per file of promtool unit tests: the suite's parallel workers (scripts/test.sh) take them apart.
@pytest.mark.parametrize("tests", sorted(p.name for p in (master_rules() / "tests").glob("*.yml")))
def test_rules_pass_promtool_unit_tests(tests):
    tested = promtool("test", "rules", str(master_rules() / "tests" / tests))
    assert tested.returncode == 0, tests + ": " + tested.stdout + tested.stderr


def test_no_fleet_rule_reads_a_series_another_fleet_rule_records():
    # The store's vmalert asks the store, where what it recorded moments ago is not searchable yet: a fleet rule
    # built on another fleet rule's output misses evaluations (the store scenario saw the series never appear).
    fleet = [r for f in rule_files() if f.name.startswith("accelmon-fleet-")
             for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]  # fmt: skip
    recorded = {r["record"] for r in fleet if "record" in r}
    for rule in fleet:
        read = set(METRIC.findall(rule["expr"])) & recorded
        assert not read, f"{rule.get('record') or rule.get('alert')} reads the fleet-recorded {sorted(read)}"


def test_every_alert_has_a_unit_test_a_severity_and_a_runbook():
    alerts = [
        r for f in rule_files() for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r
    ]
    tests = yaml.safe_load((MASTER / "prometheus" / "tests" / "alerts-test.yml").read_text())["tests"]
    tested = {case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    for alert in alerts:
        assert alert["alert"] in tested, f"{alert['alert']} has no firing test"
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}
        assert len(alert["annotations"]["description"]) > 40
        # Each links its runbook in docs/runbooks/, which says what it means, how to confirm, what to do and when
        # to escalate.
        name = alert["alert"]
        assert alert["annotations"].get("runbook_url") == RUNBOOK_BASE + f"{name}.md", f"{name}: runbook_url"
        runbook = (ROOT / "docs" / "runbooks" / f"{name}.md").read_text()
        assert runbook.startswith(f"# {name}\n"), name
        for section in ("## What it means", "## How to confirm", "## What to do", "## When to escalate"):
            assert section in runbook, f"docs/runbooks/{name}.md has no {section!r}"
    runbooks = {p.stem for p in (ROOT / "docs" / "runbooks").glob("*.md")}
    assert runbooks == {alert["alert"] for alert in alerts}, "a runbook without its alert"


def test_no_rendered_rule_file_is_shipped():
    """The live job rules exist only as the role's template: the shipped rules directory holds no rendered copy
    (the role renders its own from the operator's variables; what tests need is rendered for them)."""
    assert not (MASTER / "prometheus" / "rules" / "accelmon-live-jobs.yml").exists()
    assert (master_rules() / "rules" / "accelmon-live-jobs.yml").read_text().startswith("#\n# Ansible managed")


def test_the_masters_record_no_name_of_the_stores_fleet_rules(tmp_path):
    """cluster:* and job_id:* are the fleet-wide records, the store's alone (vmalert over every shard): a master
    recording one of those names too would send a partial series of the same name to the store (the store
    scenario's verifier caught the live-job rules' job_id:*:max)."""
    rendered = tmp_path / "accelmon-live-jobs.yml"
    render_role_template("accelmon_master", "accelmon-live-jobs.yml.j2", rendered, {})
    masters = [yaml.safe_load(rendered.read_text())] + [
        yaml.safe_load(f.read_text()) for f in rule_files() if not f.name.startswith("accelmon-fleet-")
    ]
    recorded = {r["record"] for rules in masters for g in rules["groups"] for r in g["rules"] if "record" in r}
    assert recorded and not {name for name in recorded if name.startswith(("cluster:", "job_id:"))}


def test_the_live_job_rules_follow_the_roles_variables(tmp_path):
    """An operator's thresholds and windows reach every rule, and the rendered rules pass promtool."""
    variables = {
        "accelmon_master_live_jobs_straggler_for": "30s",
        "accelmon_master_live_jobs_straggler_sm_clock_ratio": 0.85,
        "accelmon_master_live_jobs_idle_for": "2m",
        "accelmon_master_live_jobs_hung_power_ratio": 0.25,
        "accelmon_master_live_jobs_interval": "30s",
        "accelmon_master_live_jobs_straggler_cpu_throttled": 0.25,
    }
    rendered = tmp_path / "accelmon-live-jobs.yml"
    render_role_template("accelmon_master", "accelmon-live-jobs.yml.j2", rendered, variables)
    checked = promtool("check", "rules", str(rendered))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    groups = yaml.safe_load(rendered.read_text())["groups"]
    # Both groups (the live judgements, the ledger) at the interval; at the defaults none, the global interval.
    assert [g.get("interval") for g in groups] == ["30s", "30s"]
    rules = [r for g in groups for r in g["rules"]]
    (straggling,) = [r for r in rules if r.get("record") == "job_gpu:straggling:bool"]
    assert "ratio_to_job_median < 0.85\n" in straggling["expr"] and "ratio_to_job_median < 0.8\n" in straggling["expr"]
    stragglers = [r for r in rules if r.get("alert") == "AccelmonJobStraggler"]
    reasons = [r["labels"]["reason"] for r in stragglers]
    assert reasons == ["thermal", "power_cap", "link_degraded", "nic_port", "host_cpu", "unknown"]
    for rule in stragglers:
        assert rule["for"] == "30s" and rule["expr"].startswith("(job_gpu:straggling:bool == 1)")
        assert "SM clock under 0.85 of it" in " ".join(rule["annotations"]["description"].split())
        assert "for 30s" in rule["annotations"]["description"]
    # The host's threshold reaches both rules that read it (the one that names it, the one that rules it out).
    assert [r["labels"]["reason"] for r in stragglers if "throttled_seconds_total[5m]) > 0.25)" in r["expr"]] == [
        "host_cpu",
        "unknown",
    ]
    assert {r["for"] for r in rules if r.get("alert") == "AccelmonJobGpuIdle"} == {"2m"}
    hung = {r["labels"]["signals"]: r for r in rules if r.get("alert") == "AccelmonJobHung"}
    assert sorted(hung) == ["utilization_power", "utilization_power_sm_active", "utilization_sm_active"]
    for signals in ("utilization_power", "utilization_power_sm_active"):  # those that read the power
        assert "< 0.25" in hung[signals]["expr"] and "under 25 %" in hung[signals]["annotations"]["description"]
    assert "power_watts" not in hung["utilization_sm_active"]["expr"]


def test_the_reports_default_thresholds_are_the_roles():
    """Where Prometheus has no live rules to read, the report judges at the master role's defaults."""
    from accelmon.report.thresholds import Thresholds

    defaults = yaml.safe_load((ROOT / "ansible" / "roles" / "accelmon_master" / "defaults" / "main.yml").read_text())
    role = {
        name: defaults[f"accelmon_master_live_jobs_{name}"]
        for name in Thresholds().as_dict()
        if not name.endswith("_seconds")
    }
    assert {k: v for k, v in Thresholds().as_dict().items() if not k.endswith("_seconds")} == role
    assert Thresholds().straggler_for_seconds == duration(defaults["accelmon_master_live_jobs_straggler_for"])


def test_the_report_reads_the_thresholds_the_rules_were_rendered_with(tmp_path):
    """Every threshold the report applies is read back from rules rendered at values other than the defaults, in
    the form Prometheus's rules API gives them (each expression re-printed by promtool's parser, `for` in seconds)."""
    from accelmon.report.thresholds import Thresholds, from_rules

    chosen = {
        "straggler_sm_clock_ratio": 0.85,
        "straggler_power_ratio": 0.7,
        "busy_utilization": 0.4,
        "active_utilization": 0.1,
        "idle_utilization": 0.02,
        "input_gpu_utilization": 0.25,
        "input_cpu_ratio": 0.8,
        "memory_ratio": 0.9,
        "straggler_cpu_throttled": 0.3,
    }
    variables = {f"accelmon_master_live_jobs_{name}": value for name, value in chosen.items()}
    variables["accelmon_master_live_jobs_straggler_for"] = "90s"
    rendered = tmp_path / "accelmon-live-jobs.yml"
    render_role_template("accelmon_master", "accelmon-live-jobs.yml.j2", rendered, variables)
    groups = [
        {
            "name": group["name"],
            "rules": [
                {
                    "name": rule.get("record") or rule["alert"],
                    "query": " ".join(rule["expr"].split()),
                    "duration": duration(rule.get("for", "0s")),
                }
                for rule in group["rules"]
            ],
        }
        for group in yaml.safe_load(rendered.read_text())["groups"]
    ]
    thresholds, read = from_rules(groups)
    assert thresholds == Thresholds(**chosen, straggler_for_seconds=90.0)
    assert read == sorted(Thresholds().as_dict())
    assert from_rules([]) == (Thresholds(), [])


def duration(text: str) -> float:
    return float(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


@pytest.mark.parametrize("alertmanager", [False, True])
def test_the_roles_prometheus_config_passes_promtool(tmp_path, alertmanager):
    """The master role's template, rendered by Ansible with the role's defaults, is a config Prometheus accepts."""
    variables = {"accelmon_master_alertmanager_enabled": alertmanager}
    render_role_template("accelmon_master", "prometheus.yml.j2", tmp_path / "prometheus.yml", variables)
    result = promtool("check", "config", "--syntax-only", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboards_are_generated_from_code():
    result = subprocess.run(
        [sys.executable, str(MASTER / "grafana" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


# Records a panel reads where it joined or summed every GPU of the fleet at each of its points (issue 68: 18.4 s and
# 14.4 s for 720 points at 8,000 GPUs).
RECORDED_FOR_PANELS = re.compile(r"\bjob_gpu:|\bnode:accelmon_gpu_(xid_events|ecc_errors)_total:sum\b")


def test_a_panel_reading_a_record_gives_the_numbers_of_the_query_it_replaced():
    """Each such panel's query (job 100 picked) is tested by promtool in panels-test.yml and followed there by the
    query it replaced, over the raw series, with the same samples expected (names aside: a recorded series keeps
    its own): test_rules_pass_promtool_unit_tests runs them, so the panel draws the same numbers."""
    tests = yaml.safe_load((MASTER / "prometheus" / "tests" / "panels-test.yml").read_text())["tests"]
    checks = [check for test in tests for check in test["promql_expr_test"]]

    def flat(expr: str) -> str:
        return " ".join(expr.split())

    def unnamed(samples: list[dict]) -> list[tuple[str, float]]:
        return sorted((re.sub(r"^[^{]*", "", s["labels"]), s["value"]) for s in samples)

    read = [q for q in contract.panel_queries() if RECORDED_FOR_PANELS.search(q.expr)]
    assert {q.panel for q in read} >= {
        "Power against the job's median",
        "SM clock against the job's median",
        "GPU power",
        "XID events",
        "Uncorrected ECC errors",
    }
    for entry in read:
        expr = flat(concrete(entry.expr.replace("$job_id", "100")))
        at = [i for i, check in enumerate(checks) if flat(check["expr"]) == expr]
        assert at, f"{entry.dashboard}: {entry.panel}: {expr} is not in panels-test.yml"
        for i in at:
            panel, replaced = checks[i], checks[i + 1]
            assert not RECORDED_FOR_PANELS.search(replaced["expr"]), (entry.panel, replaced["expr"])
            assert replaced["eval_time"] == panel["eval_time"], (entry.panel, replaced["expr"])
            assert unnamed(replaced["exp_samples"]) == unnamed(panel["exp_samples"]), entry.panel


GRAFANA_MODEL = ROOT / ".tools" / "grafana-schema"  # scripts/setup.sh: npm ci of master/grafana/schema-check


def type_check(dashboards: dict[str, str], work: Path) -> subprocess.CompletedProcess[str]:
    """tsc over one TypeScript module per dashboard that declares its JSON a `Dashboard` of @grafana/schema: an
    object literal may hold only the model's properties, each of the model's type."""
    tsc = GRAFANA_MODEL / "node_modules" / ".bin" / "tsc"
    assert tsc.exists(), f"{tsc} is missing: scripts/setup.sh installs it (npm ci of master/grafana/schema-check)"
    work.mkdir()
    for name, text in dashboards.items():
        module = "import type { Dashboard } from '@grafana/schema';\n"
        (work / f"{name}.ts").write_text(f"{module}const dashboard: Dashboard = {text};\nexport default dashboard;\n")
    config = {"compilerOptions": {"strict": True, "noEmit": True, "module": "commonjs", "moduleResolution": "node",
                                  "target": "es2020", "skipLibCheck": True}, "include": ["*.ts"]}  # fmt: skip
    (work / "tsconfig.json").write_text(json.dumps(config))
    return subprocess.run([str(tsc), "-p", str(work)], capture_output=True, text=True, timeout=120)


def test_every_dashboard_is_a_dashboard_of_grafanas_own_model(tmp_path):
    """Checked against Grafana's published dashboard model for the Grafana we deploy (@grafana/schema 11.6.0's
    TypeScript types, compiled by tsc, both pinned): the SDK that writes the dashboards is not their judge."""
    pinned = json.loads((MASTER / "grafana" / "schema-check" / "package.json").read_text())["devDependencies"]
    image = yaml.safe_load((ROOT / "ansible" / "roles" / "accelmon_master" / "defaults" / "main.yml").read_text())
    # The same Grafana release line: a patch release (11.6.16, the security fixes) keeps its minor's dashboard model.
    # name:tag@sha256:digest (pinned by digest, the tag kept for reading): the release is the tag's.
    deployed = image["accelmon_master_grafana_image"].split("@")[0].rsplit(":", 1)[1].split(".")[:2]
    assert deployed == pinned["@grafana/schema"].split(".")[:2], (deployed, pinned["@grafana/schema"])
    # Inside the installed tree, so that '@grafana/schema' resolves to it.
    work = GRAFANA_MODEL / f"check-{os.getpid()}"
    try:
        dashboards = {
            p.stem.replace("-", "_"): p.read_text() for p in (MASTER / "grafana" / "dashboards").glob("*.json")
        }
        checked = type_check(dashboards, work)
        assert checked.returncode == 0, checked.stdout
        # The check is live: a property the model does not know fails it.
        shutil.rmtree(work)
        broken = {"broken": dashboards["accelmon_node"].replace('"title": "accelmon / ', '"titel": "accelmon / ', 1)}
        refused = type_check(broken, work)
        assert refused.returncode != 0 and "'\"titel\"' does not exist in type 'Dashboard'" in refused.stdout, (
            refused.stdout
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_dashboards_are_well_formed():
    dashboards = [json.loads(p.read_text()) for p in sorted((MASTER / "grafana" / "dashboards").glob("*.json"))]
    uids = [d["uid"] for d in dashboards]
    assert len(uids) == len(set(uids)) == len(generate.DASHBOARDS) == 9
    for dashboard in dashboards:
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids)), dashboard["uid"]
        assert dashboard["templating"]["list"][0]["type"] == "datasource"
        for panel in dashboard["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}", (dashboard["uid"], panel["title"])
            assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
            assert panel["fieldConfig"]["defaults"].get("unit"), (dashboard["uid"], panel["title"])
            assert panel["targets"], panel["title"]


def test_the_panels_asked_at_one_moment_are_the_dashboards_instant_queries():
    """contract.panel_queries says which panels Grafana asks as one instant (tables, bars), as the dashboards hold
    them: the capacity bench asks those so, and the rest as ranges (a table of the fleet's path faults asked as a
    720-step range went over Prometheus's 50 M samples at 8,000 GPUs in trouble; Grafana never asks it so)."""
    held = {}
    for path in sorted((MASTER / "grafana" / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                held[(dashboard["uid"], panel["title"], target["expr"])] = bool(target.get("instant"))
    said = {(q.dashboard, q.panel, q.expr): q.instant for q in contract.panel_queries()}
    assert said == held
    assert any(said.values()) and not all(said.values())


def query(base: str, expr: str) -> list:
    answer = get(f"{base}/api/v1/query?query={urllib.parse.quote(concrete(expr))}")
    assert answer["status"] == "success", expr
    return answer["data"]["result"]


@pytest.mark.parametrize(("expr", "expect_data"), list(panel_params()))
def test_every_panel_query_returns_data(prometheus, expr, expect_data):
    for name in METRIC.findall(expr):
        if name in ONLY_WHILE:  # the simulated fleet is never so: named by the catalogue or a rule instead
            assert not expect_data and name in served_or_recorded(), name
            continue
        assert query(prometheus, f"count({{__name__={name!r}}})".replace("'", '"')), f"{name} is not exported"
    if expect_data:
        assert query(prometheus, expr), f"no data for {expr}"


def rule_expressions():
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                yield pytest.param(rule, id=rule.get("record") or rule["alert"])


# Served only while something is so (master/grafana/contract.py), which the simulated fleet never is: each is checked
# against the catalogue or the rules instead, and its own test serves it.
ONLY_WHILE = contract.ONLY_WHILE


@pytest.mark.parametrize("rule", list(rule_expressions()))
def test_every_rule_names_exported_metrics(prometheus, rule):
    names = [n for n in METRIC.findall(rule["expr"])]
    assert names, rule["expr"]
    for name in names:
        if name in ONLY_WHILE:
            assert name in served_or_recorded(), name
            continue
        assert query(prometheus, f'count({{__name__="{name}"}})'), f"{name} in {rule.get('alert', rule.get('record'))}"
    if "record" in rule and rule["record"] not in ONLY_WHILE:
        assert query(prometheus, rule["record"]), f"recording rule {rule['record']} has no data"


def test_variables_find_values(prometheus):
    for dashboard in generate.DASHBOARDS:
        for name, definition in dashboard.variables:
            metric, label = re.match(r"label_values\((.*), (\w+)\)", definition).groups()
            values = {r["metric"].get(label) for r in query(prometheus, metric)}
            assert values - {None}, (dashboard.uid, name)


def test_fleet_sees_the_lost_gpu_and_the_xid(prometheus):
    assert query(prometheus, "cluster:accelmon_gpus_lost:sum")[0]["value"][1] == "1"
    assert query(prometheus, "cluster:accelmon_gpus_up:sum")[0]["value"][1] == "7"
    assert query(prometheus, 'accelmon_gpu_xid_errors_total{gpu="2",xid="79"}')
    alerts = get(f"{prometheus}/api/v1/alerts")["data"]["alerts"]
    firing = {a["labels"]["alertname"] for a in alerts}
    assert {"AccelmonGpuLost", "AccelmonGpuHealthFailure", "AccelmonInfinibandPortNotActive"} <= firing
    # The XID 79 is both an NVML event and a kernel log line: one alert, from the health check, with its action.
    assert "AccelmonGpuCriticalXid" not in firing
    health = [a["labels"] for a in alerts if a["labels"]["alertname"] == "AccelmonGpuHealthFailure"]
    assert {(h["gpu"], h["check"], h["action"]) for h in health} >= {("2", "xid", "reboot_node")}


def test_the_master_keeps_of_node_exporter_what_accelmon_reads(prometheus):
    """At accelmon_master_node_exporter_series's default (`read`), the simulated node's Prometheus (the role's
    metric relabelling) holds of node_exporter's per-CPU series only idle and iowait time and the CPUs' model, a
    fraction of what it serves; every panel, rule and report query is run against this data by the other tests
    here and in test_report.py, so what is dropped is read by none of them."""
    per_cpu = query(prometheus, 'count by (__name__, mode) ({job="node", cpu!=""})')
    kept = {(r["metric"]["__name__"], r["metric"].get("mode", "")) for r in per_cpu}
    # node_cpu_info: the job report's CPU model and sockets (--collector.cpu.info, one series a CPU).
    assert kept == {("node_cpu_seconds_total", "idle"), ("node_cpu_seconds_total", "iowait"), ("node_cpu_info", "")}
    cpus = int(query(prometheus, 'count(node_cpu_seconds_total{mode="idle"})')[0]["value"][1])
    assert cpus == os.cpu_count()
