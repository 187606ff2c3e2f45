"""The exporter on a real NVIDIA GPU: values against nvidia-smi, GPM under a known load, CPU and RSS against
nvitop-exporter. Run on a GPU host (DEVELOPERS.md: the device machine) from the repository root:

    PYTHONPATH=exporters python3 -m bench.real_gpu [--seconds 30] [--load-seconds 20]

0. Every NVML call the exporter makes (bench/nvml_calls.py), asked once of each GPU and MIG device: what each
   answered and cost, printed and written to --calls-json (default $OUT/nvml_calls.json where $OUT is set): the
   facts docs/hardware.md records and the fakes must answer alike.
1. Idle: accelmon-exporter (NVML at defaults, then with GPM profiling) and nvitop-exporter (if importable) each
   sample for --seconds with nothing scraping them: CPU ms per GPU per second, peak RSS.
2. Load: a bf16 matmul loop in PyTorch on every GPU; meanwhile accelmon's /metrics and `nvidia-smi --query-gpu`
   are read at the same moment and printed side by side, and the GPM ratios are checked (SM active > 0.9 and
   tensor active > 0.8 under load, near 0 idle); then `--once --collector.profiling` under the same load.
Without nvidia-smi or torch (a fake driver on LD_LIBRARY_PATH) the comparison or the load step is skipped.
"""

from __future__ import annotations

import argparse
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
    for candidate in (
        shutil.which("nvitop-exporter"),
        str(ROOT / ".cache" / "bench-nvitop" / "bin" / "nvitop-exporter"),
    ):
        if candidate and os.path.exists(candidate):
            return [candidate, "--bind-address", "127.0.0.1", "--interval", "1.0"]
    return None


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
    parser.add_argument("--load-seconds", type=float, default=20.0)
    parser.add_argument("--calls-json", metavar="FILE", help="where to write every NVML call's answer and cost")
    args = parser.parse_args()
    gpus = gpu_count()
    print("every NVML call the exporter makes, once per GPU (answer, CPU and wall time of the call):")
    calls = nvml_calls.run()
    nvml_calls.print_rows(calls)
    where = args.calls_json or (os.path.join(os.environ["OUT"], "nvml_calls.json") if os.environ.get("OUT") else None)
    if where:
        Path(where).write_text(json.dumps(calls, indent=1))
        print(f"  written to {where}")
    nvml_only = ["--no-collector.infiniband", "--no-collector.neuron", "--no-collector.profiling"]
    print(f"{gpus} GPU(s); driver and library as on this host")

    with Served(nvml_only) as served:
        ours = served.cpu_ms_per_gpu_second(args.seconds, gpus)
        rss = peak_rss_kib(served.process.pid) / 1024
    print(f"accelmon, NVML at defaults: {ours:.3f} ms CPU per GPU per second, peak RSS {rss:.1f} MiB")
    profiling = ["--no-collector.infiniband", "--no-collector.neuron", "--collector.profiling"]
    with Served(profiling) as served:
        with_gpm = served.cpu_ms_per_gpu_second(args.seconds, gpus)
        idle = scrape(served.port).decode()
    print(f"  + GPM profiling at defaults: {with_gpm - ours:+.3f} ms CPU per GPU per second")
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
            f"accelmon / nvitop-exporter = {ours / theirs:.2f}"
        )

    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch not found: load step skipped")
        return
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(args.load_seconds)])
    try:
        with Served(profiling) as served:
            time.sleep(6)  # a full GPM window under load
            print("under a bf16 matmul load, read at the same moment:")
            compare_with_smi(served.port)
            text = scrape(served.port).decode()
            sm, tensor = values(text, "accelmon_gpu_sm_active_ratio"), values(text, "accelmon_gpu_tensor_active_ratio")
            print(
                f"  GPM: SM active {sm}, tensor active {tensor}, DRAM {values(text, 'accelmon_gpu_dram_active_ratio')}"
            )
            verdict = all(v > 0.9 for v in sm.values()) and all(v > 0.8 for v in tensor.values())
            print(f"  GPM under load as expected (SM > 0.9, tensor > 0.8): {verdict}")
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
