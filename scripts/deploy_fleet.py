"""Deploys a fleet of thousands of workers: ansible/deploy.yaml run as several `ansible-playbook` processes side by
side, each on a shard of the workers, in four stages that each finish before the next starts.

1. preflight: every host's checks (deploy.yaml's preflight play, -e accelmon_deploy_preflight_only=true), shards
   side by side, the masters and the store with the first; a bad variable or host anywhere stops the deploy here,
   before any host is changed;
2. canary: the first worker, alone (and the store, which the masters write to): the change on one host, checked;
3. workers: the other workers, shards side by side, each rolling its share in batches (--batches, each checked
   before the next) within the failure budget (--max-fail-percentage of a batch);
4. masters: once every worker is deployed, one master at a time (deploy.yaml's masters play).

Why: one `ansible-playbook` schedules every task of every host on one core of the controller, about 0.0154 CPU-s
per host and task (bench/deploy_bench.py); a first deploy's ~104 tasks on 2,000 workers keep that core busy for
53 minutes whatever the forks. Shards divide that among processes (docs/deploying.md, "Sizing the controller").

A stage stops the deploy when one of its runs stopped short (a batch over its failure budget: Ansible's "NO MORE
HOSTS LEFT"), failed on its own (a bad inventory, an error before any host), or, in the preflight and canary
stages, failed any host. Failed hosts within the budget are named and the deploy goes on (exit status 2, as
`ansible-playbook`'s); they are written to a retry file for the re-run this prints. Each run's output is a log of its
own in the run directory; the exit status is 0 when every host deployed, 2 when some failed within the budget, 1
when a stage stopped the deploy.

Run (every argument after `--` goes to every ansible-playbook, e.g. a vault password file; nothing can prompt):
    python scripts/deploy_fleet.py -i host.ini --shards 4 --forks 125 -- --vault-password-file ~/.vault-pass
    python scripts/deploy_fleet.py -i host.ini --shards 4 --limit @RUN_DIR/failed.retry   # the failed ones again
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOK = ROOT / "ansible" / "deploy.yaml"
CALLBACK_DIR = Path(__file__).resolve().parent / "fleet_callback"
# The canary is its own stage: the shards' batches start at a share, not at one host each.
SHARD_BATCHES = ["5%", "25%", "100%"]
BATCH = re.compile(r"^([1-9][0-9]*|([1-9][0-9]?|100)%)$")


@dataclass
class Run:
    """One ansible-playbook of a stage: the hosts it is limited to and the variables the stage gives it."""

    stage: str
    index: int
    hosts: list[str]
    extra_vars: dict[str, object]
    rc: int | None = None
    summary: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.stage}-{self.index}"

    @property
    def failed_hosts(self) -> list[str]:
        failed = list(self.summary.get("failed", [])) + list(self.summary.get("unreachable", []))  # type: ignore[call-overload]
        return sorted(set(failed))

    @property
    def stopped(self) -> bool:
        """Cut short: a batch over its budget, or no summary at all (the run failed before or outside its hosts)."""
        return bool(self.summary.get("stopped", True)) or self.rc not in (0, 2, 4) or (
            self.rc != 0 and not self.failed_hosts)  # fmt: skip


def list_hosts(ansible: str, inventory: str, pattern: str, limit: str | None) -> list[str]:
    """The hosts `pattern` names in the inventory, in inventory order (Ansible's own pattern and --limit rules)."""
    command = [ansible, "-i", inventory, pattern, "--list-hosts", *(["--limit", limit] if limit else [])]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0 and "leaves us with no hosts" in result.stderr:
        return []  # a --limit that holds none of the group's hosts
    if result.returncode != 0:
        raise SystemExit(f"deploy_fleet: cannot list the hosts of {pattern!r}: {result.stderr.strip()}")
    lines = result.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("hosts (")), len(lines))
    return [line.strip() for line in lines[start + 1 :] if line.strip()]


def split(hosts: Sequence[str], shards: int) -> list[list[str]]:
    """`shards` contiguous slices of `hosts` (inventory order: a rack stays in one shard), sizes differing by one at
    most; fewer when there are fewer hosts."""
    count = min(shards, len(hosts))
    size, extra = divmod(len(hosts), count) if count else (0, 0)
    slices, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        slices.append(list(hosts[start:end]))
        start = end
    return slices


def plan(workers: list[str], masters: list[str], stores: list[str], shards: int, batches: list[object],
         budget: int) -> list[list[Run]]:  # fmt: skip
    """The stages, each a list of runs that go side by side."""
    common: dict[str, object] = {"accelmon_deploy_max_fail_percentage": budget}
    preflight = [
        Run(
            "preflight",
            i,
            part + (masters + stores if i == 0 else []),
            {**common, "accelmon_deploy_preflight_only": True},
        )
        for i, part in enumerate(split(workers, shards) or [[]])
    ]
    stages = [[run for run in preflight if run.hosts]]
    if workers:
        stages.append([Run("canary", 0, workers[:1] + stores, {**common, "accelmon_deploy_batches": [1]})])
        rest = [Run("workers", i, part, {**common, "accelmon_deploy_batches": batches})
                for i, part in enumerate(split(workers[1:], shards))]  # fmt: skip
        if rest:
            stages.append(rest)
    elif stores:
        stages.append([Run("store", 0, stores, common)])
    if masters:
        stages.append([Run("masters", 0, masters, common)])
    return [stage for stage in stages if stage]


def start(run: Run, args: argparse.Namespace, run_dir: Path, passthrough: list[str]) -> subprocess.Popen[bytes]:
    """ansible-playbook on the run's hosts, its output into RUN_DIR/<run>.log, what it did into <run>.json."""
    limit = run_dir / f"{run.name}.hosts"
    limit.write_text("".join(f"{host}\n" for host in run.hosts))
    env = dict(os.environ)
    env["ACCELMON_FLEET_SUMMARY"] = str(run_dir / f"{run.name}.json")
    env["ANSIBLE_CALLBACK_PLUGINS"] = os.pathsep.join(
        filter(None, [str(CALLBACK_DIR), os.environ.get("ANSIBLE_CALLBACK_PLUGINS")]))  # fmt: skip
    env["ANSIBLE_CALLBACKS_ENABLED"] = ",".join(
        filter(None, ["accelmon_fleet", os.environ.get("ANSIBLE_CALLBACKS_ENABLED")]))  # fmt: skip
    env["ANSIBLE_RETRY_FILES_ENABLED"] = "false"  # this script writes the retry file of the whole deploy
    env.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
    env["NO_COLOR"] = "1"
    command = [
        args.ansible_playbook, "-i", args.inventory, str(PLAYBOOK), "--limit", f"@{limit}",
        "-e", json.dumps(run.extra_vars), *(["--forks", str(args.forks)] if args.forks else []), *passthrough,
    ]  # fmt: skip
    print(f"  {run.name}: {len(run.hosts)} host(s), log {run_dir / f'{run.name}.log'}", flush=True)
    with open(run_dir / f"{run.name}.log", "wb") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=ROOT
        )


def run_stage(stage: list[Run], args: argparse.Namespace, run_dir: Path, passthrough: list[str]) -> None:
    began = time.monotonic()
    processes = [(run, start(run, args, run_dir, passthrough)) for run in stage]
    for run, process in processes:
        run.rc = process.wait()
        run.seconds = time.monotonic() - began
        summary = run_dir / f"{run.name}.json"
        run.summary = json.loads(summary.read_text()) if summary.exists() else {}
        state = "stopped" if run.stopped else ("failed hosts within the budget" if run.failed_hosts else "ok")
        named = (
            f": {', '.join(run.failed_hosts[:20])}{' ...' if len(run.failed_hosts) > 20 else ''}"
            if run.failed_hosts
            else ""
        )
        print(f"  {run.name}: rc {run.rc}, {state}{named} ({run.seconds:.0f} s)", flush=True)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    passthrough: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, passthrough = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("--shards", type=int, default=4, help="ansible-playbook processes side by side (default 4)")
    parser.add_argument("--forks", type=int, help="forks of each process (default: ansible.cfg's, 50)")
    parser.add_argument("--limit", help="deploy only these hosts (an Ansible pattern, or @FILE such as a retry file)")
    parser.add_argument(
        "--batches",
        default=json.dumps(SHARD_BATCHES),
        help=f"each shard's batches, JSON (default {json.dumps(SHARD_BATCHES)}; the canary is a stage of its own)",
    )
    parser.add_argument(
        "--max-fail-percentage",
        type=int,
        default=0,
        help="failed hosts a batch may have, percent, before its shard and the deploy stop (default 0)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="where logs, limits and the retry file go (default ~/.ansible/accelmon-fleet/<time>)",
    )
    parser.add_argument("--ansible-playbook", default=shutil.which("ansible-playbook") or "ansible-playbook")
    args = parser.parse_args(argv)
    # Refused before anything runs: what each run is limited to, and prompts, are this script's to decide.
    refused = ("-l", "--limit", "-k", "-K", "-J", "--ask-pass", "--ask-become-pass", "--ask-vault-pass")
    for word in passthrough:
        if word in refused or word.startswith(("--limit=", "--ask-vault-password")):
            parser.error(f"{word} cannot be given to the shards: use this script's --limit, and a vault password file")
    if args.shards < 1 or (args.forks is not None and args.forks < 1):
        parser.error("--shards and --forks are 1 or more")
    if not 0 <= args.max_fail_percentage <= 100:
        parser.error("--max-fail-percentage is 0-100")
    try:
        batches = json.loads(args.batches)
    except ValueError:
        batches = None
    if not isinstance(batches, list) or not batches or not all(BATCH.match(str(b)) for b in batches):
        parser.error(f'--batches is a JSON list of host counts or shares such as "25%" (given: {args.batches})')
    args.batches = batches
    return args, passthrough


def main(argv: list[str] | None = None) -> int:
    args, passthrough = parse(sys.argv[1:] if argv is None else argv)
    # `ansible` lists the hosts: the one installed beside ansible-playbook, or this Python's.
    beside = [Path(args.ansible_playbook).with_name("ansible"), Path(sys.executable).with_name("ansible")]
    ansible = str(next((path for path in beside if path.exists()), "ansible"))
    workers, masters, stores = (
        list_hosts(ansible, args.inventory, group, args.limit) for group in ("worker", "master", "store")
    )
    stages = plan(workers, masters, stores, args.shards, args.batches, args.max_fail_percentage)
    run_dir = args.run_dir or Path.home() / ".ansible" / "accelmon-fleet" / time.strftime("%Y%m%dT%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"deploy_fleet: {len(workers)} workers in {args.shards} shard(s), {len(masters)} master(s), "
          f"{len(stores)} store host(s); logs in {run_dir}", flush=True)  # fmt: skip
    failed: list[str] = []
    for stage in stages:
        print(f"{stage[0].stage}:", flush=True)
        run_stage(stage, args, run_dir, passthrough)
        failed += [host for run in stage for host in run.failed_hosts]
        # The preflight and the canary stop at any failed host: nothing else has changed yet, or one host only.
        strict = stage[0].stage in ("preflight", "canary")
        if any(run.stopped or (strict and run.failed_hosts) for run in stage):
            return finish(run_dir, failed, args, stopped_at=stage[0].stage)
    return finish(run_dir, failed, args, stopped_at=None)


def finish(run_dir: Path, failed: list[str], args: argparse.Namespace, stopped_at: str | None) -> int:
    retry = run_dir / "failed.retry"
    if failed:
        retry.write_text("".join(f"{host}\n" for host in sorted(set(failed))))
    if stopped_at:
        # The workers deployed before the stop take the fast path at the next run: run the whole deploy again.
        print(
            f"deploy_fleet: stopped at the {stopped_at} stage, no later stage ran (the logs say why)"
            + (f"; failed: {retry} ({len(set(failed))} host(s))" if failed else "")
            + "; once fixed, run the same command again"
        )
        return 1
    if failed:
        print(f"deploy_fleet: done, {len(set(failed))} host(s) failed within the budget: {retry}; once fixed:\n"
              f"  python scripts/deploy_fleet.py -i {args.inventory} --limit @{retry}")  # fmt: skip
        return 2
    print("deploy_fleet: done, every host deployed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
