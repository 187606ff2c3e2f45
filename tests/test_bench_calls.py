"""bench/nvml_calls.py, the probe a session with a real GPU runs first: it asks every NVML call the exporter makes,
so one run records every answer the fakes must give. Checked here against the exporter's source (a new call
without a probe fails) and run against the fake driver (every probe answers or says why)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from bench.nvml_calls import CALLS, MADE_ON_THE_WAY

from tests.support.paths import ROOT
from tests.support.processes import exporter_env

# A call site: `nvml.nvmlX(...)`, or a name looked up as a string (`getattr(nvml, "nvmlX", None)`); not prose.
NVML_CALL = re.compile(r"""(?<=[."])nvml(?:Device|Gpm|Event|System|Init|Shutdown)[A-Za-z0-9_]*\b""")


def test_every_nvml_call_of_the_exporter_is_probed():
    made = {name for path in (ROOT / "exporters").rglob("*.py") for name in NVML_CALL.findall(path.read_text())}
    assert made, "no NVML call found: the pattern is wrong"
    assert made - set(CALLS) - MADE_ON_THE_WAY == set()


def test_the_probe_runs_against_the_fake_driver(fake_nvml_dir, tmp_path):
    config = tmp_path / "fake.conf"
    config.write_text("gpus 2\nmig 1 2\nnvlink 0 4\ngpm 0\ngpm 1\n")
    out = tmp_path / "calls.json"
    env = exporter_env(fake_nvml_dir, config)
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{ROOT}"
    result = subprocess.run(
        [sys.executable, "-m", "bench.nvml_calls", "--json", str(out)], env=env, capture_output=True, text=True,
        timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())
    assert {(row["gpu"], row["call"]) for row in rows} == {(gpu, call) for gpu in (0, 1) for call in CALLS}
    answers = {(row["gpu"], row["call"]): row["answer"] for row in rows}
    assert json.loads(answers[(0, "nvmlDeviceGetUUID")]).startswith("GPU-")
    graphics = json.loads(answers[(0, "nvmlGpmSampleGet")])["graphics"]
    assert 0 <= graphics <= 100
    assert json.loads(answers[(1, "nvmlGpmMigSampleGet")]) != {}  # MIG on GPU 1: its instances sampled
    assert all(row["cpu_seconds"] >= 0 and row["wall_seconds"] >= 0 for row in rows)
    assert "nvmlDeviceGetPcieThroughput" in result.stdout
