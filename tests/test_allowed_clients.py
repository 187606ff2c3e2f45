"""Issue 66: only the masters reach the workers' exporters by default. The exporter's allow-list and node_exporter's
systemd IP filter carry the addresses of the inventory's masters (by ansible_host where it is an IP address, else
as the worker resolves the name), taken from the whole inventory whatever --limit leaves, plus the worker's own
loopback; a master no worker can resolve stops the deploy in its preflight, before any host changes."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelmon.config import load
from tests.support.paths import ROOT

ROLES = ROOT / "ansible" / "roles"
FILTER_CHECK = ROLES / "accelmon_node_exporter" / "files" / "ip_filter_check.py"

# What the workers' resolver answers (a fake getent, as glibc's prints `getent ahosts`): a name with two addresses,
# IPv4 and IPv6, and another with one. IP addresses answer themselves, as glibc's do; any other name has none.
NAMES = {"prom-a.cluster": ["198.51.100.4", "2001:db8::4"], "prom-b": ["198.51.100.5"]}
# Each worker reads another group of masters (accelmon_exporter_scraper_group); `master` is the default's.
MASTERS = {
    "master": {"m-ip": {"ansible_host": "192.0.2.7"}, "prom-b": {}},  # two: one by IP, one by its inventory name
    "by_ip": {"m-ip": {"ansible_host": "192.0.2.7"}},
    "by_name": {"m-name": {"ansible_host": "prom-a.cluster"}},
    "by_ipv6": {"m-v6": {"ansible_host": "[2001:db8::9]"}},
}
LOOPBACK = ["127.0.0.1"]  # the exporter's, for its listen address :19470 (the deploy's check scrapes from it)
# worker -> (its variables, the exporter's allow-list, node_exporter's IPAddressAllow= beside localhost)
WORKERS: dict[str, tuple[dict[str, Any], list[str], list[str]]] = {
    "w-two": ({}, ["192.0.2.7", "198.51.100.5", *LOOPBACK], ["192.0.2.7", "198.51.100.5"]),
    "w-ip": ({"accelmon_exporter_scraper_group": "by_ip"}, ["192.0.2.7", *LOOPBACK], ["192.0.2.7"]),
    "w-name": (
        {"accelmon_exporter_scraper_group": "by_name"},
        ["198.51.100.4", "2001:db8::4", *LOOPBACK],
        ["198.51.100.4", "2001:db8::4"],
    ),
    "w-v6": ({"accelmon_exporter_scraper_group": "by_ipv6"}, ["2001:db8::9", *LOOPBACK], ["2001:db8::9"]),
    # A remote Prometheus added by the operator, and the exporter bound to one IPv6 address (its own traffic).
    "w-more": (
        {
            "accelmon_exporter_allowed_clients": ["203.0.113.0/24"],
            "accelmon_exporter_listen_address": "[fd00::3]:19470",
        },
        ["192.0.2.7", "198.51.100.5", "203.0.113.0/24", "fd00::3"],
        ["192.0.2.7", "198.51.100.5", "203.0.113.0/24"],
    ),
    # The behaviour before issue 66, asked for explicitly.
    "w-open": (
        {"accelmon_exporter_allowed_clients": ["0.0.0.0/0", "::/0"]},
        ["192.0.2.7", "198.51.100.5", "0.0.0.0/0", "::/0", *LOOPBACK],
        ["0.0.0.0/0", "192.0.2.7", "198.51.100.5", "::/0"],
    ),
}


def fake_getent(directory: Path) -> Path:
    """A getent answering `ahosts` from NAMES as glibc's does (each address on three lines: STREAM, DGRAM, RAW;
    exit 2 for a name with none); anything else goes to the real one."""
    directory.mkdir(exist_ok=True)
    cases = "".join(f"  {name}) set -- {' '.join(addresses)} ;;\n" for name, addresses in NAMES.items())
    script = directory / "getent"
    script.write_text(
        '#!/bin/sh\n[ "$1" = ahosts ] || exec /usr/bin/getent "$@"\ncase "$2" in\n'
        f'{cases}  *[!0-9a-fA-F.:]*) exit 2 ;;\n  *) set -- "$2" ;;\nesac\n'
        'for a; do printf \'%-15s STREAM x\\n%-15s DGRAM\\n%-15s RAW\\n\' "$a" "$a" "$a"; done\n'
    )
    script.chmod(0o755)
    return directory


def inventory(work: Path, masters: dict[str, dict[str, Any]], workers: dict[str, dict[str, Any]]) -> Path:
    """Masters never connected to (only the workers are in the plays), workers this machine by a local connection."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    children = {group: {"hosts": hosts} for group, hosts in masters.items()}
    children["worker"] = {"hosts": {name: {**local, **variables} for name, variables in workers.items()}}
    children.setdefault("store", {"hosts": {}})
    path = work / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": children}}))
    return path


def ansible_playbook(work: Path, hosts: Path, playbook: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (work / "home").mkdir(exist_ok=True)
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1", "HOME": str(work / "home"),
           "ANSIBLE_ROLES_PATH": str(ROLES), "PATH": f"{fake_getent(work / 'bin')}:{os.environ['PATH']}"}  # fmt: skip
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(hosts), str(playbook), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env, timeout=600,
    )  # fmt: skip


def networks(values: list[str]) -> set[Any]:
    return {ipaddress.ip_network(value) for value in values}


@pytest.mark.e2e
def test_the_exporters_let_in_the_masters_of_the_whole_inventory_and_the_loopback(tmp_path):
    """The roles' own tasks (tasks/scrapers.yml) and templates, on workers whose masters are not in the play (as
    with --limit): by IP, by a name the worker resolves (IPv4 and IPv6), two masters, an IPv6 ansible_host, the
    operator's additions, and the old open behaviour asked for. Before, the exporter's config had no allow-list
    (anyone) and node_exporter's unit no IP filter."""
    node = ROLES / "accelmon_node_exporter"
    out = str(tmp_path / "{{ inventory_hostname }}")
    play = [{
        "hosts": "worker", "gather_facts": False,
        "tasks": [
            {"ansible.builtin.include_role": {"name": "accelmon_exporter", "tasks_from": "scrapers.yml",
                                              "public": True}},
            {"ansible.builtin.template": {"src": str(ROLES / "accelmon_exporter" / "templates" / "exporter.yml.j2"),
                                          "dest": out + "-exporter.yml", "mode": "0644"}},
            {"ansible.builtin.include_vars": str(node / "defaults" / "main.yml")},
            {"ansible.builtin.include_vars": str(node / "vars" / "main.yml")},
            {"ansible.builtin.template": {"src": str(node / "templates" / "allowed-clients.conf.j2"),
                                          "dest": out + "-node.conf", "mode": "0644"}},
            {"ansible.builtin.template": {"src": str(node / "templates" / "limits.conf.j2"),
                                          "dest": out + "-limits.conf", "mode": "0644"}},
        ],
    }]  # fmt: skip
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play))
    hosts = inventory(tmp_path, MASTERS, {name: variables for name, (variables, _, _) in WORKERS.items()})
    result = ansible_playbook(tmp_path, hosts, playbook)
    assert result.returncode == 0, result.stdout[-3000:]
    for name, (_, exporter, node_exporter) in WORKERS.items():
        settings = load(str(tmp_path / f"{name}-exporter.yml"))  # the exporter's own reading of its config
        assert set(settings.allowed_clients) == networks(exporter), name
        unit = (tmp_path / f"{name}-node.conf").read_text().splitlines()
        assert unit[unit.index("[Service]") :] == [
            "[Service]", "IPAccounting=yes", "IPAddressDeny=", "IPAddressDeny=any", "IPAddressAllow=",
            "IPAddressAllow=localhost " + " ".join(node_exporter),
        ], name  # fmt: skip
        # And what node_exporter may hold, whoever is let in (a security review's 4,000 loopback connections).
        limits = (tmp_path / f"{name}-limits.conf").read_text().splitlines()
        assert limits[limits.index("[Service]") :] == ["[Service]", "LimitNOFILE=4096", "MemoryMax=512M"], name


@pytest.mark.e2e
def test_a_master_the_worker_cannot_resolve_stops_the_deploy_in_its_preflight(tmp_path):
    """deploy.yaml limited to the workers: the masters are still read from the whole inventory, and one whose name
    resolves to nothing on the worker fails the worker in the preflight play, naming it, before any change. An
    empty list (which the exporter reads as "anyone") would have been written before."""
    masters = {"master": {"m-ip": {"ansible_host": "192.0.2.7"}, "ghost": {"ansible_host": "ghost.invalid"}}}
    hosts = inventory(tmp_path, masters, {"w1": {"accelmon_exporter_install_dir": str(tmp_path / "w1")}})
    result = ansible_playbook(tmp_path, hosts, ROOT / "ansible" / "deploy.yaml", "--check", "--limit", "worker")
    assert result.returncode != 0
    assert "The host(s) ghost of the group accelmon_exporter_scraper_group=master" in result.stdout, result.stdout[
        -3000:
    ]
    assert "PLAY [Workers]" not in result.stdout  # nothing past the preflight play
    assert not (tmp_path / "w1").exists()


def filter_check(tmp_path: Path, shown: str, allowed: list[str]) -> dict[str, Any]:
    """files/ip_filter_check.py against a systemctl printing `shown` for `systemctl show`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\ncat <<'EOF'\n{shown}\nEOF\n")
    (bin_dir / "systemctl").chmod(0o755)
    result = subprocess.run(
        [sys.executable, str(FILTER_CHECK)], input=json.dumps({"service": "node_exporter", "allowed": allowed}),
        capture_output=True, text=True, check=True, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )  # fmt: skip
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        # As systemd 252 shows the drop-in: localhost as its two prefixes, the listen address merged into them.
        ("IPAddressDeny=0.0.0.0/0 ::/0\nIPAddressAllow=127.0.0.0/8 ::1/128 192.0.2.7/32\nIPIngressBytes=0",
         (True, True, True)),
        # Where systemd cannot attach its BPF program: the settings loaded, the filter not applied.
        ("IPAddressDeny=0.0.0.0/0 ::/0\nIPAddressAllow=127.0.0.0/8 ::1/128 192.0.2.7/32\nIPIngressBytes=[no data]",
         (True, True, False)),
        # Another drop-in allowing more, or denying less.
        ("IPAddressDeny=0.0.0.0/0 ::/0\nIPAddressAllow=127.0.0.0/8 ::1/128 192.0.2.0/24\nIPIngressBytes=12",
         (True, False, True)),
        ("IPAddressDeny=\nIPAddressAllow=127.0.0.0/8 ::1/128 192.0.2.7/32\nIPIngressBytes=12", (False, True, True)),
        ("IPAddressDeny=0.0.0.0/0 ::/0\nIPAddressAllow=127.0.0.0/8 ::1/128\nIPIngressBytes=12", (True, False, True)),
    ],
)  # fmt: skip
def test_the_deploy_reads_the_ip_filter_systemd_loaded(tmp_path, shown, expected):
    found = filter_check(tmp_path, shown, ["127.0.0.1", "192.0.2.7"])
    assert (found["deny_all"], found["allow_as_written"], found["enforced"]) == expected, found
