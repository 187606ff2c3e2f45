"""Verify the HA fleet and its store: VictoriaMetrics and vmalert run as hardened, unprivileged services where asked,
both replicas scrape every worker, every worker's series is in the store once (no replica label, deduplicated),
vmalert evaluates the fleet-wide rules over the whole fleet, Grafana's datasource is the store and every dashboard
panel has data there, and stopping a replica loses no sample."""

import base64
import json
import sys
import time
from pathlib import Path

import testinfra

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "master" / "grafana"))
sys.path.insert(0, str(ROOT / "molecule" / "shared"))
from contract import METRIC, concrete, panel_queries  # noqa: E402
from verify import wait_for  # noqa: E402

testinfra_hosts = ["podman://accelmon-store"]
STORE_HOST = testinfra.get_host("podman://accelmon-store")
MASTERS = [testinfra.get_host(f"podman://accelmon-store-master-{r}") for r in ("a", "b")]
WORKERS = [testinfra.get_host(f"podman://accelmon-store-worker-{n}") for n in (1, 2)]
WORKER_NODES = {"accelmon-store-worker-1", "accelmon-store-worker-2"}
STORE = "http://127.0.0.1:8428"  # asked from the store host
PROMETHEUS = "http://127.0.0.1:9090"  # asked from a master
DATASOURCE = "http://accelmon-store:8428"  # the scenario's accelmon_master_query_url

# Asks a Prometheus-compatible API many instant queries in one process on a host (argv: base URL, then the
# queries as base64 JSON) and prints, for each, how many series answered.
ASK_ALL = """
import base64, json, sys, urllib.parse, urllib.request
counts = []
for expr in json.loads(base64.b64decode(sys.argv[2])):
    url = sys.argv[1] + "/api/v1/query?" + urllib.parse.urlencode({"query": expr, "latency_offset": "0s"})
    with urllib.request.urlopen(url, timeout=30) as answer:
        counts.append(len(json.load(answer)["data"]["result"]))
print(json.dumps(counts))
"""


def query(host, base, expr, **params):
    # latency_offset=0s: VictoriaMetrics shows a sample 30 s after its time by default; Prometheus ignores it.
    arguments = " ".join(f"-d {name}={value}" for name, value in {"latency_offset": "0s", **params}.items())
    answer = json.loads(
        host.check_output(f"curl -sf --get {base}/api/v1/query {arguments} --data-urlencode 'query={expr}'")
    )
    assert answer["status"] == "success"
    return answer["data"]["result"]


def series(host, base, expr, drop=()):
    """The label sets of `expr`'s series, without the labels in `drop`, sorted (duplicates kept)."""
    result = query(host, base, expr)
    return sorted(tuple(sorted((k, v) for k, v in r["metric"].items() if k not in drop)) for r in result)


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

    def status(path):
        return STORE_HOST.check_output(f"curl -gs -o /dev/null -w '%{{http_code}}' '{STORE}{path}'")

    for path in ("/api/v1/admin/tsdb/delete_series?match[]=up", "/snapshot/create", "/internal/force_merge",
                 "/debug/pprof/", "/flags"):  # fmt: skip
        assert status(path) in ("400", "401"), path
    assert query(STORE_HOST, STORE, 'up{job="accelmon"}'), "nothing was deleted"
    # With the key, the operator can (a series that does not exist, so the data stays).
    assert status(f"/api/v1/admin/tsdb/delete_series?match[]=no_such&authKey={key}") == "204"


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
    info = wait_for(lambda: len(query(STORE_HOST, STORE, 'accelmon_gpu_job_info{job_id="100"}')) == 4)
    assert info, query(STORE_HOST, STORE, "accelmon_gpu_job_info")


def test_every_workers_series_is_in_the_store_exactly_once():
    for expr in ('up{job=~"accelmon|node"}', "accelmon_gpu_power_watts", "accelmon_infiniband_state_id",
                 "node:accelmon_gpu_power_watts:sum", "accelmon_gpu_job_info"):  # fmt: skip
        # What each replica holds, against what the store holds: the same series, none twice.
        held = [series(master, PROMETHEUS, expr) for master in MASTERS]
        assert held[0] and held[0] == held[1], expr
        in_store = series(STORE_HOST, STORE, expr, drop=("cluster",))  # the external label added on the way
        assert in_store == held[0], expr
        assert {r["metric"].get("cluster") for r in query(STORE_HOST, STORE, expr)} == {"molecule"}, expr
    assert not query(STORE_HOST, STORE, '{replica!=""}'), "the replica label is dropped on the way to the store"


def test_vmalert_evaluates_the_fleet_rules_over_the_whole_fleet():
    # Each worker has 7 answering GPUs of 8 (/etc/fake-nvml.conf loses GPU 5).
    assert query(STORE_HOST, STORE, "cluster:accelmon_gpus_up:sum")[0]["value"][1] == "14"
    assert query(STORE_HOST, STORE, "cluster:accelmon_gpus_lost:sum")[0]["value"][1] == "2"

    def gpus_per_job():
        return {r["metric"]["job_id"]: r["value"][1] for r in query(STORE_HOST, STORE, "job_id:accelmon_gpus:count")}

    # vmalert evaluates every 2 s: the roll-up counts both workers' info series one evaluation after they arrive.
    assert wait_for(lambda: gpus_per_job() == {"100": "4"}), gpus_per_job()
    for master in MASTERS:  # the masters leave the fleet-wide rules to the store
        groups = json.loads(master.check_output(f"curl -sf {PROMETHEUS}/api/v1/rules"))["data"]["groups"]
        names = {r["name"] for g in groups for r in g["rules"]}
        assert "node:accelmon_gpu_power_watts:sum" in names
        assert not {n for n in names if n.startswith(("cluster:", "job_id:"))}, names


def test_grafana_reads_the_store_and_every_panel_has_data_there():
    for master in MASTERS:
        inspect = json.loads(master.check_output("podman inspect accelmon-grafana"))[0]
        assert f"PROMETHEUS_URL={DATASOURCE}" in inspect["Config"]["Env"]
    # Asked from a master, through the datasource's own URL: the name resolves and the store answers there.
    entries = list(panel_queries())
    names = sorted({name for entry in entries for name in METRIC.findall(entry.expr)})
    exprs = [concrete(entry.expr) for entry in entries] + [f'count({{__name__="{name}"}})' for name in names]
    encoded = base64.b64encode(json.dumps(exprs).encode()).decode()
    counts = json.loads(MASTERS[0].check_output(f"python3 -c '{ASK_ALL}' {DATASOURCE} {encoded}"))
    missing = [name for name, count in zip(names, counts[len(entries) :]) if not count]
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
    in_store = float(query(STORE_HOST, STORE, expr, time=at)[0]["value"][1])
    assert survivor >= window / 2 - 1, (survivor, window)  # it scraped every 2 s
    assert in_store >= survivor - 1, (in_store, survivor)  # and all of it reached the store (the edge sample aside)
