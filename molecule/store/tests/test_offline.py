"""Verify the deploy was offline (issue 65, "Offline, proven"): no host of the scenario has a route out or reaches
a package index, a mirror, a registry or the controller, and the masters' images are the archives' (loaded from
files, none left behind). Everything the other verifiers check was therefore installed from the controller."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
OFFLINE = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "offline"
testinfra_hosts = [
    f"podman://{name}"
    for name in ("accelmon-store", "accelmon-store-master-a", "accelmon-store-master-b", "accelmon-store-worker-1",
                 "accelmon-store-worker-2", "accelmon-worker", "accelmon-worker-amd")
]  # fmt: skip
MASTERS = ("accelmon-store-master-a", "accelmon-store-master-b")
# What a deploy would reach online: Debian's mirror, PyPI, Docker Hub's registry, GitHub's releases.
SERVICES = [("deb.debian.org", 80), ("pypi.org", 443), ("files.pythonhosted.org", 443),
            ("registry-1.docker.io", 443), ("github.com", 443)]  # fmt: skip

# Tries each address from the host; prints those it could connect to.
CONNECT = """
import json, socket, sys
reached = []
for address, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((address, port), timeout=3).close()
        reached.append([address, port])
    except OSError:
        pass
print(json.dumps(reached))
"""


def addresses() -> list[tuple[str, int]]:
    """The services' addresses as the controller resolves them (the hosts resolve nothing but each other), and the
    controller itself on podman's default network."""
    found = [("10.88.0.1", 22), ("10.88.0.1", 80)]
    for name, port in SERVICES:
        try:
            found += {(info[4][0], port) for info in socket.getaddrinfo(name, port, socket.AF_INET)}
        except OSError:
            continue
    return sorted(set(found))


def test_no_host_has_a_route_out(host):
    for family in ("-4", "-6"):
        routes = host.run(f"ip {family} route show default")
        assert routes.stdout.strip() == "", routes.stdout


def test_no_host_reaches_an_index_a_mirror_or_a_registry(host):
    targets = addresses()
    assert len(targets) > 2, "the controller resolved none of the services"
    reached = json.loads(host.check_output(f"python3 -c '{CONNECT}' '{json.dumps(targets)}'"))
    assert reached == [], reached
    assert host.run("getent hosts deb.debian.org").rc != 0  # no DNS answers a name outside the scenario


def test_the_masters_images_are_the_archives_and_none_is_left(host):
    if host.backend.name not in MASTERS:
        pytest.skip("a master's check")
    script = ROOT / "ansible" / "roles" / "accelmon_master" / "files" / "image_archive.py"
    for archive in ("prometheus.tar", "alertmanager.tar", "grafana.tar"):
        read = subprocess.run([sys.executable, str(script), str(OFFLINE / archive)], capture_output=True, text=True)
        [(name, image_id)] = json.loads(read.stdout)["images"].items()
        assert host.check_output(f"podman image inspect --format '{{{{.Id}}}}' {name}") == image_id, name
    assert host.run("ls /opt/accelmon-master/images/*.tar").rc != 0, "a loaded archive was left on the master"
