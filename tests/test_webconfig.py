"""TLS, mutual TLS and basic auth on /metrics from an exporter-toolkit web config file, with real clients."""

from __future__ import annotations

import base64
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from accelmon.cli import make_server
from accelmon.config import ConfigError
from accelmon.exporter.runtime import Exporter, Sampler
from accelmon.exporter.server import allowed_networks as http_networks
from accelmon.exporter.webconfig import load_web_config
from tests.support.paths import ROOT
from tests.support.toy import Steady
from tests.support.waiting import wait_until

bcrypt = pytest.importorskip("bcrypt")  # the `auth` extra; the suite's environment has it
PASSWORD = "s3cret-scrape"


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, made with openssl."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=accelmon test CA",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))  # fmt: skip
    for name, extension in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (d / f"{name}.ext").write_text(extension + "\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
        ca = ("-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"), "-CAcreateserial")
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), *ca, "-days", "2",
                "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.crt"))  # fmt: skip
    return d


@pytest.fixture
def serve(tmp_path):
    servers = []

    def start(web_config: str):
        path = tmp_path / "web-config.yml"
        path.write_text(web_config)
        exporter = Exporter([Sampler(Steady(), 0.05)])
        exporter.collect_once()
        server = make_server(exporter, "127.0.0.1:0", load_web_config(str(path)))
        server.start()
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.stop()


def fetch(url: str, context: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def client_context(pki: Path, with_certificate: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if with_certificate:
        context.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    return context


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    """`accelmon-exporter --check-config --web.config.file PATH`, as the role's validate runs it."""
    return subprocess.run(
        [sys.executable, "-m", "accelmon", "--check-config", "--web.config.file", str(path)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "exporters"), "PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_tls_serves_metrics_to_a_verifying_client_and_nothing_in_clear(pki, serve):
    port = serve(f"tls_server_config: {{cert_file: {pki}/server.crt, key_file: {pki}/server.key}}\n")
    status, body = fetch(f"https://127.0.0.1:{port}/metrics", client_context(pki))
    assert status == 200 and b'test_value{source="steady"} 1' in body
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        fetch(f"http://127.0.0.1:{port}/metrics")  # plain HTTP gets no metrics


def test_mutual_tls_refuses_a_client_without_a_certificate(pki, serve):
    port = serve(
        f"tls_server_config:\n  cert_file: {pki}/server.crt\n  key_file: {pki}/server.key\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki}/ca.crt\n"
    )
    status, _ = fetch(f"https://127.0.0.1:{port}/metrics", client_context(pki, with_certificate=True))
    assert status == 200
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        fetch(f"https://127.0.0.1:{port}/metrics", client_context(pki))


def test_basic_auth_refuses_wrong_and_unknown_users_and_remembers_the_right_one(pki, serve, tmp_path):
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    port = serve(
        f"tls_server_config: {{cert_file: {pki}/server.crt, key_file: {pki}/server.key}}\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n"
    )
    url = f"https://127.0.0.1:{port}/metrics"
    context = client_context(pki)
    status, _ = fetch(url, context)
    assert status == 401
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5, context=context)
    assert refused.value.headers["WWW-Authenticate"].startswith("Basic")
    assert fetch(url, context, auth=("prometheus", "wrong"))[0] == 401
    assert fetch(url, context, auth=("nobody", PASSWORD))[0] == 401
    status, body = fetch(url, context, auth=("prometheus", PASSWORD))
    assert status == 200 and b"test_value" in body
    assert fetch(url, context, auth=("prometheus", PASSWORD))[0] == 200  # from the cache of checked passwords
    assert fetch(url, context, auth=("prometheus", "x" * 100))[0] == 401  # bcrypt refuses over 72 bytes: no crash


def test_basic_auth_without_tls_is_refused_before_serving(tmp_path):
    """A password sent over plain HTTP is readable on the path: the file is refused, the exporter never starts."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    path = tmp_path / "web-config.yml"
    path.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    with pytest.raises(ConfigError, match="basic_auth_users without tls_server_config"):
        load_web_config(str(path))
    result = check_config(path)
    assert result.returncode == 2 and "clear text" in result.stderr


def test_the_remembered_password_is_only_a_digest():
    config_users = {"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4))}
    from accelmon.exporter.webconfig import WebConfig

    config = WebConfig(users=config_users, _checkpw=bcrypt.checkpw, _dummy=config_users["prometheus"])
    assert config.is_known("prometheus", PASSWORD) is None
    assert config.check("prometheus", PASSWORD)
    assert config.is_known("prometheus", PASSWORD)
    assert not any(PASSWORD.encode() in digest for _, digest in config._checked)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "tls_server_config: {cert_file: a, key_file: b}\nbasic_auth_users: {prometheus: hunter2}\n",
            "never a clear password",
        ),
        ("tls_server_config: {cert_file: /nonexistent.crt, key_file: /nonexistent.key}\n", "cannot load"),
        ("tls_server_config: {cert_file: a.crt}\n", "cert_file and key_file are both needed"),
        (
            "tls_server_config: {cert_file: a, key_file: b, client_auth_type: RequireAnyClientCert}\n",
            "expected one of NoClientCert",
        ),
        ("http_server_config: {http2: true}\n", "unknown key(s) http_server_config"),
    ],
)
def test_bad_web_config_is_refused_naming_the_setting(tmp_path, text, message):
    path = tmp_path / "web-config.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_web_config(str(path))


@pytest.mark.parametrize("cost", ["03", "32"])
def test_a_bcrypt_cost_bcrypt_cannot_use_is_refused_naming_the_user(pki, tmp_path, cost):
    """Issue 66 review (an operator's hash): a cost outside bcrypt's 4-31 passed the check of the file and then
    failed the exporter's start, and the deploy's `--check-config`, with bcrypt.gensalt's ValueError and a
    traceback."""
    path = tmp_path / "web-config.yml"
    path.write_text(
        f"tls_server_config: {{cert_file: {pki}/server.crt, key_file: {pki}/server.key}}\n"
        f"basic_auth_users: {{prometheus: '$2b${cost}$" + "x" * 53 + "'}\n"
    )
    with pytest.raises(ConfigError, match=f"'prometheus''s bcrypt cost {cost} is outside 4-31"):
        load_web_config(str(path))


def test_check_config_validates_the_web_config_file(tmp_path, pki):
    path = tmp_path / "web-config.yml"
    path.write_text("tls_server_config: {cert_file: /nonexistent.crt, key_file: /nonexistent.key}\n")
    result = check_config(path)
    assert result.returncode == 2 and "cannot load /nonexistent.crt" in result.stderr
    path.write_text(f"tls_server_config: {{cert_file: {pki}/server.crt, key_file: {pki}/server.key}}\n")
    ok = check_config(path)
    assert ok.returncode == 0, ok.stderr


def test_a_client_that_never_finishes_the_tls_handshake_is_cut_off(pki, serve, monkeypatch):
    from accelmon.exporter import server as http

    monkeypatch.setattr(http, "HEAD_SECONDS", 0.5)
    port = serve(f"tls_server_config: {{cert_file: {pki}/server.crt, key_file: {pki}/server.key}}\n")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as silent:
        silent.settimeout(5)
        assert silent.recv(1) == b""  # closed by the server, not by our timeout


def tls_server(web_config: str, tmp_path: Path, allowed: tuple = ()):
    from accelmon.exporter import server as http

    path = tmp_path / "web-config.yml"
    path.write_text(web_config)
    exporter = Exporter([Sampler(Steady(), 0.05)])
    exporter.collect_once()
    server = make_server(exporter, "127.0.0.1:0", load_web_config(str(path)), allowed)
    server.start()
    return server, http


def test_connections_in_their_tls_handshake_count_against_the_limits(pki, tmp_path, monkeypatch):
    """Issue 66 review: the limits were applied once the handshake was done, so connections that never started it
    were not counted: one address held 1,100 of them (5 s each, reopened), the exporter reached its 1,024 file
    descriptors (asyncio: "socket.accept() out of system resource", 156 times in 15 s) and any file a collector
    opened would fail. They now take their place in the pool from their accept, and the allow-list is applied
    before the handshake (a refused address learns nothing, not even the certificate)."""
    server, http = tls_server(f"tls_server_config: {{cert_file: {pki}/server.crt, key_file: {pki}/server.key}}\n",
                              tmp_path, allowed=http_networks(["127.0.0.1"]))  # fmt: skip
    monkeypatch.setattr(http, "HEAD_SECONDS", 30.0)  # no connection ends by its own timeout within this test
    port = server.server_address[1]
    try:
        silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
        wait_until(lambda: server.open_connections == http.MAX_CONNECTIONS_PER_CLIENT, timeout=5,
                   what=f"{http.MAX_CONNECTIONS_PER_CLIENT} connections in their handshake counted")  # fmt: skip
        silent[0].settimeout(5)
        assert silent[0].recv(1) == b""  # the oldest made room for the newer ones
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0)) as other:
                client_context(pki).wrap_socket(other, server_hostname="127.0.0.1")  # closed before any handshake
        status, body = fetch(f"https://127.0.0.1:{port}/metrics", client_context(pki))
        assert status == 200 and b"test_value" in body
    finally:
        for client in silent:
            client.close()
        server.stop()


def test_an_authenticated_scraper_keeps_its_connection_when_every_slot_is_taken(pki, tmp_path, monkeypatch):
    """Prometheus keeps its connection between scrapes; once it has authenticated, no newcomer takes its place,
    however many addresses fill the pool, and a second scraper still gets in."""
    import http.client

    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    server, http_server = tls_server(
        f"tls_server_config: {{cert_file: {pki}/server.crt, key_file: {pki}/server.key}}\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n",
        tmp_path,
    )
    monkeypatch.setattr(http_server, "MAX_CONNECTIONS", 16)
    monkeypatch.setattr(http_server, "MAX_CONNECTIONS_PER_CLIENT", 64)  # the loopback's 127/8 is one client
    port = server.server_address[1]
    credential = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()}
    prometheus = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=client_context(pki))
    flood: list[socket.socket] = []
    try:
        for _ in range(2):
            prometheus.request("GET", "/metrics", headers=credential)
            assert prometheus.getresponse().read().count(b"test_value") >= 1
        for n in range(6):  # 48 connections from 6 addresses into a pool of 16
            flood += [socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(f"127.0.1.{n}", 0))
                      for _ in range(8)]  # fmt: skip
        wait_until(lambda: server.open_connections == 16, timeout=5, what="a full pool")
        status, body = fetch(f"https://127.0.0.1:{port}/metrics", client_context(pki), auth=("prometheus", PASSWORD))
        assert status == 200 and b"test_value" in body
        prometheus.request("GET", "/metrics", headers=credential)  # the same connection, not reset
        assert b"test_value" in prometheus.getresponse().read()
    finally:
        prometheus.close()
        for client in flood:
            client.close()
        server.stop()


@pytest.mark.parametrize("cipher", ["ECDHE-RSA-AES128-SHA", "ECDHE-RSA-AES128-SHA256", "ECDHE-RSA-AES256-SHA384"])
def test_tls12_takes_forward_secret_aead_suites_only(pki, serve, cipher):
    """Python 3.9's server defaults took CBC with SHA-1 in TLS 1.2 (ECDHE-RSA-AES128-SHA), and 3.11's CBC with
    SHA-256/384: both refused now, while the AES-GCM Prometheus offers is served."""
    port = serve(f"tls_server_config: {{cert_file: {pki}/server.crt, key_file: {pki}/server.key}}\n")

    def context(ciphers: str) -> ssl.SSLContext:
        tls12 = client_context(pki)
        tls12.maximum_version = ssl.TLSVersion.TLSv1_2
        tls12.set_ciphers(ciphers)
        return tls12

    with pytest.raises(ssl.SSLError):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            context(cipher).wrap_socket(raw, server_hostname="127.0.0.1")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context("ECDHE+AESGCM").wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() == "TLSv1.2" and "GCM" in tls.cipher()[0]


def test_a_client_cannot_renegotiate_tls(pki, tmp_path):
    """Security review F5: the server's context did not set OP_NO_RENEGOTIATION, and OpenSSL 1.1.1 (EL8's) lets a
    TLS 1.2 client renegotiate unless told, each time a handshake's CPU on a connection already admitted."""
    path = tmp_path / "web-config.yml"
    path.write_text(f"tls_server_config: {{cert_file: {pki}/server.crt, key_file: {pki}/server.key}}\n")
    context = load_web_config(str(path)).ssl_context
    assert context is not None and context.options & ssl.OP_NO_RENEGOTIATION
