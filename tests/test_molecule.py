"""The Molecule scenarios, each a full create/converge/idempotence/verify/destroy on podman systemd hosts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

IMAGES = ROOT / "molecule" / "images"
SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


def molecule_env() -> dict[str, str]:
    env = dict(os.environ)
    # The demo's names and state (scripts/demo.sh) never leak into the suite's own cluster.
    for name in ("ACCELMON_CLUSTER", "ACCELMON_CLUSTER_PROMETHEUS_PORT", "MOLECULE_EPHEMERAL_DIRECTORY"):
        env.pop(name, None)
    env["CONTAINERS_CONF"] = str(IMAGES / "containers.conf")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["NO_COLOR"] = "1"
    return env


@pytest.fixture(scope="session")
def images() -> None:
    result = subprocess.run(["bash", str(IMAGES / "build.sh")], env=molecule_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.molecule
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario: str, images: None, tmp_path: Path) -> None:
    started = time.monotonic()
    log = tmp_path / f"molecule-{scenario}.log"
    with log.open("w") as output:
        result = subprocess.run(
            [sys.executable, "-m", "molecule", "test", "-s", scenario],
            cwd=ROOT,
            env=molecule_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    print(f"molecule scenario {scenario}: {time.monotonic() - started:.0f} s")
    assert result.returncode == 0, f"molecule test -s {scenario} failed:\n" + log.read_text()[-8000:]
