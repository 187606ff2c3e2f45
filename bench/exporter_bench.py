"""Exporter benchmark over the fake driver, side by side with nvitop-exporter (PyPI) in the same run.

CPU: the fake driver's cost model burns, on the calling thread, the CPU each NVML call cost on a real H100
(docs/hardware.md), so CPU per GPU per second here stands for what a real driver would cost. Both exporters
sample every 1 s with nothing scraping them; printed: CPU ms per GPU per second, our ratio to nvitop-exporter's,
profiling's extra CPU, peak RSS against the floor of Python + prometheus_client + pynvml + the driver library.
Latency: with every fake call sleeping 2 ms (no CPU), scrape latency p50/p99 over 1000 scrapes.
CPU is read from each process's CPU clock (to the nanosecond, tests.support.processes.cpu_seconds) over repeated
windows of 60 s (a multiple of every interval a host's defaults and the 60 s counters option use), until each
figure's 95 % confidence interval is within half of `--uncertainty` (default 5 %: two figures 5 % apart are told
apart) or `--max-windows` are spent: each figure is printed with its interval.
Run: .venv/bin/python -m bench.exporter_bench [--gpus 8] [--uncertainty 0.05]
     .venv/bin/python -m bench.exporter_bench --compare 08d0b7f main [--setups host,nvml,gpm]: two commits, each
     installed from its own git worktree into its own venv (.cache/bench-commits), run at the same time over the
     same fake, side by side with nvitop-exporter, measured over the same windows; the ratio per window, its mean
     and interval (a paired measure: what the machine does in a window, it does to both).
(nvitop-exporter is installed into .cache/bench-nvitop on first use; --no-peer skips it.)
For the same measurement on a real GPU, see bench/real_gpu.py.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import http.client
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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
        python: str = sys.executable,
    ) -> None:
        self.port = free_port()
        self.ready = ready
        env = {**os.environ, "LD_LIBRARY_PATH": str(fake_dir), "FAKE_NVML_CONFIG": str(config)}
        if command is None:
            command = [python, "-m", "accelmon", f"--web.listen-address=127.0.0.1:{self.port}"]
            command += ["--log.level=warning", *(args if args is not None else ACCELMON_ONLY_NVML)]
        else:
            command = [*command, "--port", str(self.port)]
        if python != sys.executable:  # a commit's own venv: its installed package, not this checkout's
            env.pop("PYTHONPATH", None)
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=Path(python).parent
        )

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

    def cpu_fraction(self, window: Window) -> Estimate:
        """CPU share of one core, sampling with no scrapes, over windows until `window` is satisfied."""
        return window.measure([self])[0]


@dataclass
class Estimate:
    """A mean over windows and its 95 % confidence half-width (Student's t)."""

    values: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def half_width(self) -> float:
        if len(self.values) < 2:
            return math.inf
        n = len(self.values)
        return T_975.get(n - 1, 1.96) * statistics.stdev(self.values) / math.sqrt(n)

    @property
    def relative(self) -> float:
        return self.half_width / abs(self.mean) if self.mean else math.inf

    def scaled(self, factor: float) -> Estimate:
        return Estimate([v * factor for v in self.values])

    def words(self, unit: str = "ms", digits: int = 3) -> str:
        return (
            f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f} {unit} (95 %, {len(self.values)} windows, "
            f"±{self.relative * 100:.1f} %)"
        )


# Student's t at 97.5 % by degrees of freedom (a 95 % two-sided interval); 1.96 past 30.
T_975 = dict(enumerate([12.71, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
                        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
                        2.052, 2.048, 2.045, 2.042], start=1))  # fmt: skip


@dataclass
class Window:
    """Repeated windows of `seconds` (60: every interval of a host's defaults and the 60 s counters divides it, so
    each window holds the same reads), at least `least`, until every figure's 95 % interval is within half of
    `uncertainty`, or `most`."""

    seconds: float = 60.0
    uncertainty: float = 0.05
    least: int = 4
    most: int = 20

    def measure(self, exporters: list[RunningExporter], ratios: bool = False) -> list[Estimate]:
        """CPU share of one core of each exporter, measured over the same windows (they run together)."""
        shares: list[list[float]] = [[] for _ in exporters]
        while True:
            before = [cpu_seconds(e.process.pid) for e in exporters]
            started = time.monotonic()
            time.sleep(self.seconds)
            wall = time.monotonic() - started
            for share, exporter, cpu in zip(shares, exporters, before):
                share.append((cpu_seconds(exporter.process.pid) - cpu) / wall)
            estimates = [Estimate(share) for share in shares]
            judged = estimates
            if ratios and len(exporters) > 1:  # a comparison is judged by its paired ratios
                judged = [Estimate([b / a for a, b in zip(shares[0], share)]) for share in shares[1:]]
            done = len(shares[0]) >= self.least and all(e.relative <= self.uncertainty / 2 for e in judged)
            if done or len(shares[0]) >= self.most:
                return estimates


def infiniband_cost(work: Path, devices: int = 8, rounds: int = 200) -> tuple[float, float, int]:
    """ms per sample, ours and node_exporter's own collector timing, on one tree of `devices` single-port HCAs."""
    from tests.support.infiniband_tree import add_device, node_exporter, scrape_node_exporter

    from accelmon.collectors.infiniband import InfinibandCollector
    from accelmon.exporter.metrics import render

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
    from accelmon.exporter.metrics import render

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


@dataclass
class Host:
    """The fakes every run shares: the driver library, an H100 board, a GPU host's board, procfs and kernel log."""

    fake_dir: Path
    h100: Path  # NVML alone, GPM supported
    host: Path  # a GPU host: 18 NVLink links and fabric state per GPU, a process on each GPU
    host_defaults: list[str]  # the exporter's arguments for that host (kernel_log, fabric, gpu_processes, health)
    sleepy: Path  # every call sleeping, for the latency run


def make_host(work: Path, gpus: int, latency_ms: float) -> Host:
    fake_dir = build_fake_nvml(work).parent
    h100 = work / "h100.conf"
    h100.write_text(f"gpus {gpus}\nprofile h100\n" + "".join(f"gpm {i}\n" for i in range(gpus)))
    sleepy = work / "sleepy.conf"
    sleepy.write_text(f"gpus {gpus}\nlatency_us {int(latency_ms * 1000)}\nunsupported nvmlDeviceGetFanSpeed\n")
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
    return Host(fake_dir, h100, host, host_defaults, sleepy)


# What --compare measures: (name, fake board, arguments) for a Host.
SETUPS = {
    "host": lambda h: (h.host, h.host_defaults),
    "nvml": lambda h: (h.h100, ACCELMON_ONLY_NVML),
    "gpm": lambda h: (h.h100, ["--no-collector.infiniband", "--no-collector.neuron", "--collector.profiling"]),
}


def commit_python(ref: str) -> tuple[str, str]:
    """The short hash of `ref` and a Python with that commit's accelmon installed: its tree from `git archive`, in a
    venv of its own under .cache/bench-commits (made once, kept)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=10", ref], capture_output=True, text=True,
                         check=True).stdout.strip()  # fmt: skip
    home = ROOT / ".cache" / "bench-commits" / sha
    python = home / "venv" / "bin" / "python"
    if not python.exists():
        tree = home / "tree"
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
        subprocess.run([str(home / "venv" / "bin" / "pip"), "install", "-q", str(tree)], check=True)
    return sha, str(python)


def compare(refs: list[str], setups: list[str], host: Host, window: Window, gpus: int, peer: list[str] | None) -> None:
    """Each commit in its own venv, run at the same time with nvitop-exporter over the same fake, measured over the
    same windows: each one's figure, and each against the first by the ratio of every window."""
    built = [commit_python(ref) for ref in refs]
    for setup in setups:
        board, arguments = SETUPS[setup](host)
        with contextlib.ExitStack() as running:
            exporters = [running.enter_context(RunningExporter(host.fake_dir, board, args=arguments, python=python))
                         for _, python in built]  # fmt: skip
            if peer is not None:
                exporters.append(running.enter_context(
                    RunningExporter(host.fake_dir, host.h100, command=peer, ready=b"gpu_utilization")
                ))  # fmt: skip
            shares = window.measure(exporters, ratios=True)
        print(f"{setup}: CPU per GPU-second, {len(shares[0].values)} windows of {window.seconds:g} s, run together")
        for (sha, _), share in zip(built, shares):
            print(f"  {sha}: {share.scaled(1000 / gpus).words()}")
        first = shares[0].values
        for (sha, _), share in zip(built[1:], shares[1:]):
            ratio = Estimate([b / a for a, b in zip(first, share.values)])
            print(f"  {sha} / {built[0][0]}: {ratio.words(unit='', digits=3)}")
        if peer is not None:
            theirs = shares[-1].values
            print(f"  nvitop-exporter (NVML alone, 1 s): {shares[-1].scaled(1000 / gpus).words()}")
            for (sha, _), share in zip(built, shares):
                ratio = Estimate([a / b for a, b in zip(share.values, theirs)])
                print(f"  {sha} / nvitop-exporter: {ratio.words(unit='', digits=3)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=2.0, help="per-call sleep for the latency run")
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--window-seconds", type=float, default=60.0, help="one CPU window (default 60)")
    parser.add_argument("--uncertainty", type=float, default=0.05,
                        help="the difference to resolve: windows are added until each figure's 95 %% interval is "
                             "within half of it (default 0.05)")  # fmt: skip
    parser.add_argument("--max-windows", type=int, default=20)
    parser.add_argument("--no-peer", action="store_true", help="skip nvitop-exporter")
    parser.add_argument("--compare", nargs="+", metavar="COMMIT", help="compare commits (the first is the base)")
    parser.add_argument("--setups", default="host", help=f"what --compare measures, of {','.join(SETUPS)}")
    args = parser.parse_args()
    gpus = args.gpus
    window = Window(args.window_seconds, args.uncertainty, most=args.max_windows)
    work = Path(tempfile.mkdtemp(prefix="accelmon-bench-"))
    host = make_host(work, gpus, args.latency_ms)
    fake_dir, h100, sleepy = host.fake_dir, host.h100, host.sleepy
    peer = None if args.no_peer else nvitop_exporter()
    print(f"host: {gpus} fake H100s, each NVML call burning the CPU it cost on a real H100 (driver 580); 1 s samples")
    if args.compare:
        compare(args.compare, args.setups.split(","), host, window, gpus, peer)
        return

    def ms(share: Estimate) -> str:
        return share.scaled(1000 / gpus).words()

    # Every configuration at once, over the same windows (each process's CPU is its own; the fake burns thread CPU
    # time, so that running together changes no figure, and a busy moment of the machine falls on all of them).
    # The same host with its counters read every 60 s rather than 30: what an operator who wants a lower floor
    # buys (the driver's own cost of the counter reads is most of what is left: docs/benchmarks.md).
    slower = work / "counters-60s.yaml"
    slower.write_text(
        "collectors:\n  nvml: {slow_interval_seconds: 60, pcie_interval_seconds: 60}\n"
        "  fabric: {interval_seconds: 60}\n"
    )
    with contextlib.ExitStack() as running:
        start = lambda *a, **k: running.enter_context(RunningExporter(fake_dir, *a, **k))  # noqa: E731
        nvml_alone = start(h100)
        at_host = start(host.host, args=host.host_defaults)
        counters_60s = start(host.host, args=[*host.host_defaults, f"--config={slower}"])
        profiling = start(h100, args=["--no-collector.infiniband", "--no-collector.neuron", "--collector.profiling"])
        exporters = [nvml_alone, at_host, counters_60s, profiling]
        if peer is not None:
            exporters.append(start(h100, command=peer, ready=b"gpu_utilization"))
        shares = window.measure(exporters, ratios=False)
        rss = peak_rss_kib(nvml_alone.process.pid) / 1024
        host_rss = peak_rss_kib(at_host.process.pid) / 1024
        their_rss = peak_rss_kib(exporters[-1].process.pid) / 1024 if peer is not None else 0.0
    ours, at_host_defaults, slower_share, with_profiling = shares[:4]
    gpm = Estimate([b - a for a, b in zip(ours.values, with_profiling.values)])
    print(f"accelmon-exporter, NVML at defaults: {ms(ours)} CPU per GPU-second (target: at most 1 ms)")
    print(f"  + GPM profiling at defaults: {ms(gpm)} (target: at most +0.25 ms)")
    print(
        "accelmon-exporter at a GPU host's defaults (nvml, kernel_log, fabric, gpu_processes, health): "
        f"{ms(at_host_defaults)} CPU per GPU-second (target: at most 0.40 ms); peak RSS {host_rss:.1f} MiB "
        "(target: at most 40)"
    )
    print(f"  the same with counters read every 60 s, not 30: {ms(slower_share)}")
    if peer is None:
        print("nvitop-exporter: skipped" + ("" if args.no_peer else " (could not be installed)"))
    else:
        theirs = shares[-1]
        alone = Estimate([a / b for a, b in zip(ours.values, theirs.values)])
        at_host_ratio = Estimate([a / b for a, b in zip(at_host_defaults.values, theirs.values)])
        print(f"nvitop-exporter 1 s, same fake: {ms(theirs)} CPU per GPU-second")
        print(f"  accelmon / nvitop-exporter, NVML alone: {alone.words(unit='', digits=3)}")
        print(f"  accelmon / nvitop-exporter, a GPU host's defaults: {at_host_ratio.words(unit='', digits=3)}")
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
