"""What serving /metrics costs: CPU and scrape latency of the whole exporter at a given scrape rate.

The exporter of a GPU node as issue 12 set it: 8 fake H100s (each NVML call burning the CPU it cost on a real
H100), 4 InfiniBand ports (the fixture tree) and a fake neuron-monitor, every collector sampling each second. A
scraper asks for /metrics every `--scrape-every` seconds (Prometheus's default is 15 s) for `--seconds`; printed:
the exporter's CPU (% of a core) and scrape latency p50/p99 over the run, for the text format and OpenMetrics.
`--tree DIR` runs the exporter of another checkout (e.g. a `git worktree` of an older commit) with the same
devices, for a before/after in one run: the script and its fakes come from this checkout.

Run: .venv/bin/python -m bench.exposition_bench [--seconds 120] [--scrape-every 15] [--tree /tmp/before]
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
from tests.support.fakenvml import build_fake_nvml  # noqa: E402
from tests.support.infiniband_tree import standard_tree  # noqa: E402
from tests.support.neuron_reports import line, report  # noqa: E402
from tests.support.processes import cpu_seconds, free_port  # noqa: E402

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def scrape(port: int, accept: str = "") -> tuple[float, int]:
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
    body = connection.getresponse().read()
    connection.close()
    return (time.perf_counter() - started) * 1000, len(body)


def start_exporter(tree: Path, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    fake_dir = build_fake_nvml(work / "fake").parent
    nvml = work / "nvml.conf"
    nvml.write_text("gpus 8\nprofile h100\n")
    reports = work / "reports.jsonl"
    reports.write_text("\n".join(line(report(i)) for i in range(1, 4)) + "\n")
    port = free_port()
    settings = work / "accelmon.yml"
    settings.write_text(
        yaml.safe_dump(
            {
                "web": {"listen_address": f"127.0.0.1:{port}"},
                "paths": {"sysfs": str(standard_tree(work / "sys"))},
                "collectors": {
                    "nvml": {"enabled": True},
                    "infiniband": {"enabled": True, "interval_seconds": 1},
                    "neuron": {
                        "enabled": True,
                        "interval_seconds": 1,
                        "period_seconds": 1,
                        "monitor_path": str(ROOT / "tests" / "fakeneuron" / "neuron-monitor"),
                    },
                },
            }
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(tree / "exporters"),
        "LD_LIBRARY_PATH": str(fake_dir),
        "FAKE_NVML_CONFIG": str(nvml),
        "FAKE_NEURON_LINES": str(reports),
        "FAKE_NEURON_THEN": "repeat",
        "FAKE_NEURON_DELAY": "1",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "accelmon", "--config", str(settings), "--log.level=warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            scrape(port)
            break
        except OSError:
            time.sleep(0.2)
    time.sleep(5)  # past start-up, the first slow reads and neuron-monitor's first reports
    return process, port


def measure(tree: Path, seconds: float, every: float, accept: str) -> tuple[float, list[float], int]:
    """(CPU share of one core, scrape latencies in ms, body size) over `seconds`, scraping every `every` s."""
    with tempfile.TemporaryDirectory(prefix="accelmon-exposition-") as work:
        process, port = start_exporter(tree, Path(work))
        try:
            latencies, size = [], 0
            cpu_before, started = cpu_seconds(process.pid), time.monotonic()
            next_scrape = started
            while time.monotonic() - started < seconds:
                if every > 0 and time.monotonic() >= next_scrape:
                    latency, size = scrape(port, accept)
                    latencies.append(latency)
                    next_scrape += every
                time.sleep(0.01)
            cpu = (cpu_seconds(process.pid) - cpu_before) / (time.monotonic() - started)
        finally:
            process.terminate()
            process.wait(10)
    return cpu, latencies, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--scrape-every", type=float, default=15.0)
    parser.add_argument("--tree", type=Path, action="append", help="another checkout to measure (repeatable)")
    args = parser.parse_args()
    trees = [ROOT, *(args.tree or [])]
    print(
        f"8 fake H100s (cost h100) + 4 IB ports + neuron-monitor, 1 s samples, a scrape every {args.scrape_every:g} s, "
        f"{args.seconds:g} s per run"
    )
    for tree in trees:
        for name, accept in (("text", ""), ("OpenMetrics", OPENMETRICS)):
            cpu, latencies, size = measure(tree, args.seconds, args.scrape_every, accept)
            p50 = statistics.median(latencies) if latencies else float("nan")
            p99 = max(latencies) if len(latencies) < 100 else statistics.quantiles(latencies, n=100)[98]
            print(
                f"{tree}: {name:11} CPU {cpu * 100:5.2f} % of a core; scrape p50 {p50:6.2f} ms, "
                f"p99 {p99:6.2f} ms over {len(latencies)} scrapes of {size} bytes"
            )


if __name__ == "__main__":
    main()
