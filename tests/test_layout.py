"""The package laid out by concern (docs/architecture.md): the folders import one another one way only, no private
name crosses a folder, health and repair know no scheduler, and the architecture page draws the graph the code has.
scripts/layout_graph.py reads the imports; these tests run it as a user does, on the package and on a broken copy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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


def broken_copy(tmp_path: Path, module: str, line: str) -> Path:
    copy = tmp_path / "accelmon"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + f"\n{line}\n")
    return copy


def test_an_upward_import_fails_the_check(tmp_path):
    # The metric model reaching the Slurm integration: a cycle through every folder between them.
    copy = broken_copy(tmp_path, "exporter/metrics.py", "from accelmon.schedulers.slurm import fleet")
    result = layout("--check", "--package", str(copy))
    assert result.returncode == 1
    assert "layout: exporter imports schedulers: against the allowed directions" in result.stderr


def test_a_private_name_across_folders_fails_the_check(tmp_path):
    copy = broken_copy(tmp_path, "collectors/jobs.py", "from accelmon.host.nvidia import _private")
    result = layout("--check", "--package", str(copy))
    assert result.returncode == 1
    assert "accelmon.collectors.jobs imports the private accelmon.host.nvidia._private across folders" in result.stderr


def test_the_repair_policy_importing_slurms_node_fails_the_check(tmp_path):
    # health may import host, but not the Slurm client there: the policy is the scheduler's to adapt to.
    copy = broken_copy(tmp_path, "health/remediation.py", "from accelmon.host.slurm_nodes import SlurmNode")
    result = layout("--check", "--package", str(copy))
    assert result.returncode == 1
    assert "health and repair know no scheduler" in result.stderr


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
