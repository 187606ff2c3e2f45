"""The whole pipeline: workers' exporters scraped by the master's Prometheus; then the operator's day two
(a masters-only redeploy, remove.yaml, a redeploy) keeps the metrics gathered before."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

testinfra_hosts = ["podman://accelmon-cluster-master"]
ROOT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
WORKERS = {"accelmon-cluster-worker-1", "accelmon-cluster-worker-2"}


def query(host, path):
    return json.loads(host.check_output(f"curl -sf 'http://127.0.0.1:9090{path}'"))["data"]


def wait_for(check, timeout=90):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(2)


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
    assert wait_for(lambda: up_workers(host) == WORKERS), up_workers(host)
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
    assert wait_for(lambda: up_workers(host) == WORKERS), up_workers(host)
    after = wait_for(lambda: query(host, at)["result"])
    assert {r["metric"]["node"] for r in after} == WORKERS
    assert [r["value"][1] for r in after] == [r["value"][1] for r in before]
