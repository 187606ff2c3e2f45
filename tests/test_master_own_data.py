"""The master role's re-own of its data volumes (tasks/own-data.yml) as root: what a container's process leaves in its
volume (a link to a host path) never makes the deploy chown anything outside the volume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.test_ansible import MASTER_ROLE, controller_env

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="chowns files to other uids: needs root, as the deploy's become"),
]


def test_a_link_left_in_a_data_volume_is_reowned_itself_never_what_it_names(tmp_path):
    """A volume the images' nobody owns (a master deployed before) holding links to a root-owned file and directory
    on the host (absolute targets, as a container's process may leave them): the re-own gives the volume, its files
    and the links themselves to Prometheus's uid, while the file and directory linked to (and what that directory
    holds) keep root:root. A second run changes nothing; --check changes nothing either."""
    volume = tmp_path / "volumes" / "prometheus"
    (volume / "wal").mkdir(parents=True)
    (volume / "wal" / "00000001").write_text("samples")
    outside = tmp_path / "host"
    (outside / "etc").mkdir(parents=True)
    (outside / "shadow").write_text("root's")
    (outside / "etc" / "inner").write_text("root's")
    for path in (outside, outside / "etc", outside / "shadow", outside / "etc" / "inner"):
        os.chown(path, 0, 0)
    (volume / "x").symlink_to(outside / "shadow")
    (volume / "d").symlink_to(outside / "etc")
    (volume / "wal" / "up").symlink_to(outside)
    inside = [volume, *volume.rglob("*")]  # rglob does not walk into the linked directories
    links = [p for p in inside if p.is_symlink()]
    assert len(links) == 3 and len(inside) == 6
    for path in inside:
        os.lchown(path, 65534, 65534)

    engine = tmp_path / "engine"
    engine.write_text(
        "#!/bin/sh\n"
        f'case "$*" in "volume inspect --format {{{{ .Mountpoint }}}} accelmon-prometheus-data") echo {volume};;\n'
        '  "volume inspect"*) echo "no such volume" >&2; exit 1;; esac\n'
    )
    engine.chmod(0o755)
    defaults = yaml.safe_load((MASTER_ROLE / "defaults" / "main.yml").read_text())
    variables = {**defaults, "__accelmon_master_engine": str(engine), "accelmon_master_grafana_enabled": False}
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(variables))
    play = [{"hosts": "localhost", "gather_facts": False, "vars_files": [str(MASTER_ROLE / "vars" / "main.yml")],
             "tasks": [{"ansible.builtin.include_tasks": {"file": str(MASTER_ROLE / "tasks" / "own-data.yml")},
                        "vars": {"__accelmon_master_owning": phase}} for phase in ("before", "after")]}]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))

    def run(*flags: str) -> str:
        result = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", *flags,
             "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'vars.yml'}",
             str(tmp_path / "play.yml")],
            capture_output=True, text=True, cwd=ROOT, timeout=300, env=controller_env(tmp_path),
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-3000:]
        return result.stdout.split("PLAY RECAP")[-1]

    def owners(paths: list[Path]) -> set[tuple[int, int]]:
        return {(p.lstat().st_uid, p.lstat().st_gid) for p in paths}

    targets = [outside, outside / "etc", outside / "shadow", outside / "etc" / "inner"]
    run("--check")
    assert owners(inside) == {(65534, 65534)} and owners(targets) == {(0, 0)}
    recap = run()
    assert "changed=" in recap and "changed=0" not in recap, recap
    assert owners(targets) == {(0, 0)}, "the deploy chowned a link's target outside the volume"
    assert owners(links) == {(60090, 60090)}, "the links themselves are the service's"
    assert owners(inside) == {(60090, 60090)}
    assert all(p.is_symlink() for p in links) and (outside / "shadow").read_text() == "root's"
    recap = run()
    assert "changed=0" in recap, recap
    assert owners(targets) == {(0, 0)} and owners(inside) == {(60090, 60090)}
