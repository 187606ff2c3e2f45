"""The master preflight's warnings in the play's output (tasks/preflight.yml, run by deploy.yaml's preflight play on
every master before any host changes): each task run as written, on an inventory of local hosts, with the role's
defaults and vars, each host's own variables."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT
from tests.test_ansible import MASTER_ROLE, controller_env

pytestmark = pytest.mark.e2e

DIGEST = "@sha256:" + "0123456789abcdef" * 4


def local_hosts(hosts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each host's variables with a local connection and this Python."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    return {host: {**local, **variables} for host, variables in hosts.items()}


def run_preflight_task(work: Path, name: str, hosts: dict[str, dict[str, Any]], group_vars: dict[str, Any]) -> str:
    """The master preflight's task `name` run as written on `hosts` (group master; local connections): the output."""
    tasks = yaml.safe_load((MASTER_ROLE / "tasks" / "preflight.yml").read_text())
    task = next(t for t in tasks if t["name"] == name)
    # The role's defaults as role defaults are (the inventory's variables win), then its vars.
    play = [{"hosts": "master", "gather_facts": False,
             "vars_files": [str(MASTER_ROLE / "vars" / "main.yml")], "tasks": [task]}]  # fmt: skip
    (work / "play.yml").write_text(yaml.safe_dump(play))
    defaults = yaml.safe_load((MASTER_ROLE / "defaults" / "main.yml").read_text())
    masters = {"hosts": local_hosts(hosts), "vars": group_vars}
    inventory = {"all": {"vars": defaults, "children": {"master": masters}}}
    (work / "hosts.yml").write_text(yaml.safe_dump(inventory))
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(work / "hosts.yml"), str(work / "play.yml")],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env=controller_env(work),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    return result.stdout


def deploy_preflight(work: Path, hosts: dict[str, dict[str, Any]], group_vars: dict[str, Any]) -> str:
    """deploy.yaml --check with accelmon_deploy_preflight_only (its preflight play alone, no host changed) on `hosts`,
    masters all (local connections): the output."""
    masters = {"hosts": local_hosts(hosts), "vars": group_vars}
    inventory = {"all": {"children": {"master": masters, "worker": {"hosts": {}}, "store": {"hosts": {}}}}}
    (work / "hosts.yml").write_text(yaml.safe_dump(inventory))
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(work / "hosts.yml"), "--check",
         "-e", "accelmon_deploy_preflight_only=true", str(ROOT / "ansible" / "deploy.yaml")],
        capture_output=True, text=True, cwd=ROOT, timeout=600, env=controller_env(work),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    return result.stdout


def warnings_of(output: str, host: str) -> list[str]:
    """The [WARNING] messages the play printed for `host` (debug's msg), one line each."""
    messages = re.findall(rf'^ok: \[{re.escape(host)}\][^\n]* => {{\n\s+"msg": "([^\n]*)"\n}}$', output, re.M)
    return [m for m in messages if m.startswith("[WARNING]")]


def test_an_image_pinned_by_its_tag_alone_is_warned_unless_archived_or_built_here(tmp_path):
    """Prometheus's, Alertmanager's and Grafana's images given by a tag alone (grafana/grafana:11.6.0, which issue 66
    names as vulnerable) are each warned, naming the variable; a digest, an image loaded from an archive or built
    on the host (localhost/, the test clusters') are not, nor an image the master does not run."""
    tag_only = {
        "accelmon_master_prometheus_image": "docker.io/prom/prometheus:v2.55.1",
        "accelmon_master_alertmanager_image": "docker.io/prom/alertmanager:v0.27.0",
        "accelmon_master_grafana_image": "docker.io/grafana/grafana:11.6.0",
    }
    grafana = tag_only["accelmon_master_grafana_image"]
    archive = {"path": "/srv/offline/grafana.tar", "sha256": "0" * 64}
    hosts = {
        "defaults": {"accelmon_master_alertmanager_enabled": True},
        "tags": {**tag_only, "accelmon_master_alertmanager_enabled": True},
        "not-run": {**tag_only, "accelmon_master_grafana_enabled": False},  # Alertmanager off by default
        "digests": {name: image + DIGEST for name, image in tag_only.items()},
        "built-here": {"accelmon_master_grafana_image": "localhost/accelmon-grafana-fake:1.0"},
        "archived": {"accelmon_master_grafana_image": grafana, "accelmon_master_image_archives": {grafana: archive}},
        # An archive keyed by the image and a digest: the image loads from it all the same (vars/main.yml).
        "archived-digest": {
            "accelmon_master_grafana_image": grafana,
            "accelmon_master_image_archives": {grafana + DIGEST: archive},
        },
    }
    output = run_preflight_task(tmp_path, "Warn of an image pinned by its tag alone", hosts, {})
    warned = {host: warnings_of(output, host) for host in hosts}
    assert [len(warned["tags"])] == [3], output[-3000:]
    for name, image in tag_only.items():
        assert [w for w in warned["tags"] if f"{name}={image} is pinned by its tag alone" in w], warned["tags"]
    assert len(warned["not-run"]) == 1 and "accelmon_master_prometheus_image=" in warned["not-run"][0]
    assert all(m.startswith("[WARNING] tags: ") for m in warned["tags"])
    assert {host: w for host, w in warned.items() if host not in ("tags", "not-run") and w} == {}, output[-3000:]


def test_the_deploys_preflight_warns_of_an_image_pinned_by_its_tag_alone(tmp_path):
    """The warning is the preflight play's, on every run of deploy.yaml (the role's defaults, pinned by digest,
    print none)."""
    hosts = {"tags": {"accelmon_master_grafana_image": "docker.io/grafana/grafana:11.6.0"}, "defaults": {}}
    output = deploy_preflight(tmp_path, hosts, {})
    assert [w for w in warnings_of(output, "tags") if "accelmon_master_grafana_image=" in w], output[-3000:]
    assert warnings_of(output, "defaults") == [], output[-3000:]


PAIR = {"m1": {"accelmon_master_alertmanager_cluster_address": "10.0.0.1"},
        "m2": {"accelmon_master_alertmanager_cluster_address": "10.0.0.2"}}  # fmt: skip
OPEN_PAIR = "Warn that the HA pair's Alertmanager is open on the cluster address"


def test_an_ha_pairs_alertmanager_open_on_the_cluster_address_is_warned_with_the_rule_that_closes_it(tmp_path):
    """An HA pair's Alertmanagers (accelmon_master_replicas: 2) publish their API (plain HTTP, no password) and their
    gossip on the cluster address: each master's output says so, what is published where, and the firewall rule that
    keeps both ports to its partner (a rule nft takes, below)."""
    pair = {"accelmon_master_replicas": 2, "accelmon_master_alertmanager_enabled": True}
    output = run_preflight_task(tmp_path, OPEN_PAIR, PAIR, pair)
    for host, me, partner in (("m1", "10.0.0.1", "10.0.0.2"), ("m2", "10.0.0.2", "10.0.0.1")):
        [warning] = warnings_of(output, host)
        assert f"published on 127.0.0.1, {me} port 9093" in warning, warning
        assert "no password" in warning and f"gossip on {me} port 9094 TCP and UDP in clear" in warning, warning
        assert f"let only the partner ({partner}) reach them" in warning, warning
        assert (f"ip daddr {me} ip saddr != '{{ {partner} }}' meta l4proto '{{ tcp, udp }}' th dport '{{ 9093, 9094 }}'"
                " drop") in warning, warning  # fmt: skip
    # With the cluster's mutual TLS the gossip is TCP alone and authenticated; the API is as open.
    tls = {name: "x" for name in ("accelmon_master_alertmanager_cluster_tls_ca", "accelmon_master_alertmanager_"
                                  "cluster_tls_cert", "accelmon_master_alertmanager_cluster_tls_key")}  # fmt: skip
    [warning] = warnings_of(run_preflight_task(tmp_path, OPEN_PAIR, PAIR, {**pair, **tls}), "m1")
    assert "port 9094 TCP, mutual TLS" in warning and "in clear" not in warning, warning
    # Not a clustered pair: a single master, or a pair where one master alone runs Alertmanager.
    single = {"m1": {**PAIR["m1"], "accelmon_master_alertmanager_listen_address": "0.0.0.0"}}
    assert warnings_of(run_preflight_task(tmp_path, OPEN_PAIR, single, {"accelmon_master_alertmanager_enabled": True}),
                       "m1") == []  # fmt: skip
    half = {"m1": {**PAIR["m1"], "accelmon_master_alertmanager_enabled": True}, "m2": PAIR["m2"]}
    output = run_preflight_task(tmp_path, OPEN_PAIR, half, {"accelmon_master_replicas": 2})
    assert warnings_of(output, "m1") == warnings_of(output, "m2") == [], output[-3000:]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("unshare"),
                    reason="needs root, nft and unshare (a network namespace of its own)")  # fmt: skip
def test_the_pairs_firewall_rule_is_one_nft_takes(tmp_path):
    """The warning's commands, run as printed in a network namespace of their own, make the rule it names."""
    pair = {"accelmon_master_replicas": 2, "accelmon_master_alertmanager_enabled": True}
    [warning] = warnings_of(run_preflight_task(tmp_path, OPEN_PAIR, PAIR, pair), "m1")
    commands = re.search(r"on this master: (nft add table .*? drop) \(docs/security\.md", warning).group(1)
    result = subprocess.run(["unshare", "-n", "sh", "-ec", f"{commands}; nft list ruleset"], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "hook prerouting priority mangle" in result.stdout  # -150: before the engines' DNAT of published ports
    assert ("ip daddr 10.0.0.1 ip saddr != 10.0.0.2 meta l4proto { tcp, udp } th dport { 9093, 9094 } drop"
            in result.stdout), result.stdout  # fmt: skip


def test_the_deploys_preflight_warns_of_an_open_ha_pair_on_each_master(tmp_path):
    """The pair's warning is the preflight play's, once on each master, on every run of deploy.yaml."""
    pair = {"accelmon_master_replicas": 2, "accelmon_master_alertmanager_enabled": True}
    output = deploy_preflight(tmp_path, PAIR, pair)
    for host in PAIR:
        assert len([w for w in warnings_of(output, host) if "Alertmanager's API" in w]) == 1, output[-3000:]
