"""Shared fixtures: the fake libnvidia-ml.so.1 (built once per run) and helpers to run the exporter."""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
FAKE_NVML_SOURCE = ROOT / "tests" / "fakenvml" / "fake_nvml.c"
GOLDEN = ROOT / "tests" / "golden"
# Self-metrics whose values change from run to run; left out of golden comparisons.
VOLATILE = ("accelmon_collector_duration_seconds", "accelmon_collector_last_sample_timestamp_seconds")


def build_fake_nvml(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / "libnvidia-ml.so.1"
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-Wall",
            "-Wno-format-truncation",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            str(library),
            str(FAKE_NVML_SOURCE),
            "-lpthread",
        ],
        check=True,
    )
    return library


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("fakenvml")).parent


class FakeNvml:
    """The fake driver loaded into this test process; pynvml finds it by its soname."""

    def __init__(self, library: ctypes.CDLL, config: Path) -> None:
        self.library = library
        self.config = config
        library.fakeNvmlCallCount.restype = ctypes.c_ulonglong
        library.fakeNvmlCallsOf.restype = ctypes.c_ulonglong
        library.fakeNvmlCallsOf.argtypes = [ctypes.c_char_p]

    def configure(self, text: str) -> None:
        """Directives for the next nvmlInit (see fake_nvml.c)."""
        self.config.write_text(text)

    def calls(self) -> int:
        return int(self.library.fakeNvmlCallCount())

    def calls_of(self, function: str) -> int:
        """How often the NVML entry point `function` (its C name) was called since the library was loaded."""
        return int(self.library.fakeNvmlCallsOf(function.encode()))

    def set_lost(self, index: int, lost: bool = True) -> None:
        self.library.fakeNvmlSetLost(index, int(lost))

    def queue_xid(self, index: int, xid: int) -> None:
        self.library.fakeNvmlQueueXid(index, ctypes.c_ulonglong(xid))

    def release(self) -> None:
        self.library.fakeNvmlRelease()


@pytest.fixture
def fake_nvml(fake_nvml_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    # Loading it RTLD_GLOBAL first means pynvml's CDLL("libnvidia-ml.so.1") gets this very library.
    library = ctypes.CDLL(str(fake_nvml_dir / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)
    config = tmp_path / "fake-nvml.conf"
    config.write_text("")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(config))
    fake = FakeNvml(library, config)
    yield fake
    fake.release()


def exporter_env(fake_nvml_dir: Path | None, config: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FAKE_NVML_CONFIG")}
    if fake_nvml_dir is not None:
        env["LD_LIBRARY_PATH"] = str(fake_nvml_dir)
    if config is not None:
        env["FAKE_NVML_CONFIG"] = str(config)
    return env


def run_once(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `accelmon-exporter --once` as a user would, in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "accelmon", "--once", *args], env=env, capture_output=True, text=True, timeout=60
    )


def free_port() -> int:
    """A TCP port free on loopback now, for a server a test starts."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_serving(port: int, timeout: float = 30.0) -> None:
    """Until an exporter started in another process answers /metrics on the loopback port."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            return
        except OSError:
            assert time.monotonic() < deadline, "the exporter did not come up"
            time.sleep(0.2)


def stable_lines(exposition: str) -> str:
    return "".join(line + "\n" for line in exposition.splitlines() if not line.startswith(VOLATILE))


def check_golden(name: str, exposition: str) -> None:
    """Compare with tests/golden/NAME; UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / name
    text = stable_lines(exposition)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text(), f"exposition differs from {path} (UPDATE_GOLDEN=1 to accept after review)"


def sample_value(exposition: str, metric: str, /, **labels: str) -> float | None:
    """The value of the first sample named `metric` whose labels include `labels`, or None."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def promtool_check(exposition: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Debian's prometheus package (.ci/run does)"
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def run_local_play(
    play: dict[str, Any], variables: dict[str, Any], directory: Path
) -> subprocess.CompletedProcess[str]:
    """Runs one play on this machine (connection local, no hosts changed unless the play changes files it is
    given) with `variables` as extra vars, from the repository's ansible.cfg; the caller checks the result."""
    playbook = directory / "play.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, **play}]))
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            *("-i", "localhost,", "-c", "local"),
            *("-e", f"ansible_python_interpreter={sys.executable}", "-e", json.dumps(variables)),
            str(playbook),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1"},
        timeout=300,
        check=False,
    )


def exec_start(unit: Path) -> list[str]:
    """The command of a rendered systemd unit's ExecStart (continuation lines joined)."""
    text = unit.read_text().replace("\\\n", " ")
    line = next(entry for entry in text.splitlines() if entry.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def render_role_template(role: str, template: str, dest: Path, variables: dict[str, Any]) -> None:
    """Renders a role's template with the role's defaults and `variables`, by Ansible itself, into `dest`."""
    role_dir = ROOT / "ansible" / "roles" / role
    task = {"src": str(role_dir / "templates" / template), "dest": str(dest), "mode": "0644"}
    files = [role_dir / "defaults" / "main.yml", role_dir / "vars" / "main.yml"]  # the role's own, as the role does
    play = {"vars_files": [str(f) for f in files if f.exists()], "tasks": [{"ansible.builtin.template": task}]}
    result = run_local_play(play, variables, dest.parent)
    assert result.returncode == 0, result.stdout[-3000:]
