"""Collectors own what they know: a new collector is one module, and every consumer picks it up from there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accelmon.collectors import collectors
from accelmon.config import ConfigError, load
from accelmon.exporter.registry import Option
from accelmon.scan import plan
from tests.support.ansible import run_local_play
from tests.support.exposition import check_golden
from tests.support.paths import ROOT
from tests.support.processes import exporter_env, on_fixtures
from tests.test_cli import SCENARIOS

UNIT_TEMPLATE = ROOT / "ansible" / "roles" / "accelmon_exporter" / "templates" / "accelmon-exporter.service.j2"

TOY = '''
"""A toy collector, added by a test without touching any other file."""

from accelmon.exporter.metrics import Catalogue, Samples

from accelmon.exporter.runtime import Collector
from accelmon.exporter.checks import Check, NodeCheck
from accelmon.exporter.registry import Option, Registration, register, seconds

CATALOGUE = Catalogue("toy", "Toy widgets", "Counted by hand.")
WIDGETS = CATALOGUE.gauge("accelmon_toy_widgets", "Widgets on the bench.", ["colour"])


def check_widgets(view):
    """Red widgets on the bench are a fault of the node."""
    rows = view.of(WIDGETS)
    if not rows:
        return None
    if any(labels["colour"] == "red" for labels, _ in rows):
        return Check("toy_widgets", "failure", "red widgets on the bench", "hardware_service")
    return Check("toy_widgets", "ok", "only blue widgets")


class ToyCollector(Collector):
    name = "toy"

    def __init__(self, colour):
        self.colour = colour

    def sample(self):
        samples = Samples()
        samples.add(WIDGETS, [self.colour], 3)
        return samples


register(
    Registration(
        name="toy",
        help="toy widgets (default: off)",
        build=lambda options, paths: ToyCollector(options["colour"]),
        catalogue=CATALOGUE,
        options=(
            seconds("interval_seconds", 2, "how often the widgets are counted"),
            Option("colour", "blue", "which widgets", ("blue", "red")),
        ),
        enabled_by_default=lambda paths, options: False,
        devices=("char-toy r",),
        node_checks=(NodeCheck("toy_widgets", check_widgets),),
        scan=True,
    )
)
'''


@pytest.fixture(scope="module")
def toy_tree(tmp_path_factory) -> Path:
    """A copy of the source tree with one more module in accelmon/collectors, and nothing else changed."""
    tree = tmp_path_factory.mktemp("toy") / "src"
    shutil.copytree(ROOT / "exporters", tree / "exporters", ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "exporters" / "accelmon" / "collectors" / "toy.py").write_text(TOY)
    return tree


def run_toy(tree: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "exporters")}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, input=stdin, timeout=60, check=False
    )


def test_a_toy_collector_appears_in_help(toy_tree):
    result = run_toy(toy_tree, "-m", "accelmon", "--help")
    assert "--collector.toy" in result.stdout
    assert "colour (default blue; one of blue, red): which widgets" in result.stdout


def test_a_toy_collector_is_validated_from_its_declaration(toy_tree):
    def check(config: str) -> subprocess.CompletedProcess[str]:
        return run_toy(toy_tree, "-m", "accelmon", "--check-config", "--config", "/dev/stdin", stdin=config)

    bad = check("collectors: {toy: {colour: green}}")
    assert bad.returncode == 2
    assert "collectors.toy.colour: expected one of blue, red, got 'green'" in bad.stderr
    assert (
        "collectors.toy.interval_seconds: expected at least 0.1"
        in check("collectors: {toy: {interval_seconds: 0.01}}").stderr
    )
    assert check("collectors: {toy: {colour: red, enabled: auto}}").returncode == 0


def red_toy(tree: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """The exporter with the toy on, counting red widgets, and `flags`."""
    config = ("--config", "/dev/stdin")
    return run_toy(tree, "-m", "accelmon", *flags, "--collector.toy", *config, stdin="collectors: {toy: {colour: red}}")


def test_a_toy_collector_samples_and_is_in_the_catalogue(toy_tree):
    once = red_toy(toy_tree, "--once", "--no-collector.nvml")
    assert once.returncode == 0, once.stderr
    assert 'accelmon_toy_widgets{colour="red"} 3' in once.stdout
    assert 'accelmon_collector_success{collector="toy"} 1' in once.stdout
    catalogue = run_toy(toy_tree, "-m", "accelmon.catalogue")
    assert "## Toy widgets (`toy`)\n\nCounted by hand." in catalogue.stdout
    assert "| `accelmon_toy_widgets` | gauge | colour |" in catalogue.stdout


def test_a_toy_collectors_check_runs_in_the_scan_and_the_served_verdicts(toy_tree):
    """The toy declares one node check and that --scan samples it: nothing else is edited, and the scan, its exit
    status and the health collector's series all carry the toy's verdict."""
    scan = red_toy(toy_tree, "--scan", "--json")
    assert scan.returncode == 2, scan.stdout + scan.stderr
    document = json.loads(scan.stdout)
    assert {
        "name": "toy_widgets",
        "verdict": "failure",
        "detail": "red widgets on the bench",
        "action": "hardware_service",
        "drill": False,
    } in document["checks"]
    healthy = run_toy(toy_tree, "-m", "accelmon", "--scan", "--collector.toy", "--no-collector.nvml")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    once = red_toy(toy_tree, "--once", "--no-collector.nvml", "--collector.health")
    assert 'accelmon_node_health_check_state{action="hardware_service",check="toy_widgets"} 2.0' in once.stdout
    assert "accelmon_node_health_verdict 2.0" in once.stdout


def test_a_toy_check_touches_only_its_module_its_tests_and_the_generated_docs(toy_tree, fake_nvml_dir, tmp_path):
    """docs/health.md's table, made again, gains the toy's check; on a node that does not run the toy, every golden
    file of the NVIDIA scenario is as committed (the toy's check is absent there, not "ok")."""
    docs = toy_tree / "docs"
    docs.mkdir(exist_ok=True)
    shutil.copy(ROOT / "docs" / "health.md", docs / "health.md")
    made = run_toy(toy_tree, "-m", "accelmon.catalogue", "--checks")
    assert made.returncode == 0, made.stderr
    assert "\n| `toy_widgets` (node) | toy |" in (docs / "health.md").read_text()
    config = tmp_path / "fake.conf"
    config.write_text(SCENARIOS["nvml_h100_real.prom"])
    env = {**exporter_env(fake_nvml_dir, config), "PYTHONPATH": str(toy_tree / "exporters")}
    once = subprocess.run(
        [sys.executable, "-m", "accelmon", "--once", *on_fixtures(tmp_path / "host", "nvml", "health")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert once.returncode == 0, once.stderr
    check_golden("nvml_h100_real.prom", once.stdout)


@pytest.mark.e2e  # renders the role's config and unit with ansible-playbook
def test_a_toy_collector_reaches_the_roles_config_and_unit(toy_tree, tmp_path):
    """The role's preflight, pointed at the toy tree, validates the toy's options on the controller, writes them
    into the exporter's config and allows the toy's devices in the unit."""
    play = {
        "vars": {"unit_template": str(UNIT_TEMPLATE)},
        "tasks": [
            {
                "ansible.builtin.include_role": {
                    "name": "accelmon_exporter",
                    "tasks_from": "preflight.yml",
                    "public": True,
                }
            },
            {
                "ansible.builtin.copy": {
                    "content": "{{ __accelmon_exporter_config }}",
                    "dest": str(tmp_path / "exporter.yml"),
                    "mode": "0600",
                }
            },
            {
                "ansible.builtin.copy": {
                    "content": "{{ lookup('ansible.builtin.template', unit_template) }}",
                    "dest": str(tmp_path / "unit"),
                    "mode": "0600",
                }
            },
        ],
    }

    def preflight(collectors_setting: dict) -> subprocess.CompletedProcess[str]:
        variables = {
            "accelmon_exporter_source_dir": str(toy_tree),
            "accelmon_exporter_collectors": collectors_setting,
            "accelmon_exporter_allowed_clients": ["192.0.2.9"],
        }  # no master group here: the scraper named
        return run_local_play(play, variables, tmp_path)

    refused = preflight({"toy": {"colour": "green"}})
    assert refused.returncode != 0
    assert "collectors.toy.colour: expected one of blue, red" in refused.stdout
    off = {"enabled": False}
    nvml_readers = {"nvml": off, "fabric": off, "gpu_processes": off, "jobs": off, "nccl": off}
    accepted = preflight({"toy": {"enabled": True, "colour": "red"}, **nvml_readers})
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    written = yaml.safe_load((tmp_path / "exporter.yml").read_text())
    assert written["collectors"]["toy"] == {"enabled": True, "colour": "red"}
    check = run_toy(toy_tree, "-m", "accelmon", "--check-config", "--config", str(tmp_path / "exporter.yml"))
    assert check.returncode == 0, check.stderr
    allowed = [line for line in (tmp_path / "unit").read_text().splitlines() if line.startswith("DeviceAllow=")]
    assert "DeviceAllow=char-toy r" in allowed
    # The NVML readers are off and profiling is at auto, which never turns it on: no NVIDIA devices.
    assert "DeviceAllow=char-nvidia-frontend rw" not in allowed


def test_devices_of_disabled_collectors_are_not_allowed(tmp_path):
    config = tmp_path / "exporter.yml"
    config.write_text("collectors: {neuron: {enabled: false}, profiling: {enabled: true}}\n")
    described = plan(load(str(config)))
    # kernel_log is at auto: the kernel log may be read once a driver is loaded.
    amd = ["char-drm rw", "char-kfd rw"]  # amd is at auto too
    assert described["device_allow"] == ["/dev/kmsg r", *amd, "char-nvidia-caps r", "char-nvidia-frontend rw"]
    # Left at auto, neuron may find its hardware at a later start: its device class is allowed.
    everything = ["/dev/kmsg r", *amd, "char-neuron rw", "char-nvidia-caps r", "char-nvidia-frontend rw"]
    assert plan(load(None))["device_allow"] == everything
    assert described["collectors"]["neuron"]["enabled"] is False
    assert described["collectors"]["nvml"]["enabled"] == "auto"
    assert described["collectors"]["profiling"]["options"]["interval_seconds"] == 10.0  # the default, filled in


def test_every_collector_declares_its_options_completely():
    for name, registration in collectors().items():
        assert registration.catalogue.collector == name
        assert registration.catalogue.specs, name
        for option in registration.options:
            assert option.help, f"{name}.{option.name} has no help"
            assert isinstance(option.default, (bool, float, str)), f"{name}.{option.name}: give a float, bool or str"
            if option.name.endswith("_seconds"):
                # No duration under 0.1 s (1e-9 spun a core); some need more (the nccl query: 13 s, RAS's own time).
                assert option.minimum is not None and option.minimum >= 0.1, f"{name}.{option.name}: 0.1 s at least"


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        (Option("on", True, "x"), "yes", "expected true or false"),
        (Option("n", 1.0, "x", minimum=0.5), 0.2, "expected at least 0.5"),
        (Option("n", 1.0, "x"), float("inf"), "expected a positive number"),
        (Option("n", 1.0, "x"), 10**400, "expected a positive number"),
        (Option("s", "a", "x", ("a", "b")), "c", "expected one of a, b"),
        (Option("s", "a", "x"), "", "expected a non-empty string"),
    ],
)
def test_an_option_refuses_what_does_not_fit_it(option, value, message):
    with pytest.raises(ConfigError, match=message):
        option.check(value, "collectors.x." + option.name)


def test_an_option_several_collectors_share_is_set_once(tmp_path):
    """The job collectors' state_dir and oar_runtime_dir are one setting each: set on one collector, every job
    collector reads it (and the role's prolog, through the plan, writes there); two different values are refused."""
    sharing = [name for name, registration in collectors().items() if "state_dir" in registration.defaults]
    assert set(sharing) == {"jobs", "job_resources", "job_perf", "nccl"}
    config = tmp_path / "exporter.yml"
    config.write_text("collectors:\n  job_resources: {state_dir: /run/jobs, oar_runtime_dir: ''}\n")
    options = plan(load(str(config)))["collectors"]
    assert {options[name]["options"]["state_dir"] for name in sharing} == {"/run/jobs"}
    assert {options[name]["options"]["oar_runtime_dir"] for name in sharing if name != "nccl"} == {""}
    config.write_text("collectors:\n  jobs: {state_dir: /run/a}\n  job_perf: {state_dir: /run/b}\n")
    with pytest.raises(
        ConfigError,
        match="state_dir is one setting shared by job_perf, job_resources, jobs, nccl; it was given different values",
    ):
        load(str(config))


def test_defaults_are_written_once():
    """The defaults that used to be written three or four times are in one module each (the role has none)."""
    text = "\n".join(p.read_text() for p in (ROOT / "exporters").rglob("*.py"))
    assert text.count('"localhost:5555"') == 1
    assert text.count("/usr/share/datacenter-gpu-manager-4/bindings/python3") == 1


def test_the_docs_list_every_collector_option():
    """docs/exporter.md's option block is what --help prints from the declarations: a new option shows up there."""
    from accelmon.cli import options_help

    assert f"```text\n{options_help()}\n```" in (ROOT / "docs" / "exporter.md").read_text(), (
        "docs/exporter.md: update the options"
    )


def _imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) for each `from module import name` of a source file, and (module, "") for each `import`."""
    import ast

    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names]
    return found


def test_no_collector_imports_another_and_no_private_name_crosses_a_module():
    """What collectors share is in host libraries (accelmon.host.nvidia, accelmon.job_sources, accelmon.host.dcgm,
    accelmon.health.gpu_metrics): a change to one collector cannot break another through an import."""
    package = ROOT / "exporters" / "accelmon"
    offences = []
    for path in sorted(package.rglob("*.py")):
        inside_collectors = path.parent.name == "collectors"
        for module, name in _imports(path):
            # The package's own list of collectors (collectors(), known_metrics()) is no other collector.
            listing = module == "accelmon.collectors" and name in ("collectors", "known_metrics")
            if inside_collectors and module.startswith("accelmon.collectors") and not listing:
                offences.append(f"{path.name} imports {module}")
            if module.startswith("accelmon") and name.startswith("_") and name != "__version__":
                offences.append(f"{path.name} imports the private {module}.{name}")
    assert offences == []


def test_every_nvml_reader_declares_the_nvidia_devices(tmp_path):
    """A collector that opens NVML needs the NVIDIA devices in the unit's DevicePolicy even when it is the only
    one on: the jobs collector opens NVML to name GPUs that records give by UUID."""
    config = tmp_path / "exporter.yml"
    off = {name: {"enabled": False} for name in collectors()}
    off["jobs"] = {"enabled": True}
    config.write_text(yaml.safe_dump({"collectors": off}))
    assert plan(load(str(config)))["device_allow"] == ["char-nvidia-frontend rw"]


def test_no_module_of_the_package_is_over_600_lines():
    """Files by concern: a module past 600 lines holds more than one (report.py was 839 lines of five)."""
    package = ROOT / "exporters" / "accelmon"
    long = {
        str(p.relative_to(package)): n for p in package.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600
    }
    assert long == {}


def test_options_that_hold_several_things_take_a_yaml_list(tmp_path):
    """`collectors.nccl.addresses: ["127.0.0.1:28028"]` was refused with "expected a string" (so was gpu_holders as a
    list): a list is taken as the space-separated string it stands for; an item that is no word is refused, naming
    the option."""
    import yaml

    from accelmon.config import ConfigError, load

    config = tmp_path / "exporter.yml"
    chosen = {
        "nccl": {"addresses": ["127.0.0.1:28028", "localhost:28029"]},
        "health": {"gpu_holders": ["accelmon-exporter.service", "nvidia-dcgm.service"], "breaker_nodes": ["gres:gpu"]},
    }
    config.write_text(yaml.safe_dump({"collectors": chosen}))
    settings = load(str(config))
    assert settings.collector("nccl").options["addresses"] == "127.0.0.1:28028 localhost:28029"
    assert settings.collector("health").options["gpu_holders"] == "accelmon-exporter.service nvidia-dcgm.service"
    config.write_text(yaml.safe_dump({"collectors": {"health": {"gpu_holders": ["a.service", "b c.service"]}}}))
    with pytest.raises(ConfigError, match=r"collectors.health.gpu_holders: expected a list of strings without spaces"):
        load(str(config))
    config.write_text(yaml.safe_dump({"collectors": {"health": {"breaker_nodes": ["gres:gpu", "rack:4"]}}}))
    with pytest.raises(ConfigError, match="breaker_nodes: expected gres:NAME"):
        load(str(config))
