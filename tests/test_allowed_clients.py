"""Issue 66: only the masters reach the workers' exporters by default. The exporter's allow-list and node_exporter's
systemd IP filter carry the addresses of the inventory's masters (by ansible_host where it is an IP address, else
as the worker resolves the name), taken from the whole inventory whatever --limit leaves, plus the worker's own
loopback; a master no worker can resolve stops the deploy in its preflight, before any host changes."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelmon.config import load
from tests.support.ansible import run_local_play
from tests.support.paths import ROOT
from tests.support.processes import exporter_env, free_port, on_fixtures, start_exporter, stop, wait_until_serving
from tests.support.waiting import wait_until

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


def allow_list_play(work: Path, *between: dict[str, Any], node_templates: tuple[str, ...]) -> Path:
    """A play on the workers: the roles' own tasks/scrapers.yml, the exporter's config as its template renders it,
    the tasks `between`, then node_exporter's `node_templates` (its defaults and vars loaded as its role does), each
    written to WORK/HOST-NAME."""
    node = ROLES / "accelmon_node_exporter"
    out = str(work / "{{ inventory_hostname }}")
    play = [{
        "hosts": "worker", "gather_facts": False,
        "tasks": [
            {"ansible.builtin.include_role": {"name": "accelmon_exporter", "tasks_from": "scrapers.yml",
                                              "public": True}},
            {"ansible.builtin.template": {"src": str(ROLES / "accelmon_exporter" / "templates" / "exporter.yml.j2"),
                                          "dest": out + "-exporter.yml", "mode": "0644"}},
            *between,
            {"ansible.builtin.include_vars": str(node / "defaults" / "main.yml")},
            {"ansible.builtin.include_vars": str(node / "vars" / "main.yml")},
            *({"ansible.builtin.template": {"src": str(node / "templates" / f"{name}.conf.j2"),
                                            "dest": f"{out}-{name}.conf", "mode": "0644"}}
              for name in node_templates),
        ],
    }]  # fmt: skip
    playbook = work / "play.yml"
    playbook.write_text(yaml.safe_dump(play))
    return playbook


def networks(values: list[str]) -> set[Any]:
    return {ipaddress.ip_network(value) for value in values}


@pytest.mark.e2e
def test_the_exporters_let_in_the_masters_of_the_whole_inventory_and_the_loopback(tmp_path):
    """The roles' own tasks (tasks/scrapers.yml) and templates, on workers whose masters are not in the play (as
    with --limit): by IP, by a name the worker resolves (IPv4 and IPv6), two masters, an IPv6 ansible_host, the
    operator's additions, and the old open behaviour asked for. Before, the exporter's config had no allow-list
    (anyone) and node_exporter's unit no IP filter."""
    playbook = allow_list_play(tmp_path, node_templates=("allowed-clients", "limits"))
    hosts = inventory(tmp_path, MASTERS, {name: variables for name, (variables, _, _) in WORKERS.items()})
    result = ansible_playbook(tmp_path, hosts, playbook)
    assert result.returncode == 0, result.stdout[-3000:]
    for name, (_, exporter, node_exporter) in WORKERS.items():
        settings = load(str(tmp_path / f"{name}-exporter.yml"))  # the exporter's own reading of its config
        assert set(settings.allowed_clients) == networks(exporter), name
        unit = (tmp_path / f"{name}-allowed-clients.conf").read_text().splitlines()
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


# Issue 66, a host that is both master and worker: its own Prometheus runs in a container on the master's bridge
# and scrapes this host's exporters from its container address there (never masqueraded: the packet is delivered on
# the host, not routed out), so the master role pins that network's subnet and the worker lets it in.
NETWORK_CHECK = ROLES / "accelmon_master" / "files" / "network_check.py"
DEFAULT_SUBNET = yaml.safe_load((ROLES / "accelmon_master" / "defaults" / "main.yml").read_text())[
    "accelmon_master_network_subnet"
]
# What the fake `ip -j -4 addr show` lists: the host's own network, the bridge an earlier deploy made for the
# default subnet (its gateway, the first address: no overlap), an InfiniBand network, and another project's docker
# network's bridge (its gateway the first address too, but not the master's network: an overlap).
INTERFACES = [
    {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "198.51.100.20", "prefixlen": 24}]},
    {"ifname": "cni-podman1", "addr_info": [{"family": "inet", "local": "10.89.254.1", "prefixlen": 24}]},
    {"ifname": "ib0", "addr_info": [{"family": "inet", "local": "10.77.0.5", "prefixlen": 16}]},
    {"ifname": "br-0123456789ab", "addr_info": [{"family": "inet", "local": "10.89.253.1", "prefixlen": 24}]},
]
OWN_BRIDGES = {"cni-podman1"}  # the master network's, as `podman network inspect accelmon` names it


# What the fake `ip -j -4 route show table all` lists: the default route, a site network and a host behind a router
# (a static and a DHCP route, neither on an interface of this host), and the kernel's own routes for the interfaces
# (the bridge's, the local table's), which the interface check covers.
ROUTES = [
    {"dst": "default", "gateway": "198.51.100.1", "dev": "eth0", "protocol": "dhcp"},
    {"dst": "10.60.0.0/16", "gateway": "198.51.100.1", "dev": "eth0", "protocol": "static"},
    {"dst": "192.0.2.77", "gateway": "198.51.100.1", "dev": "eth0", "protocol": "dhcp"},
    {"dst": "10.89.254.0/24", "dev": "cni-podman1", "protocol": "kernel", "scope": "link", "prefsrc": "10.89.254.1"},
    {"type": "local", "dst": "198.51.100.20", "table": "local", "dev": "eth0", "protocol": "kernel"},
]


def fake_ip(directory: Path) -> None:
    """An `ip` answering `ip -j -4 addr show` with INTERFACES and `ip -j -4 route show table all` with ROUTES, as
    the master's check reads the host's networks; a podman whose `network inspect accelmon` names OWN_BRIDGES, and
    a docker with no network."""
    inspected = [{"name": "accelmon", "network_interface": name} for name in OWN_BRIDGES]
    podman = directory / "podman"
    podman.write_text(
        f"#!/bin/sh\n[ \"$*\" = 'network inspect accelmon' ] || exit 125\ncat <<'EOF'\n{json.dumps(inspected)}\nEOF\n"
    )
    docker = directory / "docker"
    docker.write_text("#!/bin/sh\necho 'Error response from daemon: network accelmon not found' >&2\nexit 1\n")
    for engine in (podman, docker):
        engine.chmod(0o755)
    script = directory / "ip"
    script.write_text(
        f"#!/bin/sh\nif [ \"$3\" = route ]; then cat <<'EOF'\n{json.dumps(ROUTES)}\nEOF\n"
        f"else cat <<'EOF'\n{json.dumps(INTERFACES)}\nEOF\nfi\n"
    )
    script.chmod(0o755)


def network_problems(subnet: str, addresses: dict[str, str]) -> list[str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("network_check", NETWORK_CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.problems(subnet, addresses, INTERFACES, ROUTES, OWN_BRIDGES))


@pytest.mark.parametrize(
    ("subnet", "addresses", "refused"),
    [
        (DEFAULT_SUBNET, {"w1": "198.51.100.21", "w2": "node-2"}, ""),  # its own bridge is no overlap
        ("10.78.0.0/24", {}, ""),
        ("10.89.254.7/24", {}, "is no IPv4 network such as 10.89.254.0/24"),  # host bits: a typo
        ("10.89.254.0/33", {}, "is no IPv4 network"),
        ("fd00:accel::/64", {}, "is no IPv4 network"),
        ("bridge", {}, "is no IPv4 network"),
        ("10.89.254.0/30", {}, "the prefix must be /8 to /29"),
        ("10.0.0.0/7", {}, "the prefix must be /8 to /29"),
        ("127.77.0.0/24", {}, "loopback, link-local"),
        ("169.254.7.0/24", {}, "loopback, link-local"),
        ("10.77.3.0/24", {}, "overlaps 10.77.0.5/16 on this host's interface ib0"),
        ("198.51.100.0/25", {}, "overlaps 198.51.100.20/24 on this host's interface eth0"),
        ("203.0.113.0/24", {"w-far": "203.0.113.9", "w-v6": "[2001:db8::9]"}, "holds the address of w-far"),
        # Another network's bridge on the subnet, its gateway where the master's would be: not the master's own.
        ("10.89.253.0/24", {}, "overlaps 10.89.253.1/24 on this host's interface br-0123456789ab"),
        # Networks reached through a router: the bridge's more specific route would take their traffic.
        ("10.60.4.0/24", {}, "overlaps the route to 10.60.0.0/16 via 198.51.100.1 on this host (eth0)"),
        ("192.0.2.64/26", {}, "overlaps the route to 192.0.2.77/32 via 198.51.100.1 on this host (eth0)"),
    ],
)  # fmt: skip
def test_the_master_network_subnet_is_checked_against_the_host_and_the_inventory(subnet, addresses, refused):
    """files/network_check.py, which the master's preflight (and a co-located worker's) runs on the host: a subnet
    the engines would take but that would break a scrape is refused, naming why."""
    found = network_problems(subnet, addresses)
    if refused:
        assert any(refused in problem for problem in found), found
        assert all(problem.startswith(f"accelmon_master_network_subnet={subnet}") for problem in found), found
    else:
        assert found == []


# Both masters and workers here (one by the default subnet, one pinned elsewhere, one on the host's network), a
# master that is no worker, and a worker that is no master.
COLOCATED_MASTERS = {
    "master": {
        "both": {"ansible_host": "198.51.100.20"},
        "both-pinned": {"ansible_host": "198.51.100.21", "accelmon_master_network_subnet": "10.78.0.0/24"},
        "both-host": {"ansible_host": "198.51.100.22", "accelmon_master_network": "host"},
        "m-only": {"ansible_host": "198.51.100.30"},
    }
}
COLOCATED_WORKERS = {"both": {}, "both-pinned": {}, "both-host": {}, "w-only": {"ansible_host": "198.51.100.40"}}
MASTER_ADDRESSES = ["198.51.100.20", "198.51.100.21", "198.51.100.22", "198.51.100.30"]
OWN_NETWORK = {"both": [DEFAULT_SUBNET], "both-pinned": ["10.78.0.0/24"], "both-host": [], "w-only": []}


@pytest.mark.e2e
def test_a_host_both_master_and_worker_lets_its_own_prometheus_network_in(tmp_path):
    """The roles' tasks and templates on a co-located inventory: a host in [master] and [worker] lets in its master
    network's subnet (the default, or the one pinned), in the exporter's allow-list and node_exporter's drop-in
    alike; none on the host's network (Prometheus then connects from the host's own address, a master's), none on
    a worker that is no master. The fingerprint of the no-change path follows the subnet. Before, the allow-list held
    the masters' addresses and the loopback alone: the host's own Prometheus was refused."""
    out = str(tmp_path / "{{ inventory_hostname }}")
    fingerprint = {"ansible.builtin.copy": {"content": "{{ __accelmon_exporter_deploy_fingerprint }}",
                                            "dest": out + "-fingerprint-{{ item }}", "mode": "0644"}}  # fmt: skip
    playbook = allow_list_play(
        tmp_path,
        # The no-change record, then with another subnet for the same hosts: it must not match any more.
        {**fingerprint, "loop": ["before"]},
        {"ansible.builtin.set_fact": {"__accelmon_master_network_clients": ["10.79.0.0/24"]}},
        {**fingerprint, "loop": ["after"]},
        node_templates=("allowed-clients",),  # from what tasks/scrapers.yml kept for it
    )
    hosts = inventory(tmp_path, COLOCATED_MASTERS, COLOCATED_WORKERS)
    fake_ip(fake_getent(tmp_path / "bin"))
    result = ansible_playbook(tmp_path, hosts, playbook)
    assert result.returncode == 0, result.stdout[-3000:]
    for name, own in OWN_NETWORK.items():
        settings = load(str(tmp_path / f"{name}-exporter.yml"))
        assert set(settings.allowed_clients) == networks([*MASTER_ADDRESSES, *own, *LOOPBACK]), name
        unit = (tmp_path / f"{name}-allowed-clients.conf").read_text().splitlines()
        assert unit[-1] == "IPAddressAllow=localhost " + " ".join(sorted(MASTER_ADDRESSES + own)), name
        before, after = ((tmp_path / f"{name}-fingerprint-{when}").read_text() for when in ("before", "after"))
        assert (before != after) == (name != "w-only"), name  # a worker alone has no master network


@pytest.mark.e2e
def test_a_bad_master_network_subnet_stops_the_deploy_in_its_preflight(tmp_path):
    """deploy.yaml on a co-located inventory: a subnet with host bits, one that overlaps a network of the host, one
    that holds a worker's address, each on a host that is master and worker, and a bad one on a master alone, stop
    the deploy in its preflight play, naming the variable, before any worker or master play changes anything."""
    work = {name: str(tmp_path / name) for name in ("bad-cidr", "overlap", "holds-worker")}
    masters = {
        "master": {
            "bad-cidr": {"ansible_host": "198.51.100.23", "accelmon_master_network_subnet": "10.89.254.7/24"},
            "overlap": {"ansible_host": "198.51.100.24", "accelmon_master_network_subnet": "10.77.3.0/24"},
            "holds-worker": {"ansible_host": "198.51.100.25", "accelmon_master_network_subnet": "203.0.113.0/24"},
            "m-bad": {"ansible_host": "198.51.100.26", "accelmon_master_network_subnet": "10.89.254.0/33",
                      "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                      "accelmon_master_dir": str(tmp_path / "m-bad")},
        },
        # A host of the inventory the deploy does not touch, by its address (a worker of another site, say).
        "elsewhere": {"w-far": {"ansible_host": "203.0.113.9"}},
    }  # fmt: skip
    workers = {name: {"accelmon_exporter_install_dir": path} for name, path in work.items()}
    hosts = inventory(tmp_path, masters, workers)
    fake_ip(fake_getent(tmp_path / "bin"))
    result = ansible_playbook(tmp_path, hosts, ROOT / "ansible" / "deploy.yaml", "--check")
    output = result.stdout
    assert result.returncode != 0, output[-3000:]
    for message in (
        "accelmon_master_network_subnet=10.89.254.7/24 is no IPv4 network such as 10.89.254.0/24",
        "accelmon_master_network_subnet=10.77.3.0/24 overlaps 10.77.0.5/16 on this host's interface ib0",
        "accelmon_master_network_subnet=203.0.113.0/24 holds the address of w-far (203.0.113.9)",
        "accelmon_master_network_subnet=10.89.254.0/33 is no IPv4 network",
    ):
        assert message in output, message + "\n" + output[-3000:]
    recap = output.split("PLAY RECAP")[-1]
    for name in ("bad-cidr", "overlap", "holds-worker", "m-bad"):
        assert re.search(rf"{name}\s+:.* failed=1", recap), recap
    assert "PLAY [Workers]" not in output and "PLAY [Masters]" not in output  # nothing past the preflight play
    assert not any(Path(path).exists() for path in work.values())
    assert not (tmp_path / "m-bad").exists()


PROMETHEUS_IMAGE = "localhost/accelmon-prometheus:2.42.0"  # molecule/images/Containerfile.prometheus


def host_address() -> str:
    """This machine's own IPv4 address on a network of its own (not a container bridge)."""
    listed = json.loads(subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, check=True).stdout)
    for interface in listed:
        if interface["ifname"].startswith(("lo", "cni-", "podman", "docker", "br-", "veth")):
            continue
        for info in interface.get("addr_info", []):
            if info.get("scope") == "global":
                return str(info["local"])
    pytest.skip("no IPv4 address of this machine's own")


def prometheus_ups(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?query=up", timeout=2) as response:
            results = json.load(response)["data"]["result"]
    except OSError:
        return {}
    return {result["metric"]["exporter"]: float(result["value"][1]) for result in results}


@pytest.mark.molecule
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("podman"), reason="rootful podman, as the master role runs")
def test_a_prometheus_on_the_master_network_reaches_its_own_host_only_from_the_subnet(tmp_path):
    """The real packet path of a co-located master (rootful podman, as the role runs it): a Prometheus on a bridge
    with a pinned subnet scrapes two exporters on this host's own address. The one that lets in the subnet is up;
    the one that lets in the host's address alone (what a co-located host had before) is down: the scrape comes
    from the container's address. A Prometheus on the host's network sees the opposite: it connects from the host's
    address, so "host" needs nothing more."""
    if subprocess.run(["podman", "image", "exists", PROMETHEUS_IMAGE]).returncode != 0:
        pytest.skip(f"{PROMETHEUS_IMAGE} is not built (molecule/images/build.sh)")
    address, subnet = host_address(), "10.89.251.0/24"
    name = f"accelmon-test-colocated-{os.getpid()}"
    env = {**os.environ, "CONTAINERS_CONF": str(ROOT / "molecule" / "images" / "containers.conf")}
    exporters, allowed = {}, {"subnet": ["127.0.0.1", subnet], "host-address": ["127.0.0.1", address]}
    targets = {}
    try:
        for exporter, clients in allowed.items():
            port = free_port()
            root = tmp_path / exporter
            flags = on_fixtures(root)
            settings = json.loads((root / "accelmon.yml").read_text())
            (root / "accelmon.yml").write_text(json.dumps({**settings, "web": {"allowed_clients": clients}}))
            exporters[exporter] = start_exporter([f"--web.listen-address=0.0.0.0:{port}", *flags],
                                                 exporter_env(None, None))  # fmt: skip
            wait_until_serving(port)
            targets[exporter] = f"{address}:{port}"
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": "accelmon", "static_configs": [
                {"targets": [target], "labels": {"exporter": exporter}} for exporter, target in targets.items()]}],
        }))  # fmt: skip
        subprocess.run(["podman", "network", "create", "--subnet", subnet, name], env=env, check=True,
                       capture_output=True)  # fmt: skip
        bridge_port, host_port = free_port(), free_port()
        run = ["podman", "run", "-d", "--rm", "-v", f"{config}:/etc/prometheus/prometheus.yml:ro,Z", "--name"]
        flags = ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/tmp/data"]
        subprocess.run([*run, f"{name}-bridge", "--network", name, "-p", f"127.0.0.1:{bridge_port}:9090",
                        PROMETHEUS_IMAGE, *flags], env=env, check=True, capture_output=True)  # fmt: skip
        listen = f"--web.listen-address=127.0.0.1:{host_port}"
        subprocess.run([*run, f"{name}-host", "--network", "host", PROMETHEUS_IMAGE, *flags, listen], env=env,
                       check=True, capture_output=True)  # fmt: skip
        expected = {bridge_port: {"subnet": 1.0, "host-address": 0.0}, host_port: {"subnet": 0.0, "host-address": 1.0}}
        for port, ups in expected.items():
            wait_until(lambda port=port, ups=ups: prometheus_ups(port) == ups, timeout=60, every=0.5,
                       what=f"up {ups} on the Prometheus at {port}")  # fmt: skip
    finally:
        for container in (f"{name}-bridge", f"{name}-host"):
            subprocess.run(["podman", "rm", "-f", "--ignore", container], env=env, capture_output=True)
        subprocess.run(["podman", "network", "rm", "-f", name], env=env, capture_output=True)
        for process in exporters.values():
            stop(process)


@pytest.mark.molecule
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("podman"), reason="rootful podman, as the master role runs")
def test_a_master_network_on_another_subnet_is_made_again_on_the_pinned_one(tmp_path):
    """A master deployed before the subnet was pinned has its network on the engine's pick: the role's tasks
    (tasks/network-moved.yml, then podman.yml's network task) remove its containers and make the network again on
    accelmon_master_network_subnet. --check changes nothing; a second run changes nothing (idempotence)."""
    if subprocess.run(["podman", "image", "exists", PROMETHEUS_IMAGE]).returncode != 0:
        pytest.skip(f"{PROMETHEUS_IMAGE} is not built (molecule/images/build.sh)")
    name = f"accelmon-test-moved-{os.getpid()}"
    container = f"{name}-prometheus"
    env = {**os.environ, "CONTAINERS_CONF": str(ROOT / "molecule" / "images" / "containers.conf")}

    def subnets() -> list[str]:
        inspect = subprocess.run(["podman", "network", "inspect", name], capture_output=True, text=True, env=env)
        return [subnet["subnet"] for subnet in json.loads(inspect.stdout)[0]["subnets"]]

    play = {"tasks": [
        {"ansible.builtin.include_role": {"name": "accelmon_master", "tasks_from": "network-moved.yml"}},
        {"containers.podman.podman_network": {"name": name, "subnet": "{{ accelmon_master_network_subnet }}"},
         "become": True},
    ]}  # fmt: skip
    # The test's own network and container, never a real master's (extra vars win over the role's).
    variables = {"__accelmon_master_engine": "podman", "accelmon_master_network": name,
                 "__accelmon_master_all_containers": [container],
                 "accelmon_master_network_subnet": "10.89.249.0/24"}  # fmt: skip
    try:
        subprocess.run(["podman", "network", "create", "--subnet", "10.89.250.0/24", name], env=env, check=True,
                       capture_output=True)  # fmt: skip
        subprocess.run(["podman", "run", "-d", "--name", container, "--network", name, PROMETHEUS_IMAGE], env=env,
                       check=True, capture_output=True)  # fmt: skip
        (tmp_path / "check").mkdir()
        checked = run_local_play({**play, "check_mode": True}, variables, tmp_path / "check")
        assert checked.returncode == 0, checked.stdout[-3000:]
        assert subnets() == ["10.89.250.0/24"]
        assert subprocess.run(["podman", "container", "exists", container], env=env).returncode == 0
        (tmp_path / "first").mkdir()
        first = run_local_play(play, variables, tmp_path / "first")
        assert first.returncode == 0, first.stdout[-3000:]
        assert re.search(r"changed=3 ", first.stdout), first.stdout[-3000:]  # the container, the network, made again
        assert subnets() == ["10.89.249.0/24"]
        assert subprocess.run(["podman", "container", "exists", container], env=env).returncode == 1
        (tmp_path / "again").mkdir()
        again = run_local_play(play, variables, tmp_path / "again")
        assert again.returncode == 0 and re.search(r"changed=0 ", again.stdout), again.stdout[-3000:]
    finally:
        subprocess.run(["podman", "rm", "-f", "--ignore", container], env=env, capture_output=True)
        subprocess.run(["podman", "network", "rm", "-f", name], env=env, capture_output=True)


# `network inspect` of a network on 10.89.254.0/24 as each engine prints it: podman 4 (netavark or CNI), docker, and
# podman 3 (Ubuntu 22.04's 3.4: the CNI conflist itself; podman's issue 8366 shows one).
INSPECTED = {
    "podman 4": {"name": "accelmon", "driver": "bridge", "subnets": [{"subnet": "10.89.254.0/24",
                                                                       "gateway": "10.89.254.1"}]},
    "docker": {"Name": "accelmon", "IPAM": {"Driver": "default", "Config": [{"Subnet": "10.89.254.0/24"}]}},
    "podman 3": {"cniVersion": "0.4.0", "name": "accelmon", "plugins": [
        {"type": "bridge", "bridge": "cni-podman1", "isGateway": True, "ipMasq": True, "ipam": {
            "type": "host-local", "routes": [{"dst": "0.0.0.0/0"}],
            "ranges": [[{"subnet": "10.89.254.0/24", "gateway": "10.89.254.1"}]]}},
        {"type": "portmap", "capabilities": {"portMappings": True}}, {"type": "firewall"}, {"type": "tuning"}]},
}  # fmt: skip


@pytest.mark.e2e
@pytest.mark.parametrize("engine", sorted(INSPECTED))
@pytest.mark.parametrize("pinned", ["10.89.254.0/24", "10.89.253.0/24"])
def test_a_network_on_the_pinned_subnet_is_kept_whatever_the_engine_prints(tmp_path, engine, pinned):
    """tasks/network-moved.yml with a fake engine printing `network inspect` as docker, podman 4 and podman 3 do:
    a network already on the pinned subnet is kept with its containers, one on another is removed. Before, podman
    3's CNI conflist was read as no subnet at all: every deploy of a master on Ubuntu 22.04 removed its
    Prometheus, Grafana and Alertmanager and their network (a gap in every scrape and alert, on every HA master)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "engine"
    (tmp_path / "inspect.json").write_text(json.dumps([INSPECTED[engine]]))
    fake.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        f'[ "$1 $2" = "network inspect" ] && exec cat {tmp_path / "inspect.json"}\nexit 0\n'
    )
    fake.chmod(0o755)
    play = {"tasks": [{"ansible.builtin.include_role": {"name": "accelmon_master", "tasks_from": "network-moved.yml"}}]}
    variables = {"__accelmon_master_engine": str(fake), "accelmon_master_network": "accelmon",
                 "__accelmon_master_all_containers": ["accelmon-prometheus"], "accelmon_master_network_subnet": pinned,
                 "ansible_become": False}  # fmt: skip
    result = run_local_play(play, variables, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    removed = [line for line in calls.read_text().splitlines() if not line.startswith("network inspect")]
    if pinned == "10.89.254.0/24":
        assert removed == [], removed
    else:
        assert removed == ["rm --force accelmon-prometheus", "network rm accelmon"], removed
