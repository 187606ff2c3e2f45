"""Checks a running accelmon cluster through its Prometheus: every scrape target up, and every worker's GPU,
InfiniBand and Neuron series present. The demo runs it before it claims success, the Molecule cluster scenario
asserts on it, and an operator can run it against any master:

    python3 scripts/check_cluster.py --url http://127.0.0.1:9090 --timeout 120

Exit 0 when the cluster is whole; 1 with one line per problem (each down target with Prometheus's lastError)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

# What every worker must send, by what an operator calls it.
WORKER_SERIES = {
    "GPU": "accelmon_gpu_up",
    "InfiniBand": "accelmon_infiniband_state_id",
    "Neuron": "accelmon_neuroncore_utilization_ratio",
}
WORKER_JOB = "accelmon"

Fetch = Callable[[str], Any]  # an API path such as "/api/v1/targets" -> the response's "data"


def query_path(promql: str) -> str:
    return "/api/v1/query?" + urllib.parse.urlencode({"query": promql})


def problems(fetch: Fetch) -> list[str]:
    """What is wrong with the cluster now, one line each; empty when every target is up with its series."""
    found = []
    targets = fetch("/api/v1/targets")["activeTargets"]
    if not targets:
        return ["Prometheus has no scrape targets"]
    for target in sorted(targets, key=lambda t: t["scrapeUrl"]):
        if target["health"] != "up":
            labels = target["labels"]
            error = target.get("lastError") or "not scraped yet"
            found.append(
                f"target {target['scrapeUrl']} (job {labels.get('job')}, node {labels.get('node')}) is "
                f"{target['health']}: {error}"
            )
    workers = sorted({t["labels"].get("node", "") for t in targets if t["labels"].get("job") == WORKER_JOB})
    if not workers:
        found.append(f"no target of job {WORKER_JOB!r}: no worker is scraped")
    for what, metric in WORKER_SERIES.items():
        nodes = {r["metric"].get("node") for r in fetch(query_path(f"count by (node) ({metric})"))["result"]}
        found.extend(f"worker {node}: no {what} series ({metric})" for node in workers if node not in nodes)
    return found


def wait_until_whole(fetch: Fetch, timeout: float, poll: float = 2.0) -> list[str]:
    """Polls until the cluster is whole or the timeout passes; returns the problems of the last look."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = problems(fetch)
        except (OSError, ValueError, KeyError) as error:  # Prometheus not answering yet, or answering nonsense
            found = [f"Prometheus did not answer: {error}"]
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(poll)


def http_fetch(base_url: str) -> Fetch:
    def fetch(path: str) -> Any:
        with urllib.request.urlopen(base_url.rstrip("/") + path, timeout=10) as response:
            return json.load(response)["data"]

    return fetch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:9090", help="Prometheus (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for a whole cluster")
    args = parser.parse_args(argv)
    found = wait_until_whole(http_fetch(args.url), args.timeout)
    if found:
        print(f"the cluster is not whole after {args.timeout:.0f} s ({args.url}):", file=sys.stderr)
        for line in found:
            print(f"  - {line}", file=sys.stderr)
        return 1
    print(f"every target is up, with GPU, InfiniBand and Neuron series from every worker ({args.url})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
