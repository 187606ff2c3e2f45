"""The package laid out by concern (docs/architecture.md): the folders import one another one way only, no private
name crosses a folder, health and repair know no scheduler, and the architecture page draws the graph the code has.
scripts/layout_graph.py reads the imports; these tests run it as a user does, on the package and on a broken copy."""

from __future__ import annotations

import runpy
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from accelmon import health
from accelmon.collectors import fabric
from accelmon.health.remediation import FailingGpu, Journal, plan_repair
from tests.support.paths import ROOT

SCRIPT = ROOT / "scripts" / "layout_graph.py"
PACKAGE = ROOT / "exporters" / "accelmon"


def layout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_the_folders_import_one_another_only_in_the_allowed_directions():
    result = layout("--check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == "exporter     -"  # the lowest folder imports no other


def broken_copy(tmp_path: Path, module: str, line: str, folder: str) -> Path:
    copy = tmp_path / folder
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + f"\n{line}\n")
    return copy


# (module of a copy of the package, the line added to it, what the check must say[, the copy's folder, if not
# accelmon: a copy named otherwise is checked alike]).
BROKEN = {
    # The metric model reaching the Slurm integration: a cycle through every folder between them.
    "upward-import": (
        "exporter/metrics.py",
        "from accelmon.schedulers.slurm import fleet",
        "layout: exporter imports schedulers: against the allowed directions",
    ),
    "private-name-imported": (
        "collectors/jobs.py",
        "from accelmon.host.nvidia import _private",
        "accelmon.collectors.jobs uses the private accelmon.host.nvidia._private across folders",
    ),
    # The same name, reached as an attribute of the module rather than imported by name.
    "private-name-read-through-a-module": (
        "collectors/jobs.py",
        "from accelmon.host import nvidia as nv\nLEAK = nv._private",
        "accelmon.collectors.jobs uses the private accelmon.host.nvidia._private across folders",
    ),
    # health may import host, but not the Slurm client there: the policy is the scheduler's to adapt to.
    "repair-policy-importing-slurms-node": (
        "health/remediation.py",
        "from accelmon.host.slurm_nodes import SlurmNode",
        "accelmon.health.remediation reaches accelmon.host.slurm_nodes: health and repair know no scheduler",
    ),
    # reset_scope imports gpu_holders; were gpu_holders to read Slurm's nodes, the policy would depend on Slurm.
    "health-reaching-slurm-through-a-host-library": (
        "host/gpu_holders.py",
        "from accelmon.host.slurm_nodes import SlurmNode",
        "accelmon.health.reset_scope reaches accelmon.host.slurm_nodes: health and repair know no scheduler",
    ),
    "repair-policy-in-a-copy-named-otherwise": (
        "health/remediation.py",
        "from accelmon.host import slurm_nodes",
        "accelmon.health.remediation reaches accelmon.host.slurm_nodes: health and repair know no scheduler",
        "copy",
    ),
    # schedulers/ is one folder to the graph; its Slurm and OAR folders stand side by side all the same.
    "one-scheduler-importing-another": (
        "schedulers/oar/health.py",
        "from ..slurm import fleet",
        "accelmon.schedulers.oar.health imports accelmon.schedulers.slurm.fleet: one schedulers folder imports",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_copy_fails_the_check(tmp_path, case):
    module, line, said, *folder = BROKEN[case]
    result = layout("--check", "--package", str(broken_copy(tmp_path, module, line, *folder or ["accelmon"])))
    assert result.returncode == 1
    assert said in result.stderr


def test_a_folder_that_is_not_the_package_is_refused(tmp_path):
    # An empty graph would pass every rule.
    result = layout("--check", "--package", str(tmp_path / "missing"))
    assert result.returncode == 2
    assert "not a copy of exporters/accelmon" in result.stderr


def test_allowed_directions_that_could_close_a_loop_are_refused():
    unordered = runpy.run_path(str(SCRIPT))["unordered"]
    assert unordered({"low": set(), "middle": {"low", "high"}, "high": {"middle"}}) == [
        "middle may import high, not listed before it in ALLOWED: folders could import each other"
    ]
    assert unordered(runpy.run_path(str(SCRIPT))["ALLOWED"]) == []


def test_the_architecture_page_draws_the_graph_the_code_has():
    graph = layout().stdout.strip()
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert f"```text\n{graph}\n```" in page, "regenerate with: python scripts/layout_graph.py"


def test_at_most_four_modules_stand_directly_in_the_package():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(loose) <= 4, loose


@dataclass(frozen=True)
class OtherSchedulersNode:
    """A node as another scheduler would adapt it: only what the policy reads."""

    name: str
    reboot_pending: bool


def test_the_repair_policy_plans_for_any_schedulers_node(tmp_path):
    journal = Journal(str(tmp_path / "journal.jsonl"))
    failing = [FailingGpu("0", "GPU-0", "S0", "reset_gpu", ("xid",))]
    plan = plan_repair(failing, [], journal, OtherSchedulersNode("n1", False), 86400.0, 1000.0)
    assert (plan.step, plan.action) == ("reset", "reset_gpu")
    assert plan_repair(failing, [], journal, OtherSchedulersNode("n1", True), 86400.0, 1000.0).step == "wait"


def test_health_reads_the_fabric_collectors_link_metric_by_its_own_name():
    # health names it rather than importing the collector (collectors build on health): the two must agree.
    assert health.NVLINK_REMOTE == fabric.LINK_REMOTE.name
