"""Issue 65: scripts/deploy_fleet.py, the first deploy of thousands of workers as several ansible-playbook processes
side by side. The stages and their gates with a recording stand-in for ansible-playbook (the hosts each run was
limited to, what it was given, when it ran); then with the real ansible-playbook in --check on workers of this
machine (local connections), where its preflight-only stage, limits and callback must hold for real."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.e2e

SCRIPT = ROOT / "scripts" / "deploy_fleet.py"
ANSIBLE = Path(sys.executable).parent / "ansible"

# Records each run and writes the summary the real callback would, as FAKE_PLAN says for its hosts:
# {"fail": {stage: [hosts that fail]}, "stop": {stage: [hosts whose failure stops the run short]},
#  "sleep": seconds each run takes (0.5), "gone": {stage: [hosts its runs do not process]},
#  "crash": [stages whose runs fail as a whole], "unreachable": {stage: [hosts]}}. Like ansible-playbook it reads
# its -i from where it was started: the hosts it processes are those of its limit that its inventory files name
# (none when it cannot read them).
STAND_IN = r"""#!{python}
import json, os, re, sys, time
args = sys.argv[1:]
limit = args[args.index("--limit") + 1][1:]
hosts = open(limit).read().split()
extra = json.loads(args[len(args) - 1 - args[::-1].index("-e") + 1])
began = time.time()
plan = json.loads(os.environ.get("FAKE_PLAN", "{{}}"))
stage = os.path.basename(limit).split("-")[0]
with open(os.environ["FAKE_RECORD"] + ".started", "a") as started:
    started.write(json.dumps({{"run": os.path.basename(limit), "pid": os.getpid()}}) + "\n")
time.sleep(plan.get("sleep", 0.5))
if stage in plan.get("crash", []):  # fails as a whole: an error of its own, no summary
    print("PLAY [Preflight]\n[ERROR]: the inventory source broke\nsome trailing words")
    sys.exit(1)
named = set()
for at, word in enumerate(args):
    if word == "-i" and os.path.isfile(args[at + 1]):
        text = open(args[at + 1]).read()  # an encrypted one: as if decrypted, with the vault options given
        named |= set(hosts) if text.startswith("$ANSIBLE_VAULT") else set(re.findall(r"^([^\s\[]\S*)", text, re.M))
hosts = [h for h in hosts if h in named and h not in plan.get("gone", {{}}).get(stage, [])]
stopping = plan.get("stop", {{}}).get(stage, [])
failed = [h for h in hosts if h in plan.get("fail", {{}}).get(stage, []) + stopping]
stopped = any(h in stopping for h in hosts)
with open(os.environ["ACCELMON_FLEET_SUMMARY"], "w") as out:
    unreachable = [h for h in hosts if h in plan.get("unreachable", {{}}).get(stage, [])]
    json.dump({{"stopped": stopped, "failed": failed, "unreachable": unreachable, "hosts": hosts}}, out)
with open(os.environ["FAKE_RECORD"], "a") as record:
    record.write(json.dumps({{"run": os.path.basename(limit), "hosts": hosts, "extra": extra, "began": began,
                             "ended": time.time(), "args": args, "cwd": os.getcwd(),
                             "callbacks": [os.environ["ANSIBLE_CALLBACKS_ENABLED"],
                                           os.environ["ANSIBLE_CALLBACK_PLUGINS"]]}}) + "\n")
sys.exit(2 if failed else 4 if unreachable else 0)
"""


def _inventory(tmp_path: Path, workers: int, line: str = "", extra: dict[str, str] | None = None) -> Path:
    extra = extra or {}
    inventory = tmp_path / "host.ini"
    hosts = "".join(f"w{i:02d} {line} {extra.get(f'w{i:02d}', '')}\n" for i in range(1, workers + 1))
    inventory.write_text(f"[master]\nm1 {line}\nm2 {line}\n\n[store]\n\n[worker]\n{hosts}")
    return inventory


def _stand_in(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / "ansible-playbook"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    for tool in ("ansible", "ansible-config"):  # the real ones list the inventory's hosts and read ansible.cfg
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(ANSIBLE.with_name(tool))
    return stand_in


def _fleet(
    tmp_path: Path, inventory: Path | str, *args: str, plan: dict | None = None, cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int, str, list[dict]]:  # fmt: skip
    stand_in = _stand_in(tmp_path)
    record = tmp_path / "record.jsonl"
    record.unlink(missing_ok=True)
    env = {**os.environ, "FAKE_PLAN": json.dumps(plan or {}), "FAKE_RECORD": str(record), "HOME": str(tmp_path),
           **(env or {})}  # fmt: skip
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "-i", str(inventory), "--ansible-playbook", str(stand_in),
         "--run-dir", str(tmp_path / "run"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=120, cwd=cwd,
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
    assert list(by_stage) == ["preflight", "masters_first", "canary", "workers", "masters"], [r["run"] for r in runs]
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
    # The masters go first where some worker still serves plain HTTP (deploy.yaml's play before the workers', which
    # asks), and last: each run does its half of deploy.yaml's masters plays, never the workers' play.
    for stage, half in (("masters_first", "before"), ("masters", "after")):
        (run,) = by_stage[stage]
        assert run["hosts"] == ["m1", "m2"] and run["extra"]["accelmon_skip_worker"] is True, run
        assert run["extra"]["accelmon_deploy_masters_stage"] == half, run
    # Side by side within a stage (each stand-in sleeps 0.5 s: they overlap), one stage after the other.
    assert max(r["began"] for r in workers) < min(r["ended"] for r in workers)
    for before, after in zip(list(by_stage.values()), list(by_stage.values())[1:]):
        assert max(r["ended"] for r in before) <= min(r["began"] for r in after)
    # What follows `--` and --forks reach every run, the stage's variables last (Ansible's last -e wins).
    assert all(r["args"][-4:-2] == ["-e", "@vault.yml"] and "125" in r["args"] for r in runs)
    assert all(json.loads(r["args"][-1]) == r["extra"] for r in runs)
    assert "every host deployed" in output


def test_a_failed_preflight_host_stops_the_deploy_before_any_host_changes(tmp_path):
    rc, output, runs = _fleet(tmp_path, _inventory(tmp_path, 6), "--shards", "2", plan={"fail": {"preflight": ["w05"]}})
    assert rc == 1, output
    assert {r["run"].split("-")[0] for r in runs} == {"preflight"}, output
    assert "stopped at the preflight stage" in output and "w05" in output
    assert (tmp_path / "run" / "failed.retry").read_text() == "w05\n"
    # Nothing has changed yet: the operator is told how to go on without the host (dead nodes are routine).
    command = shlex.split(output.splitlines()[-1])
    assert command[command.index("--limit") + 1] == "all:!w05", output
    rc, output, runs = _fleet(tmp_path, _inventory(tmp_path, 6), "--shards", "2", "--limit", "all:!w05")
    assert rc == 0 and "w05" not in {h for r in runs for h in r["hosts"]}, output


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
        tmp_path, _inventory(tmp_path, 7), "--shards", "2", "--", "--diff",
        plan={"fail": {"workers": ["w03", "w06"]}},
    )  # fmt: skip
    assert rc == 2, output
    assert [r["run"].split("-")[0] for r in runs][-1] == "masters"
    retry = tmp_path / "run" / "failed.retry"
    assert retry.read_text() == "w03\nw06\n"
    # The command printed to re-run them is this one's (its shards, what follows `--`) limited to the retry file.
    command = output.splitlines()[-1].split()
    assert command[1:] == [str(SCRIPT), "-i", str(tmp_path / "host.ini"), "--ansible-playbook",
                           str(tmp_path / "bin" / "ansible-playbook"), "--shards", "2", "--limit", f"@{retry}",
                           "--", "--diff"], output  # fmt: skip
    # The retry file limits a re-run to those workers, and Ansible's own pattern rules read it.
    rc, output, runs = _fleet(tmp_path, _inventory(tmp_path, 7), "--shards", "2", "--limit", f"@{retry}")
    assert rc == 0, output
    assert sorted(h for r in runs if not r["run"].startswith(("preflight", "masters_first")) for h in r["hosts"]) == [
        "w03",
        "w06",
    ]


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
    assert [r["run"].split("-")[0] for r in runs] == ["preflight", "preflight", "masters_first", "canary"]


def test_a_relative_inventory_from_the_operators_directory_is_the_one_every_run_reads(tmp_path):
    """`-i host.ini` from the operator's own directory, as the docs write it: the runs were started in the
    repository, where no host.ini is, so each processed no host and the deploy said "every host deployed"."""
    work = tmp_path / "ops"
    work.mkdir()
    _inventory(work, 3)
    rc, output, runs = _fleet(tmp_path, "host.ini", "--shards", "2", cwd=work)
    assert rc == 0, output
    assert {r["cwd"] for r in runs} == {str(work)}
    assert sorted(h for r in runs if not r["run"].startswith(("preflight", "masters_first")) for h in r["hosts"]) == [
        "m1", "m2", "w01", "w02", "w03"]  # fmt: skip


def test_a_host_a_run_never_reached_stops_the_deploy_and_is_named(tmp_path):
    """Listed, given to a run, absent from what the run processed (its inventory changed, or did not parse)."""
    rc, output, runs = _fleet(tmp_path, _inventory(tmp_path, 5), "--shards", "2", plan={"gone": {"workers": ["w04"]}})
    assert rc == 1, output
    assert "never reached 1 of its host(s): w04" in output and "stopped at the workers stage" in output, output
    assert "masters" not in {r["run"].split("-")[0] for r in runs}
    assert (tmp_path / "run" / "failed.retry").read_text() == "w04\n"


def test_an_unreachable_host_in_the_preflight_is_named_as_such_and_the_stage_has_no_budget(tmp_path):
    rc, output, _ = _fleet(tmp_path, _inventory(tmp_path, 4), "--shards", "2", "--max-fail-percentage", "50",
                           plan={"unreachable": {"preflight": ["w03"]}})  # fmt: skip
    assert rc == 1 and "preflight-1: rc 4, failed hosts: w03 (unreachable)" in output, output
    assert "within the budget" not in output and "--limit 'all:!w03'" in output, output


def test_a_run_that_fails_as_a_whole_shows_its_error_and_offers_no_run_without_its_hosts(tmp_path):
    rc, output, _ = _fleet(tmp_path, _inventory(tmp_path, 4), "--shards", "2", plan={"crash": ["preflight"]})
    assert rc == 1 and "stopped at the preflight stage" in output, output
    assert output.count("    | [ERROR]: the inventory source broke") == 2, output
    assert "or without them" not in output, output


def test_no_host_matched_is_an_error_not_a_deploy_of_nothing(tmp_path):
    rc, output, runs = _fleet(tmp_path, _inventory(tmp_path, 3), "--limit", "w0l")
    assert rc == 1 and "nothing deployed" in output and runs == [], output


def test_a_master_that_is_also_a_worker_is_checked_once_and_deployed_as_a_master_last(tmp_path):
    """m1 in [master] and [worker], in the second shard: the preflight checked it in two runs at once (racing on the
    host and its facts file), and its shard's run deployed it as a master before the other workers were done."""
    inventory = _inventory(tmp_path, 3)
    inventory.write_text(inventory.read_text() + "m1\n")
    rc, output, runs = _fleet(tmp_path, inventory, "--shards", "2")
    assert rc == 0, output
    preflight = [h for r in runs if r["run"].startswith("preflight") for h in r["hosts"]]
    assert sorted(preflight) == ["m1", "m2", "w01", "w02", "w03"], runs
    for run in runs:
        stage = run["run"].split("-")[0]
        if stage in ("canary", "workers"):
            assert run["extra"]["accelmon_skip_master"] is True, run
        if stage == "masters":
            assert run["extra"]["accelmon_skip_worker"] is True and run["hosts"] == ["m1", "m2"], run


def test_a_signal_interrupts_every_run_and_leaves_no_ansible_playbook_behind(tmp_path):
    """SIGTERM (a CI timeout, systemd, kill) killed the script alone: its shards' ansible-playbook processes went
    on deploying, unwatched, past any gate. Now each run gets Ctrl-C, the script waits for them and says so."""
    stand_in = _stand_in(tmp_path)
    record = tmp_path / "record.jsonl"
    env = {**os.environ, "FAKE_PLAN": json.dumps({"sleep": 120}), "FAKE_RECORD": str(record), "HOME": str(tmp_path)}
    script = subprocess.Popen(
        [sys.executable, str(SCRIPT), "-i", str(_inventory(tmp_path, 4)), "--shards", "2",
         "--ansible-playbook", str(stand_in), "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    started = Path(f"{record}.started")
    deadline = time.monotonic() + 90
    while len(started.read_text().splitlines() if started.exists() else []) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = [json.loads(line)["pid"] for line in started.read_text().splitlines()]
    assert len(pids) == 2
    script.send_signal(signal.SIGTERM)
    output, _ = script.communicate(timeout=60)
    assert script.returncode == 128 + signal.SIGTERM, output
    assert "interrupted preflight-0, preflight-1" in output and "stopped by signal" in output, output
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), (pid, output)


def test_the_operators_callbacks_are_kept_beside_the_scripts(tmp_path):
    """An ansible.cfg with callbacks of its own (ANSIBLE_CONFIG): the script's environment variables replaced its
    callbacks_enabled and callback_plugins, so its junit/ARA records stopped and its stdout callback failed to load."""
    config = tmp_path / "mine.cfg"
    config.write_text(f"[defaults]\ncallbacks_enabled = ansible.builtin.junit\ncallback_plugins = {tmp_path}/cb\n")
    rc, output, runs = _fleet(tmp_path, _inventory(tmp_path, 1), env={"ANSIBLE_CONFIG": str(config)})
    assert rc == 0 and str(config) in output, output
    for run in runs:
        enabled, paths = run["callbacks"]
        assert enabled.split(",") == ["accelmon_fleet", "ansible.builtin.junit"], run
        assert paths.split(os.pathsep) == [str(ROOT / "scripts" / "fleet_callback"), f"{tmp_path}/cb"], run


def test_an_encrypted_inventory_is_listed_with_the_vault_password_given_after_the_double_dash(tmp_path):
    """The listing read it without the vault password: no host, and "every host deployed" with nothing run."""
    (tmp_path / "pass").write_text("secret\n")
    inventory = _inventory(tmp_path, 2)
    subprocess.run(
        [str(ANSIBLE.with_name("ansible-vault")), "encrypt", "--vault-password-file", str(tmp_path / "pass"),
         str(inventory)], check=True, capture_output=True, env={**os.environ, "HOME": str(tmp_path)},
    )  # fmt: skip
    rc, output, runs = _fleet(tmp_path, inventory, "--", f"--vault-password-file={tmp_path / 'pass'}")
    assert rc == 0, output
    assert "2 workers" in output and [r["hosts"] for r in runs if r["run"].startswith("canary")] == [["w01"]], output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--shards", "0"], "--shards and --forks are 1 or more"),
        (["--batches", '["5%", "abc"]'], "--batches is a JSON list"),
        (["--max-fail-percentage", "101"], "--max-fail-percentage is 0-100"),
        (["--", "--limit", "w01"], "--limit cannot be given to the shards"),
        (["--", "--ask-vault-pass"], "--ask-vault-pass cannot be given to the shards"),
        # Ansible keeps the last -e of a name: the preflight stage would deploy every host, or a budget be lost.
        (["--", "-e", "accelmon_deploy_preflight_only=false"], "accelmon_deploy_preflight_only is this script's"),
        (["--", "-e", '{"accelmon_deploy_max_fail_percentage": 50}'], "accelmon_deploy_max_fail_percentage is this"),
        (["--", "-i", "other.ini"], "-i cannot be given to the shards"),
    ],
)
def test_bad_arguments_are_refused_before_any_run(tmp_path, args, words):
    rc, output, runs = _fleet(tmp_path, _inventory(tmp_path, 3), *args)
    assert rc == 2 and words in output and runs == [], output


def test_the_documented_retry_file_commands_name_a_path_ansible_opens(tmp_path):
    """`--limit @~/...` (docs/deploying.md, ansible.cfg) fails as written: the shell expands no `~` after `@`, nor
    does Ansible ("Unable to find limit file")."""
    (tmp_path / "inv.ini").write_text("w1\n")
    (tmp_path / ".ansible").mkdir()
    (tmp_path / ".ansible" / "deploy.retry").write_text("w1\n")
    env = {**os.environ, "HOME": str(tmp_path)}
    listed = subprocess.run(
        [str(ANSIBLE), "-i", str(tmp_path / "inv.ini"), "all", "--list-hosts", "--limit", "@~/.ansible/deploy.retry"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert listed.returncode != 0 and "Unable to find limit file" in listed.stdout + listed.stderr, listed
    for path in (ROOT / "docs" / "deploying.md", ROOT / "ansible.cfg"):
        assert "@~" not in path.read_text(), path


def _real_fleet(tmp_path: Path, extra: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], Path]:
    """deploy_fleet.py with the real ansible-playbook in --check, on three workers of this machine (local
    connections, install directories in tmp_path) and no master: the stages as an operator runs them."""
    local = f"ansible_connection=local ansible_python_interpreter={sys.executable}"
    inventory = tmp_path / "host.ini"
    lines = [
        f"w{i} {local} accelmon_exporter_install_dir={tmp_path / f'w{i}'} {extra.get(f'w{i}', '')}\n" for i in (1, 2, 3)
    ]
    # No master: its Prometheus named by address (a scraper group with no host is refused, issue 66 review).
    inventory.write_text(
        '[master]\n\n[worker:vars]\naccelmon_exporter_allowed_clients=["192.0.2.10"]\n\n[store]\n\n[worker]\n'
        + "".join(lines)
    )
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
