"""Issues 65 and 66: after each restart the deploy scrapes both exporters on the worker as Prometheus would, through
their TLS and basic auth, and fails the host naming the cause. The roles' own check tasks (as their tasks/main.yml
write them) run on local-connection hosts against real servers: accelmon's HTTP server and Debian's node_exporter,
given the certificates and the credential the role's tasks/pki.yml makes on the controller."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelmon.cli import make_server
from accelmon.exporter.runtime import Exporter, Sampler
from accelmon.exporter.server import allowed_networks
from accelmon.exporter.webconfig import load_web_config
from tests.support.ansible import render_role_template
from tests.support.paths import ROOT
from tests.support.processes import free_port
from tests.support.toy import Steady
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e
bcrypt = pytest.importorskip("bcrypt")  # the `auth` extra; the suite's environment has it

ROLES = ROOT / "ansible" / "roles"
# Each host a case: what its server does wrong, if anything, and the cause the check must name (None: it passes).
EXPECTED = {
    "good": None,  # the deploy's PKI, behind an allow-list that names only a Prometheus server
    "badpass": "auth",  # the masters' password is not the one this host was deployed with
    "wrongname": "certificate",  # another host's certificate
    "otherca": "certificate",  # a certificate another CA signed
    "operator": None,  # the operator's users: the password is not the deploy's, a 401 without it is right
    "open": "auth",  # the operator's users configured, yet it answers without a password
    "mtls": None,  # the operator's certificate and client CA: refused without a client certificate
    "plain": None,  # accelmon_exporter_plain_http: plain HTTP
    "down": "connection",  # nothing listens
    # Ansible writes modules as files to this host (no pipelining): the password is not sent (were it sent, the
    # server, which holds another password's hash, would refuse it), and a 401 without it passes.
    "unpiped": None,
    "node": None,  # Debian's node_exporter with the deploy's web config
}


def playbook(
    work: Path, inventory: dict[str, dict[str, Any]], tasks: list[dict[str, Any]], **env: str
) -> subprocess.CompletedProcess[str]:
    """ansible-playbook of one play of `tasks` on `inventory`'s hosts (host -> its variables), each this machine by a
    local connection, from `work` (its inventory, play and home)."""
    work.mkdir(exist_ok=True)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {host: {**local, **variables} for host, variables in inventory.items()}
    # YAML, not INI: the variables keep their types (lists, mappings, PEM texts).
    (work / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}, sort_keys=False))
    play = {
        "hosts": "all",
        "gather_facts": False,
        # node_exporter's role variables, which its check task reads (its defaults are the hosts' variables here:
        # a play's vars_files would override the inventory's).
        "vars_files": [str(ROLES / "accelmon_node_exporter" / "vars" / "main.yml")],
        "tasks": tasks,
    }
    (work / "play.yml").write_text(yaml.safe_dump([play], sort_keys=False))
    (work / "home").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "NO_COLOR": "1",
        "HOME": str(work / "home"),
        **env,
    }
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(work / "hosts.yml"), str(work / "play.yml")],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600, check=False,
    )  # fmt: skip


def pki_task(directory: Path) -> dict[str, Any]:
    """The role's controller PKI (tasks/pki.yml) in `directory`: a CA, the credential, a certificate per host."""
    return {
        "name": "Scrape PKI",
        "ansible.builtin.include_role": {"name": "accelmon_exporter", "tasks_from": "pki.yml"},
        "vars": {
            "__accelmon_exporter_pki_path": str(directory),
            "__accelmon_exporter_pki_plain": "{{ accelmon_exporter_plain_http | default(false) }}",
            "__accelmon_exporter_pki_deployed": {},
        },
    }


def role_task(role: str, name: str) -> dict[str, Any]:
    """A task of a role's tasks/main.yml (a block's too) as written there, made into an include of the exporter's
    role where it imports a file of it."""
    tasks = yaml.safe_load((ROLES / role / "tasks" / "main.yml").read_text())
    found = next(t for b in tasks for t in [b, *b.get("block", [])] if t.get("name") == name)
    task = {k: v for k, v in found.items() if k != "ansible.builtin.import_tasks"}
    if "ansible.builtin.import_tasks" in found:
        task["ansible.builtin.include_role"] = {"name": role, "tasks_from": found["ansible.builtin.import_tasks"]}
    return task


def web_config(path: Path, pki: Path, cert: str, users: dict[str, str], client_ca: bool = False) -> Path:
    tls: dict[str, str] = {"cert_file": f"{pki}/hosts/{cert}.crt", "key_file": f"{pki}/hosts/{cert}.key"}
    if client_ca:
        tls.update(client_auth_type="RequireAndVerifyClientCert", client_ca_file=f"{pki}/ca.crt")
    path.write_text(yaml.safe_dump({"tls_server_config": tls, **({"basic_auth_users": users} if users else {})}))
    return path


def bcrypt_hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


@pytest.fixture
def servers() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for server in started:
        if isinstance(server, subprocess.Popen):
            server.terminate()
            server.wait(10)
        else:
            server.stop()


def test_a_worker_whose_scrape_fails_fails_its_deploy_naming_the_cause(tmp_path, servers):
    """Each host's exporter restarted as the deploy left it; the check passes where Prometheus's scrape would, and
    fails the host naming the cause (certificate, auth, connection) where it would not. The deploy's own allow-list
    (only a Prometheus server's address) lets the check in."""
    pki, other_pki = tmp_path / "pki", tmp_path / "other-pki"
    ports = {host: free_port() for host in EXPECTED}
    made = playbook(tmp_path / "pki-run", {host: {} for host in EXPECTED}, [pki_task(pki)])
    assert made.returncode == 0, made.stdout[-3000:]
    another = playbook(tmp_path / "other-pki-run", {"otherca": {}}, [pki_task(other_pki)])
    assert another.returncode == 0, another.stdout[-3000:]

    # accelmon-exporter's config as the role renders it for an allow-list of one Prometheus server.
    rendered = tmp_path / "exporter.yml"
    listen = {
        "accelmon_exporter_listen_address": f":{ports['good']}",
        "accelmon_exporter_allowed_clients": ["192.0.2.7"],
    }
    render_role_template("accelmon_exporter", "exporter.yml.j2", rendered, listen)
    allowed = allowed_networks(yaml.safe_load(rendered.read_text())["web"]["allowed_clients"])

    generated = {"prometheus": (pki / "scrape-password.bcrypt").read_text().strip()}
    operators = {"ops": bcrypt_hash("the operator's own")}
    webs = {
        "good": (web_config(tmp_path / "good.yml", pki, "good", generated), allowed),
        "badpass": (web_config(tmp_path / "badpass.yml", pki, "badpass", {"prometheus": bcrypt_hash("other")}), ()),
        "unpiped": (web_config(tmp_path / "unpiped.yml", pki, "unpiped", {"prometheus": bcrypt_hash("other")}), ()),
        "wrongname": (web_config(tmp_path / "wrongname.yml", pki, "good", generated), ()),
        "otherca": (web_config(tmp_path / "otherca.yml", other_pki, "otherca", generated), ()),
        "operator": (web_config(tmp_path / "operator.yml", pki, "operator", operators), ()),
        "open": (web_config(tmp_path / "open.yml", pki, "open", {}), ()),
        "mtls": (web_config(tmp_path / "mtls.yml", pki, "mtls", operators, client_ca=True), ()),
        "plain": (None, ()),
    }
    exporter = Exporter([Sampler(Steady(), 0.05)])
    exporter.collect_once()
    for host, (web, allow) in webs.items():
        address = f":{ports[host]}" if host == "good" else f"127.0.0.1:{ports[host]}"
        server = make_server(exporter, address, load_web_config(str(web)) if web else None, allow)
        server.start()
        servers.append(server)
    node_web = web_config(tmp_path / "node.yml", pki, "node", generated)
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    assert binary, "node_exporter not found: install Debian's prometheus-node-exporter (.ci/run does)"
    flags = ["--collector.disable-defaults", f"--web.listen-address=127.0.0.1:{ports['node']}"]
    servers.append(subprocess.Popen([binary, *flags, f"--web.config.file={node_web}"], stderr=subprocess.DEVNULL))
    probe = ["curl", "-sk", "-o", "/dev/null", f"https://127.0.0.1:{ports['node']}/"]
    wait_until(lambda: subprocess.run(probe, check=False).returncode == 0, 30, "node_exporter serving")

    operator_tls = {
        "accelmon_exporter_tls_cert": (pki / "hosts" / "mtls.crt").read_text(),
        "accelmon_exporter_tls_key": (pki / "hosts" / "mtls.key").read_text(),
        "accelmon_exporter_tls_client_ca": (pki / "ca.crt").read_text(),
    }
    variables: dict[str, dict[str, Any]] = {
        host: {"accelmon_exporter_python": sys.executable, "accelmon_exporter_listen_address": f"127.0.0.1:{port}"}
        for host, port in ports.items()
    }
    variables["good"].update(listen)
    for host in ("operator", "open", "mtls"):
        variables[host]["accelmon_exporter_basic_auth_users"] = operators
    variables["mtls"].update(operator_tls)
    variables["plain"]["accelmon_exporter_plain_http"] = True
    variables["node"].update(
        accelmon_node_exporter_listen_address=f"127.0.0.1:{ports['node']}", accelmon_node_exporter_plain_http=False
    )
    exporter_check = role_task("accelmon_exporter", "Check accelmon-exporter serves /metrics")
    node_check = role_task("accelmon_node_exporter", "Check node_exporter serves /metrics after the deploy")
    exporter_check["when"] = "inventory_hostname != 'node'"
    node_check["when"] = [node_check["when"], "inventory_hostname == 'node'"]
    variables["unpiped"]["ansible_pipelining"] = False
    # Pipelined as over SSH with the project's ansible.cfg ([ssh_connection]; the local connection reads this one).
    tasks = [pki_task(pki), exporter_check, node_check]
    result = playbook(tmp_path / "check-run", variables, tasks, ANSIBLE_PIPELINING="true")
    output = result.stdout
    assert result.returncode != 0, output[-4000:]
    failures = {
        host: json.loads(answer)["msg"] for host, answer in re.findall(r"^fatal: \[(\w+)\]: FAILED! => (\{.*\})$",
                                                                       output, re.M)
    }  # fmt: skip
    recap = output.split("PLAY RECAP")[-1]
    for host, cause in EXPECTED.items():
        if cause is None:
            assert re.search(rf"^{host}\s*:.*failed=0", recap, re.M), (host, failures.get(host), output[-4000:])
        else:
            assert re.search(rf": {cause}: ", failures.get(host, "")), (host, failures.get(host), output[-4000:])
    # Which exporter, where, and why, for the operator; never the password.
    assert "accelmon-exporter on badpass fails the scrape" in failures["badpass"]
    assert "401" in failures["badpass"] and "scrape CA" in failures["otherca"]
    password = (pki / "scrape-password").read_text().strip()
    assert password not in output + result.stderr


def test_the_check_runs_as_root_and_isolated():
    """Issue 66 review (a worker's user): the exporter keeps root's loopback connections slots of their own, so that
    a user flooding the loopback cannot fail the deploy's check (tests/test_http.py), but the check ran as the SSH
    user (no `become` on the task or the Workers play; inventory.example.ini logs in as ubuntu): its connections
    shared the loopback's 8 slots with the flood. It runs as root now, and with `python3 -I`: as root, neither the
    working directory (the SSH user's home) nor PYTHON* variables may choose a module it imports. The tests here run
    as root, where both ways pass, so this reads the tasks as written."""
    tasks = yaml.safe_load((ROLES / "accelmon_exporter" / "tasks" / "scrape_check.yml").read_text())
    commands = [task for task in tasks if "ansible.builtin.command" in task]
    assert len(commands) == 2 and all(task.get("become") is True for task in commands), commands
    argvs = [task["ansible.builtin.command"]["argv"] for task in commands]
    python = next(argv for argv in argvs if argv[0] == "{{ accelmon_exporter_python }}")
    assert python[1:3] == ["-I", "-c"]
