"""node_exporter and accelmon-exporter do not share one TLS key (issue 66): the deploy's CA issues each service of a
worker its own key and certificate for the same names, each written for its service's user alone, and a worker
deployed when both served one key gets node_exporter's own at the next deploy. Run here as the roles have it (the
PKI step, accelmon-exporter's tasks/tls.yml, node_exporter's tasks/web.yml) on two local-connection 'workers', each
writing under the test's directory, with a systemctl that answers as systemd would (the handlers' restarts, the
user node_exporter's unit runs as)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="gives files to other users: root only"),
]

ROLES = ROOT / "ansible" / "roles"
WORKERS = {"gpu-1": {"ansible_host": "10.0.0.5"}, "gpu-2": {}}
# Accounts every Debian has, standing for the services' own (accelmon; Debian's node_exporter runs as prometheus).
USERS = {"accelmon": "daemon", "prometheus": "bin", "root": "root"}
EXPORTER_DIR, NODE_DIR = "etc/accelmon", "etc/accelmon-node-exporter"


def fake_systemctl(directory: Path) -> Path:
    """A systemctl answering `show --property=User --value` with node_exporter's user, any other `show` as for a
    loaded, active unit (the handlers' systemd_service reads it), and anything else (restart, daemon-reload) with 0."""
    directory.mkdir(exist_ok=True)
    script = directory / "systemctl"
    user = directory / "unit-user"  # another user, as an operator's drop-in names, where the test writes one
    script.write_text(
        '#!/bin/sh\n[ "$1" = show ] || exit 0\n'
        f'case "$*" in *--property=User*) cat {user} 2>/dev/null || echo {USERS["prometheus"]} ; exit 0 ;; esac\n'
        "printf 'Id=unit.service\\nLoadState=loaded\\nActiveState=active\\nSubState=running\\n"
        "UnitFileState=enabled\\n'\n"
    )
    script.chmod(0o755)
    return directory


def deploy(work: Path, *flags: str) -> str:
    """The PKI step as accelmon_exporter's tasks/main.yml runs it, then both services' TLS tasks, on each worker into
    work/<worker>/etc/...; the PKI in work/home. Returns the output; the play must pass."""
    deployed = {"path": "{{ accelmon_exporter_config_dir }}/web-config.yml", "key": "hash"}
    tasks = [
        {"ansible.builtin.include_role": {"name": "accelmon_exporter", "tasks_from": "pki.yml"},
         "vars": {"__accelmon_exporter_pki_path": "{{ accelmon_exporter_pki_dir }}",
                  "__accelmon_exporter_pki_plain": "{{ accelmon_exporter_plain_http }}",
                  "__accelmon_exporter_pki_node_exporter": True, "__accelmon_exporter_pki_deployed": deployed}},
        {"ansible.builtin.include_role": {"name": "accelmon_exporter", "tasks_from": "tls.yml"}},
        {"ansible.builtin.include_role": {"name": "accelmon_node_exporter", "tasks_from": "web.yml"}},
    ]  # fmt: skip
    local = {"ansible_connection": "local", "ansible_become": False, "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {name: {**local, **own} for name, own in WORKERS.items()}}}
    (work / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (work / "play.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    (work / "home").mkdir(exist_ok=True)
    # The exporter's own check of its web config (the role's validate:), from this checkout's environment.
    (work / "install").mkdir(exist_ok=True)
    if not (work / "install" / "venv").exists():
        (work / "install" / "venv").symlink_to(Path(sys.executable).parent.parent)
    host_dir = str(work / "{{ inventory_hostname }}")
    variables = {
        "ansible_facts": {"os_family": "Debian", "distribution": "Debian", "distribution_major_version": "12"},
        "accelmon_exporter_config_dir": f"{host_dir}/{EXPORTER_DIR}",
        "__accelmon_node_exporter_web_dir": f"{host_dir}/{NODE_DIR}",
        "accelmon_exporter_install_dir": str(work / "install"),
        "accelmon_exporter_user": USERS["accelmon"], "accelmon_exporter_group": USERS["accelmon"],
        "accelmon_node_exporter_group": USERS["prometheus"],
    }  # fmt: skip
    path = f"{fake_systemctl(work / 'bin')}:{os.environ['PATH']}"
    env = {**os.environ, "HOME": str(work / "home"), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1",
           "ANSIBLE_ROLES_PATH": str(ROLES), "PATH": path}  # fmt: skip
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(work / "hosts.yml"), *flags,
         "-e", json.dumps(variables), str(work / "play.yml")],
        capture_output=True, text=True, cwd=ROOT, timeout=600, env=env,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def changed_counts(output: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+:.*changed=(\d+)", output, re.M)}


def owner_group_mode(path: Path) -> tuple[str, str, int]:
    import grp
    import pwd

    found = path.stat()
    return pwd.getpwuid(found.st_uid).pw_name, grp.getgrgid(found.st_gid).gr_name, found.st_mode & 0o777


def documented_worker_modes() -> dict[str, tuple[str, str, int]]:
    """docs/security.md's table of a worker's files, each path to (owner, group, mode) with this test's accounts."""
    text = (ROOT / "docs" / "security.md").read_text()
    table = text.split("On a worker (", 1)[1].split("| --- | --- | --- |\n", 1)[1]
    found = {}
    for row in re.findall(r"^  \| (.+) \| (\w+):(\w+) \| (0[0-7]{3}) \|$", table, re.M):
        names, user, group, mode = row
        directory = ""
        for name in re.findall(r"`([^`]+)`", names):
            directory = str(Path(name).parent) if name.startswith("/") else directory
            path = name if name.startswith("/") else f"{directory}/{name}"
            found[path.rstrip("/")] = (USERS[user], USERS[group], int(mode, 8))
    return found


def pem(path: Path) -> str:
    return path.read_text().strip()


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A first deploy in --check (nothing on the workers), a real one, a second one and a --check after it."""
    work = tmp_path_factory.mktemp("keys")
    outputs = [deploy(work, "--check")]
    untouched = [name for name in WORKERS if not (work / name).exists()]
    outputs += [deploy(work), deploy(work), deploy(work, "--check", "--diff")]
    return {"work": work, "outputs": outputs, "untouched": untouched}


def test_each_service_serves_a_key_of_its_own_for_the_workers_names_from_the_ca(deployed, tmp_path):
    """Two keys per worker (before: node_exporter was given accelmon-exporter's), each with a certificate the CA
    signed for the names Prometheus scrapes the worker by, and each certificate for its own key."""
    work = deployed["work"]
    ca = work / "home" / ".accelmon" / "pki" / "ca.crt"
    for name, (addresses) in {"gpu-1": ["10.0.0.5"], "gpu-2": []}.items():
        exporter, node = work / name / EXPORTER_DIR / "tls", work / name / NODE_DIR
        assert pem(exporter / "server.key") != pem(node / "server.key"), name
        assert pem(exporter / "server.crt") != pem(node / "server.crt"), name
        for directory in (exporter, node):
            checks = [["-verify_hostname", name]] + [["-verify_ip", address] for address in addresses]
            for check in checks:
                verified = subprocess.run(["openssl", "verify", "-CAfile", str(ca), *check,
                                           str(directory / "server.crt")], capture_output=True, text=True)  # fmt: skip
                assert verified.returncode == 0, (directory, check, verified.stdout + verified.stderr)
            public = [
                subprocess.run(command, capture_output=True, text=True, check=True).stdout
                for command in (["openssl", "x509", "-noout", "-pubkey", "-in", str(directory / "server.crt")],
                                ["openssl", "pkey", "-pubout", "-in", str(directory / "server.key")])
            ]  # fmt: skip
            assert public[0] == public[1], directory
        # node_exporter's web config names its own files and the scrape credential's hash, as before.
        web = yaml.safe_load((node / "web-config.yml").read_text())
        assert web["tls_server_config"] == {"cert_file": f"{node}/server.crt", "key_file": f"{node}/server.key"}
        assert web["basic_auth_users"]["prometheus"].startswith("$2")
    # On the controller: node_exporter's apart from the exporter's, the owner's alone as every PKI file.
    pki = work / "home" / ".accelmon" / "pki"
    assert sorted(p.name for p in (pki / "node-exporter").iterdir()) == ["gpu-1.crt", "gpu-1.key", "gpu-2.crt",
                                                                         "gpu-2.key"]  # fmt: skip
    assert oct((pki / "node-exporter").stat().st_mode & 0o777) == "0o700"
    assert {oct(p.stat().st_mode & 0o777) for p in pki.rglob("*") if p.is_file()} == {"0o600"}
    assert not [out for out in deployed["outputs"] if "BEGIN EC PRIVATE" in out or "BEGIN PRIVATE" in out]


def test_each_key_is_its_services_user_alone_as_docs_security_md_says(deployed):
    """The deployed owners and modes are docs/security.md's worker table, row for row (before: both keys 0640,
    readable by the exporter's group and by node_exporter's, `prometheus` on Debian)."""
    documented = documented_worker_modes()
    assert {"/etc/accelmon/tls/server.key", "/etc/accelmon-node-exporter/server.key"} <= set(documented), documented
    for name in WORKERS:
        for path, expected in documented.items():
            local = deployed["work"] / name / path.lstrip("/")
            assert owner_group_mode(local) == expected, (name, path)


def test_a_second_deploy_and_check_change_nothing_and_check_mode_touches_no_worker(deployed):
    _, first, second, last_check = deployed["outputs"]
    assert deployed["untouched"] == list(WORKERS)  # --check wrote nothing on the workers
    assert changed_counts(first)["gpu-1"] > 0
    assert changed_counts(second) == {"gpu-1": 0, "gpu-2": 0}, second[-3000:]
    assert changed_counts(last_check) == {"gpu-1": 0, "gpu-2": 0}, last_check[-3000:]


def test_a_worker_whose_node_exporter_served_the_shared_key_gets_its_own_and_the_old_copy_goes(tmp_path):
    """A worker deployed before this change: node_exporter's directory holds accelmon-exporter's key and
    certificate (root:<node_exporter's group> 0640) and the controller has no node-exporter/ directory. The next
    deploy issues node_exporter its own, writes it in place of the shared one (no file there holds the exporter's key
    any more), leaves the exporter's key and certificate as they were, and the deploy after changes nothing."""
    deploy(tmp_path)
    pki = tmp_path / "home" / ".accelmon" / "pki"
    import shutil

    shutil.rmtree(pki / "node-exporter")
    for name in WORKERS:
        exporter, node = tmp_path / name / EXPORTER_DIR / "tls", tmp_path / name / NODE_DIR
        for file in ("server.crt", "server.key"):
            (node / file).write_text((exporter / file).read_text())
            os.chown(node / file, 0, __import__("grp").getgrnam(USERS["prometheus"]).gr_gid)
            (node / file).chmod(0o640)
    before = {name: (pki / "hosts" / f"{name}.key").read_bytes() for name in WORKERS}
    shared = {name: pem(tmp_path / name / EXPORTER_DIR / "tls" / "server.key") for name in WORKERS}
    upgrade = deploy(tmp_path)
    assert changed_counts(upgrade)["gpu-1"] > 0
    for name in WORKERS:
        node = tmp_path / name / NODE_DIR
        assert not [p for p in node.rglob("*") if p.is_file() and shared[name] in p.read_text()], name
        assert pem(node / "server.key") == pem(pki / "node-exporter" / f"{name}.key")
        assert owner_group_mode(node / "server.key") == (USERS["prometheus"], "root", 0o400)
        assert pem(tmp_path / name / EXPORTER_DIR / "tls" / "server.key") == shared[name]  # the exporter's kept
        assert (pki / "hosts" / f"{name}.key").read_bytes() == before[name]
    assert changed_counts(deploy(tmp_path)) == {"gpu-1": 0, "gpu-2": 0}


def test_node_exporter_serves_its_own_certificate_from_the_files_the_role_wrote(deployed):
    """Debian's node_exporter given the web config the role wrote (its own files, as deployed): a client trusting
    the CA and checking the worker's name gets node_exporter's certificate, not accelmon-exporter's, and /metrics
    with the scrape password."""
    import base64
    import shutil
    import socket
    import ssl
    import urllib.request

    from tests.support.processes import start_node_exporter
    from tests.support.waiting import wait_until

    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    assert binary, "node_exporter not found: install Debian's prometheus-node-exporter (.ci/run does)"
    work = deployed["work"]
    pki = work / "home" / ".accelmon" / "pki"
    node, exporter = work / "gpu-1" / NODE_DIR, work / "gpu-1" / EXPORTER_DIR / "tls"
    process, port = start_node_exporter(binary, node / "web-config.yml")
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))

    def served() -> bytes | None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname="gpu-1") as tls:  # the name is checked
                    return tls.getpeercert(binary_form=True)
        except OSError:
            return None

    try:
        assert wait_until(lambda: served() is not None, timeout=20)
        der = served()
        assert der == ssl.PEM_cert_to_DER_cert((node / "server.crt").read_text())
        assert der != ssl.PEM_cert_to_DER_cert((exporter / "server.crt").read_text())
        request = urllib.request.Request(f"https://gpu-1:{port}/metrics")
        password = (pki / "scrape-password").read_text().strip()
        request.add_header("Authorization", "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode())
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
        # gpu-1 is not a name this machine resolves: connect to the loopback, check the certificate for gpu-1.
        original = socket.getaddrinfo
        socket.getaddrinfo = lambda host, *rest: original("127.0.0.1" if host == "gpu-1" else host, *rest)
        try:
            with opener.open(request, timeout=10) as response:
                assert response.status == 200 and b"node_exporter_build_info" in response.read()
        finally:
            socket.getaddrinfo = original
    finally:
        process.terminate()
        process.wait(10)


def test_a_node_exporter_run_as_another_user_reaches_its_own_files(tmp_path):
    """An operator's drop-in runs node_exporter as another user (here sys, not in node_exporter's group): its key,
    certificate and web config are that user's alone, and their directory is entered by that user's primary group.
    Before, the files followed the user but the directory stayed root:<node_exporter's group> 0750, which that user
    could not enter: node_exporter failed to start on its web config."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "unit-user").write_text("sys\n")
    deploy(tmp_path)
    for name in WORKERS:
        node = tmp_path / name / NODE_DIR
        assert owner_group_mode(node) == ("root", "sys", 0o750), name
        for file in ("server.crt", "server.key", "web-config.yml"):
            assert owner_group_mode(node / file) == ("sys", "root", 0o400), (name, file)
    assert changed_counts(deploy(tmp_path)) == {"gpu-1": 0, "gpu-2": 0}
