"""The Ansible collection accelmon.monitoring, as a user gets it: built by scripts/build_collection.py, installed by
ansible-galaxy into an empty collections path, its deploy playbook run by FQCN from outside the repository (check
mode), its roles finding their bundle and the exporter's source inside the collection. One version everywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.e2e
tomllib = pytest.importorskip("tomllib")  # Python 3.11+, as the controller's venv (the 3.9 run is unit only)

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("collection")
    built = subprocess.run(
        [sys.executable, "scripts/build_collection.py", str(work / "dist")], cwd=ROOT, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    tarball = Path(built.stdout.strip())
    assert tarball.name == f"accelmon-monitoring-{VERSION}.tar.gz"
    collections = work / "collections"
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "-p", str(collections), str(tarball)],
        check=True,
        capture_output=True,
    )
    return work, tarball, collections / "ansible_collections" / "accelmon" / "monitoring"


def test_one_version_in_the_package_the_exporter_the_collection_and_the_changelog(installed):
    _, tarball, _ = installed
    with tarfile.open(tarball) as archive:
        manifest = json.load(archive.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
    assert manifest["collection_info"]["version"] == VERSION
    assert manifest["collection_info"]["license"] == ["MIT"]
    printed = subprocess.run([sys.executable, "-m", "accelmon", "--version"], capture_output=True, text=True)
    assert VERSION in printed.stdout + printed.stderr
    assert f"## {VERSION}" in (ROOT / "CHANGELOG.md").read_text()
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


FAKE_SYSTEMCTL = """#!/bin/sh
# systemctl as a host where every unit is loaded, enabled and running (for ansible's systemd_service module).
for argument in "$@"; do
  case "$argument" in
    show)
      eval "unit=\\${$#}"
      printf 'Id=%s\\nLoadState=loaded\\nActiveState=active\\n' "$unit"
      printf 'SubState=running\\nUnitFileState=enabled\\n'
      exit 0;;
    is-enabled) echo enabled; exit 0;;
    is-active) echo active; exit 0;;
  esac
done
exit 0
"""


def test_the_deploy_playbook_runs_by_fqcn_from_the_installed_collection(installed):
    work, _, collection = installed
    python = f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}"
    inventory = work / "host.ini"
    inventory.write_text(f"[master]\n{python}\n\n[worker]\n{python}\n\n[store]\n\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({"ANSIBLE_COLLECTIONS_PATH": str(work / "collections"), "NO_COLOR": "1"})
    # This machine has no systemd as PID 1: a systemctl that reports every unit loaded, enabled and running lets
    # the check-mode deploy run to its end, so its exit status is what is asserted.
    fake_bin = work / "fake-systemd-bin"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "systemctl").write_text(FAKE_SYSTEMCTL)
    (fake_bin / "systemctl").chmod(0o755)
    env["PATH"] = f"{fake_bin}{os.pathsep}{env['PATH']}"
    result = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "accelmon.monitoring.deploy", "--check", "--tags",
         "config", "-e", "accelmon_master_grafana_admin_password=collection-test-password-1"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = result.stdout + result.stderr
    # The roles resolved by FQCN, their argument specs and preflights ran, the bundle came from the collection.
    assert "accelmon.monitoring.accelmon_exporter : Remember what the exporter asks of the host" in output
    rule_files = len(list((ROOT / "master" / "prometheus" / "rules").glob("*.yml")))
    dashboards = len(list((ROOT / "master" / "grafana" / "dashboards").glob("*.json")))
    assert (
        f"bundle {collection}/roles/accelmon_master/files/bundle: {rule_files} rule files and the role's live job "
        f"rules, {dashboards} dashboards" in output
    ), output
    assert "PLAY [Workers]" in output
    assert result.returncode == 0, output[-3000:]
    assert "accelmon.monitoring.accelmon_exporter : Ensure accelmon-exporter is enabled and running" in output


def test_a_bad_variable_stops_the_fqcn_deploy_in_preflight(installed):
    work, _, _ = installed
    inventory = work / "bad.ini"
    inventory.write_text(
        f"[master]\n\n[worker]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n\n"
        '[store]\n\n[worker:vars]\naccelmon_exporter_allowed_clients=["192.0.2.10"]\n'  # no master: named by address
    )
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
           "ANSIBLE_COLLECTIONS_PATH": str(work / "collections")}  # fmt: skip
    result = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "accelmon.monitoring.deploy", "--check", "-e",
         '{"accelmon_exporter_amd_support": "sometimes"}'],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    assert "accelmon_exporter_amd_support" in result.stdout + result.stderr
    assert "PLAY [Workers]" not in result.stdout


def test_the_exporter_wheel_builds_from_the_collections_copy_of_the_source(installed, tmp_path):
    _, _, collection = installed
    # As the role builds it (tasks/install.yml: pip wheel of accelmon_exporter_source_dir).
    source = collection / "roles" / "accelmon_exporter" / "files" / "source"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
         str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert [p.name for p in tmp_path.glob("*.whl")] == [f"accelmon-{VERSION}-py3-none-any.whl"]
