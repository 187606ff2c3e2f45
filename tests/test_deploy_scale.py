"""The deploy at fleet scale, on the controller: work done once per run or per distinct input, not once per host."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.e2e


# Issue 65: the exporter's configuration is checked on the controller once per distinct configuration of the run.
def test_the_controller_checks_each_distinct_exporter_configuration_once(tmp_path):
    """Two workers share a configuration, one has its own, one an invalid one: a --check deploy of the four
    spawns the exporter's --check-config three times (before: twice per worker, eight, in the preflight play and again
    in the workers' play); the invalid one alone fails, named with its error, and the others deploy. Two sharing
    prove the once-per-configuration as three did, for a full worker's check-mode run less."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "exporters", source / "exporters",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))  # fmt: skip
    # Each start of the check appends a line here: `python -m accelmon` runs this file first.
    spawns = tmp_path / "spawns"
    main = source / "exporters" / "accelmon" / "__main__.py"
    main.write_text(f"with open({str(spawns)!r}, 'a') as _f:\n    _f.write('check\\n')\n" + main.read_text())
    local = f"ansible_connection=local ansible_python_interpreter={sys.executable}"
    inventory = tmp_path / "host.ini"
    inventory.write_text(
        '[master]\n\n[worker:vars]\naccelmon_exporter_allowed_clients=["192.0.2.10"]\n\n[store]\n\n[worker]\n'
        + "".join(f"same-{n} {local}\n" for n in range(2))
        + f"own {local} accelmon_exporter_log_level=debug\n"
        + f"bad {local} accelmon_exporter_listen_address=nowhere\n"
    )
    # HOME in tmp_path: the scrape PKI the deploy makes on the controller, even in --check, is the test's.
    (tmp_path / "home").mkdir()
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1", "HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "--check",
         str(ROOT / "ansible" / "deploy.yaml"), "-e", f"accelmon_exporter_source_dir={source}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
        timeout=900,
    )  # fmt: skip
    output = result.stdout
    assert result.returncode != 0, output[-3000:]
    assert spawns.read_text().count("check\n") == 3, output[-3000:]
    assert "(item=2 host(s): same-0, same-1)" in output
    recap = {line.split()[0]: line for line in output.split("PLAY RECAP")[-1].splitlines() if ":" in line}
    assert "failed=1" in recap["bad"]
    assert all("failed=0" in recap[host] for host in ("same-0", "same-1", "own")), recap
    failure = output[: output.index("fatal: [bad]")].rsplit("TASK [", 1)[-1]
    assert failure.startswith("accelmon_exporter : Stop on an invalid exporter configuration")
    assert "listen address 'nowhere'" in failure
    # The three went through the workers' play (the recap above), where the check did not run again (the count).
    assert output.count("TASK [accelmon_exporter : Write the exporter configuration]") >= 2
