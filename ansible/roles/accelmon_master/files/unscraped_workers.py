"""The workers this master's Prometheus cannot scrape, and why, read from its own API after a deploy (issue 66).

A worker that refuses the master (its allow-list names another address of the master: NAT, a second NIC, a new
address), answers with another CA's certificate (deployed from another controller) or refuses its password, deploys
green: its own check scrapes from its loopback. Only the master sees the refusal, so each deploy of a master asks
its Prometheus, once every worker target has been scraped (or TIMEOUT passed), which are down and with what error,
and the play warns naming them. A worker still on plain HTTP and scraped by the job's plain twin is not down.

Run by tasks/main.yml as `python3 -c` with one argument, the Prometheus base URL (http://127.0.0.1:PORT), and an
optional second, the seconds to wait; prints {"down": ["JOB on NODE: ERROR", ...], "pending": N}: `pending`
targets not scraped yet when the wait ended. Standard library only (the master's system Python, 3.6 and newer).
"""

import json
import sys
import time
import urllib.request

WORKER_JOBS = ("accelmon", "node")
NEVER = "0001-01-01T00:00:00Z"  # Prometheus's lastScrape before a target's first scrape


def targets(base):
    with urllib.request.urlopen(base + "/api/v1/targets?state=active", timeout=10) as answer:
        return json.load(answer)["data"]["activeTargets"]


def judge(active):
    """(down, pending) of the worker jobs' targets: down as "JOB on NODE: ERROR", sorted."""
    plain_up = {
        (t["scrapePool"][: -len("-plain")], t["labels"].get("node", ""))
        for t in active
        if t["scrapePool"].endswith("-plain") and t["health"] == "up"
    }
    down, pending = [], 0
    for target in active:
        pool, node = target["scrapePool"], target["labels"].get("node", "")
        if pool not in WORKER_JOBS:
            continue
        if target.get("lastScrape", NEVER).startswith("0001-"):
            pending += 1
        elif target["health"] != "up" and (pool, node) not in plain_up:
            down.append(f"{pool} on {node}: {target.get('lastError', '')[:300]}")
    return sorted(down), pending


def main():
    base = sys.argv[1].rstrip("/")
    deadline = time.monotonic() + (float(sys.argv[2]) if len(sys.argv) > 2 else 60)
    while True:
        try:
            down, pending = judge(targets(base))
        except (OSError, ValueError, KeyError) as error:
            down, pending = [f"its targets could not be read: {error}"], 0
        if pending == 0 or time.monotonic() >= deadline:
            break
        time.sleep(1)
    json.dump({"down": down, "pending": pending}, sys.stdout)


if __name__ == "__main__":
    main()
