"""The Molecule scenarios, each a full create/converge/idempotence/verify/destroy on podman systemd hosts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.support.ansible import render_role_template
from tests.support.paths import ROOT
from tests.support.processes import free_port

IMAGES = ROOT / "molecule" / "images"
SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


def molecule_env() -> dict[str, str]:
    env = dict(os.environ)
    # The demo's names and state (scripts/demo.sh) never leak into the suite's own cluster.
    for name in ("ACCELMON_CLUSTER", "ACCELMON_CLUSTER_PROMETHEUS_PORT", "MOLECULE_EPHEMERAL_DIRECTORY"):
        env.pop(name, None)
    env["CONTAINERS_CONF"] = str(IMAGES / "containers.conf")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["NO_COLOR"] = "1"
    return env


@pytest.fixture(scope="session")
def images() -> None:
    result = subprocess.run(["bash", str(IMAGES / "build.sh")], env=molecule_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.molecule
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario: str, images: None, tmp_path: Path) -> None:
    started = time.monotonic()
    log = tmp_path / f"molecule-{scenario}.log"
    with log.open("w") as output:
        result = subprocess.run(
            [sys.executable, "-m", "molecule", "test", "-s", scenario],
            cwd=ROOT,
            env=molecule_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    print(f"molecule scenario {scenario}: {time.monotonic() - started:.0f} s")
    assert result.returncode == 0, f"molecule test -s {scenario} failed:\n" + log.read_text()[-8000:]


def render_compose(tmp_path: Path, prometheus_port: int, alertmanager_port: int) -> Path:
    """The master role's compose template, rendered by Ansible with the role's defaults and local images."""
    master_dir = tmp_path / "master"
    variables = {
        "accelmon_master_dir": str(master_dir),
        "accelmon_master_network": "accelmon-composetest",
        "accelmon_master_prometheus_image": "localhost/accelmon-prometheus:2.42.0",
        "accelmon_master_prometheus_port": prometheus_port,
        "accelmon_master_grafana_enabled": False,  # no Grafana image can reach this machine
        "accelmon_master_alertmanager_enabled": True,
        "accelmon_master_alertmanager_image": "localhost/accelmon-alertmanager:0.25.0",
        "accelmon_master_alertmanager_port": alertmanager_port,
    }
    (master_dir / "prometheus" / "targets").mkdir(parents=True)
    shutil.copytree(ROOT / "master" / "prometheus" / "rules", master_dir / "prometheus" / "rules")
    (master_dir / "prometheus" / "prometheus.yml").write_text(
        "rule_files: [/etc/prometheus/rules/*.yml]\n"
        "alerting: {alertmanagers: [{static_configs: [{targets: ['accelmon-composetest-alertmanager:9093']}]}]}\n"
    )
    (master_dir / "alertmanager").mkdir()
    (master_dir / "alertmanager" / "alertmanager.yml").write_text("route: {receiver: x}\nreceivers: [{name: x}]\n")
    render_role_template("accelmon_master", "compose.yaml.j2", master_dir / "compose.yaml", variables)
    return master_dir / "compose.yaml"


def give_volumes_to_their_users(env: dict[str, str], uids: dict[str, int]) -> None:
    """What the role's tasks/own-data.yml does once the containers run: each new data volume, which the engine gave
    the image's owner of the mount point (nobody) at the first mount, is given to its service's own uid and the
    container restarted (rootless, in podman's user namespace)."""
    for service, uid in uids.items():
        inspect = ["podman", "volume", "inspect", "--format", "{{.Mountpoint}}", f"accelmon-composetest-{service}-data"]
        mountpoint = subprocess.run(inspect, capture_output=True, text=True, env=env, check=True).stdout.strip()
        chown = ["chown", "-R", f"{uid}:{uid}", mountpoint]
        subprocess.run(chown if os.geteuid() == 0 else ["podman", "unshare", *chown], env=env, check=True)
        restart = ["podman", "restart", f"accelmon-composetest-{service}"]
        subprocess.run(restart, capture_output=True, env=env, check=True, timeout=120)


def wait_ready(url: str) -> None:
    for _ in range(60):
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} never answered")


@pytest.mark.molecule
def test_compose_file_runs_with_podman_compose(images: None, tmp_path: Path) -> None:
    """The one container definition, run by a compose implementation as it is: the services start hardened,
    publish on loopback only, and Prometheus loads the master's rules and finds Alertmanager by name."""
    prometheus_port, alertmanager_port = free_port(), free_port()
    compose = render_compose(tmp_path, prometheus_port, alertmanager_port)
    definition = yaml.safe_load(compose.read_text())
    assert set(definition["services"]) == {"prometheus", "alertmanager"}
    # Names of the test's own, so that it can never touch a real master's containers or data on this machine.
    text = compose.read_text().replace("name: accelmon\n", "name: accelmon-composetest\n")
    compose.write_text(re.sub(r"(?<!/)accelmon-(prometheus|alertmanager|grafana)", r"accelmon-composetest-\1", text))
    podman_compose = [str(Path(sys.executable).parent / "podman-compose"), "-f", str(compose)]
    env = molecule_env()
    try:
        up = subprocess.run([*podman_compose, "up", "-d"], capture_output=True, text=True, env=env, timeout=300)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        give_volumes_to_their_users(env, {"prometheus": 60090, "alertmanager": 60093})
        wait_ready(f"http://127.0.0.1:{prometheus_port}/-/ready")
        wait_ready(f"http://127.0.0.1:{alertmanager_port}/-/ready")
        with urllib.request.urlopen(f"http://127.0.0.1:{prometheus_port}/api/v1/rules", timeout=5) as response:
            groups = json.load(response)["data"]["groups"]
        assert {rule["name"] for group in groups for rule in group["rules"]} >= {"AccelmonExporterDown"}
        for _ in range(30):
            with urllib.request.urlopen(f"http://127.0.0.1:{prometheus_port}/api/v1/alertmanagers", timeout=5) as r:
                if json.load(r)["data"]["activeAlertmanagers"]:
                    break
            time.sleep(1)
        else:
            raise AssertionError("Prometheus never found Alertmanager by its container name")
        inspect = subprocess.run(
            ["podman", "inspect", "accelmon-composetest-prometheus"], capture_output=True, text=True, env=env
        )
        config = json.loads(inspect.stdout)[0]
        assert config["HostConfig"]["ReadonlyRootfs"] is True
        assert config["Config"]["User"] == "60090:60090"
        assert "no-new-privileges" in config["HostConfig"]["SecurityOpt"]
        assert config["HostConfig"]["CapAdd"] in (None, [])
        bindings = config["HostConfig"]["PortBindings"]["9090/tcp"]
        assert [b["HostIp"] for b in bindings] == ["127.0.0.1"]
    finally:
        subprocess.run([*podman_compose, "down", "-v"], capture_output=True, env=env, timeout=300, check=False)


def test_the_offline_recipe_is_what_the_store_scenario_runs() -> None:
    """docs/deploying.md's "Offline, end to end" and the store scenario (issue 65): every variable the recipe sets
    for a group the scenario sets for that group, from its bundle in the same way (the sha256 files beside the
    files), which its prepare makes with the recipe's commands."""
    doc = (ROOT / "docs" / "deploying.md").read_text()
    section = doc[doc.index("**Offline, end to end.**") :]
    commands = section[section.index("```sh\n") + 6 : section.index("```\n", section.index("```sh\n") + 6)]
    block = section[section.index("```yaml\n") + 8 : section.index("```\n", section.index("```yaml\n") + 8)]
    # The recipe's comments name each variable's group: "# group_vars/GROUP.yml".
    recipe: dict[str, dict[str, object]] = {}
    for chunk in re.split(r"^# group_vars/", block, flags=re.M)[1:]:
        group, _, body = chunk.partition(".yml")
        recipe[group] = yaml.safe_load(body.partition("\n")[2])
    scenario = yaml.safe_load((ROOT / "molecule" / "store" / "molecule.yml").read_text())["provisioner"]["inventory"]
    assert set(recipe) == {"all", "worker", "store", "master"}
    for group, variables in recipe.items():
        for name, value in variables.items():
            if name == "accelmon_exporter_wheelhouse_dir":  # per worker there (one Python, each worker's extras)
                assert all("wheelhouse" in str(v.get(name, "wheelhouse")) for v in scenario["host_vars"].values())
                assert "wheelhouse" in scenario["group_vars"]["scraped_worker"][name]
                continue
            given = scenario["group_vars"][group][name]
            if name == "offline":
                assert given.endswith("/offline"), given
            elif name == "accelmon_master_image_archives":
                assert all(set(entry) == {"path", "sha256"} for entry in given.values())
                assert sorted(str(entry) for entry in value.values()) == sorted(str(entry) for entry in given.values())
            elif name.endswith("_sha256"):
                assert given.strip() == value, name  # read from the .sha256 file beside the file
            else:
                assert re.sub(r"[0-9.]+[.]linux", "V.linux", given) == re.sub(r"[0-9.]+[.]linux", "V.linux", value)
    prepare = (ROOT / "molecule" / "store" / "prepare.yml").read_text()
    for command in ("podman, save", "apt-get, download", 'sha256sum "$file" | cut -d\' \' -f1 > "$file.sha256"'):
        assert command.replace(", ", " ") in commands and command in prepare, command
