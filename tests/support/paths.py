"""The repository's folders, for tests and benchmarks alike."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
FAKE_NVML_SOURCE = ROOT / "tests" / "fakenvml" / "fake_nvml.c"
FAKE_AMDSMI_SOURCE = ROOT / "tests" / "fakeamdsmi" / "fake_amdsmi.c"
FAKE_NEURON_MONITOR = ROOT / "tests" / "fakeneuron" / "neuron-monitor"
FAKE_DCGM_BINDINGS = ROOT / "tests" / "fakedcgm"  # pydcgm and dcgm_structs as DCGM's bindings directory holds them
