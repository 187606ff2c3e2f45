"""Checks a running Grafana that the master role deployed, through Grafana's HTTP API as a user would meet it: it
answers and its database is up, its Prometheus data source reaches Prometheus, every accelmon dashboard is there,
and every panel's query is answered through Grafana (an empty answer is an answer: a demo has no MIG instance). The
demo runs it where it could start the real Grafana; an operator can run it against any master:

    python3 scripts/check_grafana.py --url https://MASTER:3000 --password-file ~/.accelmon/grafana-admin-password \
        --ca-file ~/.accelmon/pki/ca.crt

(--ca-file: the CA the deploy issued the master's Grafana certificate from; without it, the system's CAs.)

Exit 0 when Grafana is whole; 1 with one line per problem. The API: Grafana's HTTP API reference (health,
data sources, search, dashboards by uid, data source queries at /api/ds/query).
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "master" / "grafana" / "dashboards"
# Grafana's own variables, at what a 5-minute view gives them.
BUILTINS = {"$__rate_interval": "1m", "$__interval": "30s", "$__range": "5m"}

Call = Callable[[str, Optional[dict[str, Any]]], Any]  # (API path, JSON body or None for a GET) -> the JSON answer


def expected_dashboards() -> dict[str, str]:
    """uid -> title of every dashboard the repository ships (master/grafana/dashboards)."""
    found = {}
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        found[board["uid"]] = board["title"]
    return found


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for item in items:
        yield item
        yield from panels(item.get("panels") or [])


def concrete(expr: str, variables: dict[str, str]) -> str:
    """The query as Grafana sends it with every dashboard variable at "All" (a regex matching everything)."""
    for name, value in {**BUILTINS, **variables}.items():
        expr = expr.replace("${" + name.lstrip("$") + "}", value).replace(name, value)
    return expr


def problems(call: Call) -> list[str]:
    found = []
    health = call("/api/health", None)
    if health.get("database") != "ok":
        return [f"Grafana's database is not ok: {health}"]
    sources = [s for s in call("/api/datasources", None) if s.get("type") == "prometheus"]
    if not sources:
        return ["Grafana has no Prometheus data source (the role provisions one)"]
    source = sources[0]
    checked = call(f"/api/datasources/uid/{source['uid']}/health", None)
    if str(checked.get("status", "")).upper() != "OK":
        found.append(f"data source {source.get('name')} does not reach Prometheus: {checked.get('message')}")
    served = {d["uid"]: d for d in call("/api/search?type=dash-db&limit=5000", None)}
    for uid, title in expected_dashboards().items():
        if uid not in served:
            found.append(f"dashboard {title} ({uid}) is missing")
            continue
        board = call(f"/api/dashboards/uid/{uid}", None)["dashboard"]
        variables = {f"${v['name']}": ".*" for v in board.get("templating", {}).get("list", [])}
        for panel in panels(board.get("panels") or []):
            for target in panel.get("targets") or []:
                if not target.get("expr"):
                    continue
                query = {"refId": "A", "datasource": {"type": "prometheus", "uid": source["uid"]},
                         "expr": concrete(target["expr"], variables), "instant": True, "range": False}  # fmt: skip
                try:
                    answer = call("/api/ds/query", {"queries": [query], "from": "now-5m", "to": "now"})
                    error = answer.get("results", {}).get("A", {}).get("error")
                except RuntimeError as failed:
                    error = str(failed)
                if error:
                    found.append(f"{title} / {panel.get('title')}: {error}")
    return found


def caller(url: str, password: str, timeout: float = 10.0, ca_file: Optional[str] = None) -> Call:
    token = base64.b64encode(f"admin:{password}".encode()).decode()
    # https is verified, name and chain: against the given CA (the deploy's), else the system's.
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https:") else None

    def call(path: str, body: Optional[dict[str, Any]]) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url.rstrip("/") + path, data=data, method="POST" if data else "GET")
        request.add_header("Authorization", f"Basic {token}")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"{path}: HTTP {error.code} {error.read()[:200].decode(errors='replace')}") from None

    return call


def plain_http_refused(url: str, ca_file: Optional[str]) -> str:
    """Why `url` is refused, or "": the admin password goes with every request, so plain http:// is taken only to
    this host's loopback (the demo's Grafana); masters serve HTTPS by default (accelmon_master_grafana_plain_http)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        return ""
    if parts.scheme != "http":
        return f"--url {url}: not an http(s):// URL"
    if ca_file:
        return f"--url {url} is plain http://: --ca-file would not be used (https:// for the master's Grafana)"
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return f"--url {url}: plain http:// would send the admin password in clear (https://, --ca-file: the CA)"
    return ""


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="https://MASTER:3000; http:// only to this host (the demo's)")
    parser.add_argument("--password-file", required=True, help="the admin password (the role's file)")
    parser.add_argument("--ca-file", help="the CA of Grafana's certificate (the deploy's: ~/.accelmon/pki/ca.crt)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for Grafana to answer")
    args = parser.parse_args(argv)
    refused = plain_http_refused(args.url, args.ca_file)
    if refused:
        parser.error(refused)  # before the password is read, let alone sent
    ca_file = str(Path(args.ca_file).expanduser()) if args.ca_file else None
    call = caller(args.url, Path(args.password_file).expanduser().read_text().strip(), ca_file=ca_file)
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            found = problems(call)
            break
        except (OSError, RuntimeError) as error:  # not up yet: refused, reset, a 503 while it migrates its database
            if time.monotonic() >= deadline:
                print(f"Grafana at {args.url} did not answer within {args.timeout:g} s: {error}", file=sys.stderr)
                return 1
            time.sleep(2)
    for line in found:
        print(line, file=sys.stderr)
    if not found:
        print(f"Grafana at {args.url}: {len(expected_dashboards())} dashboards, every panel answered")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
