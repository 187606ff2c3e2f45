"""The whole pipeline: workers' exporters scraped by the master's Prometheus; then the operator's day two
(a masters-only redeploy, remove.yaml, a redeploy) keeps the metrics gathered before."""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import testinfra

ROOT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "molecule" / "shared"))
from check_cluster import wait_until_whole  # noqa: E402
from verify import wait_for  # noqa: E402

CLUSTER = os.environ.get("ACCELMON_CLUSTER", "accelmon-cluster")  # the prefix molecule.yml names the hosts by
testinfra_hosts = [f"podman://{CLUSTER}-master"]
WORKERS = {f"{CLUSTER}-worker-1", f"{CLUSTER}-worker-2"}


def query(host, path):
    return json.loads(host.check_output(f"curl -sf 'http://127.0.0.1:9090{path}'"))["data"]


def playbook(name, *extra):
    command = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        os.environ["MOLECULE_INVENTORY_FILE"],
        str(ROOT / "ansible" / name),
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    return result.stdout


def up_workers(host):
    targets = query(host, "/api/v1/targets")["activeTargets"]
    return {t["labels"]["node"] for t in targets if t["labels"]["job"] == "accelmon" and t["health"] == "up"}


def test_every_worker_is_scraped_with_its_gpus(host):
    # Each down target with Prometheus's lastError, each worker missing a kind of series: the why, not a set().
    problems = wait_until_whole(lambda path: query(host, path), timeout=120)
    assert not problems, "the cluster is not whole:\n" + "\n".join(problems)
    assert up_workers(host) == WORKERS
    gpus = wait_for(lambda: query(host, "/api/v1/query?query=count%20by%20(node)%20(accelmon_gpu_up)")["result"])
    assert {r["metric"]["node"]: r["value"][1] for r in gpus} == {w: "8" for w in WORKERS}
    lost = query(host, "/api/v1/query?query=accelmon_gpu_up%3D%3D0")["result"]
    assert sorted((r["metric"]["node"], r["metric"]["gpu"]) for r in lost) == sorted((w, "5") for w in WORKERS)
    ports = query(host, "/api/v1/query?query=count%20by%20(node)%20(accelmon_infiniband_state_id)")["result"]
    assert {r["metric"]["node"]: r["value"][1] for r in ports} == {w: "4" for w in WORKERS}
    cores = wait_for(
        lambda: query(host, "/api/v1/query?query=count%20by%20(node)%20(accelmon_neuroncore_utilization_ratio)")[
            "result"
        ]
    )
    assert {r["metric"]["node"]: r["value"][1] for r in cores} == {w: "4" for w in WORKERS}  # 2 runtimes x 2 cores
    nodes = query(host, "/api/v1/targets")["activeTargets"]
    assert {t["labels"]["node"] for t in nodes if t["labels"]["job"] == "node" and t["health"] == "up"} == WORKERS


def test_exporters_answer_only_over_mutual_tls_with_the_password(host):
    """The scrapes above went over mutual TLS with basic auth; here each piece is taken away in turn."""
    secrets = "/opt/accelmon-master/prometheus/secrets"
    worker = sorted(WORKERS)[0]
    url = f"https://{worker}:19470/metrics"
    tls = f"--cacert {secrets}/exporter-ca.crt --cert {secrets}/client.crt --key {secrets}/client.key"
    auth = f"-u prometheus:$(cat {secrets}/exporter-password)"

    def status(options, target=url):
        return host.run(f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 {options} {target}").stdout

    assert status(f"{tls} {auth}") == "200"
    assert status(tls) == "401"  # no password
    assert status(f"--cacert {secrets}/exporter-ca.crt {auth}") == "000"  # no client certificate: no handshake
    assert status(auth, f"http://{worker}:19470/metrics") == "000"  # plain HTTP


def published_prometheus() -> str:
    """The master's Prometheus as the host reaches it (a port published on its loopback)."""
    published = subprocess.run(
        ["podman", "port", f"{CLUSTER}-master", "9090/tcp"], capture_output=True, text=True, check=True
    ).stdout.split()
    return f"http://{published[0]}"


def minor_to_uuid(worker) -> dict[str, str]:
    """The driver's own map (procfs `information` files) from device minor, Slurm's GPU index, to UUID."""
    text = worker.check_output("cat /opt/fake-proc/driver/nvidia/gpus/*/information")
    uuids = re.findall(r"GPU UUID:\s*(\S+)", text)
    minors = re.findall(r"Device Minor:\s*(\d+)", text)
    return dict(zip(minors, uuids))


def test_a_slurm_job_is_attributed_while_it_runs_and_reported_after(host, tmp_path):
    """A real Slurm job asks for 2 GPUs on each of 2 nodes: its GPUs carry its job id in Prometheus while it runs
    (by UUID: Slurm's indices are device minors, out of NVML's order here), none after, and accelmon-report finds
    its nodes, GPUs, window and energy."""
    controller = testinfra.get_host(f"podman://{CLUSTER}-worker-1")
    job = controller.check_output(
        "su alice -c 'sbatch --parsable --chdir=/tmp --nodes=2 --gres=gpu:2 --wrap \"srun sleep 30\"'"
    ).strip()
    attributed = f"/api/v1/query?query=accelmon_gpu_job_info%7Bjob_id%3D%22{job}%22%7D"
    series = wait_for(lambda: len(query(host, attributed)["result"]) == 4 and query(host, attributed)["result"])
    assert series, controller.check_output(f"scontrol show job {job}")
    for worker in WORKERS:
        expected = minor_to_uuid(testinfra.get_host(f"podman://{worker}"))
        held = {r["metric"]["uuid"] for r in series if r["metric"]["node"] == worker}
        assert held == {expected["0"], expected["1"]}, (worker, held, expected)
    assert {r["metric"]["user"] for r in series} == {"alice"}
    # When the job ends the epilog removes its record, and the series go stale.
    assert wait_for(lambda: not query(host, attributed)["result"], timeout=120), "still attributed after the job"
    out = tmp_path / "report"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "accelmon-report"), job, "--prometheus", published_prometheus(),
         "--out", str(out), "--lookback", "1h"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["nodes"]) == sorted(WORKERS) and summary["user"] == "alice"
    assert len(summary["gpus"]) == 4
    assert 20 <= summary["duration_seconds"] <= 60, summary["duration_seconds"]  # `sleep 30`, seen every 2 s
    for gpu in summary["gpus"]:  # the fake driver's energy counters grow by its power draw
        expected_joules = gpu["power_mean_watts"] * summary["duration_seconds"]
        assert abs(gpu["energy_joules"] - expected_joules) <= gpu["power_mean_watts"] * 6, (gpu, expected_joules)
    assert (out / "report.html").stat().st_size > 10_000 and (out / "report.pdf").exists()


def test_day_two_keeps_the_metrics(host):
    wait_for(lambda: up_workers(host) == WORKERS)
    time.sleep(5)
    now = time.time()
    at = f"/api/v1/query?query=accelmon_gpu_power_watts%7Bgpu%3D%221%22%7D&time={now:.3f}"
    before = query(host, at)["result"]
    assert len(before) == 2

    recap = playbook("deploy.yaml", "-e", "skip_worker=true")
    assert "changed=0" in recap.split("PLAY RECAP")[-1]
    # --check --diff on the deployed cluster: runs through, and would change nothing.
    recap = playbook("deploy.yaml", "--check", "--diff").split("PLAY RECAP")[-1]
    assert recap.count("changed=0") == 3 and "failed=0" in recap

    playbook("remove.yaml")
    assert host.run("podman container exists accelmon-prometheus").rc != 0
    assert host.run("podman volume exists accelmon-prometheus-data").rc == 0  # data kept

    playbook("deploy.yaml")
    problems = wait_until_whole(lambda path: query(host, path), timeout=120)
    assert not problems, "the cluster is not whole after a redeploy:\n" + "\n".join(problems)
    after = wait_for(lambda: query(host, at)["result"])
    assert {r["metric"]["node"] for r in after} == WORKERS
    assert [r["value"][1] for r in after] == [r["value"][1] for r in before]


def test_prometheus_is_published_on_the_host_loopback_only():
    """The demo tells users to open http://127.0.0.1:9090: the master's Prometheus is published there, and on
    loopback only (the tests take a free port instead, so a running demo keeps its own)."""
    published = subprocess.run(
        ["podman", "port", f"{CLUSTER}-master", "9090/tcp"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(published) == 1 and published[0].startswith("127.0.0.1:"), published
    with urllib.request.urlopen(f"http://{published[0]}/-/ready", timeout=10) as response:
        assert response.status == 200
