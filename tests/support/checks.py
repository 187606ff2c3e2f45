"""What the tests of a collector's checks share: one GPU's samples as NVML serves them, and a check's verdict."""

from __future__ import annotations

from accelmon import health
from accelmon.collectors import nvml
from accelmon.exporter.checks import Check
from accelmon.exporter.metrics import Samples


def nvml_only(rows: list[tuple[object, list[str], float]]) -> Samples:
    samples = Samples()
    samples.add(nvml.UP, ["0", "GPU-a"], 1)
    for spec, extra, value in rows:
        samples.add(spec, ["0", "GPU-a", *extra], value)
    return samples


def gpu(node: health.NodeHealth, index: str) -> health.GpuHealth:
    return next(g for g in node.gpus if g.index == index)


def check(node: health.NodeHealth, index: str, name: str) -> Check:
    return next(c for c in gpu(node, index).checks if c.name == name)
