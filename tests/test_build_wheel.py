"""The controller's wheel build (ansible/roles/accelmon_exporter/files/build_wheel.py): two deploys from one checkout
at once (the CI's Molecule scenarios run in parallel) removed each other's setuptools build/ mid-build and one failed
("rmtree failed: No such file or directory"). Under the lock each build removes build/ and builds as one step."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.paths import ROOT

# The controller's build: its Python has the pinned build backend (the deploy extra), the e2e tier's venv.
pytestmark = pytest.mark.e2e

BUILD = ROOT / "ansible" / "roles" / "accelmon_exporter" / "files" / "build_wheel.py"


def project(root: Path) -> Path:
    """A small setuptools project with many modules (a build that takes a moment, as accelmon's does)."""
    (root / "pkg").mkdir(parents=True)
    for n in range(200):
        (root / "pkg" / f"m{n}.py").write_text(f"VALUE = {n}\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "pkg"\nversion = "1.0"\n[tool.setuptools]\npackages = ["pkg"]\n'
    )
    return root


def test_builds_from_one_checkout_at_once_both_succeed_and_stale_modules_go(tmp_path):
    source = project(tmp_path / "src")
    (source / "build" / "lib" / "pkg").mkdir(parents=True)
    (source / "build" / "lib" / "pkg" / "removed.py").write_text("STALE = True\n")  # a module since removed
    results: list[int] = []

    def build(wheels: str) -> None:
        command = [sys.executable, str(BUILD), str(source), str(tmp_path / wheels), "--quiet", "--no-deps",
                   "--no-build-isolation", "--no-index"]  # fmt: skip
        results.append(subprocess.run(command, capture_output=True, text=True, timeout=300).returncode)

    threads = [threading.Thread(target=build, args=(f"wheels-{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [0, 0, 0, 0]
    wheel = next((tmp_path / "wheels-0").glob("pkg-1.0-*.whl"))
    listed = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(wheel)], capture_output=True, text=True)
    assert "pkg/m199.py" in listed.stdout and "removed.py" not in listed.stdout


def build_with_inputs(source: Path, wheels: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(BUILD), str(source), str(wheels), "--input", str(source / "pkg"),
               "--input", str(source / "pyproject.toml"), "--quiet", "--no-deps", "--no-build-isolation",
               "--no-index"]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def wheel_lists(wheels: Path) -> str:
    wheel = next(wheels.glob("pkg-1.0-*.whl"))
    return subprocess.run([sys.executable, "-m", "zipfile", "-l", str(wheel)], capture_output=True, text=True).stdout


def test_a_wheel_built_from_the_same_inputs_is_not_built_again_and_any_change_rebuilds_it(tmp_path):
    """Each batch of a serial play (and each shard of a fleet deploy) runs the build: unchanged inputs reuse the
    wheel; an edited module, a new one, or a wheel removed since builds again."""
    source, wheels = project(tmp_path / "src"), tmp_path / "wheels"
    first = build_with_inputs(source, wheels)
    assert first.returncode == 0, first.stderr
    wheel = next(wheels.glob("pkg-1.0-*.whl"))
    built_at = wheel.stat().st_mtime_ns
    (source / "build").mkdir(exist_ok=True)
    (source / "build" / "left-by-the-first").write_text("")  # a build removes build/ first: a reuse does not

    again = build_with_inputs(source, wheels)
    assert again.returncode == 0 and "not built again" in again.stdout
    assert wheel.stat().st_mtime_ns == built_at and (source / "build" / "left-by-the-first").exists()

    (source / "pkg" / "new_module.py").write_text("NEW = 1\n")
    changed = build_with_inputs(source, wheels)
    assert changed.returncode == 0 and "not built again" not in changed.stdout
    assert "pkg/new_module.py" in wheel_lists(wheels)

    next(wheels.glob("pkg-1.0-*.whl")).unlink()
    lost = build_with_inputs(source, wheels)
    assert lost.returncode == 0 and "not built again" not in lost.stdout
    assert "pkg/new_module.py" in wheel_lists(wheels)
