"""Fixtures, and the tiers every test belongs to. Helpers live in tests/support (imported as `tests.support`).

Tiers (pytest markers):
- `unit`: in this process, on fixture trees (the exporter run as a user runs it included), or beside a reference
  binary (promtool, node_exporter's InfiniBand collector); seconds each. The default.
- `e2e`: real servers started from the repository's own config (Prometheus, VictoriaMetrics, vmalert), Chromium,
  ansible-playbook on this machine, this machine's own kernel log (root, its dmesg_restrict); a module says so
  with `pytestmark = pytest.mark.e2e`, and every test that uses the `prometheus` fixture is e2e.
- `molecule`: a Molecule scenario on podman systemd hosts.
`./scripts/test.sh --quick` runs lint and the unit tier; the full suite (the default, and CI) runs all three.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.support.fakeamdsmi import FakeAmdSmi, build_fake_amdsmi
from tests.support.fakenvml import FakeNvml, build_fake_nvml
from tests.support.simulated_node import simulated_prometheus

TIERS = ("unit", "e2e", "molecule")


def pytest_addoption(parser: pytest.Parser) -> None:
    # The full suite runs the unit tier on the workers' oldest Python (3.9) first, then every tier on this one:
    # what passed there is not run again (scripts/test.sh), which keeps CI's time for what has not run.
    parser.addoption("--record-passed", metavar="FILE", help="write the ids of the tests that pass to FILE")
    parser.addoption("--skip-passed", metavar="FILE", help="deselect the tests FILE lists (--record-passed)")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_file = config.getoption("--skip-passed")
    if skip_file:
        passed = set(Path(skip_file).read_text().split("\n"))
        deselected = [item for item in items if item.nodeid in passed]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if item.nodeid not in passed]
    for item in items:
        # The suite runs on parallel workers (pytest-xdist, --dist loadgroup: scripts/test.sh): a module's tests that
        # share a fixture made once per module (a Prometheus, a batch of playbook runs) go to one worker, which makes
        # it once; the others go wherever a worker is free.
        if shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        if "prometheus" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.e2e)
        tiers = [tier for tier in TIERS if item.get_closest_marker(tier)]
        if len(tiers) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked with several tiers: {tiers}")
        if not tiers:
            item.add_marker(pytest.mark.unit)


def shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(definitions[-1].scope in ("module", "package") for definitions in info.name2fixturedefs.values())


def plain_nodeid(nodeid: str) -> str:
    """The test's id without the "@group" pytest-xdist's loadgroup appends to it in the reports."""
    test, _, group = nodeid.rpartition("@")
    return test if test and group == test.split("::")[0] else nodeid


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("fakenvml")).parent


@pytest.fixture
def fake_nvml(fake_nvml_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    config = tmp_path / "fake-nvml.conf"
    config.write_text("")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(config))
    fake = FakeNvml.load(fake_nvml_dir, config)
    yield fake
    fake.release()


@pytest.fixture
def started() -> Iterator[Callable[[Any], Any]]:
    """start(collector): the collector started, and stopped when the test ends (after its fakes' own teardown,
    which releases any call a test left hanging)."""
    made: list[Any] = []

    def start(collector: Any) -> Any:
        collector.start()
        made.append(collector)
        return collector

    yield start
    for collector in made:
        collector.stop()


@pytest.fixture(scope="session")
def fake_rocm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ROCm directory whose lib/libamd_smi.so is the fake (tests/fakeamdsmi)."""
    rocm = tmp_path_factory.mktemp("rocm")
    build_fake_amdsmi(rocm)
    return rocm


@pytest.fixture
def fake_amdsmi(fake_rocm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeAmdSmi:
    """The fake libamd_smi.so, where AMD's amdsmi bindings look first ($ROCM_PATH/lib); they bind it on their first
    import in this process."""
    config = tmp_path / "fake-amdsmi.conf"
    config.write_text("")
    monkeypatch.setenv("FAKE_AMDSMI_CONFIG", str(config))
    monkeypatch.setenv("ROCM_PATH", str(fake_rocm))
    return FakeAmdSmi(fake_rocm / "lib" / "libamd_smi.so", config)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, fake_nvml_dir: Path) -> Iterator[str]:
    """The base URL of a real Prometheus with the master's rules over one simulated worker (simulated_node.py)."""
    with simulated_prometheus(tmp_path_factory.mktemp("contract"), fake_nvml_dir) as base:
        yield base


@pytest.fixture
def fake_dcgm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Sets what the fake DCGM bindings (tests/fakedcgm) answer: fake_dcgm(up=True, gpus=[0, 1], ...); starts
    with the host engine down."""
    state = tmp_path / "dcgm.json"

    def set_state(**values: object) -> None:
        state.write_text(json.dumps(values))

    set_state(up=False)
    monkeypatch.setenv("FAKE_DCGM_STATE", str(state))
    return set_state


class PassedRecorder:
    """--record-passed: the ids of the tests whose every phase passed, written when the session ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failed: set[str] = set()
        self.passed: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = plain_nodeid(report.nodeid)
        if not report.passed:
            self.failed.add(nodeid)  # a skip or a failure in any phase: run it again on the next Python
        elif report.when == "call":
            self.passed.add(nodeid)

    def pytest_sessionfinish(self) -> None:
        self.path.write_text("\n".join(sorted(self.passed - self.failed)))


def pytest_configure(config: pytest.Config) -> None:
    record_file = config.getoption("--record-passed")
    # Under pytest-xdist the controller sees every worker's reports and writes the file once; a worker would
    # write its own share over it.
    if record_file and not hasattr(config, "workerinput"):
        config.pluginmanager.register(PassedRecorder(Path(record_file)), "accelmon-passed-recorder")
