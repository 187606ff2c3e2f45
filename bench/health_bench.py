"""What the health and per-job work costs: `accelmon-exporter --scan` wall time on 8 GPUs, and the exporter's CPU
with nvml alone, with the kernel_log and health collectors, and with everything on by default where the NVIDIA
driver is loaded (+ fabric: 18 NVLink links per GPU and a fabric; + gpu_processes: the fake's processes with
per-process samples), in one run.

The GPUs are the fake NVML's with the H100 cost model (`profile h100`: each call burns the CPU it cost on a real
H100, driver 580); the kernel log is a file in /dev/kmsg's format with `--records` records (a server's log after
boot holds a few thousand), a few of them XIDs; the driver's procfs files name the 8 GPUs.

Run: .venv/bin/python -m bench.health_bench [--gpus 8] [--records 5000] [--scans 20] [--cpu-seconds 30]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.fakenvml import build_fake_nvml
from tests.support.jobs_tree import bus_id, nvidia_procfs
from tests.support.kernel_log_lines import BOOT, record, xid_line
from tests.support.processes import exporter_command, exporter_env

from bench.exporter_bench import ACCELMON_ONLY_NVML, RunningExporter


def kernel_log(path: Path, records: int, gpus: int) -> None:
    """`records` records of boot chatter with an XID on every 500th, spread over the GPUs."""
    lines = []
    for sequence in range(records):
        if sequence % 500 == 499:
            lines.append(record(sequence, sequence * 0.01, xid_line(bus_id(sequence % gpus).rsplit(".", 1)[0], 13)))
        else:
            lines.append(record(sequence, sequence * 0.01, f"usb 1-{sequence % 7}: new device number {sequence}"))
    path.write_text("".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--scans", type=int, default=20)
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="accelmon-health-bench-"))
    fake_dir = build_fake_nvml(work).parent
    config = work / "h100.conf"
    # An HGX H100 board: 18 NVLink links per GPU, fabric registration completed, processes with samples.
    board = "".join(f"nvlink {i} 18\nfabric {i} 3 0 2\n" for i in range(args.gpus))
    config.write_text(f"gpus {args.gpus}\nprofile h100\nprocess_samples 1\n{board}")
    procfs = nvidia_procfs(work / "proc", gpus=args.gpus)
    (procfs / "stat").write_text(f"btime {BOOT}\n")
    kmsg = work / "kmsg"
    kernel_log(kmsg, args.records, args.gpus)
    paths = [f"--path.procfs={procfs}", f"--path.kmsg={kmsg}"]
    print(f"host: {args.gpus} fake H100s (cost model of driver 580), a kernel log of {args.records} records")

    walls = []
    for _ in range(args.scans):
        started = time.perf_counter()
        result = subprocess.run(
            exporter_command("--scan", "--json", *paths),
            env=exporter_env(fake_dir, config),
            capture_output=True,
            text=True,
            check=False,
        )
        walls.append(time.perf_counter() - started)
        if result.returncode not in (0, 1, 2):
            sys.exit(f"--scan failed ({result.returncode}): {result.stderr}")
    walls.sort()
    print(
        f"--scan --json, {args.scans} runs: median {statistics.median(walls):.2f} s, "
        f"max {walls[-1]:.2f} s (a whole process: Python start, NVML init, one sample, the checks)"
    )

    def ms_per_gpu_second(fraction: float) -> float:
        return fraction * 1000 / args.gpus

    runs = (
        ("nvml only", [*ACCELMON_ONLY_NVML, "--no-collector.kernel_log", "--no-collector.health"]),
        (
            "+ kernel_log and health",
            [*ACCELMON_ONLY_NVML, *paths, "--no-collector.fabric", "--no-collector.gpu_processes"],
        ),
        ("+ fabric and gpu_processes (defaults)", [*ACCELMON_ONLY_NVML, *paths]),
    )
    before = None
    for name, flags in runs:
        with RunningExporter(fake_dir, config, args=flags) as exporter:
            cost = ms_per_gpu_second(exporter.cpu_fraction(args.cpu_seconds))
        added = f" ({cost - before:+.3f})" if before is not None else ""
        print(f"exporter CPU, {name + ':':40} {cost:.3f} ms per GPU-second{added}")
        before = cost


if __name__ == "__main__":
    main()
