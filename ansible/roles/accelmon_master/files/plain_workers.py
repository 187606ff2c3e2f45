"""Which workers' exporters still answer plain HTTP, asked from the master as its Prometheus asks (issue 66).

A release before TLS by default served /metrics in plain HTTP to anyone. While a rolling upgrade reaches 2,000
workers over hours, the masters must scrape each worker as it serves now: the upgraded ones in HTTPS with the
password, the others in plain HTTP without it (a password is never sent in clear). This lists the others, for the
masters' plain scrape jobs (templates/prometheus.yml.j2), and the workers seen serving TLS, which the master
remembers (tasks/plain_workers.yml): a worker once seen serving TLS is never taken as plain again, so that whoever
holds its port while its exporter restarts (a user's process bound to it) cannot bring it back to plain HTTP with
its own metrics, the down alert silenced. Only a worker never seen serving TLS, one of the release before, may be.

Run by tasks/plain_workers.yml for one job with, on stdin, {"timeout": SECONDS, "seen": [NODE, ...], "targets":
[{"targets": ["HOST:PORT"], "labels": {"node": NODE}}, ...]} (the job's targets file, templates/targets.json.j2;
"seen": the workers seen serving TLS before, not asked again); prints {"plain": [NODE, ...], "tls": [NODE, ...]}.

TLS: a TLS handshake completes (any certificate: this only tells which protocol answers). Plain: a plain GET
/metrics is answered 200 (a TLS server answers a plain request with an alert, a reset or Go's HTTP 400, never 200).
A worker that cannot be reached, or answers anything else, is neither: one not yet deployed, or down, is down
either way. Each question has `timeout` seconds in all, however slowly a worker answers. Runs on the master's
system Python (3.6 and newer), standard library only.
"""

import json
import socket
import ssl
import sys
import time
from concurrent.futures import ThreadPoolExecutor

# Enough connections at once for 2,000 workers' two exporters in seconds, few enough for any master's file limit.
PARALLEL = 64


def split_host_port(target):
    """('10.0.0.5', 19470) of '10.0.0.5:19470', ('2001:db8::6', 19470) of '[2001:db8::6]:19470'."""
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


def left(deadline):
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise socket.timeout("out of time")
    return remaining


def speaks_tls(host, port, deadline):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # which protocol answers, not who: nothing is sent over it
    with socket.create_connection((host, port), timeout=left(deadline)) as connection:
        connection.settimeout(left(deadline))
        with context.wrap_socket(connection, server_hostname=host or None):
            return True


def answers_plain_http(host, port, deadline):
    """Whether a plain GET /metrics is answered 200. Reads the status line only, not the page."""
    with socket.create_connection((host, port), timeout=left(deadline)) as connection:
        connection.sendall(b"GET /metrics HTTP/1.0\r\nHost: " + host.encode("idna") + b"\r\n\r\n")
        status = b""
        while b"\r\n" not in status and len(status) < 256:
            connection.settimeout(left(deadline))
            chunk = connection.recv(256)
            if not chunk:
                break
            status += chunk
    words = status.split(b"\r\n", 1)[0].split()
    return len(words) >= 2 and words[0].startswith(b"HTTP/1.") and words[1] == b"200"


def classify(target, timeout):
    """'plain', 'tls' or None (neither answered), each question within `timeout` seconds. Plain first: a TLS server
    refuses a plain request at once, where a plain one waits for the line end a TLS greeting never sends."""
    try:
        host, port = split_host_port(target)
    except ValueError:
        return None
    try:
        if answers_plain_http(host, port, time.monotonic() + timeout):
            return "plain"
    except (OSError, UnicodeError, ValueError):
        pass
    try:
        return "tls" if speaks_tls(host, port, time.monotonic() + timeout) else None
    except (OSError, ValueError):
        return None


def main():
    request = json.load(sys.stdin)
    timeout = float(request.get("timeout", 3))
    seen = set(request.get("seen", []))
    asked = [
        (group["labels"]["node"], target)
        for group in request["targets"]
        for target in group["targets"]
        if group["labels"]["node"] not in seen
    ]
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        answers = list(pool.map(lambda one: classify(one[1], timeout), asked))
    found = {"plain": set(), "tls": set()}
    for (node, _), answer in zip(asked, answers):
        if answer:
            found[answer].add(node)
    json.dump({kind: sorted(nodes) for kind, nodes in found.items()}, sys.stdout)


if __name__ == "__main__":
    main()
