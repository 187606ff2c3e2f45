"""The master's rule files as a Prometheus reads them: master/prometheus/rules/ (shipped as they are) and the live
job judgements, which the master role renders from its template and accelmon_master_live_jobs_* variables on every
master (ansible/roles/accelmon_master/templates/accelmon-live-jobs.yml.j2). No rendered copy is kept in the
repository: what needs the rules (promtool's tests, the tests' Prometheus, the capacity bench) renders them here,
by Ansible itself, at the role's defaults or at the variables given.

    .venv/bin/python master/prometheus/render_live_jobs.py OUT_DIR     writes OUT_DIR/rules/*.yml and OUT_DIR/tests/
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "ansible" / "roles" / "accelmon_master"
SHIPPED = ROOT / "master" / "prometheus" / "rules"
TESTS = ROOT / "master" / "prometheus" / "tests"
LIVE_JOBS = "accelmon-live-jobs.yml"


def render(variables: Optional[dict[str, Any]] = None) -> str:
    """The live job rules at the role's defaults, or at `variables` over them."""
    with tempfile.TemporaryDirectory() as work:
        dest = Path(work) / "rules.yml"
        play = [
            {
                "hosts": "localhost",
                "gather_facts": False,
                "vars_files": [str(ROLE / "defaults" / "main.yml")],
                "vars": variables or {},
                "tasks": [
                    {
                        "ansible.builtin.template": {
                            "src": str(ROLE / "templates" / f"{LIVE_JOBS}.j2"),
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
            raise RuntimeError(result.stdout[-3000:] + result.stderr[-3000:])
        return dest.read_text()


def write_rules(out: Path, variables: Optional[dict[str, Any]] = None) -> Path:
    """`out`/rules/ holding every rule file a master evaluates (the live job rules rendered), and `out`/tests/ the
    promtool tests beside them (their rule_files name ../rules/): returns `out`/rules."""
    rules, tests = out / "rules", out / "tests"
    rules.mkdir(parents=True, exist_ok=True)
    tests.mkdir(parents=True, exist_ok=True)
    for path in SHIPPED.glob("*.yml"):
        shutil.copy(path, rules)
    (rules / LIVE_JOBS).write_text(render(variables))
    for path in TESTS.glob("*.yml"):
        shutil.copy(path, tests)
    return rules


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print(write_rules(Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
