"""What the AMD collector costs: the exporter's CPU per GPU-second with the `amd` collector over the fake
libamd_smi.so, beside the `nvml` collector over the fake NVML, in one run, same GPU count, same 1 s interval.

Cost model: both fake libraries answer at no cost of their own (no AMD GPU was lent: amdsmi's call costs on a real
MI300X are unmeasured, docs/amd.md; the NVML side runs without its H100 cost model here so that both sides count the
same thing). The figure is accelmon's own work per GPU: the Python side of each call, the bindings' ctypes layer,
conversions and the sample. A real MI300X adds the library's and the driver's cost on top.

Run: .venv/bin/python -m bench.amd_bench [--gpus 8] [--cpu-seconds 30]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from tests.support.fakeamdsmi import build_fake_amdsmi
from tests.support.fakenvml import build_fake_nvml

from bench.exporter_bench import ACCELMON_ONLY_NVML, RunningExporter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="accelmon-amd-bench-"))
    fake_nvml = build_fake_nvml(work / "nvml").parent
    build_fake_amdsmi(work / "rocm")
    nvml_config, amd_config = work / "nvml.conf", work / "amdsmi.conf"
    nvml_config.write_text(f"gpus {args.gpus}\n")
    amd_config.write_text(f"gpus {args.gpus}\n")
    os.environ.update({"ROCM_PATH": str(work / "rocm"), "FAKE_AMDSMI_CONFIG": str(amd_config)})
    print(f"host: {args.gpus} GPUs, fake libraries at no cost of their own, samples every second")
    results = {}
    for name, library, flags in (
        ("nvml (fake NVML)", fake_nvml, ACCELMON_ONLY_NVML),
        ("amd (fake libamd_smi)", work / "none", [*ACCELMON_ONLY_NVML, "--no-collector.nvml", "--collector.amd"]),
    ):
        with RunningExporter(library, nvml_config, args=flags) as exporter:
            results[name] = exporter.cpu_fraction(args.cpu_seconds) * 1000 / args.gpus
    for name, per_gpu in results.items():
        print(f"{name + ':':24} {per_gpu:.3f} ms CPU per GPU-second")


if __name__ == "__main__":
    main()
