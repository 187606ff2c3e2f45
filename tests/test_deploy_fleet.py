"""Issue 65: scripts/deploy_fleet.py, the first deploy of thousands of workers as several ansible-playbook processes
side by side. The stages and their gates with a recording stand-in for ansible-playbook (the hosts each run was
limited to, what it was given, when it ran); then with the real ansible-playbook in --check on workers of this
machine (local connections), where its preflight-only stage, limits and callback must hold for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.e2e

SCRIPT = ROOT / "scripts" / "deploy_fleet.py"
ANSIBLE = Path(sys.executable).parent / "ansible"

# Records each run and writes the summary the real callback would, as FAKE_PLAN says for its hosts:
# {"fail": {stage: [hosts that fail]}, "stop": {stage: [hosts whose failure stops the run short]}}.
STAND_IN = r"""#!{python}
import json, os, sys, time
args = sys.argv[1:]
limit = args[args.index("--limit") + 1][1:]
hosts = open(limit).read().split()
extra = json.loads(args[args.index("-e") + 1])
began = time.time()
time.sleep(0.5)
plan = json.loads(os.environ.get("FAKE_PLAN", "{{}}"))
stage = os.path.basename(limit).split("-")[0]
stopping = plan.get("stop", {{}}).get(stage, [])
failed = [h for h in hosts if h in plan.get("fail", {{}}).get(stage, []) + stopping]
stopped = any(h in stopping for h in hosts)
with open(os.environ["ACCELMON_FLEET_SUMMARY"], "w") as out:
    json.dump({{"stopped": stopped, "failed": failed, "unreachable": [], "hosts": hosts}}, out)
with open(os.environ["FAKE_RECORD"], "a") as record:
    record.write(json.dumps({{"run": os.path.basename(limit), "hosts": hosts, "extra": extra, "began": began,
                             "ended": time.time(), "args": args}}) + "\n")
sys.exit(2 if failed else 0)
"""


def _inventory(tmp_path: Path, workers: int, line: str = "", extra: dict[str, str] | None = None) -> Path:
    extra = extra or {}
    inventory = tmp_path / "host.ini"
    hosts = "".join(f"w{i:02d} {line} {extra.get(f'w{i:02d}', '')}\n" for i in range(1, workers + 1))
    inventory.write_text(f"[master]\nm1 {line}\nm2 {line}\n\n[store]\n\n[worker]\n{hosts}")
    return inventory


def _fleet(tmp_path: Path, inventory: Path, *args: str, plan: dict | None = None) -> tuple[int, str, list[dict]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / "ansible-playbook"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    if not (bin_dir / "ansible").exists():
        (bin_dir / "ansible").symlink_to(ANSIBLE)  # the real one lists the inventory's hosts
    record = tmp_path / "record.jsonl"
    record.unlink(missing_ok=True)
    env = {**os.environ, "FAKE_PLAN": json.dumps(plan or {}), "FAKE_RECORD": str(record), "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "-i", str(inventory), "--ansible-playbook", str(stand_in),
         "--run-dir", str(tmp_path / "run"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=120,
    )  # fmt: skip
    runs = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return result.returncode, result.stdout, runs


def test_the_stages_run_in_order_the_shards_side_by_side_and_every_host_once(tmp_path):
    inventory = _inventory(tmp_path, 9)
    rc, output, runs = _fleet(tmp_path, inventory, "--shards", "4", "--forks", "125", "--", "-e", "@vault.yml")
    assert rc == 0, output
    by_stage: dict[str, list[dict]] = {}
    for run in runs:
        by_stage.setdefault(run["run"].split("-")[0], []).append(run)
    assert list(by_stage) == ["preflight", "canary", "workers", "masters"], [r["run"] for r in runs]
    # Preflight: every host, checks only; the masters with the first shard.
    preflight = by_stage["preflight"]
    assert all(r["extra"]["accelmon_deploy_preflight_only"] is True for r in preflight)
    assert sorted(h for r in preflight for h in r["hosts"]) == sorted(
        [f"w{i:02d}" for i in range(1, 10)] + ["m1", "m2"]
    )
    assert len(preflight) == 4
    # The canary alone, then the other eight workers in four shards of two, inventory order, each rolling in batches.
    assert [r["hosts"] for r in by_stage["canary"]] == [["w01"]]
    assert by_stage["canary"][0]["extra"]["accelmon_deploy_batches"] == [1]
    workers = sorted(by_stage["workers"], key=lambda r: r["run"])
    assert [r["hosts"] for r in workers] == [["w02", "w03"], ["w04", "w05"], ["w06", "w07"], ["w08", "w09"]]
    assert all(r["extra"]["accelmon_deploy_batches"] == ["5%", "25%", "100%"] for r in workers)
    assert [r["hosts"] for r in by_stage["masters"]] == [["m1", "m2"]]
    # Side by side within a stage (each stand-in sleeps 0.5 s: they overlap), one stage after the other.
    assert max(r["began"] for r in workers) < min(r["ended"] for r in workers)
    for before, after in zip(list(by_stage.values()), list(by_stage.values())[1:]):
        assert max(r["ended"] for r in before) <= min(r["began"] for r in after)
    # What follows `--` and --forks reach every run; no run prompts.
    assert all(r["args"][-2:] == ["-e", "@vault.yml"] and "125" in r["args"] for r in runs)
    assert "every host deployed" in output


def test_a_failed_preflight_host_stops_the_deploy_before_any_host_changes(tmp_path):
    rc, output, runs = _fleet(tmp_path, _inventory(tmp_path, 6), "--shards", "2", plan={"fail": {"preflight": ["w05"]}})
    assert rc == 1, output
    assert {r["run"].split("-")[0] for r in runs} == {"preflight"}, output
    assert "stopped at the preflight stage" in output and "w05" in output
    assert (tmp_path / "run" / "failed.retry").read_text() == "w05\n"


def test_a_shard_over_its_budget_stops_the_deploy_before_the_masters_and_names_its_hosts(tmp_path):
    """w04 fails its shard's batch beyond the budget (the run stops short): the other shard finishes its own run,
    the masters' stage never starts, the exit is 1 and the failed host is in the retry file."""
    rc, output, runs = _fleet(
        tmp_path,
        _inventory(tmp_path, 7),
        "--shards",
        "2",
        "--max-fail-percentage",
        "10",
        plan={"stop": {"workers": ["w04"]}},
    )
    assert rc == 1, output
    stages = [r["run"].split("-")[0] for r in runs]
    assert "masters" not in stages and stages.count("workers") == 2, stages
    assert all(r["extra"]["accelmon_deploy_max_fail_percentage"] == 10 for r in runs)
    assert "stopped at the workers stage" in output and "w04" in output
    assert (tmp_path / "run" / "failed.retry").read_text() == "w04\n"


def test_failures_within_the_budget_go_on_to_the_masters_and_exit_2_with_a_retry_file(tmp_path):
    rc, output, runs = _fleet(
        tmp_path, _inventory(tmp_path, 7), "--shards", "2", plan={"fail": {"workers": ["w03", "w06"]}}
    )
    assert rc == 2, output
    assert [r["run"].split("-")[0] for r in runs][-1] == "masters"
    retry = tmp_path / "run" / "failed.retry"
    assert retry.read_text() == "w03\nw06\n"
    # The retry file limits a re-run to those workers, and Ansible's own pattern rules read it.
    rc, output, runs = _fleet(tmp_path, _inventory(tmp_path, 7), "--shards", "2", "--limit", f"@{retry}")
    assert rc == 0, output
    assert sorted(h for r in runs if not r["run"].startswith("preflight") for h in r["hosts"]) == ["w03", "w06"]


def test_a_failed_canary_stops_the_deploy_before_the_shards(tmp_path):
    """Whatever the budget: the canary is one host, the change's first test."""
    rc, output, runs = _fleet(
        tmp_path,
        _inventory(tmp_path, 5),
        "--shards",
        "2",
        "--max-fail-percentage",
        "50",
        plan={"fail": {"canary": ["w01"]}},
    )
    assert rc == 1 and "stopped at the canary stage" in output, output
    assert [r["run"].split("-")[0] for r in runs] == ["preflight", "preflight", "canary"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--shards", "0"], "--shards and --forks are 1 or more"),
        (["--batches", '["5%", "abc"]'], "--batches is a JSON list"),
        (["--max-fail-percentage", "101"], "--max-fail-percentage is 0-100"),
        (["--", "--limit", "w01"], "--limit cannot be given to the shards"),
        (["--", "--ask-vault-pass"], "--ask-vault-pass cannot be given to the shards"),
    ],
)
def test_bad_arguments_are_refused_before_any_run(tmp_path, args, words):
    rc, output, runs = _fleet(tmp_path, _inventory(tmp_path, 3), *args)
    assert rc == 2 and words in output and runs == [], output


def _real_fleet(tmp_path: Path, extra: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], Path]:
    """deploy_fleet.py with the real ansible-playbook in --check, on three workers of this machine (local
    connections, install directories in tmp_path) and no master: the stages as an operator runs them."""
    local = f"ansible_connection=local ansible_python_interpreter={sys.executable}"
    inventory = tmp_path / "host.ini"
    lines = [
        f"w{i} {local} accelmon_exporter_install_dir={tmp_path / f'w{i}'} {extra.get(f'w{i}', '')}\n" for i in (1, 2, 3)
    ]
    inventory.write_text("[master]\n\n[store]\n\n[worker]\n" + "".join(lines))
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "-i", str(inventory), "--shards", "2", "--run-dir", str(tmp_path / "run"),
         "--ansible-playbook", str(Path(sys.executable).parent / "ansible-playbook"), "--", "--check"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env, timeout=900,
    )  # fmt: skip
    return result, tmp_path / "run"


def test_the_real_playbook_in_shards_checks_all_then_deploys_canary_and_shards(tmp_path):
    result, run = _real_fleet(tmp_path, {})
    assert result.returncode == 0, result.stdout + "".join(p.read_text()[-3000:] for p in run.glob("*.log"))
    # The preflight stage ran every check and changed nothing: no host reached its roles' tasks.
    for log in sorted(run.glob("preflight-*.log")):
        text = log.read_text()
        assert "Run the worker preflight checks" in text and "accelmon_exporter : Create the group" not in text, text
        assert "Change nothing after the preflight" in text or "Leave the workers alone" in text
    summaries = {p.stem: json.loads(p.read_text()) for p in run.glob("*.json")}
    assert sorted(h for name, s in summaries.items() if name.startswith("preflight") for h in s["hosts"]) == [
        "w1",
        "w2",
        "w3",
    ]
    assert summaries["canary-0"]["hosts"] == ["w1"] and summaries["canary-0"]["stopped"] is False
    assert sorted(h for name, s in summaries.items() if name.startswith("workers") for h in s["hosts"]) == ["w2", "w3"]
    for name in ("canary-0", "workers-0", "workers-1"):
        assert "accelmon_exporter : Create the group" in (run / f"{name}.log").read_text(), name


def test_the_real_playbook_stops_at_the_preflight_on_one_bad_variable_anywhere(tmp_path):
    result, run = _real_fleet(tmp_path, {"w3": "accelmon_exporter_log_level=chatty"})
    assert result.returncode == 1, result.stdout
    assert "stopped at the preflight stage" in result.stdout and "w3" in result.stdout, result.stdout
    assert not list(run.glob("canary-*")) and not list(run.glob("workers-*"))
    assert (run / "failed.retry").read_text() == "w3\n"


@pytest.mark.parametrize(
    "budget, bad, stopped, failed",
    [
        (0, "c", True, ["c"]),  # one failed host of a batch of two, over a budget of 0: the later batch never runs
        (50, "c", False, ["c"]),  # within the budget: the play goes on, ansible-playbook still exits 2
        (0, "", False, []),
    ],
)
def test_the_callback_tells_a_run_cut_short_from_failures_within_the_budget(tmp_path, budget, bad, stopped, failed):
    """What the stages' gates read, from the real ansible-playbook: both failing runs exit 2."""
    local = f"ansible_connection=local ansible_python_interpreter={sys.executable}"
    (tmp_path / "inv.ini").write_text("[w]\n" + "".join(f"{h} {local}\n" for h in "abcd"))
    (tmp_path / "play.yml").write_text(
        '- hosts: w\n  gather_facts: false\n  serial: [1, 2, 1]\n  max_fail_percentage: "{{ budget }}"\n'
        "  tasks:\n    - ansible.builtin.fail: {msg: broken}\n      when: inventory_hostname == bad\n"
    )
    summary = tmp_path / "summary.json"
    env = {**os.environ, "ACCELMON_FLEET_SUMMARY": str(summary), "HOME": str(tmp_path),
           "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "scripts" / "fleet_callback"),
           "ANSIBLE_CALLBACKS_ENABLED": "accelmon_fleet"}  # fmt: skip
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "inv.ini"),
         str(tmp_path / "play.yml"), "-e", json.dumps({"budget": budget, "bad": bad})],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == (2 if failed else 0), result.stdout
    written = json.loads(summary.read_text())
    assert written["stopped"] is stopped and written["failed"] == failed, (written, result.stdout)
    # Cut short, d (the last batch) never ran; within the budget it did.
    assert ("d" in written["hosts"]) is (not stopped)
