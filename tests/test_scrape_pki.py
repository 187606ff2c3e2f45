"""TLS and basic auth on by default (issue 66): the scrape PKI the deploy makes on the controller, once, and what the
workers' exporters and the masters' Prometheus are configured with from it."""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.processes import start_node_exporter
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

ROLES = ROOT / "ansible" / "roles"
WORKERS = {"gpu-1": {"ansible_host": "10.0.0.5"}, "gpu-2": {}}


def run_play(
    work: Path, tasks: list[dict], variables: dict[str, Any], *flags: str, passes: bool = True,
    workers: dict[str, dict[str, str]] = WORKERS,
) -> str:  # fmt: skip
    """One play over two local 'workers' (gpu-1 at 10.0.0.5, gpu-2 by name), HOME in `work`: the default PKI
    directory (~/.accelmon/pki) is the test's. Returns the output; the play must pass (or fail: passes=False)."""
    inventory = {"all": {"hosts": {name: {"ansible_connection": "local", **own} for name, own in workers.items()}}}
    (work / "hosts.yml").write_text(yaml.safe_dump(inventory))
    play = [{"hosts": "all", "gather_facts": False, "tasks": tasks}]
    (work / "play.yml").write_text(yaml.safe_dump(play))
    (work / "home").mkdir(exist_ok=True)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(work / "hosts.yml"), *flags,
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", json.dumps(variables), str(work / "play.yml")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "HOME": str(work / "home"), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1",
             "ANSIBLE_ROLES_PATH": str(ROLES)},
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert (result.returncode == 0) == passes, output[-4000:]
    return output


def pki_tasks(role: str = "accelmon_exporter", **variables: Any) -> list[dict]:
    """The role's own step (pki.yml, as its tasks include it), then __accelmon_pki written out per host."""
    return [
        {"ansible.builtin.include_role": {"name": "accelmon_exporter", "tasks_from": "pki.yml"},
         "vars": {"__accelmon_exporter_pki_path": "{{ accelmon_exporter_pki_dir }}",
                  "__accelmon_exporter_pki_plain": "{{ accelmon_exporter_plain_http }}", **variables}},
        {"ansible.builtin.copy": {"content": "{{ __accelmon_pki | to_json }}", "mode": "0600",
                                  "dest": "{{ playbook_dir }}/{{ inventory_hostname }}.json"},
         "delegate_to": "localhost", "no_log": True, "check_mode": False},
    ]  # fmt: skip


def changed_counts(output: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+:.*changed=(\d+)", output, re.M)}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The PKI made by a first deploy in --check, then a second, real one: both outputs and what each host got."""
    work = tmp_path_factory.mktemp("pki")
    first = run_play(work, pki_tasks(), {}, "--check", "--diff")
    before = {p.name: p.read_bytes() for p in (work / "home" / ".accelmon" / "pki").rglob("*") if p.is_file()}
    second = run_play(work, pki_tasks(), {}, "--diff")
    after = {p.name: p.read_bytes() for p in (work / "home" / ".accelmon" / "pki").rglob("*") if p.is_file()}
    hosts = {name: json.loads((work / f"{name}.json").read_text()) for name in WORKERS}
    return {"work": work, "outputs": [first, second], "before": before, "after": after, "hosts": hosts}


def test_the_ca_certificates_and_password_are_made_once_on_the_controller_and_reused(made):
    pki = made["work"] / "home" / ".accelmon" / "pki"
    assert set(made["after"]) == {"ca.key", "ca.crt", "scrape-password", "scrape-password.bcrypt",
                                  "gpu-1.key", "gpu-1.crt", "gpu-2.key", "gpu-2.crt"}  # fmt: skip
    assert made["before"] == made["after"]  # the second deploy made nothing anew
    assert changed_counts(made["outputs"][1]) == {"gpu-1": 0, "gpu-2": 0}
    # The owner's alone: the directories 0700, every file 0600.
    assert {oct(p.stat().st_mode & 0o777) for p in (pki, pki / "hosts")} == {"0o700"}
    assert {oct(p.stat().st_mode & 0o777) for p in pki.rglob("*") if p.is_file()} == {"0o600"}
    password = made["after"]["scrape-password"].decode().strip()
    assert len(password) >= 40
    assert not [output for output in made["outputs"] if password in output or "BEGIN EC PRIVATE" in output]
    hosts = made["hosts"]
    assert hosts["gpu-1"]["password"] == hosts["gpu-2"]["password"] == password
    assert hosts["gpu-1"]["ca"] == hosts["gpu-2"]["ca"] and hosts["gpu-1"]["cert"] != hosts["gpu-2"]["cert"]
    bcrypt = pytest.importorskip("bcrypt")
    assert bcrypt.checkpw(password.encode(), hosts["gpu-1"]["hash"].encode())


def test_each_workers_certificate_names_it_and_its_address_and_is_signed_by_the_ca(made, tmp_path):
    x509 = pytest.importorskip("cryptography.x509")
    pki = made["work"] / "home" / ".accelmon" / "pki"
    for host, names in {"gpu-1": ({"gpu-1"}, {"10.0.0.5"}), "gpu-2": ({"gpu-2"}, set())}.items():
        cert = x509.load_pem_x509_certificate((pki / "hosts" / f"{host}.crt").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert set(san.get_values_for_type(x509.DNSName)) == names[0]
        assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == names[1]
        command = ["openssl", "verify", "-CAfile", str(pki / "ca.crt"), str(pki / "hosts" / f"{host}.crt")]
        verified = subprocess.run(command, capture_output=True, text=True)
        assert verified.returncode == 0, verified.stdout + verified.stderr


def test_plain_http_is_an_explicit_choice_and_warned(tmp_path):
    output = run_play(tmp_path, pki_tasks(), {"accelmon_exporter_plain_http": True})
    assert "[WARNING] plain HTTP asked for" in output
    assert json.loads((tmp_path / "gpu-1.json").read_text()) == {}
    assert not (tmp_path / "home" / ".accelmon").exists()


def role_value(work: Path, role: str, expression: str, facts: dict[str, Any], **variables: Any) -> Any:
    """An expression over `role`'s defaults and vars, with __accelmon_pki as pki.yml sets it, as Ansible renders it."""
    files = [str(ROLES / role / "defaults" / "main.yml"), str(ROLES / role / "vars" / "main.yml")]
    tasks = [{"ansible.builtin.copy": {"content": "{{ (" + expression + ") | to_json }}", "mode": "0600",
                                       "dest": "{{ playbook_dir }}/{{ inventory_hostname }}-value.json"},
              "delegate_to": "localhost", "vars": {"__accelmon_pki": facts}}]  # fmt: skip
    play = [{"hosts": "gpu-1", "gather_facts": False, "vars_files": files, "tasks": tasks}]
    (work / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"gpu-1": {"ansible_connection": "local"}}}}))
    (work / "value.yml").write_text(yaml.safe_dump(play))
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(work / "hosts.yml"),
         "-e", f"ansible_python_interpreter={sys.executable}",
         "-e", json.dumps({"ansible_facts": {"os_family": "Debian"}, **variables}), str(work / "value.yml")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    return json.loads((work / "gpu-1-value.json").read_text())


def test_the_exporters_web_config_takes_the_generated_certificate_and_password_unless_given(made, tmp_path):
    facts = made["hosts"]["gpu-1"]
    web = role_value(tmp_path, "accelmon_exporter", "__accelmon_exporter_web_config", facts)
    assert web == {"tls_server_config": {"cert_file": "/etc/accelmon/tls/server.crt",
                                         "key_file": "/etc/accelmon/tls/server.key"},
                   "basic_auth_users": {"prometheus": facts["hash"]}}  # fmt: skip
    files = role_value(tmp_path, "accelmon_exporter", "__accelmon_exporter_tls_files", facts)
    assert [f["content"] for f in files] == [facts["cert"], facts["key"], ""]
    assert role_value(tmp_path, "accelmon_exporter", "__accelmon_exporter_extras", facts) == ["auth"]
    # The operator's own win.
    own = {"prometheus": "$2b$12$" + "a" * 53}
    web = role_value(tmp_path, "accelmon_exporter", "__accelmon_exporter_web_config", facts,
                     accelmon_exporter_basic_auth_users=own)  # fmt: skip
    assert web["basic_auth_users"] == own
    files = role_value(tmp_path, "accelmon_exporter", "__accelmon_exporter_tls_files", facts,
                       accelmon_exporter_tls_cert="OWN CERT", accelmon_exporter_tls_key="OWN KEY")  # fmt: skip
    assert [f["content"] for f in files][:2] == ["OWN CERT", "OWN KEY"]
    assert role_value(tmp_path, "accelmon_exporter", "__accelmon_exporter_web_config", {}) == {}  # plain HTTP


def test_node_exporter_serves_https_with_the_password_and_refuses_plain_http(made, tmp_path):
    """Debian's node_exporter (the one the role installs) given the role's flags and web config: it serves the
    generated certificate to a client trusting the CA, answers 401 without the password, nothing over plain HTTP."""
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    assert binary, "node_exporter not found: install Debian's prometheus-node-exporter (.ci/run does)"
    facts = made["hosts"]["gpu-1"]
    web = role_value(tmp_path, "accelmon_node_exporter", "__accelmon_node_exporter_web_config", facts)
    assert web["basic_auth_users"] == {"prometheus": facts["hash"]}
    directory = "/etc/accelmon-node-exporter"
    assert web["tls_server_config"] == {"cert_file": f"{directory}/server.crt", "key_file": f"{directory}/server.key"}
    template = str(ROLES / "accelmon_node_exporter" / "templates" / "node_exporter.default.j2")

    def flags(**variables: Any) -> str:
        text = role_value(tmp_path, "accelmon_node_exporter", f"lookup('ansible.builtin.template', '{template}')",
                          facts, **variables)  # fmt: skip
        return next(line for line in text.splitlines() if line.startswith("ARGS="))

    assert f"--web.config.file={directory}/web-config.yml" in flags()
    assert "--web.config.file" not in flags(accelmon_node_exporter_plain_http=True)
    # The same files, here.
    (tmp_path / "server.crt").write_text(facts["cert"])
    (tmp_path / "server.key").write_text(facts["key"])
    web["tls_server_config"] = {"cert_file": str(tmp_path / "server.crt"), "key_file": str(tmp_path / "server.key")}
    (tmp_path / "web-config.yml").write_text(yaml.safe_dump(web))
    process, port = start_node_exporter(binary, tmp_path / "web-config.yml")
    context = ssl.create_default_context(cadata=facts["ca"])
    context.check_hostname = False  # the certificate names gpu-1 and 10.0.0.5; its chain is what is checked here

    def status(url: str, password: str | None) -> int | str:
        request = urllib.request.Request(url)
        if password:
            import base64

            token = base64.b64encode(f"prometheus:{password}".encode()).decode()
            request.add_header("Authorization", "Basic " + token)
        try:
            with urllib.request.urlopen(request, timeout=5, context=context if url.startswith("https") else None) as r:
                return r.status
        except urllib.error.HTTPError as error:
            return error.code
        except (urllib.error.URLError, ConnectionError) as error:
            return type(error).__name__

    try:
        https = f"https://127.0.0.1:{port}/metrics"
        assert wait_until(lambda: status(https, facts["password"]) == 200, timeout=20)
        assert status(https, None) == 401
        assert status(https, "wrong") == 401
        assert status(f"http://127.0.0.1:{port}/metrics", facts["password"]) == 400  # Go's answer to HTTP on TLS
    finally:
        process.terminate()
        process.wait(10)


def test_prometheus_scrapes_both_worker_jobs_over_https_with_the_credential_and_limits(made, tmp_path):
    """The master's prometheus.yml from the generated PKI: both worker jobs https (the CA, the password files) and
    bounded; promtool check config passes on it with the secret files where the container mounts them."""
    facts = {k: v for k, v in made["hosts"]["gpu-1"].items() if k in ("ca", "password", "hash")}
    template = str(ROLES / "accelmon_master" / "templates" / "prometheus.yml.j2")
    text = role_value(tmp_path, "accelmon_master", f"lookup('ansible.builtin.template', '{template}')", facts,
                      accelmon_master_shards=1)  # fmt: skip
    config = yaml.safe_load(text)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    secrets = "/etc/prometheus/secrets"
    for name, prefix in (("accelmon", "exporter"), ("node", "node-exporter")):
        job = jobs[name]
        assert job["scheme"] == "https"
        assert job["tls_config"] == {"ca_file": f"{secrets}/{prefix}-ca.crt"}
        assert job["basic_auth"] == {"username": "prometheus", "password_file": f"{secrets}/{prefix}-password"}
        assert (job["sample_limit"], job["label_limit"], job["label_value_length_limit"], job["body_size_limit"]) == (
            20000,
            30,
            1024,
            "10MB",
        )
    secret_files = role_value(tmp_path, "accelmon_master", "__accelmon_master_exporter_secrets | selectattr('content')"
                              " | map(attribute='name') | list", facts)  # fmt: skip
    assert secret_files == ["exporter-ca.crt", "exporter-password", "node-exporter-ca.crt", "node-exporter-password"]
    # promtool reads the files the config names: here, under tmp_path.
    (tmp_path / "secrets").mkdir()
    for name in secret_files:
        (tmp_path / "secrets" / name).write_text(facts["ca"] if name.endswith(".crt") else facts["password"])
    (tmp_path / "prometheus.yml").write_text(
        text.replace(secrets, str(tmp_path / "secrets")).replace("/etc/prometheus/", f"{tmp_path}/")
    )
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found (scripts/setup.sh puts it in .tools)"
    checked = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                             text=True)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Plain HTTP, asked for: no TLS, no password, still bounded.
    plain = yaml.safe_load(role_value(tmp_path, "accelmon_master", f"lookup('ansible.builtin.template', '{template}')",
                                      facts, accelmon_master_scrape_plain_http=True))  # fmt: skip
    for job in plain["scrape_configs"][:2]:
        assert "scheme" not in job and "basic_auth" not in job and job["sample_limit"] == 20000


@pytest.mark.parametrize(
    ("group", "variables", "message"),
    [
        (
            "worker",
            {"accelmon_exporter_plain_http": True,
             "accelmon_exporter_basic_auth_users": {"prometheus": "$2b$12$" + "a" * 53}},
            "basic auth needs TLS",
        ),
        (
            "master",
            {"accelmon_exporter_plain_http": True, "accelmon_master_exporter_basic_auth_username": "prometheus",
             "accelmon_master_exporter_basic_auth_password": "in-clear-text-1"},
            "a password needs https",
        ),
    ],
)  # fmt: skip
def test_a_password_over_plain_http_stops_the_deploy_in_preflight(tmp_path, group, variables, message):
    """Asked for plain HTTP and given a password all the same: the deploy stops before any host changes, naming it,
    never printing the password."""
    host = f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}"
    inventory = tmp_path / "host.ini"
    inventory.write_text(
        "".join(f"[{name}]\n{host if name == group else ''}\n\n" for name in ("master", "worker", "store"))
    )
    (tmp_path / "home").mkdir()
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "--check",
         str(ROOT / "ansible" / "deploy.yaml"), "-e", json.dumps(variables)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "HOME": str(tmp_path / "home"), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
             "NO_COLOR": "1"},
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0 and message in " ".join(output.split()), output[-3000:]
    assert "in-clear-text-1" not in output
    assert not (tmp_path / "home" / ".accelmon").exists()  # stopped before the PKI step


def test_a_fleet_deployed_from_a_lost_pki_stops_the_deploy_unless_rotated(tmp_path):
    """The controller's PKI directory lost (a new controller, a wiped home): the deploy would make a new CA and
    password, re-issue the hosts it reaches and leave every other one unscraped (401, unknown CA). A host whose
    deployed web config holds another scrape hash stops it, naming the host and the way out, before the host
    changes; accelmon_exporter_pki_rotate=true re-issues (before: the new PKI was deployed silently)."""
    deployed = {"__accelmon_exporter_pki_deployed": {"path": "{{ playbook_dir }}/{{ inventory_hostname }}-web.yml",
                                                     "key": "hash"}}  # fmt: skip
    run_play(tmp_path, pki_tasks(), {})
    for name in WORKERS:  # what the role wrote on each worker from this PKI
        made = json.loads((tmp_path / f"{name}.json").read_text())
        (tmp_path / f"{name}-web.yml").write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": made["hash"]}}))
    run_play(tmp_path, pki_tasks(**deployed), {})  # the same PKI: goes on
    shutil.rmtree(tmp_path / "home" / ".accelmon")
    output = run_play(tmp_path, pki_tasks(**deployed), {}, passes=False)
    for name in WORKERS:
        assert f"{name} was deployed with another scrape credential" in output
    assert "accelmon_exporter_pki_rotate=true" in output
    assert "$2b$" not in output  # neither hash printed
    run_play(tmp_path, pki_tasks(**deployed), {"accelmon_exporter_pki_rotate": True})
    # Re-issued (gpu-1 given the new hash), and a worker never deployed (no web config yet): both go on.
    rotated = json.loads((tmp_path / "gpu-1.json").read_text())["hash"]
    (tmp_path / "gpu-1-web.yml").write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": rotated}}))
    (tmp_path / "gpu-2-web.yml").unlink()
    run_play(tmp_path, pki_tasks(**deployed), {})


def test_workers_reached_by_ipv6_are_named_by_their_certificate_and_scraped_in_brackets(tmp_path):
    """An inventory's IPv6 ansible_host, bare or in brackets: the certificate names the address (an IP SAN, not
    'IP:[...]', which made the certificate fail), and the masters' targets bracket it before the port (before:
    '2001:db8::6:19470', which Prometheus cannot split into host and port)."""
    x509 = pytest.importorskip("cryptography.x509")
    workers = {"gpu-6": {"ansible_host": "2001:db8::6"}, "gpu-7": {"ansible_host": "[2001:db8::7]"},
               "gpu-8": {"ansible_host": "gpu-8.ib.example"}}  # fmt: skip
    targets = {"ansible.builtin.template": {"src": str(ROLES / "accelmon_master" / "templates" / "targets.json.j2"),
                                            "dest": "{{ playbook_dir }}/targets.json", "mode": "0644"},
               "vars": {"accelmon_master_worker_group": "all", "item": {"port_variable": "x", "default_port": 19470}},
               "delegate_to": "localhost", "run_once": True}  # fmt: skip
    run_play(tmp_path, [*pki_tasks(), targets], {}, workers=workers)
    pki = tmp_path / "home" / ".accelmon" / "pki"
    for host, (dns, ips) in {"gpu-6": ({"gpu-6"}, {"2001:db8::6"}), "gpu-7": ({"gpu-7"}, {"2001:db8::7"}),
                             "gpu-8": ({"gpu-8", "gpu-8.ib.example"}, set())}.items():  # fmt: skip
        cert = x509.load_pem_x509_certificate((pki / "hosts" / f"{host}.crt").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert (
            set(san.get_values_for_type(x509.DNSName)),
            {str(ip) for ip in san.get_values_for_type(x509.IPAddress)},
        ) == (dns, ips)
    found = {t["labels"]["node"]: t["targets"] for t in json.loads((tmp_path / "targets.json").read_text())}
    assert found == {"gpu-6": ["[2001:db8::6]:19470"], "gpu-7": ["[2001:db8::7]:19470"],
                     "gpu-8": ["gpu-8.ib.example:19470"]}  # fmt: skip


def test_a_certificate_near_its_end_is_signed_again_by_the_next_deploy(tmp_path):
    """A worker's certificate within 90 days of its end is re-signed by the same CA at the next deploy (before:
    x509_certificate kept it until it expired and every scrape of the worker failed); one with longer left is
    kept, so a second deploy still changes nothing."""
    x509 = pytest.importorskip("cryptography.x509")
    crt = tmp_path / "home" / ".accelmon" / "pki" / "hosts" / "gpu-1.crt"

    def end():
        return x509.load_pem_x509_certificate(crt.read_bytes()).not_valid_after_utc

    run_play(tmp_path, pki_tasks(__accelmon_exporter_pki_host_days=30), {})
    short = end()
    second = run_play(tmp_path, pki_tasks(), {})
    renewed = end()
    assert (renewed - short).days > 700
    assert changed_counts(second)["gpu-1"] >= 1
    third = run_play(tmp_path, pki_tasks(), {})
    assert end() == renewed and changed_counts(third) == {"gpu-1": 0, "gpu-2": 0}
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(crt.parent.parent / "ca.crt"), str(crt)],
                              capture_output=True, text=True)  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr


def task_lines(output: str, task: str) -> list[str]:
    """The result words (ok, changed, skipping) of each host at the exporter role's `task`, in output order."""
    found = re.search(rf"TASK \[accelmon_exporter : {re.escape(task)}\] \**\n((?:.+\n)+)", output)
    return [line.split(":", 1)[0] for line in found.group(1).splitlines()] if found else []


def test_a_current_certificate_costs_the_controller_no_module_and_a_new_address_or_key_is_signed_again(tmp_path):
    """Issue 65: at the next deploy a host whose certificate is current starts no module on the controller (before:
    four at every deploy, ≈2 CPU-s a host, bench/deploy_bench.py); a host reached at a new address gets a
    certificate naming it, and one whose key was lost a new key and a certificate for it."""
    x509 = pytest.importorskip("cryptography.x509")
    serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")
    hosts = tmp_path / "home" / ".accelmon" / "pki" / "hosts"
    run_play(tmp_path, pki_tasks(), {})
    first = {name: (hosts / f"{name}.crt").read_bytes() for name in WORKERS}
    second = run_play(tmp_path, pki_tasks(), {})
    for task in ("Make this host's keys unless they exist", "Make this host's signing requests",
                 "Sign this host's certificates with the CA"):  # fmt: skip
        assert task_lines(second, task) == ["skipping", "skipping"], (task, second[-3000:])
    assert {name: (hosts / f"{name}.crt").read_bytes() for name in WORKERS} == first
    (hosts / "gpu-2.key").unlink()
    third = run_play(tmp_path, pki_tasks(), {}, workers={"gpu-1": {"ansible_host": "10.0.0.9"}, "gpu-2": {}})
    assert changed_counts(third)["gpu-1"] >= 1 and changed_counts(third)["gpu-2"] >= 1
    cert = x509.load_pem_x509_certificate((hosts / "gpu-1.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"10.0.0.9"}
    key = serialization.load_pem_private_key((hosts / "gpu-2.key").read_bytes(), password=None)
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    assert x509.load_pem_x509_certificate((hosts / "gpu-2.crt").read_bytes()).public_key().public_bytes(
        serialization.Encoding.PEM, public
    ) == key.public_key().public_bytes(serialization.Encoding.PEM, public)


@pytest.mark.parametrize(
    ("address", "plain", "warned"),
    [("0.0.0.0", True, True), ("10.0.0.9", True, True), ("0.0.0.0", False, False), ("127.0.0.1", True, False),
     ("::1", True, False)],
)  # fmt: skip
def test_grafana_in_clear_on_the_network_is_warned(tmp_path, address, plain, warned):
    """The master preflight's own task, run as the role has it: plain HTTP (only ever asked for: HTTPS is the
    default, tests/test_grafana_tls.py) on an address others reach is said."""
    preflight = yaml.safe_load((ROLES / "accelmon_master" / "tasks" / "preflight.yml").read_text())
    task = next(t for t in preflight if t.get("name") == "Warn that Grafana serves in clear")
    variables = {"accelmon_master_grafana_listen_address": address, "accelmon_master_grafana_port": 3000,
                 "accelmon_master_grafana_plain_http": plain, "accelmon_master_grafana_enabled": True}  # fmt: skip
    output = run_play(tmp_path, [task], variables, workers={"master-1": {}})
    assert (f"[WARNING] master-1: Grafana serves plain HTTP on {address}:3000" in output) is warned, output[-2000:]


def test_node_exporters_certificate_near_its_end_takes_the_full_deploy_and_is_signed_again(tmp_path):
    """The no-change fast path (tasks/unchanged.yml) ends a worker only while both of its certificates last 90 days
    more, and its fingerprint holds node_exporter's files too: a node_exporter certificate near its end is signed
    again by the full deploy it forces, accelmon-exporter's left as it was (before: only hosts/ was read, and a
    worker on the fast path would have served node_exporter's certificate past its end)."""
    pki = tmp_path / "home" / ".accelmon" / "pki"
    run_play(tmp_path, pki_tasks(__accelmon_exporter_pki_node_exporter=True), {})
    exporter_crt, node_crt = pki / "hosts" / "gpu-1.crt", pki / "node-exporter" / "gpu-1.crt"
    kept = exporter_crt.read_bytes()

    def fast_path() -> tuple[bool, str]:
        found = role_value(tmp_path / "value", "accelmon_exporter",
                           "[__accelmon_exporter_deploy_cert_current, __accelmon_exporter_deploy_pki]", {},
                           accelmon_exporter_pki_dir=str(pki))  # fmt: skip
        return str(found[0]).lower() == "true", found[1]

    (tmp_path / "value").mkdir()
    current, fingerprint = fast_path()
    assert current
    # Signed again by the same CA for 30 days only, as a certificate issued 795 days ago would be.
    csr = tmp_path / "node.csr"
    subprocess.run(["openssl", "req", "-new", "-key", str(pki / "node-exporter" / "gpu-1.key"), "-subj", "/CN=gpu-1",
                    "-out", str(csr)], check=True, capture_output=True)  # fmt: skip
    subprocess.run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey",
                    str(pki / "ca.key"), "-CAcreateserial", "-days", "30", "-out", str(node_crt)],
                   check=True, capture_output=True)  # fmt: skip
    current, changed = fast_path()
    assert not current and changed != fingerprint
    output = run_play(tmp_path, pki_tasks(__accelmon_exporter_pki_node_exporter=True), {})
    assert changed_counts(output)["gpu-1"] >= 1
    assert fast_path()[0] and exporter_crt.read_bytes() == kept
    x509 = pytest.importorskip("cryptography.x509")
    renewed = x509.load_pem_x509_certificate(node_crt.read_bytes())
    assert (renewed.not_valid_after_utc - renewed.not_valid_before_utc).days > 700
