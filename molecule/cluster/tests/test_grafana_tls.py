"""Grafana in HTTPS by default (issue 66), on the cluster deployed with no TLS variable: the master's Grafana files
are the certificate the deploy's CA issued to it, naming it, readable by Grafana's user alone, and its container
runs with them. The stand-in image serves nothing (no registry ships Grafana here): what Grafana is given is read
here; the handshake with these files, by name and CA, is tests/test_grafana_tls.py's."""

import json
import os
import subprocess
from pathlib import Path

CLUSTER = os.environ.get("ACCELMON_CLUSTER", "accelmon-cluster")
MASTER = f"{CLUSTER}-master"
testinfra_hosts = [f"podman://{MASTER}"]
TLS = "/opt/accelmon-master/grafana/tls"
GRAFANA_UID = 60300  # accelmon_master_grafana_uid's default
PKI = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "accelmon-pki"


def test_the_masters_grafana_files_are_the_certificate_the_deploys_ca_issued_it(host, tmp_path):
    for name in ("cert.crt", "key.key"):
        found = host.file(f"{TLS}/{name}")
        assert (found.uid, found.gid, found.mode) == (GRAFANA_UID, GRAFANA_UID, 0o400), name
        assert (found.user, found.group) == ("accelmon-grafana", "accelmon-grafana"), name
    cert = host.file(f"{TLS}/cert.crt").content_string
    assert cert.strip() == (PKI / "grafana" / f"{MASTER}.crt").read_text().strip()
    (tmp_path / "cert.crt").write_text(cert)
    checked = subprocess.run(
        ["openssl", "verify", "-CAfile", str(PKI / "ca.crt"), str(tmp_path / "cert.crt")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Named as the inventory names it and by its default route's address (a browser on the cluster's network).
    text = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "cert.crt")],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    address = subprocess.run(
        ["podman", "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", MASTER],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert f"DNS:{MASTER}" in text and f"IP Address:{address}" in text, text
    # The key goes with it (the same public key), and only the controller keeps a copy.
    keys = {
        subprocess.run(["openssl", "pkey", "-pubout"], input=k, capture_output=True, text=True, check=True).stdout
        for k in (host.check_output(f"cat {TLS}/key.key"), (PKI / "grafana" / f"{MASTER}.key").read_text())
    }
    pub = subprocess.run(["openssl", "x509", "-noout", "-pubkey", "-in", str(tmp_path / "cert.crt")],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert keys == {pub}
    assert oct((PKI / "grafana" / f"{MASTER}.key").stat().st_mode & 0o777) == "0o600"


def test_grafanas_container_serves_https_with_them_as_its_own_user(host):
    running = json.loads(host.check_output("podman inspect accelmon-grafana"))[0]
    environment = dict(entry.split("=", 1) for entry in running["Config"]["Env"])
    assert environment["GF_SERVER_PROTOCOL"] == "https"
    assert environment["GF_SERVER_CERT_FILE"] == "/etc/grafana/tls/cert.crt"
    assert environment["GF_SERVER_CERT_KEY"] == "/etc/grafana/tls/key.key"
    assert environment["GF_SECURITY_COOKIE_SECURE"] == "true"
    mounts = {m["Destination"]: m for m in running["Mounts"]}
    assert mounts["/etc/grafana/tls"]["Source"] == TLS and not mounts["/etc/grafana/tls"]["RW"]
    assert running["Config"]["User"] == f"{GRAFANA_UID}:{GRAFANA_UID}"
    # Grafana's user reads its key there (the files are 0400, its own).
    inside = host.run("podman exec accelmon-grafana cat /etc/grafana/tls/key.key")
    assert inside.rc == 0 and inside.stdout.strip() == host.check_output(f"cat {TLS}/key.key").strip()
