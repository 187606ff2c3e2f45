"""TLS, mutual TLS and basic authentication for /metrics, from a web config file in exporter-toolkit's format.

The same file node_exporter and every exporter built on prometheus/exporter-toolkit read (`--web.config.file`):

    tls_server_config:
      cert_file: server.crt             # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # mutual TLS; default NoClientCert
      client_ca_file: ca.crt
      min_version: TLS12                # or TLS13
    basic_auth_users:
      prometheus: $2b$12$...            # bcrypt hashes only, as exporter-toolkit (htpasswd -nBC 12 "" | tr -d ':')

Python's ssl cannot ask for a client certificate without verifying it, so the toolkit's RequestClientCert and
RequireAnyClientCert are refused rather than served weaker. bcrypt (the `auth` extra) is imported only when the
file has users, so an exporter without basic auth needs no compiled dependency.
"""

from __future__ import annotations

import hashlib
import os
import ssl
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from accelmon.exporter.validation import ConfigError

CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# TLS 1.2's suites: forward-secret AEAD only, as Mozilla's "intermediate" profile. Python's default took CBC with
# SHA-256/384 too, and Python 3.9's CBC with SHA-1 (ECDHE-ECDSA-AES128-SHA): every client that speaks TLS 1.2 to
# an exporter (Prometheus's Go, curl, Python) has AES-GCM. TLS 1.3's suites are all AEAD and are not changed here.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version"}
# Checked passwords remembered (by hash, never in clear), so a scrape every 15 s does not cost a bcrypt check
# (~0.2 s of CPU at cost 12) each time; bounded, and only successes are kept, so no client can grow it.
CACHE_SIZE = 64


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    _checked: set[tuple[str, bytes]] = field(default_factory=set)
    _checkpw: Callable[[bytes, bytes], bool] | None = None
    _dummy: bytes = b""  # a hash of a random password at the users' cost, checked for unknown users

    @property
    def requires_auth(self) -> bool:
        return bool(self.users)

    def is_known(self, user: str, password: str) -> bool | None:
        """True if this user and password passed before; None if a bcrypt check is needed (see `check`)."""
        return True if (user, _digest(user, password)) in self._checked else None

    def check(self, user: str, password: str) -> bool:
        """The bcrypt check (slow: run it off the event loop). An unknown user costs the same as a wrong password."""
        assert self._checkpw is not None
        hashed = self.users.get(user, self._dummy)
        try:
            ok = self._checkpw(password.encode("utf-8"), hashed) and user in self.users
        except ValueError:  # bcrypt refuses passwords over 72 bytes
            ok = False
        if ok:
            if len(self._checked) >= CACHE_SIZE:
                self._checked.clear()
            self._checked.add((user, _digest(user, password)))
        return ok


def _digest(user: str, password: str) -> bytes:
    return hashlib.sha256(f"{user}\0{password}".encode()).digest()


def load_web_config(path: str) -> WebConfig:
    try:
        with open(path, encoding="utf-8") as stream:
            data = yaml.safe_load(stream)
    except OSError as error:
        raise ConfigError(f"web config file {path}: {error.strerror}") from error
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        raise ConfigError(f"web config file {path}: not valid YAML: {error}") from error
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"web config file {path}: expected a mapping")
    unknown = sorted(set(data) - {"tls_server_config", "basic_auth_users"})
    if unknown:
        raise ConfigError(
            f"web config file {path}: unknown key(s) {', '.join(unknown)} (accelmon-exporter reads "
            "tls_server_config and basic_auth_users)"
        )
    # A password sent in clear can be read by anyone on the path and replayed: basic auth only inside TLS.
    if data.get("basic_auth_users") and not data.get("tls_server_config"):
        raise ConfigError(
            f"web config file {path}: basic_auth_users without tls_server_config would take passwords in clear "
            "text; add tls_server_config (cert_file, key_file)"
        )
    base = os.path.dirname(os.path.abspath(path))
    config = WebConfig()
    if data.get("basic_auth_users"):
        config.users = _users(data["basic_auth_users"], path)
    if data.get("tls_server_config"):
        config.ssl_context = _tls(data["tls_server_config"], base, path)
    if config.users:
        try:
            import bcrypt
        except ImportError as error:
            raise ConfigError(
                f"web config file {path}: basic_auth_users needs the bcrypt package (pip install 'accelmon[auth]')"
            ) from error
        config._checkpw = bcrypt.checkpw
        # Checked for unknown users, at the cost of a real user's hash: timing does not tell users apart.
        rounds = int(next(iter(config.users.values())).split(b"$")[2])
        config._dummy = bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(rounds))
    return config


def _tls(section: Any, base: str, path: str) -> ssl.SSLContext:
    where = f"web config file {path}: tls_server_config"
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: expected a mapping")
    unknown = sorted(set(section) - TLS_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown or unsupported key(s) {', '.join(unknown)}")
    if not section.get("cert_file") or not section.get("key_file"):
        raise ConfigError(f"{where}: cert_file and key_file are both needed")
    auth = section.get("client_auth_type", "NoClientCert")
    if auth not in CLIENT_AUTH:
        raise ConfigError(f"{where}.client_auth_type: expected one of {', '.join(CLIENT_AUTH)}, got {auth!r}")
    version = section.get("min_version", "TLS12")
    if version not in TLS_VERSIONS:
        raise ConfigError(f"{where}.min_version: expected TLS12 or TLS13, got {version!r}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[version]
    context.set_ciphers(TLS12_CIPHERS)
    # A client may not renegotiate (TLS 1.2; 1.3 has none): OpenSSL 1.1.1 (EL8's) allows it unless told, and each
    # renegotiation costs the server a handshake's CPU on a connection already admitted. Python 3.7+ with OpenSSL
    # 1.1.0h+ has the flag; an older one keeps OpenSSL's default.
    context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    cert, key = (os.path.join(base, str(section[name])) for name in ("cert_file", "key_file"))
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"{where}: cannot load {cert} with {key}: {error}") from error
    context.verify_mode = CLIENT_AUTH[auth]
    if auth != "NoClientCert":
        if not section.get("client_ca_file"):
            raise ConfigError(f"{where}: client_auth_type {auth} needs client_ca_file")
        ca = os.path.join(base, str(section["client_ca_file"]))
        try:
            context.load_verify_locations(ca)
        except (OSError, ssl.SSLError) as error:
            raise ConfigError(f"{where}: cannot load client_ca_file {ca}: {error}") from error
    return context


def _users(section: Any, path: str) -> dict[str, bytes]:
    where = f"web config file {path}: basic_auth_users"
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: expected a mapping of user to bcrypt hash")
    users = {}
    for user, hashed in section.items():
        parts = hashed.split("$") if isinstance(hashed, str) else []
        if (
            not isinstance(user, str)
            or ":" in user
            or len(parts) != 4
            or parts[1] not in ("2a", "2b", "2y")
            or not parts[2].isdigit()
        ):
            raise ConfigError(f"{where}: {user!r} needs a bcrypt hash ($2a$, $2b$ or $2y$), never a clear password")
        # bcrypt's costs (golang.org/x/crypto/bcrypt MinCost 4, MaxCost 31, as exporter-toolkit checks them): another
        # failed the exporter's start with a traceback (bcrypt.gensalt's ValueError), not this message.
        if not 4 <= int(parts[2]) <= 31:
            raise ConfigError(f"{where}: {user!r}'s bcrypt cost {parts[2]} is outside 4-31")
        users[user] = hashed.encode("ascii")
    return users
