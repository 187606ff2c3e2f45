"""The deploy's check of an exporter after its restart (tasks/scrape_check.yml): GET /metrics on this host as
Prometheus would, through the exporter's TLS and basic auth, and say in one JSON line whether it answered and why not.

    python3 -c "$(cat scrape_check.py)"  < spec.json

Run on the worker by `python3 -c` with the spec on stdin (a role's files/ are not modules, and a collection's roles
may hold no module of their own): the scrape password arrives on the SSH channel (the project's ansible.cfg
pipelines) and the task's no_log keeps it out of the output and the host's journal; it is never on a command line
or in a file. The spec:

    host, port        where to connect (the exporter's listen address; the loopback for every interface)
    tls               false: plain HTTP
    server_name       the name the certificate must carry (the one Prometheus scrapes by), verified against `ca`
    ca                the scrape CA's PEM; "" where the operator brought the certificate (no CA known here)
    served_cert       the operator's certificate PEM: the one served must be it ("" with the deploy's PKI)
    client_cert       true: the server requires a client certificate (mutual TLS), which the deploy does not have
    username, password  the scrape credential; "" where it is not sent (basic auth is then expected to answer 401)
    no_password       why not, for the message
    basic_auth        whether the server is configured with basic auth users
    metric            a metric name the body must hold
    seconds           how long to try again (a just-restarted exporter) before reporting the last failure

Prints {"ok": bool, "cause": "connection|tls|certificate|client certificate|auth|status|body|", "message": str,
"url": what it asked};
the message never holds the password. The standard library of Python 3.7+ only: it runs on the worker's python3.
"""

import base64
import http.client
import json
import re
import socket
import ssl
import sys
import time

TIMEOUT = 5.0  # per connection and read: the exporter answers from memory (a scrape never waits on hardware)
MAX_BODY = 64 * 1024 * 1024  # enough for the metric sought; a larger body is the masters' scrape limit's to judge


def attempt(spec):
    """One scrape: (ok, cause, message)."""
    try:
        raw = socket.create_connection((spec["host"], int(spec["port"])), timeout=TIMEOUT)
    except OSError as error:
        return False, "connection", f"cannot connect to {spec['host']}:{spec['port']}: {error}"
    connection = http.client.HTTPConnection(spec["host"], int(spec["port"]), timeout=TIMEOUT)
    try:
        if spec["tls"]:
            ok, cause, message, sock = handshake(spec, raw)
            if sock is None:
                return ok, cause, message
            connection.sock = sock
        else:
            connection.sock = raw
        return request(spec, connection)
    finally:
        connection.close()
        raw.close()


def handshake(spec, raw):
    """The TLS session as Prometheus opens it: (ok, cause, message, socket or None when the check ends here)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if spec["ca"]:
        context.load_verify_locations(cadata=spec["ca"])
    else:
        # The operator's certificate: its CA is not the deploy's to know, so the certificate served is compared
        # with the one deployed instead (which the exporter checked against its key before it started).
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        sock = context.wrap_socket(raw, server_hostname=spec["server_name"] if spec["ca"] else None)
    except ssl.SSLCertVerificationError as error:
        return (
            False,
            "certificate",
            f"the certificate served does not verify for {spec['server_name']} against the scrape CA: "
            f"{error.verify_message}",
            None,
        )
    except (ssl.SSLError, OSError) as error:
        if spec["client_cert"]:
            return True, "", "TLS refused without a client certificate, as mutual TLS requires", None
        return False, "tls", f"TLS handshake failed: {error}", None
    if spec["served_cert"]:
        expected = ssl.PEM_cert_to_DER_cert(first_certificate(spec["served_cert"]))
        if sock.getpeercert(binary_form=True) != expected:
            sock.close()
            return False, "certificate", "the certificate served is not the one deployed (accelmon_*_tls_cert)", None
    return True, "", "", sock


def first_certificate(pem):
    found = re.search(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", pem, re.S)
    return found.group(0) if found else pem


def request(spec, connection):
    headers = {"User-Agent": "accelmon-deploy-check", "Accept": "text/plain", "Connection": "close"}
    if spec["password"]:
        token = f"{spec['username']}:{spec['password']}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
    try:
        connection.request("GET", "/metrics", headers=headers)
        response = connection.getresponse()
        body = response.read(MAX_BODY)
    except (ssl.SSLError, OSError, http.client.HTTPException) as error:
        if spec["client_cert"]:
            # TLS 1.3: the server refuses a missing client certificate after the client's handshake ends.
            return True, "", "refused without a client certificate, as mutual TLS requires"
        return False, "connection", f"no answer to GET /metrics: {error!r}"
    if spec["client_cert"]:
        return False, "client certificate", f"answered {response.status} without a client certificate"
    if response.status == 401:
        if spec["password"]:
            return False, "auth", "401 Unauthorized: the scrape password was refused"
        if spec["basic_auth"]:
            return True, "", f"401 without a password: basic auth is on ({spec['no_password']})"
        return False, "auth", "401 Unauthorized, though no basic auth is configured"
    if not spec["password"] and spec["basic_auth"]:
        return False, "auth", f"answered {response.status} without a password: basic auth is not on"
    if response.status != 200:
        return False, "status", f"answered {response.status} {response.reason}"
    if not re.search(rb"^" + re.escape(spec["metric"].encode()) + rb"[{ ]", body, re.M):
        return False, "body", f"answered 200 without {spec['metric']}"
    return True, "", f"200, {spec['metric']} served"


def main():
    spec = json.load(sys.stdin)
    deadline = time.monotonic() + float(spec["seconds"])
    while True:
        ok, cause, message = attempt(spec)
        if ok or time.monotonic() >= deadline:
            break
        time.sleep(1)
    host = f"[{spec['host']}]" if ":" in spec["host"] else spec["host"]
    url = f"{'https' if spec['tls'] else 'http'}://{host}:{spec['port']}/metrics"
    json.dump({"ok": ok, "cause": cause, "message": message, "url": url}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
