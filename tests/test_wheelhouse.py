"""scripts/wheelhouse.py: the air-gapped fleet's wheelhouse asks pip for every (Python, architecture) the workers run,
with the exporter's dependencies and extras as the role's lock files pin them (docs/deploying.md, "Air-gapped")."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import ROOT

SCRIPT = ROOT / "scripts" / "wheelhouse.py"
LOCKS = ROOT / "ansible" / "roles" / "accelmon_exporter" / "files"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def targets(stdout: str) -> list[tuple[str, str]]:
    """The (Python version, platform tags) of each pip download the script asks for."""
    pairs = []
    for line in stdout.splitlines():
        if line.startswith("wheelhouse: Python "):
            words = line.split()
            version = words[words.index("--python-version") + 1]
            platforms = tuple(words[i + 1] for i, word in enumerate(words) if word == "--platform")
            pairs.append((version, platforms))
    return pairs


def test_by_default_every_python_and_architecture_of_the_fleet(tmp_path):
    result = run(str(tmp_path / "wheels"), "--dry-run")
    assert result.returncode == 0, result.stderr
    pairs = targets(result.stdout)
    assert [(version, platforms[0].split("_", 3)[-1]) for version, platforms in pairs] == [
        (version, architecture)
        for version in ("3.9", "3.10", "3.11", "3.12", "3.13")
        for architecture in ("x86_64", "aarch64")
    ]
    for _, platforms in pairs:
        architecture = platforms[0].removeprefix("manylinux_2_28_")
        assert platforms == (f"manylinux_2_28_{architecture}", f"manylinux_2_17_{architecture}",
                             f"manylinux2014_{architecture}")  # fmt: skip
    for line in result.stdout.splitlines():
        words = line.split()
        assert "--only-binary=:all:" in words and words[words.index("--dest") + 1] == str(tmp_path / "wheels")
        # Exactly the role's lock files (the dependencies, then the extras it installs: auth, cloudwatch, amd),
        # every file checked against their hashes, nothing resolved beyond them.
        assert "--require-hashes" in words and "--no-deps" in words
        assert words[-8:] == [arg for name in ("", "-auth", "-cloudwatch", "-amd")
                              for arg in ("-r", str(LOCKS / f"requirements{name}.lock"))]  # fmt: skip
    assert not (tmp_path / "wheels").exists(), "a dry run downloads nothing"


def test_a_chosen_python_and_architecture_without_extras(tmp_path):
    result = run(str(tmp_path), "--python", "3.12", "3.12", "3.9", "--platform", "aarch64", "--no-extras", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert [(version, platforms[-1]) for version, platforms in targets(result.stdout)] == [
        ("3.12", "manylinux2014_aarch64"),
        ("3.9", "manylinux2014_aarch64"),
    ]
    assert all(line.endswith(f"-r {LOCKS / 'requirements.lock'}") for line in result.stdout.splitlines())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--python", "3.8"], "a Python version 3.9 or later"),
        (["--python", "three"], "a Python version 3.9 or later"),
        (["--platform", "ppc64le"], "invalid choice: 'ppc64le'"),
        ([], "the following arguments are required: dest"),
    ],
)
def test_bad_arguments_are_refused(args, message):
    result = run(*args, "--dry-run")
    assert result.returncode == 2
    assert message in result.stderr
