"""What dcgm-exporter compatibility costs: the exporter's CPU with and without `--compat dcgm-exporter` (the
DCGM_FI_* series made from the same samples, every second), and what a scrape carries, in one run.

The GPUs are the fake NVML's with the H100 cost model (`profile h100`: each call burns the CPU it cost on a real
H100, driver 580). CPU is measured without scrapes (sampling), then per scrape over `--scrapes` scrapes.

Run: .venv/bin/python -m bench.compat_bench [--gpus 8] [--cpu-seconds 30] [--scrapes 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tests.support.fakenvml import build_fake_nvml
from tests.support.processes import cpu_seconds

from bench.exporter_bench import ACCELMON_ONLY_NVML, RunningExporter, scrape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    parser.add_argument("--scrapes", type=int, default=200)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="accelmon-compat-bench-"))
    fake_dir = build_fake_nvml(work).parent
    config = work / "h100.conf"
    config.write_text(f"gpus {args.gpus}\nprofile h100\n")
    print(f"host: {args.gpus} fake H100s (cost model of driver 580), samples every second")
    results = {}
    for name, flags in (
        ("accelmon names", ACCELMON_ONLY_NVML),
        ("+ dcgm-exporter names", [*ACCELMON_ONLY_NVML, "--compat", "dcgm-exporter"]),
    ):
        with RunningExporter(fake_dir, config, args=flags) as exporter:
            sampling = exporter.cpu_fraction(args.cpu_seconds) * 1000 / args.gpus
            body = scrape(exporter.port)
            started = cpu_seconds(exporter.process.pid)
            began = time.perf_counter()
            for _ in range(args.scrapes):
                scrape(exporter.port)
            wall = time.perf_counter() - began
            per_scrape = (cpu_seconds(exporter.process.pid) - started) / args.scrapes * 1000
        results[name] = (sampling, per_scrape, len(body), wall / args.scrapes * 1000)
    base = None
    for name, (sampling, per_scrape, size, wall) in results.items():
        added = f" ({sampling - base[0]:+.3f})" if base else ""
        print(
            f"{name + ':':24} sampling {sampling:.3f} ms CPU per GPU-second{added}; a scrape {per_scrape:.2f} ms CPU, "
            f"{wall:.2f} ms wall, {size / 1024:.0f} KiB"
        )
        base = base or (sampling, per_scrape)


if __name__ == "__main__":
    main()
