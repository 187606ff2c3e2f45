"""The loopback guard (ansible/roles/accelmon_exporter/tasks/loopback_guard.yml): over the loopback, only root (and,
on a master whose Prometheus runs in the host's network, that Prometheus's uid) may connect to accelmon-exporter's
and node_exporter's ports. A user of a worker held ~4,100 idle loopback connections to node_exporter (LimitNOFILE
4096) and every scrape failed for as long as they were held: its IP filter must let the loopback in for the
deploy's check, which runs as root, and nothing told users from root.

The role's templates are rendered by Ansible with the tasks file's own variables (the other roles' defaults read
as the tasks read them) for an inventory shaped like the user's; the rules are then loaded by the real `nft` into
a fresh network namespace (`unshare --net`: never the host's; it is gone when its last process exits), where
root's and nobody's connections are tried."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT

pytestmark = pytest.mark.e2e

ROLE = ROOT / "ansible" / "roles" / "accelmon_exporter"
PROMETHEUS_UID = yaml.safe_load((ROOT / "ansible/roles/accelmon_master/defaults/main.yml").read_text())[
    "accelmon_master_prometheus_uid"
]


def guard_vars() -> dict[str, Any]:
    """The variables the tasks file gives its templates (its block's vars), as written there."""
    tasks = yaml.safe_load((ROLE / "tasks" / "loopback_guard.yml").read_text())
    (block,) = [task for task in tasks if task.get("name") == "Put the loopback guard in place"]
    return block["vars"]


def render(tmp_path: Path, groups: tuple[str, ...], variables: dict[str, Any] | None = None) -> tuple[str, str]:
    """The rules file and the unit the role writes for this machine as a host of `groups` (an inventory of one
    host; `variables` as the inventory's, given as extra vars: a play's vars_files, the role's defaults here, would
    win over inventory variables): Ansible renders both templates with the role's defaults and vars."""
    inventory = tmp_path / "host.ini"
    host = f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}"
    inventory.write_text("".join(f"[{group}]\n{host}\n" for group in groups))
    play = {
        "hosts": "localhost",
        "gather_facts": True,
        "gather_subset": ["!all", "min"],  # as deploy.yaml's preflight: the OS family names node_exporter's unit
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "vars": {"role_path": str(ROLE), **guard_vars()},
        "tasks": [
            {"ansible.builtin.template": {"src": str(ROLE / "templates" / src), "dest": str(tmp_path / dest)}}
            for src, dest in (("loopback-guard.nft.j2", "guard.nft"), ("accelmon-loopback-guard.service.j2", "unit"))
        ],
    }
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inventory),
            "-e",
            json.dumps(variables or {}),
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1", "HOME": str(tmp_path)},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    return (tmp_path / "guard.nft").read_text(), (tmp_path / "unit").read_text()


def rule(rules: str) -> str:
    (line,) = [line.strip() for line in rules.splitlines() if line.strip().startswith("fib daddr")]
    return line


def test_a_plain_workers_guard_lets_root_alone_reach_both_exporters(tmp_path):
    rules, unit = render(tmp_path, ("worker",))
    assert rule(rules) == (
        "fib daddr type local tcp dport { 9100, 19470 } tcp flags & (syn | ack) == syn meta skuid != { 0 } counter"
        " reject with tcp reset"
    )
    # Replaced as a whole in one transaction: made if missing, deleted, made again.
    assert rules.index("table inet accelmon_loopback {}\ndelete table inet accelmon_loopback\n") < rules.index(
        "table inet accelmon_loopback {\n"
    )
    lines = unit.splitlines()
    assert "ExecStart=/usr/sbin/nft -f /etc/accelmon/loopback-guard.nft" in lines
    assert "ExecStop=-/usr/sbin/nft delete table inet accelmon_loopback" in lines
    assert {"Type=oneshot", "RemainAfterExit=yes", "WantedBy=multi-user.target nftables.service"} <= set(lines)
    # In place before either exporter listens (this machine is Debian: the package's unit name).
    assert "Before=accelmon-exporter.service prometheus-node-exporter.service" in lines


def test_a_master_and_worker_with_prometheus_on_the_host_network_lets_its_prometheus_in(tmp_path):
    rules, _ = render(tmp_path, ("master", "worker"), {"accelmon_master_network": "host"})
    assert PROMETHEUS_UID == 60090
    assert "meta skuid != { 0, 60090 }" in rule(rules)


def test_a_master_and_worker_on_the_bridge_adds_no_uid(tmp_path):
    """On the master's bridge (its default network) Prometheus connects from its container, never by the host's
    loopback: root alone is let in there. The inventory's own uid and ports are the ones written."""
    rules, _ = render(tmp_path, ("master", "worker"))
    assert "meta skuid != { 0 }" in rule(rules)
    rules, _ = render(
        tmp_path,
        ("master", "worker"),
        {
            "accelmon_master_network": "host",
            "accelmon_master_prometheus_uid": 61000,
            "accelmon_exporter_listen_address": "10.0.0.5:19999",
            "accelmon_node_exporter_listen_address": "[::]:9101",
        },
    )
    assert "tcp dport { 9101, 19999 } tcp flags & (syn | ack) == syn meta skuid != { 0, 61000 }" in rule(rules)
    # A site's own agent, let through by its uid.
    rules, _ = render(tmp_path, ("worker",), {"accelmon_exporter_loopback_guard_uids": [997, 0]})
    assert "meta skuid != { 0, 997 }" in rule(rules)


# In the namespace, as root: the loopback up, a veth whose address is one of the namespace's own (its traffic to
# itself leaves by lo too), listeners on the guarded ports and another, a connection to each from root and nobody
# before the rules are loaded and after (loaded twice: the second replaces the first). Prints JSON.
NAMESPACE_SCRIPT = r"""
import json, socket, subprocess, sys, time
rules, client, ports = sys.argv[1], sys.argv[2], [int(p) for p in sys.argv[3:]]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "link", "add", "lg0", "type", "veth", "peer", "name", "lg1"], check=True)
subprocess.run(["ip", "addr", "add", "10.77.0.1/24", "dev", "lg0"], check=True)
for link in ("lg0", "lg1"):
    subprocess.run(["ip", "link", "set", link, "up"], check=True)
listeners = []
for port in ports:
    listener = socket.socket(socket.AF_INET6)
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    listener.bind(("::", port))
    listener.listen(16)
    listeners.append(listener)
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
def tries():
    out = {}
    for user, prefix in (("root", []), ("nobody", NOBODY)):
        for host in ("127.0.0.1", "::1", "10.77.0.1"):
            for port in ports:
                answer = subprocess.run(prefix + ["/usr/bin/python3", "-c", client, host, str(port)],
                                        capture_output=True, text=True, timeout=30)
                out[f"{user} {host} {port}"] = (answer.stdout + answer.stderr).strip()
    return out
before = tries()
for _ in range(2):
    subprocess.run(["nft", "-f", rules], check=True)
after = tries()
listed = subprocess.run(["nft", "list", "table", "inet", "accelmon_loopback"], capture_output=True, text=True)
print(json.dumps({"before": before, "after": after, "table": listed.stdout}))
"""

# A TCP connect with a 5 s timeout: "ok", "refused" (ECONNREFUSED: the guard's reset) or what else, and how long.
CLIENT = r"""
import socket, sys, time
started = time.monotonic()
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
    answer = "ok"
except ConnectionRefusedError:
    answer = "refused"
except OSError as error:
    answer = type(error).__name__
print(answer, round(time.monotonic() - started, 3))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace, nft and setpriv: root only")
def test_in_a_fresh_network_namespace_root_connects_and_nobody_is_reset_at_once(tmp_path):
    assert shutil.which("nft"), "nft is missing: ./scripts/setup.sh installs nftables"
    assert os.access("/usr/bin/python3", os.X_OK), "the client runs as nobody on the system's python3"
    render(tmp_path, ("worker",))
    (tmp_path / "guard.nft").chmod(0o644)
    other = 9200  # not guarded
    ran = subprocess.run(
        ["unshare", "--net", "/usr/bin/python3", "-c", NAMESPACE_SCRIPT, str(tmp_path / "guard.nft"), CLIENT,
         "9100", "19470", str(other)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout)
    print(json.dumps(result["after"], indent=1))
    answers = {when: {key: value.split()[0] for key, value in result[when].items()} for when in ("before", "after")}
    seconds = {key: float(value.split()[1]) for key, value in result["after"].items()}

    # Without the guard nobody connects to both exporters: what the attack used.
    assert set(answers["before"].values()) == {"ok"}, result["before"]
    for key, answer in answers["after"].items():
        user, _, port = key.split()
        if user == "root" or int(port) == other:
            assert answer == "ok", (key, result["after"])
        else:
            # By 127.0.0.1, ::1 and the namespace's own address alike: reset at once, no timeout to wait out.
            assert answer == "refused", (key, result["after"])
            assert seconds[key] < 1, (key, seconds[key])
    # Loaded twice, one rule: the second load replaced the table. nobody's 6 SYNs were counted.
    assert result["table"].count("reject with tcp reset") == 1, result["table"]
    assert "counter packets 6 " in result["table"], result["table"]


def run_guard_tasks(tmp_path: Path, *variables: str) -> str:
    """The role's tasks file itself, in --check, on this machine (no guard deployed): its output."""
    play = [
        {
            "hosts": "localhost",
            "gather_facts": True,
            "gather_subset": ["!all", "min"],
            "tasks": [
                {"ansible.builtin.include_role": {"name": "accelmon_exporter", "tasks_from": "loopback_guard.yml"}}
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    extra = [f"accelmon_exporter_config_dir={tmp_path / 'etc'}", *variables]
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", "--check",
         "-e", f"ansible_python_interpreter={sys.executable}", *[arg for var in extra for arg in ("-e", var)],
         str(tmp_path / "play.yml")],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1", "HOME": str(tmp_path),
             "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles")},
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    return output


@pytest.mark.skipif(os.geteuid() != 0, reason="the tasks become root, as in a deploy")
def test_check_mode_on_a_host_without_the_guard_changes_nothing_and_turning_it_off_warns(tmp_path):
    """--check reports the rules and the unit it would write, writes neither, and asks systemd nothing about a unit
    not there yet; false prints the role's kind of warning, and finds nothing to remove."""
    output = run_guard_tasks(tmp_path)
    assert "changed: [localhost]" in output.split("Write the loopback guard's rules", 1)[1].split("TASK", 1)[0]
    assert not (tmp_path / "etc").exists()
    for task in ("Load the loopback guard, and load it at boot", "Check the loopback guard's table is loaded"):
        assert "skipping: [localhost]" in output.split(task, 1)[1].split("TASK", 1)[0], task
    assert "[WARNING] accelmon_exporter_loopback_guard is false" not in output

    output = run_guard_tasks(tmp_path, "accelmon_exporter_loopback_guard=false")
    assert "[WARNING] accelmon_exporter_loopback_guard is false on localhost" in output
    assert "Write the loopback guard's rules" in output  # the task is there, skipped
    assert "changed=0" in output and "failed=0" in output
