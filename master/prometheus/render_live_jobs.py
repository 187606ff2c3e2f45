"""Writes rules/accelmon-live-jobs.yml: the master role's template of the live job judgements, rendered by Ansible
with the role's defaults (the copy promtool's tests, the store's tests and the demo read; the role renders its own
from the operator's variables on every master). `--check` fails where the copy differs from the template.

    .venv/bin/python master/prometheus/render_live_jobs.py [--check]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "ansible" / "roles" / "accelmon_master"
RULES = ROOT / "master" / "prometheus" / "rules" / "accelmon-live-jobs.yml"


def render() -> str:
    with tempfile.TemporaryDirectory() as work:
        dest = Path(work) / "rules.yml"
        play = [
            {
                "hosts": "localhost",
                "gather_facts": False,
                "vars_files": [str(ROLE / "defaults" / "main.yml")],
                "tasks": [
                    {
                        "ansible.builtin.template": {
                            "src": str(ROLE / "templates" / "accelmon-live-jobs.yml.j2"),
                            "dest": str(dest),
                            "mode": "0644",
                        }
                    }
                ],
            }
        ]
        (Path(work) / "play.yml").write_text(json.dumps(play))
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "ansible-playbook"),
                *("-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"),
                str(Path(work) / "play.yml"),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1"},
            timeout=300,
            check=False,
        )
        if result.returncode != 0:
            raise SystemExit(result.stdout[-3000:] + result.stderr[-3000:])
        return dest.read_text()


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if RULES.read_text() != text:
            print(f"{RULES.relative_to(ROOT)} differs from the role's template: run {Path(__file__).name}")
            return 1
        return 0
    RULES.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
