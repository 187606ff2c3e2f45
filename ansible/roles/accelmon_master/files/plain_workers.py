"""Which workers' exporters still answer plain HTTP, asked from the master as its Prometheus asks (issue 66).

A release before TLS by default served /metrics in plain HTTP to anyone. While a rolling upgrade reaches 2,000
workers over hours, the masters must scrape each worker as it serves now: the upgraded ones in HTTPS with the
password, the others in plain HTTP without it (a password is never sent in clear). This lists the others, for the
masters' plain scrape jobs (templates/prometheus.yml.j2). Run by tasks/plain_workers.yml for one job with, on
stdin, {"timeout": SECONDS, "targets": [{"targets": ["HOST:PORT"], "labels": {"node": NODE}}, ...]} (the job's
targets file, templates/targets.json.j2); prints [NODE, ...], the nodes that answered a plain GET /metrics with 200.

What answers 200 to plain HTTP is plain: a TLS server answers a plain request with a TLS alert, a reset or an
HTTP 400 (Go's "Client sent an HTTP request to an HTTPS server."), never 200. A worker that cannot be reached, or
answers anything else, is left to the HTTPS job: a worker not yet deployed, or down, is down either way.
Runs on the master's system Python (3.6 and newer), standard library only.
"""

import json
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

# Enough connections at once for 2,000 workers' two exporters in seconds, few enough for any master's file limit.
PARALLEL = 64


def split_host_port(target):
    """('10.0.0.5', 19470) of '10.0.0.5:19470', ('2001:db8::6', 19470) of '[2001:db8::6]:19470'."""
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


def answers_plain_http(target, timeout):
    """Whether `target` answers a plain GET /metrics with 200. Reads the status line only, not the page."""
    host, port = split_host_port(target)
    try:
        with socket.create_connection((host, port), timeout=timeout) as connection:
            connection.settimeout(timeout)
            connection.sendall(b"GET /metrics HTTP/1.0\r\nHost: " + host.encode("idna") + b"\r\n\r\n")
            status = b""
            while b"\r\n" not in status and len(status) < 256:
                chunk = connection.recv(256)
                if not chunk:
                    break
                status += chunk
    except (OSError, UnicodeError, ValueError):
        return False
    words = status.split(b"\r\n", 1)[0].split()
    return len(words) >= 2 and words[0].startswith(b"HTTP/1.") and words[1] == b"200"


def main():
    request = json.load(sys.stdin)
    timeout = float(request.get("timeout", 3))
    asked = [(group["labels"]["node"], target) for group in request["targets"] for target in group["targets"]]
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        answers = list(pool.map(lambda one: answers_plain_http(one[1], timeout), asked))
    json.dump(sorted({node for (node, _), is_plain in zip(asked, answers) if is_plain}), sys.stdout)


if __name__ == "__main__":
    main()
