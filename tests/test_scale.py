"""Scale-out with the master role's Prometheus config, run by real Prometheus servers: sharding splits the workers
between shards with nothing lost or doubled, HA replicas scrape the same targets, and every shard remote-writes
its samples, with the shard and replica labels, into a Prometheus-compatible store (a Prometheus whose
remote-write receiver is on)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.support.ansible import render_role_template
from tests.support.processes import free_port

pytestmark = pytest.mark.e2e

NODES = [f"gpu-{n:02d}" for n in range(10)]
SHARDS, REPLICAS = 2, 2


def get(base: str, path: str, **params: str) -> dict:
    with urllib.request.urlopen(f"{base}{path}?{urllib.parse.urlencode(params)}", timeout=5) as response:
        return json.load(response)["data"]


def wait_ready(base: str, deadline: float) -> None:
    while True:
        try:
            urllib.request.urlopen(f"{base}/-/ready", timeout=2).read()
            return
        except OSError:
            assert time.monotonic() < deadline, f"{base} did not start"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A remote-write store and SHARDS x REPLICAS Prometheus servers configured by the role for a 10-worker fleet."""
    prometheus = shutil.which("prometheus")
    assert prometheus, "install Debian's prometheus (setup.sh unpacks it into .tools)"
    work = tmp_path_factory.mktemp("scale")
    targets = work / "targets"
    targets.mkdir()
    # Every worker's exporter and node_exporter, on ports where nothing listens: up == 0 is a sample like any other.
    for job, base_port in (("accelmon", 20000), ("node", 21000)):
        groups = [{"targets": [f"127.0.0.1:{base_port + i}"], "labels": {"node": node}} for i, node in enumerate(NODES)]
        (targets / f"{job}.json").write_text(json.dumps(groups))
    store_port = free_port()
    store = work / "store"
    store.mkdir()
    (store / "prometheus.yml").write_text("global: {}\n")
    variables = {
        "accelmon_master_shards": SHARDS,
        "accelmon_master_replicas": REPLICAS,
        "accelmon_master_external_labels": {"cluster": "test"},
        "accelmon_master_remote_write": [
            {"url": f"http://127.0.0.1:{store_port}/api/v1/write", "queue_config": {"batch_send_deadline": "1s"}}
        ],
        "accelmon_master_prometheus_scrape_interval": "1s",
    }
    # Every config is rendered before any server starts: a failed rendering leaves no server behind.
    servers = []
    for position in range(SHARDS * REPLICAS):
        home = work / f"master-{position}"
        home.mkdir()
        here = {**variables, "__accelmon_master_position": position}
        render_role_template("accelmon_master", "prometheus.yml.j2", home / "prometheus.yml", here)
        config = home / "prometheus.yml"
        config.write_text(config.read_text().replace("/etc/prometheus/targets/", f"{targets}/"))
        servers.append((position, f"http://127.0.0.1:{free_port()}", config))
    commands = [
        [prometheus, f"--config.file={store / 'prometheus.yml'}", f"--storage.tsdb.path={store / 'data'}",
         f"--web.listen-address=127.0.0.1:{store_port}", "--web.enable-remote-write-receiver"],
        *([prometheus, f"--config.file={config}", f"--storage.tsdb.path={config.parent / 'data'}",
           f"--web.listen-address={base.removeprefix('http://')}"] for _, base, config in servers),
    ]  # fmt: skip
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for command in commands:
            processes.append(subprocess.Popen(command, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        for _, base, _ in servers:
            wait_ready(base, deadline)
        wait_ready(f"http://127.0.0.1:{store_port}", deadline)
        yield servers, f"http://127.0.0.1:{store_port}"
    finally:
        for process in processes:
            process.terminate()
        stop_by = time.monotonic() + 5  # one deadline for all: a server still flushing its remote-write queue is killed
        for process in processes:
            try:
                process.wait(max(0.1, stop_by - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def scraped_nodes(base: str) -> dict[str, set[str]]:
    """job -> the nodes this Prometheus keeps as targets (after its relabelling)."""
    deadline = time.monotonic() + 30
    while True:
        active = get(base, "/api/v1/targets", state="active")["activeTargets"]
        if active or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    kept: dict[str, set[str]] = {"accelmon": set(), "node": set()}
    for target in active:
        if target["labels"]["job"] in kept:  # not the server's own `prometheus` job
            kept[target["labels"]["job"]].add(target["labels"]["node"])
    return kept


def test_shards_split_the_workers_and_replicas_share_them(fleet):
    servers, _ = fleet
    kept = {position: scraped_nodes(base) for position, base, _ in servers}
    shards = []
    for shard in range(SHARDS):
        first, second = kept[shard * REPLICAS], kept[shard * REPLICAS + 1]
        assert first == second, "the two replicas of a shard scrape the same targets"
        assert first["accelmon"] == first["node"], "a worker's exporter and node_exporter stay on one shard"
        assert first["accelmon"], f"shard {shard} got no worker"
        shards.append(first["accelmon"])
    assert shards[0].isdisjoint(shards[1]) and shards[0] | shards[1] == set(NODES)


def test_every_series_reaches_the_store_once_per_replica(fleet):
    _, store = fleet
    deadline = time.monotonic() + 60
    while True:  # bounded: remote_write sends within a few seconds of the first scrapes
        per_series = get(
            store, "/api/v1/query", query='count by (job, node) (up{cluster="test",job=~"accelmon|node"})'
        )["result"]
        if len(per_series) == 2 * len(NODES) and all(r["value"][1] == str(REPLICAS) for r in per_series):
            break
        assert time.monotonic() < deadline, per_series
        time.sleep(1)
    origins = get(store, "/api/v1/query", query='count by (shard, replica) (up{cluster="test",job=~"accelmon|node"})')[
        "result"
    ]
    assert {(r["metric"]["shard"], r["metric"]["replica"]) for r in origins} == {
        (str(s), str(r)) for s in range(SHARDS) for r in range(REPLICAS)
    }
    # After deduplication by replica (the store's job: here max by the other labels) each series is there once.
    deduplicated = get(
        store, "/api/v1/query", query='count(max without (replica) (up{cluster="test",job=~"accelmon|node"}))'
    )["result"]
    assert deduplicated[0]["value"][1] == str(2 * len(NODES))


def test_rendered_config_names_credentials_by_file_only(tmp_path):
    secret = "hunter2-remote-write"
    variables = {
        "accelmon_master_remote_write": [
            {"url": "https://vm.example/api/v1/write", "basic_auth_username": "acc", "basic_auth_password": secret},
            {"url": "https://mimir.example/api/v1/push", "bearer_token": "tok-" + secret, "tls_ca": "PEM"},
        ]
    }
    render_role_template("accelmon_master", "prometheus.yml.j2", tmp_path / "prometheus.yml", variables)
    text = (tmp_path / "prometheus.yml").read_text()
    assert secret not in text
    assert "password_file: /etc/prometheus/secrets/remote-write/0-password" in text
    assert "credentials_file: /etc/prometheus/secrets/remote-write/1-token" in text
    assert "ca_file: /etc/prometheus/secrets/remote-write/1-ca.crt" in text
    promtool = shutil.which("promtool")
    assert promtool
    result = subprocess.run([promtool, "check", "config", "--syntax-only", str(tmp_path / "prometheus.yml")],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert Path(tmp_path / "prometheus.yml").exists()


def test_replicas_write_identical_series_and_send_alerts_once(tmp_path):
    """drop_replica_label strips the replica label from what goes to the store (after the external labels are
    added, ahead of the endpoint's own relabelling); Alertmanager gets the replicas' alerts without it too."""
    variables = {
        "accelmon_master_shards": 1,
        "accelmon_master_replicas": 2,
        "accelmon_master_group": "masters",
        "__accelmon_master_position": 1,
        "accelmon_master_alertmanager_enabled": True,
        "accelmon_master_remote_write": [
            {"url": "http://vm:8428/api/v1/write", "drop_replica_label": True,
             "write_relabel_configs": [{"action": "drop", "source_labels": ["__name__"], "regex": "go_.*"}]},
            {"url": "http://thanos:19291/api/v1/receive"},
        ],
    }  # fmt: skip
    render_role_template("accelmon_master", "prometheus.yml.j2", tmp_path / "prometheus.yml", variables)
    config = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    assert config["global"]["external_labels"] == {"replica": "1"}
    vm, thanos = config["remote_write"]
    assert vm["write_relabel_configs"] == [
        {"action": "labeldrop", "regex": "replica"},
        {"action": "drop", "source_labels": ["__name__"], "regex": "go_.*"},
    ]
    assert "write_relabel_configs" not in thanos  # a store that deduplicates by the label keeps it
    assert config["alerting"]["alert_relabel_configs"] == [{"action": "labeldrop", "regex": "replica"}]
    result = subprocess.run([shutil.which("promtool") or "promtool", "check", "config", "--syntax-only",
                             str(tmp_path / "prometheus.yml")], capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def grafana_datasource(tmp_path: Path, variables: dict) -> dict:
    """The role's provisioned datasource as Grafana reads it: YAML, then $$ back to $ (Grafana expands $NAME)."""
    render_role_template("accelmon_master", "grafana-datasource.yml.j2", tmp_path / "prometheus.yml", variables)
    text = (tmp_path / "prometheus.yml").read_text()
    assert "$" not in text.replace("$$", ""), "a lone $ would be expanded by Grafana"
    [datasource] = yaml.safe_load(text.replace("$$", "$"))["datasources"]
    return datasource


@pytest.mark.parametrize(
    ("variables", "url"),
    [
        ({}, "http://accelmon-prometheus:9090"),  # its own Prometheus, over the containers' network
        ({"accelmon_master_network": "host"}, "http://127.0.0.1:9090"),
        ({"accelmon_master_query_url": "http://10.0.0.40:8428"}, "http://10.0.0.40:8428"),  # the global store
    ],
)
def test_grafanas_datasource_reads_the_global_store_when_one_is_given(tmp_path, variables, url):
    datasource = grafana_datasource(tmp_path, variables)
    assert datasource["url"] == url and datasource["uid"] == "accelmon-prometheus"
    assert "basicAuth" not in datasource and "secureJsonData" not in datasource  # nothing asked, nothing sent


def test_grafanas_datasource_carries_the_stores_credentials_verbatim(tmp_path):
    """Basic auth, a CA and a tenant header (Mimir's X-Scope-OrgID): Grafana gets each value as given, a $ in the
    password included, secrets in secureJsonData (which Grafana encrypts), never in jsonData."""
    ca = "-----BEGIN CERTIFICATE-----\nMIIB$x\n-----END CERTIFICATE-----"
    datasource = grafana_datasource(
        tmp_path,
        {
            "accelmon_master_query_url": "https://store-01:8428",
            "accelmon_master_query_basic_auth_username": "grafana",
            "accelmon_master_query_basic_auth_password": "pa$$word$HOME\"'",
            "accelmon_master_query_headers": {"X-Scope-OrgID": "tenant-$1"},
            "accelmon_master_query_tls_ca": ca,
        },
    )
    assert datasource["basicAuth"] is True and datasource["basicAuthUser"] == "grafana"
    assert datasource["jsonData"] == {
        "httpMethod": "POST",
        "tlsAuthWithCACert": True,
        "httpHeaderName1": "X-Scope-OrgID",
    }
    assert datasource["secureJsonData"] == {
        "basicAuthPassword": "pa$$word$HOME\"'",
        "tlsCACert": ca + "\n",
        "httpHeaderValue1": "tenant-$1",
    }


def test_grafanas_datasource_sends_a_bearer_token_as_its_authorization_header(tmp_path):
    datasource = grafana_datasource(
        tmp_path,
        {
            "accelmon_master_query_url": "https://thanos-query:9090",
            "accelmon_master_query_bearer_token": "t0ken",
            "accelmon_master_query_headers": {"X-Scope-OrgID": "fleet"},
        },
    )
    assert "basicAuth" not in datasource
    names = {k: v for k, v in datasource["jsonData"].items() if k.startswith("httpHeaderName")}
    assert names == {"httpHeaderName1": "X-Scope-OrgID", "httpHeaderName2": "Authorization"}
    assert datasource["secureJsonData"] == {"httpHeaderValue1": "fleet", "httpHeaderValue2": "Bearer t0ken"}
