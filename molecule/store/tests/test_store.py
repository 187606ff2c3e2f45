"""Verify the HA fleet and its store: VictoriaMetrics and vmalert run as hardened, unprivileged services where asked,
the store answers HTTPS with its credentials only, both replicas scrape every worker, every worker's series is in
the store once (no replica label, deduplicated), vmalert evaluates the fleet-wide rules over the whole fleet,
Grafana's provisioned datasource (URL, credentials, CA) reaches the store and every dashboard panel has data
there, and stopping a replica loses no sample."""

import base64
import json
import sys
import time
from pathlib import Path

import testinfra
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "master" / "grafana"))
sys.path.insert(0, str(ROOT / "molecule" / "shared"))
from contract import METRIC, ONLY_WHILE, concrete, panel_queries  # noqa: E402
from verify import wait_for  # noqa: E402

testinfra_hosts = ["podman://accelmon-store"]
STORE_HOST = testinfra.get_host("podman://accelmon-store")
MASTERS = [testinfra.get_host(f"podman://accelmon-store-master-{r}") for r in ("a", "b")]
WORKERS = [testinfra.get_host(f"podman://accelmon-store-worker-{n}") for n in (1, 2)]
WORKER_NODES = {"accelmon-store-worker-1", "accelmon-store-worker-2"}
PROMETHEUS = "http://127.0.0.1:9090"  # asked from a master
STORE = "https://accelmon-store:8428"  # the scenario's accelmon_master_query_url
DATASOURCE_FILE = "/opt/accelmon-master/grafana/provisioning/datasources/prometheus.yml"

# Asks a Prometheus-compatible API instant queries in one process on a host, as Grafana's datasource would: with
# its CA and its basic auth when given. argv[1]: base64 JSON {base, ca, user, password, queries: [[expr, params]]};
# prints each query's result.
ASK = """
import base64, json, ssl, sys, urllib.parse, urllib.request
job = json.loads(base64.b64decode(sys.argv[1]))
context = ssl.create_default_context(cadata=job["ca"]) if job.get("ca") else None
answers = []
for expr, params in job["queries"]:
    query = urllib.parse.urlencode({"query": expr, "latency_offset": "0s", **params})
    request = urllib.request.Request(job["base"] + "/api/v1/query?" + query)
    if job.get("user"):
        secret = base64.b64encode((job["user"] + ":" + job["password"]).encode()).decode()
        request.add_header("Authorization", "Basic " + secret)
    with urllib.request.urlopen(request, timeout=30, context=context) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    answers.append(body["data"]["result"])
print(json.dumps(answers))
"""


def grafana_datasource(master) -> dict:
    """The datasource the master role provisioned for Grafana, read as Grafana reads it ($$ is one $)."""
    text = master.file(DATASOURCE_FILE).content_string
    [datasource] = yaml.safe_load(text.replace("$$", "$"))["datasources"]
    return datasource


def ask(host, base, queries, datasource=None):
    """Each (expr, params) of `queries` asked of `base` from `host`, through `datasource`'s credentials if given."""
    job = {"base": base, "queries": queries}
    if datasource:
        secure = datasource.get("secureJsonData", {})
        job.update(ca=secure.get("tlsCACert"), user=datasource.get("basicAuthUser"),
                   password=secure.get("basicAuthPassword"))  # fmt: skip
    encoded = base64.b64encode(json.dumps(job).encode()).decode()
    return json.loads(host.check_output(f"python3 -c '{ASK}' {encoded}"))


def query(host, base, expr, **params):
    """One instant query of a master's own Prometheus (`host`, `base`), or of the store (`host` None), the store
    asked from the first master through Grafana's datasource, the way Grafana asks it."""
    if host is None:
        return ask(MASTERS[0], STORE, [[expr, params]], grafana_datasource(MASTERS[0]))[0]
    return ask(host, base, [[expr, params]])[0]


def series(host, base, expr, drop=()):
    """The label sets of `expr`'s series, without the labels in `drop`, sorted (duplicates kept)."""
    result = query(host, base, expr)
    return sorted(tuple(sorted((k, v) for k, v in r["metric"].items() if k not in drop)) for r in result)


def store_credentials():
    """The store's basic auth, as the role wrote it (root-only) for the services."""
    lines = STORE_HOST.file("/etc/accelmon-store/auth.env").content_string.splitlines()
    assignments = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    return assignments["httpAuth_username"], assignments["httpAuth_password"]


def curl_store(arguments):
    """curl on the store host to its own HTTPS name, trusting the certificate the role installed."""
    return STORE_HOST.check_output(
        f"curl -gs --resolve accelmon-store:8428:127.0.0.1 --cacert /etc/accelmon-store/tls/store.crt {arguments}"
    )


def test_store_services_run_unprivileged_and_hardened():
    for unit in ("accelmon-store.service", "accelmon-store-vmalert.service"):
        service = STORE_HOST.service(unit)
        assert service.is_running and service.is_enabled, unit
        properties = STORE_HOST.check_output(
            f"systemctl show {unit} -p DynamicUser -p ProtectSystem -p NoNewPrivileges"
        )
        assert "DynamicUser=yes" in properties and "ProtectSystem=strict" in properties, properties
        assert "NoNewPrivileges=yes" in properties, properties
        pid = STORE_HOST.check_output(f"systemctl show {unit} -p MainPID --value")
        assert STORE_HOST.check_output(f"stat -c %u /proc/{pid}") != "0", f"{unit} runs as root"
    # Data in the service's own state directory, which only its dynamic user reads.
    assert STORE_HOST.file("/var/lib/private/accelmon-store").mode & 0o077 == 0


def test_the_packages_own_service_never_runs():
    assert STORE_HOST.check_output("systemctl is-enabled victoria-metrics.service || true") == "masked"
    assert not STORE_HOST.service("victoria-metrics.service").is_running


def test_listening_only_where_asked():
    listening = STORE_HOST.check_output("ss -Hltnp")
    store = [line for line in listening.splitlines() if "victoria-metric" in line]
    vmalert = [line for line in listening.splitlines() if "vmalert" in line]
    assert store and all("0.0.0.0:8428" in line for line in store), listening  # the masters write to it
    assert vmalert and all("127.0.0.1:8880" in line for line in vmalert), listening  # its default: loopback


def test_admin_endpoints_need_the_root_only_key():
    key_file = STORE_HOST.file("/etc/accelmon-store/admin.env")
    assert key_file.user == "root" and key_file.mode == 0o600
    key = key_file.content_string.splitlines()[0].partition("=")[2]
    assert len(key) == 64
    unit = STORE_HOST.check_output("systemctl show accelmon-store.service -p ExecStart")
    assert key not in unit and key not in STORE_HOST.check_output("ps -eo args")
    user, password = store_credentials()

    def status(path):  # a client with the store's credentials, without the admin key
        return curl_store(f"-u {user}:{password} -o /dev/null -w '%{{http_code}}' '{STORE}{path}'")

    for path in ("/api/v1/admin/tsdb/delete_series?match[]=up", "/snapshot/create", "/internal/force_merge",
                 "/debug/pprof/", "/flags"):  # fmt: skip
        assert status(path) in ("400", "401"), path
    assert query(None, STORE, 'up{job="accelmon"}'), "nothing was deleted"
    # With the key, the operator can (a series that does not exist, so the data stays).
    assert status(f"/api/v1/admin/tsdb/delete_series?match[]=no_such&authKey={key}") == "204"


def test_the_store_answers_https_with_its_credentials_only():
    auth, key = STORE_HOST.file("/etc/accelmon-store/auth.env"), STORE_HOST.file("/etc/accelmon-store/tls/store.key")
    assert (auth.user, auth.mode) == ("root", 0o600)
    assert (key.user, key.group, key.mode) == ("root", "accelmon-store-tls", 0o640)
    # Only VictoriaMetrics joins the key's group; vmalert does not.
    for unit, groups in (("accelmon-store.service", "accelmon-store-tls"), ("accelmon-store-vmalert.service", "")):
        assert STORE_HOST.check_output(f"systemctl show -p SupplementaryGroups --value {unit}") == groups, unit
    user, password = store_credentials()
    assert (user, password) == ("fleet", "molecule-store-password-1")  # molecule.yml's, passed on verbatim
    commands = STORE_HOST.check_output(
        "systemctl show accelmon-store.service accelmon-store-vmalert.service -p ExecStart"
    )
    assert password not in commands and password not in STORE_HOST.check_output("ps -eo args")

    def status(arguments):
        return curl_store(f"-o /dev/null -w '%{{http_code}}' {arguments}")

    query_url = f"'{STORE}/api/v1/query?query=up'"
    assert status(query_url) == "401"
    assert status(f"-u {user}:wrong-password {query_url}") == "401"
    assert status(f"-X POST --data-binary '' {STORE}/api/v1/write") == "401"
    assert status(f"-u {user}:{password} {query_url}") == "200"
    # Plain HTTP on the same port is not served.
    assert STORE_HOST.run("curl -sf -m 5 'http://127.0.0.1:8428/api/v1/query?query=up'").rc != 0
    # Grafana's datasource on each master: the store's URL, its user and password, the test CA; Grafana's own
    # user reads it, nobody else.
    for master in MASTERS:
        datasource = grafana_datasource(master)
        assert datasource["url"] == STORE and datasource["basicAuthUser"] == "fleet"
        assert datasource["secureJsonData"]["basicAuthPassword"] == "molecule-store-password-1"
        assert "BEGIN CERTIFICATE" in datasource["secureJsonData"]["tlsCACert"]
        provisioned = master.file(DATASOURCE_FILE)
        grafana = "accelmon-grafana"
        assert (provisioned.user, provisioned.group, provisioned.mode) == (grafana, grafana, 0o400)


def test_both_replicas_scrape_every_worker():
    for master in MASTERS:
        active = json.loads(master.check_output(f"curl -sf {PROMETHEUS}/api/v1/targets?state=active"))
        targets = [t for t in active["data"]["activeTargets"] if t["labels"]["job"] in ("accelmon", "node")]
        assert {t["labels"]["node"] for t in targets} == WORKER_NODES, targets
        assert all(t["health"] == "up" for t in targets), targets


def test_a_job_runs_on_both_workers():
    """The Slurm prolog, run as slurmd runs it, so the job series and roll-ups have data for the tests below."""
    for worker in WORKERS:
        worker.check_output(
            "env SLURM_JOB_ID=100 SLURM_JOB_USER=alice SLURM_JOB_ACCOUNT=ml SLURM_JOB_GPUS=0,1 "
            "/etc/slurm/prolog.d/50-accelmon.sh"
        )
    info = wait_for(lambda: len(query(None, STORE, 'accelmon_gpu_job_info{job_id="100"}')) == 4)
    assert info, query(None, STORE, "accelmon_gpu_job_info")


def test_every_workers_series_is_in_the_store_exactly_once():
    for expr in ('up{job=~"accelmon|node"}', "accelmon_gpu_power_watts", "accelmon_infiniband_state_id",
                 "node:accelmon_gpu_power_watts:sum", "accelmon_gpu_job_info"):  # fmt: skip
        # What each replica holds, against what the store holds: the same series, none twice.
        held = [series(master, PROMETHEUS, expr) for master in MASTERS]
        assert held[0] and held[0] == held[1], expr
        in_store = series(None, STORE, expr, drop=("cluster",))  # the external label added on the way
        assert in_store == held[0], expr
        assert {r["metric"].get("cluster") for r in query(None, STORE, expr)} == {"molecule"}, expr
    assert not query(None, STORE, '{replica!=""}'), "the replica label is dropped on the way to the store"


def test_vmalert_evaluates_the_fleet_rules_over_the_whole_fleet():
    # Each worker has 7 answering GPUs of 8 (/etc/fake-nvml.conf loses GPU 5).
    assert query(None, STORE, "cluster:accelmon_gpus_up:sum")[0]["value"][1] == "14"
    assert query(None, STORE, "cluster:accelmon_gpus_lost:sum")[0]["value"][1] == "2"

    def gpus_per_job():
        return {r["metric"]["job_id"]: r["value"][1] for r in query(None, STORE, "job_id:accelmon_gpus:count")}

    # vmalert evaluates every 2 s: the roll-up counts both workers' info series one evaluation after they arrive.
    assert wait_for(lambda: gpus_per_job() == {"100": "4"}), gpus_per_job()

    # The ledger, written by both replicas of the pair: each GPU counted once (docs/ledger.md, "HA pairs"), the
    # states adding up to the 16 GPUs; unhealthy, each failing or lost GPU once (GPU 5, lost since the exporter
    # started, has no UUID on accelmon_gpu_up and the health check's UUID on its failure).
    def ledger():
        return {
            r["metric"]["state"]: int(r["value"][1]) for r in query(None, STORE, "cluster:accelmon_gpus_by_state:count")
        }

    assert wait_for(lambda: sum(ledger().values()) == 16), ledger()
    failing = query(None, STORE, "count by (node, gpu) (accelmon_gpu_health_check_state == 2 or accelmon_gpu_up == 0)")
    assert ledger()["unhealthy"] == len(failing) >= 2 and ledger()["unreachable"] == 0, (ledger(), failing)
    for master in MASTERS:  # the masters leave the fleet-wide rules to the store
        groups = json.loads(master.check_output(f"curl -sf {PROMETHEUS}/api/v1/rules"))["data"]["groups"]
        names = {r["name"] for g in groups for r in g["rules"]}
        assert "node:accelmon_gpu_power_watts:sum" in names
        assert not {n for n in names if n.startswith(("cluster:", "job_id:"))}, names


def test_grafana_reads_the_store_and_every_panel_has_data_there():
    # Asked from a master, through the datasource Grafana was given (URL, credentials, CA): the name resolves, the
    # certificate verifies and the store answers every panel's query there.
    entries = list(panel_queries())
    names = sorted({name for entry in entries for name in METRIC.findall(entry.expr)})
    exprs = [concrete(entry.expr) for entry in entries] + [f'count({{__name__="{name}"}})' for name in names]

    def missing_names():
        results = ask(MASTERS[0], STORE, [[expr, {}] for expr in exprs], grafana_datasource(MASTERS[0]))
        counts[:] = [len(result) for result in results]
        return [name for name, count in zip(names, counts[len(entries) :]) if not count]

    # Job 100 began when test_a_job_runs_on_both_workers ran its prolog: its cgroup series (read every 10 s) and the
    # roll-ups vmalert makes of them need a few evaluations to reach the store (a rate needs two samples).
    counts: list[int] = []
    wait_for(lambda: not missing_names(), timeout=120)
    missing = [name for name in missing_names() if name not in ONLY_WHILE]  # a healthy fleet may have none of these
    assert not missing, f"not in the store: {missing}"
    empty = [entry for entry, count in zip(entries, counts) if entry.expect_data and not count]
    assert not empty, f"panels without data from the store: {empty}"


def test_zz_stopping_a_replica_loses_no_samples():
    """The last test: it stops the second replica's Prometheus (the scenario's destroy follows)."""
    MASTERS[1].check_output("podman stop accelmon-prometheus")
    stopped = time.time()
    time.sleep(16)
    # 12 s after the stop, evaluated 4 s ago: remote_write (1 s batch deadline) has delivered all of it.
    at, window = stopped + 12, 11
    expr = f'count_over_time(up{{job="accelmon",node="accelmon-store-worker-1"}}[{window}s])'
    survivor = float(query(MASTERS[0], PROMETHEUS, expr, time=at)[0]["value"][1])
    in_store = float(query(None, STORE, expr, time=at)[0]["value"][1])
    assert survivor >= window / 2 - 1, (survivor, window)  # it scraped every 2 s
    assert in_store >= survivor - 1, (in_store, survivor)  # and all of it reached the store (the edge sample aside)
