"""Exporter benchmark: 8 fake GPUs whose every NVML call takes 2 ms (configurable).

Prints scrape latency p50/p99 over 1000 scrapes, exporter CPU per hour of sampling at 1 s, peak RSS,
series per GPU and NVML calls per GPU per sample. Run: .venv/bin/python bench/exporter_bench.py
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "exporters"))
from conftest import build_fake_nvml  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def scrape(port: int) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/metrics")
    body = connection.getresponse().read()
    connection.close()
    return body


def calls_per_gpu_per_sample(fake_dir: Path, config: Path, gpus: int) -> float:
    """Counted in this process by the fake driver itself, over 5 samples, XID and PCIe threads excluded."""
    os.environ["FAKE_NVML_CONFIG"] = str(config)
    library = ctypes.CDLL(str(fake_dir / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)
    library.fakeNvmlCallCount.restype = ctypes.c_ulonglong
    sys.path.insert(0, str(ROOT / "exporters"))
    from accelmon.collectors.nvml import NvmlCollector

    collector = NvmlCollector(xid_events=False, pcie_interval=3600)
    collector.start()
    collector.sample()  # first sample learns what is unsupported
    before = library.fakeNvmlCallCount()
    for _ in range(5):
        collector.sample()
    calls = library.fakeNvmlCallCount() - before
    collector.stop()
    return calls / 5 / gpus


class RunningExporter:
    """accelmon-exporter in its own process over the fake driver, on a loopback port; stopped on exit."""

    def __init__(self, fake_dir: Path, config: Path) -> None:
        self.port = free_port()
        env = {**os.environ, "LD_LIBRARY_PATH": str(fake_dir), "FAKE_NVML_CONFIG": str(config)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "accelmon", f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warning"],
            env=env,
        )

    def __enter__(self) -> RunningExporter:
        deadline = time.monotonic() + 30
        body = b""
        while b"accelmon_gpu_up" not in body:
            if time.monotonic() > deadline:
                raise SystemExit("exporter did not come up")
            time.sleep(0.2)
            try:
                body = scrape(self.port)
            except OSError:
                pass
        time.sleep(2)  # past start-up
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(10)

    def cpu_fraction(self, seconds: float) -> float:
        """CPU share of one core over `seconds` of sampling, with no scrapes."""
        cpu_before, wall_before = cpu_seconds(self.process.pid), time.monotonic()
        time.sleep(seconds)
        return (cpu_seconds(self.process.pid) - cpu_before) / (time.monotonic() - wall_before)


def infiniband_cost(work: Path, devices: int = 8, rounds: int = 200) -> tuple[float, float, int]:
    """ms per sample, ours and node_exporter's own collector timing, on one tree of `devices` single-port HCAs."""
    from accelmon.collectors.infiniband import InfinibandCollector
    from accelmon.core import render
    from ib_fixture import add_device, node_exporter, scrape_node_exporter

    sysfs = work / "ib-sys"
    for index in range(devices):
        add_device(sysfs, f"mlx5_{index}", {1: {"base": index}}, pci_address=f"0000:{0x10 + index:02x}:00.0")
    collector = InfinibandCollector(str(sysfs))
    started = time.perf_counter()
    for _ in range(rounds):
        render(collector.sample())
    ours = (time.perf_counter() - started) / rounds * 1000
    durations = []
    with node_exporter(sysfs) as port:
        for _ in range(50):
            for line in scrape_node_exporter(port).splitlines():
                if line.startswith('node_scrape_collector_duration_seconds{collector="infiniband"}'):
                    durations.append(float(line.split()[-1]) * 1000)
    theirs = statistics.median(durations)
    return ours, theirs, devices


def neuron_cost(rounds: int = 200) -> float:
    """ms to parse one neuron-monitor report of a trn1.32xlarge (16 runtimes, 2 cores each) and render it."""
    from accelmon.collectors.neuron import NeuronCollector
    from accelmon.core import render
    from neuron_reports import line, report, runtime

    collector = NeuronCollector(monitor="/nonexistent")
    text = [
        line(report(i, [runtime(f"job-{r}", 1000 + r, i, errors=1) for r in range(16)])).encode() for i in range(rounds)
    ]
    started = time.perf_counter()
    for i in range(rounds):
        collector.state.add_line(text[i], time.monotonic(), time.time())
        render(collector.sample())
    return (time.perf_counter() - started) / rounds * 1000


def profiling_cost(fake_dir: Path, work: Path, gpus: int) -> float:
    """CPU ms per profiling sample over GPM for `gpus` GPUs (fake driver, instant calls), in a child process."""
    config = work / "gpm.conf"
    config.write_text(f"gpus {gpus}\n" + "".join(f"gpm {i}\n" for i in range(gpus)))
    code = (
        "import time\nfrom accelmon.collectors.profiling import ProfilingCollector\nfrom accelmon.core import render\n"
        "c = ProfilingCollector(backend='gpm'); c.start(); time.sleep(0.11); c.sample()\n"
        "t = time.process_time()\nfor _ in range(200): render(c.sample())\n"
        "print((time.process_time() - t) / 200 * 1000)\nc.stop()\n"
    )
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_dir), "FAKE_NVML_CONFIG": str(config)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(result.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--cpu-seconds", type=float, default=30.0, help="how long to measure sampling CPU")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="accelmon-bench-"))
    fake_dir = build_fake_nvml(work).parent
    slow = work / "slow.conf"
    slow.write_text(f"gpus {args.gpus}\nlatency_us {int(args.latency_ms * 1000)}\nunsupported nvmlDeviceGetFanSpeed\n")
    fast = work / "fast.conf"
    fast.write_text(f"gpus {args.gpus}\nunsupported nvmlDeviceGetFanSpeed\n")

    with RunningExporter(fake_dir, slow) as exporter:
        cpu_slow = exporter.cpu_fraction(args.cpu_seconds)
        latencies = []
        for _ in range(args.scrapes):
            started = time.perf_counter()
            body = scrape(exporter.port)
            latencies.append((time.perf_counter() - started) * 1000)
        rss = peak_rss_mib(exporter.process.pid)
    with RunningExporter(fake_dir, fast) as exporter:
        cpu_fast = exporter.cpu_fraction(args.cpu_seconds)
    text = body.decode()
    series_gpu0 = sum(1 for line in text.splitlines() if 'gpu="0"' in line and not line.startswith("#"))
    quantiles = statistics.quantiles(latencies, n=100)
    calls = calls_per_gpu_per_sample(fake_dir, fast, args.gpus)
    print(f"host: {args.gpus} fake GPUs, every NVML call {args.latency_ms} ms, sampling every 1 s")
    print(
        f"scrape latency over {args.scrapes} scrapes: p50 {quantiles[49]:.2f} ms, p99 {quantiles[98]:.2f} ms, "
        f"max {max(latencies):.2f} ms ({len(body)} bytes)"
    )
    print(f"exporter CPU, fake calls instant: {cpu_fast * 3600:.1f} s per hour = {cpu_fast * 100:.2f} % of one core")
    print(
        f"exporter CPU, fake calls {args.latency_ms} ms: {cpu_slow * 3600:.1f} s per hour = {cpu_slow * 100:.2f} % "
        "(includes the fake driver's own sleeping, which a real driver spends in the kernel instead)"
    )
    print(f"peak RSS: {rss:.1f} MiB")
    print(f"series per GPU: {series_gpu0}")
    print(f"NVML calls per GPU per sample: {calls:.1f} (plus 2 PCIe throughput calls per GPU every 10 s)")
    ours, theirs, devices = infiniband_cost(work)
    print(
        f"InfiniBand sample of {devices} ports: accelmon {ours:.2f} ms, node_exporter {theirs:.2f} ms "
        f"(its own collector timing), ratio {ours / theirs:.2f}"
    )
    print(f"Neuron report of 16 runtimes x 2 cores, parsed and rendered: {neuron_cost():.2f} ms")
    print(f"profiling (GPM) per sample of {args.gpus} GPUs: {profiling_cost(fake_dir, work, args.gpus):.2f} ms CPU")


if __name__ == "__main__":
    main()
