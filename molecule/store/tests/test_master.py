"""Verify a converged master (the store scenario's first replica, which runs Alertmanager too): Prometheus runs in a
container with its config, rules and inventory targets; Grafana's secret and Alertmanager's config are private; the
containers are locked down."""

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
testinfra_hosts = ["podman://accelmon-store-master-a"]
WORKERS = ["accelmon-store-worker-1", "accelmon-store-worker-2"]


def api(host, path):
    return json.loads(host.check_output(f"curl -sf http://127.0.0.1:9090{path}"))


def test_prometheus_runs_as_a_container_as_its_own_user(host):
    inspect = json.loads(host.check_output("podman inspect accelmon-prometheus"))[0]
    assert inspect["State"]["Running"]
    assert inspect["Config"]["User"] == "60090:60090"  # accelmon-prometheus, not the image's nobody
    assert inspect["HostConfig"]["RestartPolicy"]["Name"] == "always"
    assert inspect["ImageName"].endswith("accelmon-prometheus:2.42.0")
    args = inspect["Config"]["Cmd"] or inspect["Args"]
    assert "--storage.tsdb.retention.time=30d" in args
    assert not any("enable-admin-api" in a for a in args)


def test_targets_come_from_the_inventory(host):
    targets = api(host, "/api/v1/targets")["data"]["activeTargets"]
    by_job = {(t["labels"]["job"], t["labels"]["instance"]) for t in targets}
    for worker in WORKERS:
        assert ("accelmon", f"{worker}:19470") in by_job
        assert ("node", f"{worker}:9100") in by_job
    node_labels = sorted(t["labels"].get("node") for t in targets if t["labels"]["job"] == "accelmon")
    assert node_labels == WORKERS


def test_rules_are_loaded(host):
    groups = api(host, "/api/v1/rules")["data"]["groups"]
    names = {rule["name"] for group in groups for rule in group["rules"]}
    assert {"AccelmonExporterDown", "AccelmonGpuLost", "AccelmonCollectorFailing"} <= names


def test_admin_api_is_off(host):
    code = host.check_output(
        "curl -s -o /dev/null -w '%{http_code}' -X POST http://127.0.0.1:9090/api/v1/admin/tsdb/snapshot"
    )
    assert code != "200"


def test_grafana_is_provisioned_from_files_with_a_private_password(host):
    datasource = host.file("/opt/accelmon-master/grafana/provisioning/datasources/prometheus.yml")
    assert "uid: accelmon-prometheus" in datasource.content_string
    assert host.file("/opt/accelmon-master/grafana/provisioning/dashboards/accelmon.yml").exists
    secret = host.file("/opt/accelmon-master/grafana/admin_password")
    assert secret.mode == 0o400 and secret.user == "accelmon-grafana" and secret.group == "accelmon-grafana"
    on_host = secret.content_string
    controller_file = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "secrets", "grafana-admin-password")
    with open(controller_file) as stream:
        assert stream.read().strip() == on_host.strip()
    assert len(on_host.strip()) >= 20 and on_host.strip().lower() not in {"admin", "password", "azure"}
    assert stat.S_IMODE(os.stat(controller_file).st_mode) == 0o600


def test_alertmanager_runs_with_receivers_from_variables_and_gets_prometheus_alerts(host):
    inspect = json.loads(host.check_output("podman inspect accelmon-alertmanager"))[0]
    assert inspect["State"]["Running"]
    assert inspect["Config"]["User"] == "60093:60093"  # accelmon-alertmanager
    config = host.file("/opt/accelmon-master/alertmanager/alertmanager.yml").content_string
    assert "receiver: oncall" in config and "http://127.0.0.1:9999/accelmon" in config
    ready = host.check_output(
        "for i in $(seq 1 30); do curl -sf http://127.0.0.1:9093/-/ready >/dev/null && echo ready && break; "
        "sleep 1; done"
    )
    assert ready == "ready"
    for _ in range(30):
        managers = api(host, "/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
        if managers:
            break
        time.sleep(1)
    assert [m["url"] for m in managers] == ["http://127.0.0.1:9093/api/v2/alerts"]


def test_secrets_and_containers_are_locked_down(host):
    """Alertmanager's config can hold webhook tokens and SMTP passwords: it was 0644. The containers ran with a
    writable root, every capability and no no-new-privileges, published on every interface."""
    # Owned by Alertmanager's own user, which it runs as: not uid 65534 nor group 65534 (every `nobody` process).
    config = host.file("/opt/accelmon-master/alertmanager/alertmanager.yml")
    assert config.mode == 0o400 and config.uid == 60093 and config.gid == 60093
    for name in ("accelmon-prometheus", "accelmon-alertmanager"):
        settings = json.loads(host.check_output(f"podman inspect {name}"))[0]["HostConfig"]
        assert settings["ReadonlyRootfs"] is True, name
        assert any(cap.upper() in ("ALL", "CAP_ALL") for cap in settings["CapDrop"]) or len(settings["CapDrop"]) > 10
        assert any("no-new-privileges" in option for option in settings["SecurityOpt"]), name
    listening = host.check_output("ss -ltnH")
    for port in (9090, 9093):  # this host only, by default (the master uses the host's network here)
        assert f"127.0.0.1:{port} " in listening, listening
        assert f"*:{port} " not in listening and f"0.0.0.0:{port} " not in listening, listening


def test_the_running_containers_are_those_of_the_written_definition(host):
    """podman runs exactly the services of /opt/accelmon-master/compose.yaml."""
    import yaml

    definition = yaml.safe_load(host.file("/opt/accelmon-master/compose.yaml").content_string)
    assert set(definition["services"]) == {"prometheus", "alertmanager", "grafana"}
    running = set(host.check_output("podman ps --format '{{.Names}}'").split())
    assert running == {service["container_name"] for service in definition["services"].values()}
    for service in definition["services"].values():
        inspect = json.loads(host.check_output(f"podman inspect {service['container_name']}"))[0]
        assert inspect["ImageName"] == service["image"]
        assert inspect["Config"]["User"] == service["user"]


def grafana_password_set(host):
    return host.check_output("podman exec accelmon-grafana cat /var/lib/grafana/admin-password-reset")


def test_grafana_got_its_admin_password_through_its_cli(host):
    """Grafana reads the password file only when it creates its database; the role also sets it with
    `grafana cli admin reset-admin-password --password-from-stdin`, the same password."""
    assert grafana_password_set(host) == host.file("/opt/accelmon-master/grafana/admin_password").content_string


def test_zz_a_changed_password_variable_reaches_grafana(host):
    """Last (it changes the password): the variable changed after the first deploy is set in Grafana."""
    new_password = "changed-after-the-first-deploy-" + str(int(time.time()))
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            os.environ["MOLECULE_INVENTORY_FILE"],
            str(ROOT / "ansible" / "deploy.yaml"),
            *("--limit", "accelmon-store-master-a", "--tags", "master"),
            *("-e", f"accelmon_master_grafana_admin_password={new_password}"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    assert new_password not in result.stdout  # no_log: the password is never printed
    assert grafana_password_set(host) == new_password
