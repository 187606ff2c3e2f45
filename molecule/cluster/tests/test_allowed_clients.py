"""Issue 66: only the masters reach the workers' exporters by default. Deployed with no allow-list variable, each
worker's accelmon-exporter and node_exporter let in the master (its address as the worker resolves its name) and the
worker's own loopback; another worker is refused. node_exporter's refusal is systemd's (IPAddressDeny=any in a
drop-in), which the kernel applies only with BPF cgroup firewalling: where systemd reports it cannot, the unit's
settings are checked and the test says so (docs/security.md)."""

import os
import shlex
import sys
from pathlib import Path

import testinfra
import yaml

sys.path.insert(0, str(Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]) / "molecule" / "shared"))
from verify import wait_for

CLUSTER = os.environ.get("ACCELMON_CLUSTER", "accelmon-cluster")
testinfra_hosts = [f"podman://{CLUSTER}-master"]
MASTER = f"{CLUSTER}-master"
WORKER, OTHER = f"{CLUSTER}-worker-1", f"{CLUSTER}-worker-2"
SECRETS = "/opt/accelmon-master/prometheus/secrets"
SERVICE = "prometheus-node-exporter"  # Debian's package, the image's distribution

# From the host it runs on: a TCP connection to the address, then a TLS handshake (the server's certificate not
# checked: only whether the server lets this address in). Prints "accepted", "closed" (connected, then closed before
# any TLS: the exporter's allow-list at its accept), "timeout" (systemd's filter drops the packets) or "refused"
# (nothing listens).
PROBE = """
import socket, ssl, sys
context = ssl.create_default_context()
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
try:
    raw = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
except socket.timeout:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
except ConnectionResetError:  # the exporter resets a refused client at its accept: the connect may meet it
    print("closed")
else:
    try:
        with context.wrap_socket(raw, server_hostname=sys.argv[1]):
            print("accepted")
    except (ssl.SSLError, OSError):
        print("closed")
"""


def probe(host, target: str, port: int) -> str:
    return host.check_output(f"python3 -c {shlex.quote(PROBE)} {target} {port}")


def addresses(host, name: str) -> set[str]:
    """`name`'s addresses as `host` resolves them (what the role's getent ahosts saw)."""
    return {line.split()[0] for line in host.check_output(f"getent ahosts {name}").splitlines()}


def test_a_workers_exporters_let_in_the_master_and_refuse_another_worker(host):
    worker, other = testinfra.get_host(f"podman://{WORKER}"), testinfra.get_host(f"podman://{OTHER}")
    master_addresses = addresses(worker, MASTER)
    assert master_addresses and not master_addresses & addresses(worker, OTHER)

    # The rendered allow-lists: the master as this worker resolves it, the loopback; no other worker, no "anyone".
    config = yaml.safe_load(worker.file("/etc/accelmon/exporter.yml").content_string)
    assert set(config["web"]["allowed_clients"]) == master_addresses | {"127.0.0.1"}
    shown = dict(
        line.split("=", 1)
        for line in worker.check_output(
            f"systemctl show --property=IPAddressDeny,IPAddressAllow,IPIngressBytes {SERVICE}"
        ).splitlines()
    )
    assert set(shown["IPAddressDeny"].split()) == {"0.0.0.0/0", "::/0"}, shown  # systemd 252 prints ::/0 first
    allowed = {prefix.split("/")[0] for prefix in shown["IPAddressAllow"].split()}
    assert allowed == {"127.0.0.0", "::1"} | master_addresses, shown

    # The master's Prometheus scrapes both (its targets up, through TLS and the password), and so does the master
    # by hand from its own address; the worker itself passes (the deploy's check).
    def curl(port: int, prefix: str) -> str:
        return host.run(
            f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 --cacert {SECRETS}/{prefix}-ca.crt"
            f" -u prometheus:$(cat {SECRETS}/{prefix}-password) https://{WORKER}:{port}/metrics"
        ).stdout

    assert wait_for(lambda: curl(19470, "exporter") == "200", timeout=60)
    assert curl(9100, "node-exporter") == "200"
    assert wait_for(lambda: probe(worker, "127.0.0.1", 19470) == "accepted", timeout=60)
    assert probe(worker, "127.0.0.1", 9100) == "accepted"

    # Another worker: the exporter closes the connection at its accept, before any TLS.
    assert probe(other, WORKER, 19470) == "closed"
    # node_exporter: dropped by systemd where the kernel applies its filter; else TLS (and the password) only.
    enforced = shown["IPIngressBytes"].isdigit()
    print(
        f"node_exporter's IP filter applied by the kernel here: {enforced} (IPIngressBytes={shown['IPIngressBytes']})"
    )
    assert probe(other, WORKER, 9100) == ("timeout" if enforced else "accepted")


def test_node_exporter_runs_with_its_file_and_memory_limits():
    """The role's second drop-in, as systemd loaded it on a worker (LimitNOFILE= and MemoryMax=, defaults/main.yml):
    node_exporter's Go runtime would otherwise raise its open-file limit to the hard one."""
    worker = testinfra.get_host(f"podman://{WORKER}")
    shown = worker.check_output(f"systemctl show -p LimitNOFILE -p MemoryMax {SERVICE}").splitlines()
    assert sorted(shown) == ["LimitNOFILE=4096", "MemoryMax=536870912"], shown
    pid = worker.check_output(f"systemctl show -p MainPID --value {SERVICE}")
    limits = [line.split()[3:5] for line in worker.check_output(f"cat /proc/{pid}/limits").splitlines()
              if line.startswith("Max open files")]  # fmt: skip
    assert limits == [["4096", "4096"]], limits  # soft and hard: Go raises only the soft one to the hard


def test_a_worker_lets_only_root_reach_its_exporters_over_the_loopback():
    """The loopback guard (the exporter role's tasks/loopback_guard.yml): the allow-lists above let the loopback in
    for the deploy's check, so a user of the worker could hold node_exporter's descriptors; the guard's nftables
    table resets any connection to either port over the loopback but root's (the master here is no worker)."""
    worker = testinfra.get_host(f"podman://{WORKER}")
    assert worker.service("accelmon-loopback-guard").is_enabled
    assert worker.run("nft list table inet accelmon_loopback").rc == 0
    nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups"
    for port in (19470, 9100):
        assert wait_for(lambda port=port: probe(worker, "127.0.0.1", port) == "accepted", timeout=60)  # root
        # The guard's reset answers the connect itself: refused, before any TLS.
        assert worker.check_output(f"{nobody} python3 -c {shlex.quote(PROBE)} 127.0.0.1 {port}") == "refused"
