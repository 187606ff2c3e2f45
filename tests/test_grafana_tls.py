"""Grafana serves HTTPS by default (issue 66): with no certificate given, the master role's PKI step
(accelmon_master/tasks/pki.yml) has the deploy's own CA issue each master a certificate naming how it is reached,
writes it for Grafana's uid alone, and the container runs with it. Run here as the role has it, on a local-connection
'master' (at 127.0.0.1, so that the certificate is checked by name as a browser would), its PKI in the test's HOME."""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT

pytestmark = pytest.mark.e2e
x509 = pytest.importorskip("cryptography.x509")

ROLE = ROOT / "ansible" / "roles" / "accelmon_master"
GRAFANA_UID = 60300  # accelmon_master_grafana_uid's default
sys.path.insert(0, str(ROOT / "scripts"))
import check_grafana  # noqa: E402


def deploy(work: Path, *flags: str, **variables: Any) -> str:
    """The role's PKI step on master-1, then what the rest of the role reads of it written out: the Grafana service
    of compose.yaml and the facts the names came from. Returns the output; the play must pass."""
    compose = f"lookup('ansible.builtin.template', '{ROLE / 'templates' / 'compose.yaml.j2'}') | from_yaml"
    tasks = [
        {"ansible.builtin.include_role": {"name": "accelmon_master", "tasks_from": "pki.yml", "public": True}},
        {"ansible.builtin.copy": {
            "dest": "{{ playbook_dir }}/seen.json", "mode": "0600",
            "content": "{{ {'grafana': (" + compose + ").services.grafana, 'facts': ansible_facts} | to_json }}"},
         "delegate_to": "localhost", "check_mode": False, "changed_when": False},  # the test's, not the role's
    ]  # fmt: skip
    inventory = {"all": {"hosts": {"master-1": {"ansible_connection": "local", "ansible_host": "127.0.0.1",
                                                "ansible_become_method": "su"}}}}  # fmt: skip
    (work / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (work / "play.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    (work / "home").mkdir(exist_ok=True)
    # The engine the preflight would find: `true` takes the Restart Grafana handler's `restart accelmon-grafana`.
    variables = {"accelmon_master_dir": str(work / "master"), "__accelmon_master_engine": "true", **variables}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(work / "hosts.yml"), *flags,
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", json.dumps(variables), str(work / "play.yml")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "HOME": str(work / "home"), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1",
             "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles")},
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def changed(output: str) -> int:
    return int(re.search(r"^master-1\s+:.*changed=(\d+)", output, re.M).group(1))


def names(cert_file: Path) -> set[str]:
    san = x509.load_pem_x509_certificate(cert_file.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    return {*san.value.get_values_for_type(x509.DNSName), *map(str, san.value.get_values_for_type(x509.IPAddress))}


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A first deploy whose certificate is near its end (30 days), a second that issues it again, a third and a
    --check --diff that change nothing."""
    work = tmp_path_factory.mktemp("grafana-tls")
    (work / "master" / "grafana").mkdir(parents=True)
    short = deploy(work, "-e", "__accelmon_exporter_pki_host_days=30")
    pki = work / "home" / ".accelmon" / "pki"
    short_end = x509.load_pem_x509_certificate((pki / "grafana" / "master-1.crt").read_bytes()).not_valid_after_utc
    outputs = [short, deploy(work), deploy(work), deploy(work, "--check", "--diff")]
    seen = json.loads((work / "seen.json").read_text())
    return {"work": work, "pki": pki, "outputs": outputs, "short_end": short_end, **seen}


def test_the_masters_certificate_is_the_deploys_cas_and_names_the_master(deployed):
    pki, facts = deployed["pki"], deployed["facts"]
    cert = pki / "grafana" / "master-1.crt"
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(pki / "ca.crt"), str(cert)], capture_output=True,
                              text=True)  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # The inventory name, ansible_host, the FQDN and the default routes' addresses, as the setup module read them.
    expected = {"master-1", "127.0.0.1", facts["fqdn"], (facts.get("default_ipv4") or {}).get("address", ""),
                (facts.get("default_ipv6") or {}).get("address", "")} - {"", "localhost"}  # fmt: skip
    assert names(cert) == {name for name in expected if not name.startswith("localhost.")}
    # Apart from the workers' (hosts/, none here), the controller's files its user's alone.
    assert not list((pki / "hosts").iterdir())
    assert {oct(p.stat().st_mode & 0o777) for p in (pki, pki / "grafana")} == {"0o700"}
    assert {oct(p.stat().st_mode & 0o777) for p in (pki / "grafana").iterdir()} == {"0o600"}


def test_the_master_gets_it_for_grafanas_uid_alone_and_no_output_shows_the_key(deployed):
    tls = deployed["work"] / "master" / "grafana" / "tls"
    pki = deployed["pki"] / "grafana"
    for name, source in (("cert.crt", "master-1.crt"), ("key.key", "master-1.key")):
        found = (tls / name).stat()
        assert (found.st_uid, found.st_gid, oct(found.st_mode & 0o777)) == (GRAFANA_UID, GRAFANA_UID, "0o400"), name
        assert (tls / name).read_text().strip() == (pki / source).read_text().strip()
    key = (pki / "master-1.key").read_text().strip().splitlines()[1]  # a line of the key's base64
    assert not [output for output in deployed["outputs"] if key in output or "PRIVATE KEY" in output]


def test_grafana_runs_https_with_the_files_mounted_read_only(deployed):
    grafana = deployed["grafana"]
    environment = grafana["environment"]
    assert environment["GF_SERVER_PROTOCOL"] == "https"
    assert environment["GF_SERVER_CERT_FILE"] == "/etc/grafana/tls/cert.crt"
    assert environment["GF_SERVER_CERT_KEY"] == "/etc/grafana/tls/key.key"
    assert environment["GF_SECURITY_COOKIE_SECURE"] == "true"
    assert f"{deployed['work'] / 'master'}/grafana/tls:/etc/grafana/tls:ro,Z" in grafana["volumes"]


def test_a_certificate_near_its_end_is_issued_again_and_then_left_alone(deployed):
    _, renewing, again, check = deployed["outputs"]
    cert = deployed["pki"] / "grafana" / "master-1.crt"
    end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
    assert (end - deployed["short_end"]).days > 700
    assert changed(renewing) >= 1  # the new certificate written, Grafana restarted
    assert changed(again) == 0 and changed(check) == 0


def test_a_browser_trusting_the_ca_reaches_grafana_by_the_masters_name_and_none_other(deployed, tmp_path):
    """The deployed certificate and key served over TLS (as Grafana serves them): scripts/check_grafana.py given the
    CA file verifies it at https://127.0.0.1 (the master's ansible_host); without the CA, or by a name the
    certificate does not give, the connection is refused."""
    tls = deployed["work"] / "master" / "grafana" / "tls"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"database": "ok"}')

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls / "cert.crt", tls / "key.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ca = str(deployed["pki"] / "ca.crt")
    port = server.server_port
    try:
        assert check_grafana.caller(f"https://127.0.0.1:{port}", "p", 5, ca_file=ca)("/api/health", None) == {
            "database": "ok"
        }
        for url, ca_file in ((f"https://127.0.0.1:{port}", None), (f"https://localhost:{port}", ca)):
            with pytest.raises(ssl.SSLCertVerificationError):
                try:
                    check_grafana.caller(url, "p", 5, ca_file=ca_file)("/api/health", None)
                except OSError as error:  # urllib wraps it
                    raise getattr(error, "reason", error) from None
    finally:
        server.shutdown()
        server.server_close()


def test_a_new_name_issues_it_again_and_plain_http_asked_for_takes_it_away(deployed, tmp_path):
    work = deployed["work"]
    cert = deployed["pki"] / "grafana" / "master-1.crt"
    output = deploy(work, accelmon_master_grafana_tls_names=["grafana.example.com"])
    assert "grafana.example.com" in names(cert) and changed(output) >= 1
    # Plain HTTP asked for (the preflight warns of it: tests/test_scrape_pki.py): no certificate on the master, none
    # in the container.
    deploy(work, accelmon_master_grafana_plain_http=True)
    assert not (work / "master" / "grafana" / "tls").exists()
    grafana = json.loads((work / "seen.json").read_text())["grafana"]
    assert "GF_SERVER_PROTOCOL" not in grafana["environment"]
    assert not [volume for volume in grafana["volumes"] if "/etc/grafana/tls" in volume]
