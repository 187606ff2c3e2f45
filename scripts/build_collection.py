"""Builds the Ansible collection `accelmon.monitoring`: the four roles and the deploy and remove playbooks, usable
by FQCN (`ansible-playbook accelmon.monitoring.deploy`) once `ansible-galaxy collection install` put the tarball in
a collections path. The roles are whole inside it: the master bundle (dashboards, Grafana's provisioning, rules) and
the exporter's source (the wheel is built from it on the controller) are copied into the roles' files/, where the
roles look first; the repository keeps one copy of each. The version is the package's (pyproject.toml).

Run: python scripts/build_collection.py [OUTPUT_DIR]   (default dist/; prints the tarball's path)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE, NAME = "accelmon", "monitoring"
ROLES = ("accelmon_exporter", "accelmon_node_exporter", "accelmon_master", "accelmon_store")
ROLE_REFERENCE = re.compile(r"^(\s+(?:- role|name): )(" + "|".join(ROLES) + r")$", re.MULTILINE)
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".cache", "build")


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def playbook(source: Path) -> str:
    """A playbook of ansible/ as the collection holds it: roles by FQCN, their argument specs in ../roles."""
    text = ROLE_REFERENCE.sub(rf"\g<1>{NAMESPACE}.{NAME}.\g<2>", source.read_text())
    return text.replace("playbook_dir ~ '/roles/", "playbook_dir ~ '/../roles/")


def stage(into: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    galaxy = {
        "namespace": NAMESPACE,
        "name": NAME,
        "version": version(),
        "readme": "README.md",
        "authors": ["accelmon developers"],
        "description": project["description"],
        "license": [project["license"]],
        "tags": ["monitoring", "gpu", "prometheus", "grafana", "nvidia", "amd"],
        "dependencies": {"containers.podman": ">=1.10.0"},
        "repository": "https://github.com/accelmon/accelmon",
        "build_ignore": [],
    }
    (into / "galaxy.yml").write_text(yaml.safe_dump(galaxy, sort_keys=False))
    (into / "meta").mkdir()
    (into / "meta" / "runtime.yml").write_text('---\nrequires_ansible: ">=2.15.0"\n')
    for name in ("LICENSE", "CHANGELOG.md"):
        shutil.copy(ROOT / name, into / name)
    (into / "README.md").write_text(
        f"# {NAMESPACE}.{NAME}\n\naccelmon's roles ({', '.join(ROLES)}) and playbooks (deploy, remove). "
        "After `ansible-galaxy collection install accelmon-monitoring-*.tar.gz`:\n\n"
        f"```sh\nansible-playbook -i host.ini {NAMESPACE}.{NAME}.deploy\n```\n\n"
        "Each role's README lists its variables; the project's documentation is at "
        "https://github.com/accelmon/accelmon/tree/main/docs.\n"
    )
    shutil.copytree(ROOT / "ansible" / "roles", into / "roles", ignore=IGNORED)
    (into / "playbooks").mkdir()
    for name in ("deploy.yaml", "remove.yaml"):
        (into / "playbooks" / name).write_text(playbook(ROOT / "ansible" / name))
    master = into / "roles" / "accelmon_master" / "files" / "bundle"
    shutil.copytree(ROOT / "master" / "grafana" / "dashboards", master / "grafana" / "dashboards")
    shutil.copytree(ROOT / "master" / "grafana" / "provisioning", master / "grafana" / "provisioning")
    shutil.copytree(ROOT / "master" / "prometheus" / "rules", master / "prometheus" / "rules")
    store = into / "roles" / "accelmon_store" / "files" / "bundle" / "prometheus" / "rules"
    store.mkdir(parents=True)
    for rules in sorted((ROOT / "master" / "prometheus" / "rules").glob("accelmon-fleet-*.yml")):
        shutil.copy(rules, store)
    source = into / "roles" / "accelmon_exporter" / "files" / "source"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "exporters", source / "exporters", ignore=IGNORED)


def build(output: Path) -> Path:
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="accelmon-collection-") as work:
        staged = Path(work) / NAME
        staged.mkdir()
        stage(staged)
        galaxy = Path(sys.executable).parent / "ansible-galaxy"
        subprocess.run(
            [str(galaxy), "collection", "build", "--force", "--output-path", str(output), str(staged)],
            check=True,
            capture_output=True,
            text=True,
        )
    return output / f"{NAMESPACE}-{NAME}-{version()}.tar.gz"


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "dist"))
