"""The exporter on a real NVIDIA GPU: values against nvidia-smi, GPM under a known load, CPU and RSS against
nvitop-exporter. Run on a GPU host (DEVELOPERS.md: the device machine) from the repository root:

    PYTHONPATH=exporters python3 -m bench.real_gpu [--seconds 30] [--load-seconds 60]

0. Every NVML call the exporter makes (bench/nvml_calls.py), asked once of each GPU and MIG device: what each
   answered and cost, printed and written to --out (default $OUT where it is set) as nvml_calls.json: the facts
   docs/hardware.md records and the fakes must answer alike. `nvidia-smi -q` goes beside it (smi_q.txt).
1. Idle: accelmon-exporter (NVML alone, at a GPU host's defaults, then with GPM profiling) and nvitop-exporter
   (installed or importable) each sample for --seconds with nothing scraping them: CPU ms per GPU per second, RSS.
2. Load: a bf16 matmul loop in PyTorch on every GPU; meanwhile accelmon's /metrics and `nvidia-smi --query-gpu`
   are read at the same moment and printed side by side, and the GPM ratios are checked (SM active > 0.9 and
   tensor active > 0.8 under load, near 0 idle); every NVML call is asked again under the load (the per-process
   reads then have a process to name: nvml_calls_load.json), both expositions are kept (metrics_idle.prom,
   metrics_load.prom); then `--once --collector.profiling` under the same load.
Without nvidia-smi or torch (a fake driver on LD_LIBRARY_PATH) the comparison or the load step is skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from tests.support.processes import cpu_seconds, free_port, peak_rss_kib  # noqa: E402

from bench import nvml_calls  # noqa: E402
from bench.exporter_bench import scrape  # noqa: E402

SMI_FIELDS = {
    "utilization.gpu": ("accelmon_gpu_utilization_ratio", 0.01),
    "memory.used": ("accelmon_gpu_memory_used_bytes", 1024 * 1024),
    "power.draw": ("accelmon_gpu_power_watts", 1.0),
    "temperature.gpu": ("accelmon_gpu_temperature_celsius", 1.0),
    "clocks.sm": ("accelmon_gpu_sm_clock_hertz", 1e6),
}
LOAD = """
import sys, time, torch
n, until = 8192, time.time() + float(sys.argv[1])
pairs = [(torch.randn(n, n, device=f"cuda:{d}", dtype=torch.bfloat16),) * 2 for d in range(torch.cuda.device_count())]
while time.time() < until:
    for a, b in pairs:
        a @ b
    torch.cuda.synchronize()
"""


def gpu_count() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def values(text: str, metric: str) -> dict[str, float]:
    """gpu index -> value of `metric` in an exposition."""
    found = {}
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            labels, value = line.rsplit(" ", 1)
            gpu = labels.split('gpu="', 1)[1].split('"', 1)[0]
            found[gpu] = float(value)
    return found


class Served:
    """An exporter process on a loopback port; `command` is accelmon's unless given."""

    def __init__(self, args: list[str], command: list[str] | None = None) -> None:
        self.port = free_port()
        if command is None:
            command = [sys.executable, "-m", "accelmon", f"--web.listen-address=127.0.0.1:{self.port}", *args]
        else:
            command = [*command, "--port", str(self.port)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self) -> Served:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                scrape(self.port)
                time.sleep(6)  # past start-up, the first slow reads and one GPM window
                return self
            except OSError:
                time.sleep(0.5)
        raise SystemExit("the exporter did not come up")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(10)

    def cpu_ms_per_gpu_second(self, seconds: float, gpus: int) -> float:
        before, started = cpu_seconds(self.process.pid), time.monotonic()
        time.sleep(seconds)
        return (cpu_seconds(self.process.pid) - before) / (time.monotonic() - started) * 1000 / gpus


def nvitop_command() -> list[str] | None:
    arguments = ["--bind-address", "127.0.0.1", "--interval", "1.0"]
    if importlib.util.find_spec("nvitop_exporter") is not None:  # wheels carried to the GPU machine
        return [sys.executable, "-m", "nvitop_exporter", *arguments]
    for candidate in (
        shutil.which("nvitop-exporter"),
        str(ROOT / ".cache" / "bench-nvitop" / "bin" / "nvitop-exporter"),
    ):
        if candidate and os.path.exists(candidate):
            return [candidate, *arguments]
    return None


def wait_for_load(seconds: float = 60.0) -> float:
    """Until every GPU is busy (PyTorch takes seconds to start), or `seconds`: the lowest utilisation seen."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        deadline, lowest = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            lowest = min(pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles)
            if lowest >= 90:
                break
            time.sleep(0.5)
        return lowest
    finally:
        pynvml.nvmlShutdown()


def keep(out: Path | None, name: str, text: str) -> None:
    if out is not None:
        (out / name).write_text(text)
        print(f"  written to {out / name}")


def compare_with_smi(port: int) -> None:
    if shutil.which("nvidia-smi") is None:
        print("  nvidia-smi not found: value comparison skipped")
        return
    query = ",".join(SMI_FIELDS)
    smi = subprocess.run(
        ["nvidia-smi", f"--query-gpu=index,{query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    text = scrape(port).decode()
    for line in smi.strip().splitlines():
        index, *fields = [part.strip() for part in line.split(",")]
        for (field, (metric, scale)), raw in zip(SMI_FIELDS.items(), fields):
            ours = values(text, metric).get(index)
            print(f"  GPU {index} {field:16} nvidia-smi {float(raw) * scale:>14.6g}   accelmon {ours!s:>14}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="CPU measurement per exporter")
    parser.add_argument("--load-seconds", type=float, default=60.0)
    parser.add_argument("--out", metavar="DIR", default=os.environ.get("OUT"), help="where to keep what was read")
    args = parser.parse_args()
    out = Path(args.out) if args.out else None
    gpus = gpu_count()
    print("every NVML call the exporter makes, once per GPU (answer, CPU and wall time of the call):")
    calls = nvml_calls.run(repeat=5)
    nvml_calls.print_rows(calls)
    keep(out, "nvml_calls.json", json.dumps(calls, indent=1))
    if shutil.which("nvidia-smi"):
        keep(out, "smi_q.txt", subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True).stdout)
    host = ["--no-collector.infiniband", "--no-collector.neuron"]
    nvml_only = [*host, "--no-collector.profiling", "--no-collector.kernel_log", "--no-collector.fabric",
                 "--no-collector.gpu_processes", "--no-collector.health"]  # fmt: skip
    print(f"{gpus} GPU(s); driver and library as on this host")

    with Served(nvml_only) as served:
        ours = served.cpu_ms_per_gpu_second(args.seconds, gpus)
        rss = peak_rss_kib(served.process.pid) / 1024
    print(f"accelmon, NVML alone: {ours:.3f} ms CPU per GPU per second, peak RSS {rss:.1f} MiB")
    with Served(host) as served:
        at_host_defaults = served.cpu_ms_per_gpu_second(args.seconds, gpus)
        keep(out, "metrics_idle.prom", scrape(served.port).decode())
    print(
        "accelmon at a GPU host's defaults (nvml, kernel_log, fabric, gpu_processes, health): "
        f"{at_host_defaults:.3f} ms CPU per GPU per second"
    )
    profiling = [*host, "--collector.profiling"]
    with Served(profiling) as served:
        with_gpm = served.cpu_ms_per_gpu_second(args.seconds, gpus)
        idle = scrape(served.port).decode()
    print(f"  + GPM profiling at defaults: {with_gpm - at_host_defaults:+.3f} ms CPU per GPU per second")
    print(f"  GPM idle: SM active {values(idle, 'accelmon_gpu_sm_active_ratio')}")
    peer = nvitop_command()
    if peer is None:
        print("nvitop-exporter not found: skipped")
    else:
        with Served([], command=peer) as served:
            theirs = served.cpu_ms_per_gpu_second(args.seconds, gpus)
            their_rss = peak_rss_kib(served.process.pid) / 1024
        print(
            f"nvitop-exporter: {theirs:.3f} ms CPU per GPU per second, peak RSS {their_rss:.1f} MiB; "
            f"accelmon / nvitop-exporter = {ours / theirs:.2f} NVML alone, {at_host_defaults / theirs:.2f} at a GPU "
            "host's defaults"
        )

    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch not found: load step skipped")
        return
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(args.load_seconds)])
    try:
        print(f"load started: lowest GPU utilisation {wait_for_load()} %")
        with Served(profiling) as served:
            time.sleep(12)  # a full GPM window (10 s at defaults) under load
            print("under a bf16 matmul load, read at the same moment:")
            compare_with_smi(served.port)
            text = scrape(served.port).decode()
            sm, tensor = values(text, "accelmon_gpu_sm_active_ratio"), values(text, "accelmon_gpu_tensor_active_ratio")
            print(
                f"  GPM: SM active {sm}, tensor active {tensor}, DRAM {values(text, 'accelmon_gpu_dram_active_ratio')}"
            )
            verdict = all(v > 0.9 for v in sm.values()) and all(v > 0.8 for v in tensor.values())
            print(f"  GPM under load as expected (SM > 0.9, tensor > 0.8): {verdict}")
            keep(out, "metrics_load.prom", text)
        print("every NVML call again, under the load:")
        loaded = nvml_calls.run(repeat=3)
        nvml_calls.print_rows(loaded)
        keep(out, "nvml_calls_load.json", json.dumps(loaded, indent=1))
        once = subprocess.run(
            [sys.executable, "-m", "accelmon", "--once", *profiling], capture_output=True, text=True, timeout=120
        )
        print(
            f"--once --collector.profiling under load: SM active {values(once.stdout, 'accelmon_gpu_sm_active_ratio')}"
        )
    finally:
        load.wait(args.load_seconds + 60)


if __name__ == "__main__":
    main()
