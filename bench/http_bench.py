"""Scrape load and attacks on a served exporter (8 fake GPUs + 4 InfiniBand ports, 1 s samples), on loopback.

Prints: 50 concurrent keep-alive scrapers for --seconds (failures, latency p50/p99/max, exporter CPU); RSS under a
header flood (100 connections x 99 headers of 65 KB) and after it; a normal scrape's latency with 200 slow-header
clients connected. Run: .venv/bin/python -m bench.http_bench [--seconds 60] [--scrapers 50]
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from tests.support.fakenvml import build_fake_nvml  # noqa: E402
from tests.support.infiniband_tree import add_device  # noqa: E402
from tests.support.processes import cpu_seconds, rss_kib  # noqa: E402

from bench.exporter_bench import RunningExporter  # noqa: E402


def scrapers(port: int, count: int, seconds: float) -> tuple[list[float], int]:
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    until = time.monotonic() + seconds

    def scrape_loop() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while time.monotonic() < until:
            started = time.perf_counter()
            try:
                connection.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            elapsed = (time.perf_counter() - started) * 1000
            with lock:
                if ok:
                    latencies.append(elapsed)
                else:
                    failures[0] += 1
        connection.close()

    threads = [threading.Thread(target=scrape_loop) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, failures[0]


def header_flood(port: int) -> None:
    header = b"X-Flood: " + b"a" * 65_000 + b"\r\n"
    clients = []
    for _ in range(100):
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            client.sendall(b"GET /metrics HTTP/1.1\r\n")
            for _ in range(99):
                client.sendall(header)
        except OSError:
            pass  # cut off by the server
        clients.append(client)
    for client in clients:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scrapers", type=int, default=50)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="accelmon-http-bench-"))
    fake_dir = build_fake_nvml(work).parent
    config = work / "fake.conf"
    config.write_text("gpus 8\nunsupported nvmlDeviceGetFanSpeed\n")
    sysfs = work / "sys"
    for index in range(4):
        add_device(sysfs, f"mlx5_{index}", {1: {"base": index}}, pci_address=f"0000:{0x10 + index:02x}:00.0")
    args_exporter = [f"--path.sysfs={sysfs}", "--collector.infiniband", "--no-collector.neuron"]
    os.environ.pop("FAKE_NVML_CONFIG", None)
    with RunningExporter(fake_dir, config, args=args_exporter) as exporter:
        pid, port = exporter.process.pid, exporter.port
        cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
        latencies, failures = scrapers(port, args.scrapers, args.seconds)
        cpu = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - wall_before)
        q = statistics.quantiles(latencies, n=100)
        print(
            f"{args.scrapers} concurrent scrapers, {args.seconds:.0f} s: {len(latencies)} scrapes, {failures} failed, "
            f"p50 {q[49]:.1f} ms, p99 {q[98]:.1f} ms, max {max(latencies):.1f} ms; exporter CPU {cpu * 100:.0f} % "
            "of a core (target: 0 failed, p99 < 50 ms)"
        )
        idle = rss_kib(pid) / 1024
        header_flood(port)
        flooded = rss_kib(pid) / 1024
        time.sleep(2)
        print(
            f"header flood (100 connections x 99 headers of 65 KB): RSS {idle:.1f} MiB idle, {flooded:.1f} MiB after, "
            f"{rss_kib(pid) / 1024:.1f} MiB 2 s later (target: under 2x idle)"
        )
        slow = []
        for _ in range(200):
            client = socket.create_connection(("127.0.0.1", port), timeout=5)
            client.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            slow.append(client)
        started = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/metrics")
        connection.getresponse().read()
        print(
            f"a scrape with 200 slow-header clients connected: {(time.perf_counter() - started) * 1000:.1f} ms "
            "(target: under 1 s)"
        )
        for client in slow:
            client.close()


if __name__ == "__main__":
    main()
