"""Verify a converged store: VictoriaMetrics and vmalert run as hardened, unprivileged services on the address
asked for, the package's own service never ran, and vmalert's fleet rules turn written samples into roll-ups."""

import json
import time

testinfra_hosts = ["podman://accelmon-store"]
STORE = "http://127.0.0.1:8428"


def query(host, expr):
    # latency_offset=0s: the newest samples too (VictoriaMetrics shows a sample 30 s after its time by default).
    answer = json.loads(
        host.check_output(f"curl -sf --get {STORE}/api/v1/query -d latency_offset=0s --data-urlencode 'query={expr}'")
    )
    assert answer["status"] == "success"
    return answer["data"]["result"]


def test_services_run_unprivileged_and_hardened(host):
    for unit in ("accelmon-store.service", "accelmon-store-vmalert.service"):
        service = host.service(unit)
        assert service.is_running and service.is_enabled, unit
        properties = host.check_output(f"systemctl show {unit} -p DynamicUser -p ProtectSystem -p NoNewPrivileges")
        assert "DynamicUser=yes" in properties and "ProtectSystem=strict" in properties, properties
        assert "NoNewPrivileges=yes" in properties, properties
        pid = host.check_output(f"systemctl show {unit} -p MainPID --value")
        assert host.check_output(f"stat -c %u /proc/{pid}") != "0", f"{unit} runs as root"
    # Data in the service's own state directory, which only its dynamic user reads.
    assert host.file("/var/lib/private/accelmon-store").mode & 0o077 == 0


def test_the_packages_own_service_never_runs(host):
    assert host.check_output("systemctl is-enabled victoria-metrics.service || true") == "masked"
    assert not host.service("victoria-metrics.service").is_running


def test_listening_only_where_asked(host):
    listening = host.check_output("ss -Hltnp")
    store = [line for line in listening.splitlines() if "victoria-metric" in line]
    vmalert = [line for line in listening.splitlines() if "vmalert" in line]
    assert store and all("127.0.0.1:8428" in line for line in store), listening
    assert vmalert and all("127.0.0.1:8880" in line for line in vmalert), listening


def test_vmalert_rolls_up_written_samples(host):
    # Two workers' GPUs as a master's remote_write would send them (here through the import API, which takes the
    # text format): 3 answering GPUs and a lost one.
    now = int(time.time() * 1000)
    lines = [
        f'accelmon_gpu_up{{job="accelmon",node="gpu-node-{n}",instance="gpu-node-{n}:19470",gpu="{g}"}} {v} {now}'
        for n, g, v in ((1, 0, 1), (1, 1, 1), (2, 0, 1), (2, 1, 0))
    ]
    payload = "\\n".join(lines)
    for _ in range(30):  # bounded: vmalert evaluates every 2 s and writes back
        host.check_output(f"printf '{payload}\\n' | curl -sf --data-binary @- {STORE}/api/v1/import/prometheus")
        up = query(host, "cluster:accelmon_gpus_up:sum")
        lost = query(host, "cluster:accelmon_gpus_lost:sum")
        if up and lost and up[0]["value"][1] == "3" and lost[0]["value"][1] == "1":
            break
        time.sleep(2)
    else:
        raise AssertionError(f"no roll-ups from vmalert: {up} {lost}")
    groups = json.loads(host.check_output("curl -sf http://127.0.0.1:8880/api/v1/rules"))["data"]["groups"]
    assert {g["name"] for g in groups} == {"accelmon-fleet-rollups", "accelmon-jobs"}


def test_samples_survive_a_restart(host):
    expr = 'count(last_over_time(accelmon_gpu_up{node="gpu-node-1"}[1h]))'
    assert query(host, expr)[0]["value"][1] == "2"  # the two GPUs the test above wrote
    host.check_output("systemctl restart accelmon-store.service")
    for _ in range(30):  # bounded
        if host.run(f"curl -sf {STORE}/health").rc == 0:
            break
        time.sleep(1)
    assert query(host, expr)[0]["value"][1] == "2"
