"""Exporter benchmark over the fake driver, side by side with nvitop-exporter (PyPI) in the same run.

CPU: the fake driver's cost model burns, on the calling thread, the CPU each NVML call cost on a real H100
(docs/hardware.md), so CPU per GPU per second here stands for what a real driver would cost. Both exporters
sample every 1 s with nothing scraping them; printed: CPU ms per GPU per second, our ratio to nvitop-exporter's,
profiling's extra CPU, peak RSS against the floor of Python + prometheus_client + pynvml + the driver library.
Latency: with every fake call sleeping 2 ms (no CPU), scrape latency p50/p99 over 1000 scrapes.
Run: .venv/bin/python -m bench.exporter_bench [--gpus 8] [--cpu-seconds 30]
(nvitop-exporter is installed into .cache/bench-nvitop on first use; --no-peer skips it.)
For the same measurement on a real GPU, see bench/real_gpu.py.
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "exporters"))
from tests.support.fakenvml import build_fake_nvml  # noqa: E402
from tests.support.jobs_tree import nvidia_procfs  # noqa: E402
from tests.support.kernel_log_lines import BOOT, record  # noqa: E402
from tests.support.processes import cpu_seconds, free_port, peak_rss_kib  # noqa: E402


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

    now = [0.0]
    collector = NvmlCollector(xid_events=False, pcie_interval=3600, clock=lambda: now[0])
    collector.start()
    collector.sample()  # first sample learns what is unsupported
    before = library.fakeNvmlCallCount()
    for _ in range(30):  # one slow interval at the default 1 s / 30 s
        now[0] += 1.0
        collector.sample()
    calls = library.fakeNvmlCallCount() - before
    collector.stop()
    return calls / 30 / gpus


ACCELMON_ONLY_NVML = ["--no-collector.infiniband", "--no-collector.neuron", "--no-collector.profiling"]


class RunningExporter:
    """An exporter in its own process over the fake driver, on a loopback port; stopped on exit. accelmon's by
    default; `command` runs another (nvitop-exporter), `ready` is what its page shows once it has GPUs."""

    def __init__(
        self,
        fake_dir: Path,
        config: Path,
        args: list[str] | None = None,
        command: list[str] | None = None,
        ready: bytes = b"accelmon_gpu_up",
    ) -> None:
        self.port = free_port()
        self.ready = ready
        env = {**os.environ, "LD_LIBRARY_PATH": str(fake_dir), "FAKE_NVML_CONFIG": str(config)}
        if command is None:
            command = [sys.executable, "-m", "accelmon", f"--web.listen-address=127.0.0.1:{self.port}"]
            command += ["--log.level=warning", *(args if args is not None else ACCELMON_ONLY_NVML)]
        else:
            command = [*command, "--port", str(self.port)]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self) -> RunningExporter:
        deadline = time.monotonic() + 60
        body = b""
        while self.ready not in body:
            if time.monotonic() > deadline:
                raise SystemExit("exporter did not come up")
            time.sleep(0.2)
            try:
                body = scrape(self.port)
            except OSError:
                pass
        time.sleep(3)  # past start-up and the first slow reads
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
    from tests.support.infiniband_tree import add_device, node_exporter, scrape_node_exporter

    from accelmon.collectors.infiniband import InfinibandCollector
    from accelmon.metrics import render

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
    from tests.support.neuron_reports import line, report, runtime

    from accelmon.collectors.neuron import NeuronCollector
    from accelmon.metrics import render

    collector = NeuronCollector(monitor="/nonexistent")
    text = [
        line(report(i, [runtime(f"job-{r}", 1000 + r, i, errors=1) for r in range(16)])).encode() for i in range(rounds)
    ]
    started = time.perf_counter()
    for i in range(rounds):
        collector.state.add_line(text[i], time.monotonic(), time.time())
        render(collector.sample())
    return (time.perf_counter() - started) / rounds * 1000


def nvitop_exporter() -> list[str] | None:
    """nvitop-exporter in a venv of its own (it pins its own nvidia-ml-py), made on first use."""
    venv = ROOT / ".cache" / "bench-nvitop"
    binary = venv / "bin" / "nvitop-exporter"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        installed = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "nvitop-exporter"], check=False)
        if installed.returncode != 0:
            return None
    return [str(binary), "--bind-address", "127.0.0.1", "--interval", "1.0"]


def rss_floor_mib(fake_dir: Path, config: Path) -> float:
    """Peak RSS of Python with prometheus_client, PyYAML and pynvml imported and NVML initialised: the floor
    under any Python NVML exporter on this machine (on a real GPU the driver library is most of it)."""
    code = (
        "import prometheus_client, yaml, pynvml\npynvml.nvmlInit()\n"
        "print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])\n"
    )
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_dir), "FAKE_NVML_CONFIG": str(config)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(result.stdout) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=2.0, help="per-call sleep for the latency run")
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--cpu-seconds", type=float, default=30.0, help="how long to measure each exporter's CPU")
    parser.add_argument("--no-peer", action="store_true", help="skip nvitop-exporter")
    args = parser.parse_args()
    gpus = args.gpus

    work = Path(tempfile.mkdtemp(prefix="accelmon-bench-"))
    fake_dir = build_fake_nvml(work).parent
    h100 = work / "h100.conf"
    h100.write_text(f"gpus {gpus}\nprofile h100\n" + "".join(f"gpm {i}\n" for i in range(gpus)))
    sleepy = work / "sleepy.conf"
    sleepy.write_text(f"gpus {gpus}\nlatency_us {int(args.latency_ms * 1000)}\nunsupported nvmlDeviceGetFanSpeed\n")

    def ms_per_gpu_second(fraction: float) -> float:
        return fraction * 1000 / gpus

    # A GPU host as the exporter finds it: the driver's procfs (kernel_log, fabric and gpu_processes turn on by
    # themselves), a kernel log of boot chatter, 18 NVLink links and fabric state per GPU, a process on each GPU.
    host = work / "gpu-host.conf"
    board = "".join(f"nvlink {i} 18\nfabric {i} 3 0 2\ngpm {i}\n" for i in range(gpus))
    host.write_text(f"gpus {gpus}\nprofile h100\nprocess_samples 1\n{board}")
    procfs = nvidia_procfs(work / "proc", gpus=gpus)
    (procfs / "stat").write_text(f"btime {BOOT}\n")
    kmsg = work / "kmsg"
    kmsg.write_text("".join(record(n, n * 0.01, f"usb 1-{n % 7}: new device number {n}") for n in range(2000)))
    host_defaults = ["--no-collector.infiniband", "--no-collector.neuron", f"--path.procfs={procfs}",
                     f"--path.kmsg={kmsg}"]  # fmt: skip

    print(f"host: {gpus} fake H100s, each NVML call burning the CPU it cost on a real H100 (driver 580); 1 s samples")
    with RunningExporter(fake_dir, h100) as exporter:
        ours = exporter.cpu_fraction(args.cpu_seconds)
        rss = peak_rss_kib(exporter.process.pid) / 1024
    with RunningExporter(fake_dir, host, args=host_defaults) as exporter:
        at_host_defaults = exporter.cpu_fraction(args.cpu_seconds)
        host_rss = peak_rss_kib(exporter.process.pid) / 1024
    # The same host with its counters read every 60 s rather than 30: what an operator who wants a lower floor
    # buys (the driver's own cost of the counter reads is most of what is left: docs/benchmarks.md).
    slower = work / "counters-60s.yaml"
    slower.write_text(
        "collectors:\n  nvml: {slow_interval_seconds: 60, pcie_interval_seconds: 60}\n"
        "  fabric: {interval_seconds: 60}\n"
    )
    with RunningExporter(fake_dir, host, args=[*host_defaults, f"--config={slower}"]) as exporter:
        counters_60s = exporter.cpu_fraction(args.cpu_seconds)
    with RunningExporter(
        fake_dir, h100, args=["--no-collector.infiniband", "--no-collector.neuron", "--collector.profiling"]
    ) as exporter:
        with_profiling = exporter.cpu_fraction(args.cpu_seconds)
    print(
        f"accelmon-exporter, NVML at defaults: {ms_per_gpu_second(ours):.3f} ms CPU per GPU per second "
        f"= {ours * 100 / gpus:.3f} % of a core per GPU (target: at most 1 ms)"
    )
    print(
        f"  + GPM profiling at defaults: {ms_per_gpu_second(with_profiling - ours):+.3f} ms CPU per GPU per "
        "second (target: at most +0.3 ms)"
    )
    print(
        "accelmon-exporter at a GPU host's defaults (nvml, kernel_log, fabric, gpu_processes, health): "
        f"{ms_per_gpu_second(at_host_defaults):.3f} ms CPU per GPU per second (target: at most 0.5 ms); "
        f"peak RSS {host_rss:.1f} MiB (target: at most 40)"
    )
    print(f"  the same with counters read every 60 s, not 30: {ms_per_gpu_second(counters_60s):.3f} ms")
    peer = None if args.no_peer else nvitop_exporter()
    if peer is None:
        print("nvitop-exporter: skipped" + ("" if args.no_peer else " (could not be installed)"))
    else:
        with RunningExporter(fake_dir, h100, command=peer, ready=b"gpu_utilization") as exporter:
            theirs = exporter.cpu_fraction(args.cpu_seconds)
            their_rss = peak_rss_kib(exporter.process.pid) / 1024
        print(
            f"nvitop-exporter 1 s, same fake: {ms_per_gpu_second(theirs):.3f} ms CPU per GPU per second; "
            f"accelmon / nvitop-exporter = {ours / theirs:.2f} with NVML alone, "
            f"{at_host_defaults / theirs:.2f} at a GPU host's defaults (target: at most 0.2)"
        )
        print(f"  peak RSS: nvitop-exporter {their_rss:.1f} MiB")
    floor = rss_floor_mib(fake_dir, h100)
    print(
        f"peak RSS: accelmon {rss:.1f} MiB; floor (Python + prometheus_client + PyYAML + pynvml + nvmlInit) "
        f"{floor:.1f} MiB; above the floor: {rss - floor:+.1f} MiB (target: at most +5)"
    )

    with RunningExporter(fake_dir, sleepy) as exporter:
        latencies = []
        for _ in range(args.scrapes):
            started = time.perf_counter()
            body = scrape(exporter.port)
            latencies.append((time.perf_counter() - started) * 1000)
    text = body.decode()
    series_gpu0 = sum(1 for line in text.splitlines() if 'gpu="0"' in line and not line.startswith("#"))
    quantiles = statistics.quantiles(latencies, n=100)
    print(
        f"scrape latency, every NVML call sleeping {args.latency_ms} ms: p50 {quantiles[49]:.2f} ms, "
        f"p99 {quantiles[98]:.2f} ms, max {max(latencies):.2f} ms over {args.scrapes} scrapes ({len(body)} bytes)"
    )
    print(f"series per GPU: {series_gpu0}")
    calls = calls_per_gpu_per_sample(fake_dir, h100, gpus)
    print(f"NVML calls per GPU per sample (slow and static reads averaged in): {calls:.1f}")
    ib_ours, ib_theirs, devices = infiniband_cost(work)
    print(
        f"InfiniBand sample of {devices} ports: accelmon {ib_ours:.2f} ms, node_exporter {ib_theirs:.2f} ms "
        f"(its own collector timing), ratio {ib_ours / ib_theirs:.2f}"
    )
    print(f"Neuron report of 16 runtimes x 2 cores, parsed and rendered: {neuron_cost():.2f} ms")


if __name__ == "__main__":
    main()
