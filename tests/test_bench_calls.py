"""bench/nvml_calls.py, the probe a session with a real GPU runs first: it asks every NVML call the exporter makes,
so one run records every answer the fakes must give. Checked here against the exporter's source (a new call
without a probe fails) and run against the fake driver (every probe answers or says why)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from bench.nvml_calls import CALLS, MADE_ON_THE_WAY

from tests.support.paths import ROOT
from tests.support.processes import exporter_env

# A call site: `nvml.nvmlX(...)`, or a name looked up as a string (`getattr(nvml, "nvmlX", None)`); not prose.
NVML_CALL = re.compile(r"""(?<=[."])nvml(?:Device|Gpm|Event|System|Init|Shutdown)[A-Za-z0-9_]*\b""")


def test_every_nvml_call_of_the_exporter_is_probed():
    made = {name for path in (ROOT / "exporters").rglob("*.py") for name in NVML_CALL.findall(path.read_text())}
    assert made, "no NVML call found: the pattern is wrong"
    assert made - set(CALLS) - MADE_ON_THE_WAY == set()


def probe_the_fake(fake_nvml_dir: Path, tmp_path: Path, config: str) -> tuple[list[dict], str]:
    """bench/nvml_calls.py run against the fake driver set up by `config`: its rows and its printout."""
    (tmp_path / "fake.conf").write_text(config)
    out = tmp_path / "calls.json"
    env = exporter_env(fake_nvml_dir, tmp_path / "fake.conf")
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{ROOT}"
    result = subprocess.run(
        [sys.executable, "-m", "bench.nvml_calls", "--json", str(out), "--repeat", "1"], env=env,
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text()), result.stdout


def test_the_probe_runs_against_the_fake_driver(fake_nvml_dir, tmp_path):
    rows, printed = probe_the_fake(fake_nvml_dir, tmp_path, "gpus 2\nmig 1 2\nnvlink 0 4\ngpm 0\ngpm 1\n")
    assert {(row["gpu"], row["call"]) for row in rows} == {(gpu, call) for gpu in (0, 1) for call in CALLS}
    answers = {(row["gpu"], row["call"]): row["answer"] for row in rows}
    assert json.loads(answers[(0, "nvmlDeviceGetUUID")]).startswith("GPU-")
    graphics = json.loads(answers[(0, "nvmlGpmSampleGet")])["graphics"]
    assert 0 <= graphics <= 100
    assert json.loads(answers[(1, "nvmlGpmMigSampleGet")]) != {}  # MIG on GPU 1: its instances sampled
    assert all(row["cpu_seconds"] >= 0 and row["wall_seconds"] >= 0 for row in rows)
    assert "nvmlDeviceGetPcieThroughput" in printed


def shape(answer: object) -> object:
    """An answer with its readings taken out: errors, keys, value types and lengths stay."""
    if isinstance(answer, dict):
        return {key: shape(value) for key, value in answer.items()}
    if isinstance(answer, list):
        return [shape(value) for value in answer]
    if isinstance(answer, str):
        return answer if answer in ("Not Supported", "Not Found", "Invalid Argument") else "text"
    return type(answer).__name__


def decoded(answer: str) -> object:
    """A probe's answer as JSON, or its error text as it is."""
    return answer if answer.startswith("error: ") else json.loads(answer)


def field_kinds(fields: dict) -> dict:
    """Per field of nvmlDeviceGetFieldValues: its return code, and its value type where it answered."""
    return {field: (ret, kind if ret == 0 else None) for field, (ret, kind, _) in fields.items()}


# Readings (utilization, clocks, temperatures, energy) are compared by shape alone. Left out: the v1 fabric
# structure, whose UUID array's length follows the pynvml that asked, not the driver.
LEFT_OUT = {"nvmlDeviceGetGpuFabricInfo"}
# Calls the exporter made only after the H100 was measured (the next session with a GPU records them with the rest):
# the fake answers them as nvml.h describes, and this comparison takes them in once they are in the measurement.
NOT_YET_MEASURED = {"nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetNvLinkRemotePciInfo"}
# Facts of the board and driver the code relies on, to be answered exactly as the H100 did.
FACTS = (
    "nvmlDeviceGetName", "nvmlDeviceGetCudaComputeCapability", "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetFanSpeed", "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetAttributes_v2", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetProcessUtilization", "nvmlGpmQueryDeviceSupport",
    "nvmlGpmMigSampleGet", "nvmlDeviceGetComputeRunningProcesses",
)  # fmt: skip


def test_the_fake_answers_as_the_h100_did(fake_nvml_dir, tmp_path):
    """The fake with `profile h100` against what a real H100 answered (docs/hardware/h100-sxm-580.json, idle):
    the same errors, fields, value types and shapes for every call, and the same board facts."""
    measured = json.loads((ROOT / "docs" / "hardware" / "h100-sxm-580.json").read_text())["idle"]
    real = {call: decoded(row["answer"]) for call, row in measured.items()}
    rows, _ = probe_the_fake(fake_nvml_dir, tmp_path, "gpus 1\nprofile h100\ngpm 0\n")
    fake = {row["call"]: decoded(row["answer"]) for row in rows}
    assert set(fake) - (NOT_YET_MEASURED - set(real)) == set(real)
    for call in sorted(set(real) - LEFT_OUT):
        if call == "nvmlDeviceGetFieldValues":
            assert field_kinds(fake[call]) == field_kinds(real[call])
        else:
            assert shape(fake[call]) == shape(real[call]), call
    for call in FACTS:
        assert fake[call] == real[call], call
    for size in ("total", "reserved"):
        assert fake["nvmlDeviceGetMemoryInfo"][size] == real["nvmlDeviceGetMemoryInfo"][size], size
