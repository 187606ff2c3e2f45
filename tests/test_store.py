"""The global store of a sharded HA fleet, run by real servers configured by the roles: two shards of two replicas
(the master role's Prometheus config) scrape two simulated workers and remote-write into VictoriaMetrics with the
accelmon_store role's flags, whose vmalert evaluates the fleet-wide rules. The store takes HTTPS and basic auth
only, as the role sets it up; the masters write and Grafana's provisioned datasource reads with the credentials
and CA the roles gave them. Every worker's series is in the store once, the fleet rules see the whole fleet, every
dashboard panel has data from the store, and stopping a replica loses no samples."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.support.ansible import exec_start, render_role_template
from tests.support.dashboards import METRIC, concrete, contract, panel_params, served_or_recorded
from tests.support.processes import free_port
from tests.support.rules import master_rules
from tests.support.simulated_node import rapl_sysfs, start_exporter, start_node_exporter

pytestmark = pytest.mark.e2e

SHARDS, REPLICAS = 2, 2
STORE_USER, STORE_PASSWORD = "fleet", "store-test-password-1"  # test credentials
STORE_NAME = "store.test"  # the name in the store's certificate (besides 127.0.0.1)
# How to reach a base URL that asks for TLS and credentials: its SSL context and Authorization header.
CLIENTS: dict[str, tuple[ssl.SSLContext, str]] = {}


def shard_of(node: str, shards: int) -> int:
    """Prometheus's hashmod relabelling of one label value: the MD5's last 8 bytes, big-endian, modulo."""
    return int.from_bytes(hashlib.md5(node.encode()).digest()[8:], "big") % shards


def one_node_per_shard() -> list[str]:
    names = (f"gpu-node-{n}" for n in range(1, 100))
    chosen: dict[int, str] = {}
    for name in names:
        chosen.setdefault(shard_of(name, SHARDS), name)
        if len(chosen) == SHARDS:
            return [chosen[shard] for shard in range(SHARDS)]
    raise AssertionError("no names found for every shard")


NODES = one_node_per_shard()  # NODES[s] is scraped by shard s


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(directory: Path) -> None:
    """A CA and the store's certificate signed by it, for the store's name and 127.0.0.1."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=accelmon test CA",
            "-keyout", str(directory / "ca.key"), "-out", str(directory / "ca.crt"))  # fmt: skip
    (directory / "store.ext").write_text(f"subjectAltName=DNS:{STORE_NAME},IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=store", "-keyout", str(directory / "store.key"),
            "-out", str(directory / "store.csr"))  # fmt: skip
    openssl("x509", "-req", "-in", str(directory / "store.csr"), "-CA", str(directory / "ca.crt"),
            "-CAkey", str(directory / "ca.key"), "-CAcreateserial", "-days", "2",
            "-extfile", str(directory / "store.ext"), "-out", str(directory / "store.crt"))  # fmt: skip


def client_of(datasource: dict) -> tuple[ssl.SSLContext, str]:
    """What Grafana does with its provisioned datasource: trust its CA, send its basic auth."""
    secure = datasource["secureJsonData"]
    context = ssl.create_default_context(cadata=secure["tlsCACert"])
    user_password = f"{datasource['basicAuthUser']}:{secure['basicAuthPassword']}"
    return context, "Basic " + base64.b64encode(user_password.encode()).decode()


def environment_file(path: Path) -> dict[str, str]:
    """A systemd EnvironmentFile's assignments (the role writes plain KEY=VALUE lines)."""
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def get(base: str, path: str, **params: str) -> dict:
    request = urllib.request.Request(f"{base}{path}?{urllib.parse.urlencode(params)}")
    context = None
    if base in CLIENTS:
        context, authorization = CLIENTS[base]
        request.add_header("Authorization", authorization)
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return answer["data"]


def instant(base: str, expr: str, **params: str) -> list:
    return get(base, "/api/v1/query", query=concrete(expr), **params)["result"]


def wait_for(base: str, expr: str, deadline: float) -> list:
    while True:  # bounded by the deadline
        try:
            result = instant(base, expr)
            if result:
                return result
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{base}: no data for {expr}"
        time.sleep(1)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, fake_nvml_dir):
    binaries = {name: shutil.which(name) for name in ("prometheus", "victoria-metrics", "vmalert")}
    binaries["node_exporter"] = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    assert all(binaries.values()), f"setup.sh unpacks these into .tools: {binaries}"
    work = tmp_path_factory.mktemp("store")
    store_port, vmalert_port = free_port(), free_port()
    store = f"https://127.0.0.1:{store_port}"
    pki = work / "pki"
    pki.mkdir()
    make_pki(pki)

    # The store, with the role's units' commands and its environment file, HTTPS and basic auth on.
    store_vars = {
        "accelmon_store_listen_address": "127.0.0.1",
        "accelmon_store_port": store_port,
        "accelmon_store_vmalert_port": vmalert_port,
        "accelmon_store_dedup_interval": "1s",  # the masters scrape every second here
        "accelmon_store_evaluation_interval": "1s",
        "accelmon_store_basic_auth_username": STORE_USER,
        "accelmon_store_basic_auth_password": STORE_PASSWORD,
        "accelmon_store_tls_cert": (pki / "store.crt").read_text(),
        "accelmon_store_tls_key": (pki / "store.key").read_text(),
        "accelmon_store_tls_server_name": STORE_NAME,
    }
    for template in ("accelmon-store.service", "accelmon-store-vmalert.service", "auth.env"):
        render_role_template("accelmon_store", f"{template}.j2", work / template, store_vars)
    # What systemd does: the environment file's flags; the role's paths are this test's files.
    rules = master_rules() / "rules"
    on_host = {"/var/lib/accelmon-store": str(work / "store-data"), "/etc/accelmon-store/tls/": f"{pki}/",
               "/etc/accelmon-store/rules/*.yml": str(rules / "accelmon-fleet-*.yml")}  # fmt: skip

    def command(unit: str, binary: str) -> list[str]:
        arguments = exec_start(work / unit)
        arguments[0] = binaries[binary]
        for path, here in on_host.items():
            arguments = [a.replace(path, here) for a in arguments]
        return arguments

    store_environment = {**os.environ, **environment_file(work / "auth.env")}
    victoria = command("accelmon-store.service", "victoria-metrics")
    victoria.append("-search.latencyOffset=0s")  # test only: queries see samples at once, not 30 s later
    vmalert = command("accelmon-store-vmalert.service", "vmalert")
    # Grafana's datasource as the master role provisions it, the store's credentials and CA given to the role.
    grafana_vars = {
        "accelmon_master_query_url": store,
        "accelmon_master_query_basic_auth_username": STORE_USER,
        "accelmon_master_query_basic_auth_password": STORE_PASSWORD,
        "accelmon_master_query_tls_ca": (pki / "ca.crt").read_text(),
    }
    render_role_template("accelmon_master", "grafana-datasource.yml.j2", work / "datasource.yml", grafana_vars)
    [datasource] = yaml.safe_load((work / "datasource.yml").read_text().replace("$$", "$"))["datasources"]
    assert datasource["url"] == store
    CLIENTS[store] = client_of(datasource)

    # The masters: what the role writes on each, for 2 shards x 2 replicas remote-writing into the store.
    targets = work / "targets"
    targets.mkdir()
    exporter_ports = [free_port() for _ in NODES]
    node_exporter_port = free_port()
    (targets / "accelmon.json").write_text(
        json.dumps([{"targets": [f"127.0.0.1:{p}"], "labels": {"node": n}} for p, n in zip(exporter_ports, NODES)])
    )
    # One node_exporter stands for both workers' (two targets: the same address with each worker's node label).
    (targets / "node.json").write_text(
        json.dumps([{"targets": [f"127.0.0.1:{node_exporter_port}"], "labels": {"node": n}} for n in NODES])
    )
    # What the role copies to a sharded master: every rule file but the fleet-wide ones.
    local_rules = work / "rules"
    local_rules.mkdir()
    for path in rules.glob("*.yml"):
        if not path.name.startswith("accelmon-fleet-"):
            shutil.copy(path, local_rules)
    master_vars = {
        "accelmon_master_shards": SHARDS,
        "accelmon_master_replicas": REPLICAS,
        "accelmon_master_external_labels": {"cluster": "test"},
        "accelmon_master_remote_write": [
            {
                "url": f"{store}/api/v1/write",
                "drop_replica_label": True,
                "queue_config": {"batch_send_deadline": "1s"},
                "basic_auth_username": STORE_USER,
                "basic_auth_password": STORE_PASSWORD,
                "tls_ca": (pki / "ca.crt").read_text(),
            }
        ],
        "accelmon_master_prometheus_scrape_interval": "1s",
    }
    # The remote-write secrets as the master role writes them (remote-write/<position>-<kind>).
    secrets = work / "secrets"
    (secrets / "remote-write").mkdir(parents=True)
    (secrets / "remote-write" / "0-password").write_text(STORE_PASSWORD)
    shutil.copy(pki / "ca.crt", secrets / "remote-write" / "0-ca.crt")
    masters = []
    for position in range(SHARDS * REPLICAS):
        home = work / f"master-{position}"
        home.mkdir()
        config = home / "prometheus.yml"
        render_role_template(
            "accelmon_master", "prometheus.yml.j2", config, {**master_vars, "__accelmon_master_position": position}
        )
        text = config.read_text().replace("/etc/prometheus/targets/", f"{targets}/")
        text = text.replace("/etc/prometheus/secrets/", f"{secrets}/")
        config.write_text(text.replace("/etc/prometheus/rules/", f"{local_rules}/"))
        base = f"http://127.0.0.1:{free_port()}"
        command = [binaries["prometheus"], f"--config.file={config}", f"--storage.tsdb.path={home / 'data'}",
                   f"--web.listen-address={base.removeprefix('http://')}"]  # fmt: skip
        masters.append((base, command))

    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        processes["store"] = subprocess.Popen(victoria, stderr=subprocess.DEVNULL, env=store_environment)
        processes["vmalert"] = subprocess.Popen(vmalert, stderr=subprocess.DEVNULL, env=store_environment)
        for index, (node, port) in enumerate(zip(NODES, exporter_ports)):
            (work / node).mkdir()
            processes[f"exporter-{index}"] = start_exporter(work / node, port, fake_nvml_dir)
        processes["node_exporter"] = start_node_exporter(
            binaries["node_exporter"], node_exporter_port, rapl_sysfs(work / "node-sys")
        )
        for position, (_, command) in enumerate(masters):
            processes[f"master-{position}"] = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180  # a bound for a loaded machine (CI runs the tiers on parallel workers)
        # vmalert's results over both shards' data, and the neuron-monitor's (the slowest to start).
        wait_for(store, "cluster:accelmon_gpus_up:sum == 14", deadline)
        wait_for(store, "cluster:accelmon_neuroncore_utilization_ratio:avg", deadline)
        wait_for(store, "job_id:accelmon_gpus:count", deadline)
        time.sleep(4)  # rate() and increase() want a few samples
        yield {"store": store, "masters": [base for base, _ in masters], "processes": processes, "pki": pki}
    finally:
        CLIENTS.pop(store, None)
        for process in processes.values():
            process.terminate()
        stop_by = time.monotonic() + 5  # one deadline for all: a Prometheus still flushing to the store is killed
        for process in processes.values():
            try:
                process.wait(max(0.1, stop_by - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def series(base: str, expr: str, drop: tuple[str, ...] = ()) -> list[tuple]:
    """The label sets of `expr`'s series, without the labels in `drop`, sorted (duplicates kept)."""
    result = instant(base, expr)
    return sorted(tuple(sorted((k, v) for k, v in r["metric"].items() if k not in drop)) for r in result)


def test_each_shard_scrapes_its_worker(fleet):
    for position, base in enumerate(fleet["masters"]):
        shard = position // REPLICAS
        active = get(base, "/api/v1/targets", state="active")["activeTargets"]
        nodes = {t["labels"]["node"] for t in active if t["labels"]["job"] in ("accelmon", "node")}
        assert nodes == {NODES[shard]}, (position, nodes)


def test_every_workers_series_is_in_the_store_exactly_once(fleet):
    store, masters = fleet["store"], fleet["masters"]
    for expr in ('up{job=~"accelmon|node"}', "accelmon_gpu_power_watts", "accelmon_infiniband_state_id",
                 "node:accelmon_gpu_power_watts:sum", "accelmon_gpu_job_info"):  # fmt: skip
        # What the shards hold (one replica of each), against what the store holds: same series, none twice.
        expected = sorted(s for shard in range(SHARDS) for s in series(masters[shard * REPLICAS], expr))
        in_store = series(store, expr, drop=("cluster", "shard"))  # the external labels a shard adds on the way
        assert expected, expr
        assert in_store == expected, expr
    assert not instant(store, '{replica!=""}'), "the replica label is dropped on the way to the store"
    assert {r["metric"]["shard"] for r in instant(store, "up")} == {str(s) for s in range(SHARDS)}


def status_of(url: str, context: ssl.SSLContext, authorization: str = "", data: bytes | None = None) -> int:
    request = urllib.request.Request(url, data=data)
    if authorization:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_store_answers_only_https_with_its_credentials(fleet):
    store = fleet["store"]
    context = ssl.create_default_context(cafile=str(fleet["pki"] / "ca.crt"))
    query = f"{store}/api/v1/query?query=up"
    wrong = "Basic " + base64.b64encode(f"{STORE_USER}:wrong-password".encode()).decode()
    for authorization in ("", wrong):
        assert status_of(query, context, authorization) == 401
        assert status_of(f"{store}/api/v1/write", context, authorization, data=b"") == 401
    assert status_of(query, *CLIENTS[store]) == 200
    # Plain HTTP gets no answer; a client that does not trust the test CA refuses the certificate.
    with pytest.raises(OSError):
        urllib.request.urlopen(query.replace("https://", "http://"), timeout=5)
    with pytest.raises(ssl.SSLCertVerificationError):
        try:
            urllib.request.urlopen(query, timeout=5, context=ssl.create_default_context())
        except urllib.error.URLError as error:
            raise error.reason from None


def test_vmalert_evaluates_the_fleet_rules_over_the_whole_fleet(fleet):
    store, masters = fleet["store"], fleet["masters"]
    # Each worker has 7 answering GPUs of 8: a shard alone would count 7.
    assert instant(store, "cluster:accelmon_gpus_up:sum")[0]["value"][1] == "14"
    assert instant(store, "cluster:accelmon_gpus_lost:sum")[0]["value"][1] == "2"
    # Job 100 holds GPUs 0 and 1 of each simulated worker (the same job ids on both: 4 GPUs in all).
    counts = {r["metric"]["job_id"]: r["value"][1] for r in instant(store, "job_id:accelmon_gpus:count")}
    assert counts == {"100": "4", "200": "2"}
    for base in masters:  # the shards leave the fleet-wide rules to the store
        names = {r["name"] for g in get(base, "/api/v1/rules")["groups"] for r in g["rules"]}
        assert "node:accelmon_gpu_power_watts:sum" in names
        assert not {n for n in names if n.startswith(("cluster:", "job_id:"))}, names


def test_the_ledger_counts_each_gpu_once_though_two_replicas_write_it(fleet):
    """docs/ledger.md, "HA pairs": both replicas of each shard record every GPU's ledger state and write it to the
    store, which keeps one series a GPU (the replica label dropped, samples deduplicated); vmalert's fleet counts there
    add up to the fleet's 16 GPUs at every evaluation, each failing or lost GPU unhealthy once."""
    store = fleet["store"]

    def by_state() -> dict[str, int]:
        return {
            r["metric"]["state"]: int(r["value"][1]) for r in instant(store, "cluster:accelmon_gpus_by_state:count")
        }

    deadline = time.monotonic() + 60
    while sum(by_state().values()) != 16:  # the ledger's rules run an evaluation behind the rules they read
        assert time.monotonic() < deadline, by_state()
        time.sleep(1)
    per_gpu = instant(store, 'count by (node, uuid) ({__name__=~"gpu:accelmon_ledger_.*:bool"})')
    assert len(per_gpu) == 16 and {r["value"][1] for r in per_gpu} == {"1"}, per_gpu  # one series a GPU there
    start = time.time()
    time.sleep(12)  # vmalert evaluates every 2 s: the counts of six evaluations
    counted = get(store, "/api/v1/query_range", query="sum(cluster:accelmon_gpus_by_state:count)",
                  start=str(start), end=str(time.time()), step="2")["result"]  # fmt: skip
    assert {value for _, value in counted[0]["values"]} == {"16"}, counted
    # Unhealthy: each GPU (by node and index) that fails a check or is lost, once: the lost GPU 5 of each worker
    # (accelmon_gpu_up without a UUID, the health check's with one) among them.
    failing = instant(store, "count by (node, gpu) (accelmon_gpu_health_check_state == 2 or accelmon_gpu_up == 0)")
    assert {r["metric"]["gpu"] for r in failing} >= {"5"}, failing
    assert by_state()["unhealthy"] == len(failing) and by_state()["unreachable"] == 0, (by_state(), failing)


@pytest.mark.parametrize(("expr", "expect_data"), list(panel_params()))
def test_every_panel_query_returns_data_from_the_store(fleet, expr, expect_data):
    for name in METRIC.findall(expr):
        if name in contract.ONLY_WHILE:  # the simulated fleet is never so: named by the catalogue or a rule instead
            assert not expect_data and name in served_or_recorded(), name
            continue
        assert instant(fleet["store"], f'count({{__name__="{name}"}})'), f"{name} is not in the store"
    if expect_data:
        assert instant(fleet["store"], expr), f"no data for {expr}"


def test_stopping_a_replica_loses_no_samples(fleet):
    """The last test of the module: it stops a server of the fleet."""
    store, masters = fleet["store"], fleet["masters"]
    stop(fleet["processes"]["master-1"])  # shard 0's second replica
    stopped = time.time()
    time.sleep(10)
    window = int(time.time() - stopped) - 1
    expr = f'count_over_time(up{{job="accelmon",node="{NODES[0]}"}}[{window}s])'
    survivor = float(instant(masters[0], expr)[0]["value"][1])
    in_store = float(instant(store, expr)[0]["value"][1])
    assert survivor >= window - 2, (survivor, window)  # it scraped every second
    assert in_store >= survivor - 1, (in_store, survivor)  # and all of it reached the store (the edge sample aside)
