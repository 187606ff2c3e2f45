"""Issue 65: the no-change fast path. A worker whose last complete deploy recorded the fingerprint this run would
make, with its exporters active, ends after a few tasks; any difference runs the full roles."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.e2e

# The tasks of a worker with a current record, both plays: the preflight's variables checked, the controller's
# fingerprint (on the run's first host), the record and the services read, the end; the workers' play's skip switch
# and end. Before the fast path: about 100 (bench/deploy_bench.py), 24.5 of them in the preflight play.
FAST_PATH_TASKS = 10
HOSTS = ("same", "changed", "forced")


def _play(tmp_path: Path, check_diff: bool, extra: dict[str, str]) -> str:
    """ansible-playbook --check of deploy.yaml on HOSTS (this machine, by a local connection), each with
    an install directory of its own in tmp_path (where its record lives); systemctl answers `active` for both
    services (a fake ahead on PATH; everything else goes to the real one)."""
    local = f"ansible_connection=local ansible_python_interpreter={sys.executable}"
    lines = [
        f"{host} {local} accelmon_exporter_install_dir={tmp_path / host} {extra.get(host, '')}\n" for host in HOSTS
    ]
    inventory = tmp_path / "host.ini"
    # No master: its Prometheus named by address (a scraper group with no host is refused, issue 66 review).
    inventory.write_text(
        '[master]\n\n[worker:vars]\naccelmon_exporter_allowed_clients=["192.0.2.10"]\n\n[store]\n\n[worker]\n'
        + "".join(lines)
    )
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "systemctl").write_text(
        '#!/bin/sh\nif [ "$1" = is-active ]; then shift; for u; do echo active; done; exit 0; fi\n'
        'exec /usr/bin/systemctl "$@"\n'
    )
    (fake / "systemctl").chmod(0o755)
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1", "HOME": str(tmp_path / "home"),
           "PATH": f"{fake}:{os.environ['PATH']}"}  # fmt: skip
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "--check",
         *(["--diff"] if check_diff else []), str(ROOT / "ansible" / "deploy.yaml")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:]
    return result.stdout


def _workers_play(output: str) -> str:
    return output.split("PLAY [Workers]", 1)[1].split("PLAY [Masters]", 1)[0]


def _worker_plays(output: str) -> str:
    """The preflight play and the workers' play."""
    return output.split("PLAY [Masters]", 1)[0]


def _tasks(play: str, host: str) -> int:
    """The tasks the workers' play ran for `host`: one result line each (ok, changed, skipping, or ran elsewhere)."""
    return len(re.findall(rf"^(?:ok|changed|skipping|fatal): \[{host}(?: -> [^]]+)?\]", play, re.M))


def test_an_unchanged_worker_ends_after_a_few_tasks_and_any_difference_runs_the_full_roles(tmp_path):
    """First run, no records: every worker takes the full roles (a worker with no record runs in full), and --diff
    shows the fingerprint each would record. Records written as a complete deploy would: the unchanged worker runs
    FAST_PATH_TASKS tasks and changes nothing; one whose variable changed and one forced with accelmon_deploy_full
    run in full beside it. No worker without a record runs again in the second run: the first is that case, and each
    worker's full check-mode run is ~30 s of this tier on two shared cores."""
    first = _workers_play(_play(tmp_path, True, {}))
    fingerprints = dict(
        re.findall(rf"\+\+\+ after: {tmp_path}/(\w+)/deployed\.sha256\n@@[^\n]*\n\+([0-9a-f]{{64}})", first)
    )
    assert set(fingerprints) == set(HOSTS), first[-3000:]
    for host in HOSTS:
        assert _tasks(first, host) > 40, host
    for host in HOSTS:
        (tmp_path / host).mkdir(exist_ok=True)
        (tmp_path / host / "deployed.sha256").write_text(fingerprints[host] + "\n")
        (tmp_path / host / "deployed.sha256").chmod(0o600)  # as the role writes it

    output = _play(
        tmp_path, False, {"changed": "accelmon_exporter_log_level=debug", "forced": "accelmon_deploy_full=true"}
    )
    second = _workers_play(output)
    recap = {line.split()[0]: line for line in output.split("PLAY RECAP")[-1].splitlines() if ":" in line}
    print("tasks of the unchanged worker:", _tasks(_worker_plays(output), "same"))
    assert _tasks(_worker_plays(output), "same") <= FAST_PATH_TASKS, _worker_plays(output)
    assert "changed=0" in recap["same"], recap
    records = "".join(block for block in second.split("TASK [") if block.startswith("accelmon_exporter : Record the"))
    for host in ("changed", "forced"):
        assert _tasks(second, host) > 40, (host, second[-3000:])
    # What changed is recorded anew; a forced run records what a plain one would (its next run is a fast one).
    assert "changed: [changed]" in records, records
    assert "ok: [forced]" in records, records


def test_a_bad_accelmon_deploy_full_stops_the_deploy_in_its_first_play(tmp_path):
    """The switch is checked with the roll-out settings, before any host is read or changed."""
    inventory = tmp_path / "host.ini"
    inventory.write_text(
        '[master]\n\n[worker:vars]\naccelmon_exporter_allowed_clients=["192.0.2.10"]\n\n[store]\n\n[worker]\n'
        f"w ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    (tmp_path / "home").mkdir()
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1", "HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "--check",
         str(ROOT / "ansible" / "deploy.yaml"), "-e", "accelmon_deploy_full=always"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    assert "accelmon_deploy_full is true or false (given: always)" in result.stdout, result.stdout[-3000:]
    assert "Read the last complete deploy" not in result.stdout and "PLAY [Workers]" not in result.stdout
