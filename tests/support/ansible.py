"""Ansible run from a test: one local play, a role's template rendered by Ansible with the role's defaults, and a
rendered unit's ExecStart."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import ROOT


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
