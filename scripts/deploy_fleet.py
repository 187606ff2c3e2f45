"""Deploys a fleet of thousands of workers: ansible/deploy.yaml run as several `ansible-playbook` processes side by
side, each on a shard of the workers, in five stages that each finish before the next starts.

1. preflight: every host's checks (deploy.yaml's preflight play, -e accelmon_deploy_preflight_only=true), shards
   side by side, the masters and the store with the first; a bad variable or host anywhere stops the deploy here,
   before any host is changed;
2. masters first: where a master finds workers still serving plain HTTP (an upgrade from a release before TLS by
   default), the masters are deployed now, one at a time, so that their Prometheus scrapes each worker as it serves
   while the batches go (deploy.yaml's play "Masters, before workers leave plain HTTP"); elsewhere it asks only;
3. canary: the first worker, alone (and the store, which the masters write to): the change on one host, checked;
4. workers: the other workers, shards side by side, each rolling its share in batches (--batches, each checked
   before the next) within the failure budget (--max-fail-percentage of a batch);
5. masters: once every worker is deployed, one master at a time (deploy.yaml's masters play).

Why: one `ansible-playbook` schedules every task of every host on one core of the controller, about 0.0154 CPU-s
per host and task (bench/deploy_bench.py); a first deploy's ~104 tasks on 2,000 workers keep that core busy for
53 minutes whatever the forks. Shards divide that among processes (docs/deploying.md, "Sizing the controller").

A stage stops the deploy when one of its runs stopped short (a batch over its failure budget: Ansible's "NO MORE
HOSTS LEFT"), failed on its own (a bad inventory, an error before any host), or, in the preflight and canary
stages, failed any host. Failed hosts within the budget are named and the deploy goes on (exit status 2, as
`ansible-playbook`'s); they are written to a retry file for the re-run this prints. Each run's output is a log of its
own in the run directory; the exit status is 0 when every host deployed, 2 when some failed within the budget, 1
when a stage stopped the deploy or no host matched, 128+N when signal N (Ctrl-C, SIGTERM) stopped it: the runs in
flight are interrupted as Ctrl-C would (their process groups), never left running unwatched.

The runs are started where this script is (relative paths after `--` and -i mean what they meant to the operator),
with the listing's environment and ansible.cfg (ANSIBLE_CONFIG, or this repository's); the operator's own
callbacks_enabled and callback_plugins are kept beside this script's callback. A run that did not reach every host
it was given (an inventory that did not parse, a host gone from it) stops the deploy: nothing is "done" unseen.

Run (every argument after `--` goes to every ansible-playbook, e.g. a vault password file; nothing can prompt):
    python scripts/deploy_fleet.py -i host.ini --shards 4 --forks 125 -- --vault-password-file ~/.vault-pass
    python scripts/deploy_fleet.py -i host.ini --shards 4 --limit @RUN_DIR/failed.retry   # the failed ones again
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
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
# The variables each stage sets: an operator's -e after `--` must not override them (Ansible's last -e wins).
STAGE_VARS = re.compile(
    r"accelmon_deploy_(batches|max_fail_percentage|preflight_only|masters_stage)|accelmon_skip_(master|worker)"
)
# Options the listing needs as much as the runs do: an encrypted inventory is read with them.
VAULT_OPTIONS = ("--vault-password-file", "--vault-pass-file", "--vault-id")


class SignalError(Exception):
    """A signal (Ctrl-C, SIGTERM, SIGHUP) reached this script: its runs are interrupted and reported."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _signalled(signum: int, _frame: object) -> None:
    raise SignalError(signum)


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
    def unreached(self) -> list[str]:
        """Hosts given to the run that none of its plays processed (every host runs the preflight play): the
        inventory the run read lacked them (unparsed, changed since the listing)."""
        processed = set(self.summary.get("hosts", []))  # type: ignore[call-overload]
        return sorted(set(self.hosts) - processed) if self.summary else list(self.hosts)

    @property
    def stopped(self) -> bool:
        """Cut short: a batch over its budget, or no summary at all (the run failed before or outside its hosts),
        or hosts it never reached."""
        return bool(self.summary.get("stopped", True)) or self.rc not in (0, 2, 4) or (
            self.rc != 0 and not self.failed_hosts) or bool(self.unreached)  # fmt: skip


def inventory_args(args: argparse.Namespace) -> list[str]:
    return [word for path in args.inventory for word in ("-i", path)]


def vault_args(passthrough: list[str]) -> list[str]:
    """The vault options among the runs' arguments (`--vault-id x` or `--vault-id=x`), for the listing."""
    kept = []
    for at, word in enumerate(passthrough):
        if word in VAULT_OPTIONS and at + 1 < len(passthrough):
            kept += [word, passthrough[at + 1]]
        elif word.startswith(tuple(f"{option}=" for option in VAULT_OPTIONS)):
            kept.append(word)
    return kept


def list_hosts(ansible: str, inventory: list[str], pattern: str, limit: str | None,
               env: dict[str, str] | None = None) -> list[str]:  # fmt: skip
    """The hosts `pattern` names in the inventory, in inventory order (Ansible's own pattern and --limit rules)."""
    command = [ansible, *inventory, pattern, "--list-hosts", *(["--limit", limit] if limit else [])]
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
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
    # A host in several groups (a master that is also a worker) is checked by one run only: two runs on one host at
    # once would race on it and on its facts cache file.
    others = [host for host in dict.fromkeys(masters + stores) if host not in workers]
    preflight = [
        Run("preflight", i, part + (others if i == 0 else []), {**common, "accelmon_deploy_preflight_only": True})
        for i, part in enumerate(split(workers, shards) or [[]])
    ]
    stages = [[run for run in preflight if run.hosts]]
    # The worker stages leave the masters' play alone (a master that is also a worker is a master last, once every
    # worker is deployed), and the masters' stage leaves the workers' play alone.
    on_workers = {**common, "accelmon_skip_master": True}
    if masters and workers:
        stages.append(
            [
                Run(
                    "masters_first",
                    0,
                    masters,
                    {**common, "accelmon_skip_worker": True, "accelmon_deploy_masters_stage": "before"},
                )
            ]
        )
    if workers:
        stages.append([Run("canary", 0, workers[:1] + stores, {**on_workers, "accelmon_deploy_batches": [1]})])
        rest = [Run("workers", i, part, {**on_workers, "accelmon_deploy_batches": batches})
                for i, part in enumerate(split(workers[1:], shards))]  # fmt: skip
        if rest:
            stages.append(rest)
    elif stores:
        stages.append([Run("store", 0, stores, on_workers)])
    if masters:
        stages.append(
            [
                Run(
                    "masters",
                    0,
                    masters,
                    {**common, "accelmon_skip_worker": True, "accelmon_deploy_masters_stage": "after"},
                )
            ]
        )
    return [stage for stage in stages if stage]


def environment(ansible_config: str) -> dict[str, str]:
    """The listing's and every run's environment: this repository's ansible.cfg unless ANSIBLE_CONFIG names one,
    the operator's callbacks kept beside this script's (environment variables replace ansible.cfg's lists, so the
    effective lists are read from ansible-config first), and an inventory that does not parse an error, not an
    empty fleet (Ansible's default only warns and targets no host)."""
    env = dict(os.environ)
    here = Path("ansible.cfg")
    if "ANSIBLE_CONFIG" not in env and here.is_file() and here.resolve() != ROOT / "ansible.cfg":
        print(
            "deploy_fleet: ./ansible.cfg is not read (ANSIBLE_CONFIG=./ansible.cfg reads it instead of this"
            " repository's, whose forks, connection and fact settings are sized for a fleet)",
            flush=True,
        )
    env.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
    dump = subprocess.run(
        [ansible_config, "dump", "--format", "json"], capture_output=True, text=True, check=False, env=env
    )
    settings = {}
    if dump.returncode == 0:
        settings = {entry["name"]: entry.get("value") for entry in json.loads(dump.stdout) if "name" in entry}
    paths = [str(CALLBACK_DIR), *(settings.get("DEFAULT_CALLBACK_PLUGIN_PATH") or [])]
    enabled = ["accelmon_fleet", *(settings.get("CALLBACKS_ENABLED") or [])]
    env["ANSIBLE_CALLBACK_PLUGINS"] = os.pathsep.join(dict.fromkeys(paths))
    env["ANSIBLE_CALLBACKS_ENABLED"] = ",".join(dict.fromkeys(enabled))
    env["ANSIBLE_RETRY_FILES_ENABLED"] = "false"  # this script writes the retry file of the whole deploy
    env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] = "true"
    env["NO_COLOR"] = "1"
    return env


def start(run: Run, args: argparse.Namespace, run_dir: Path, passthrough: list[str],
          env: dict[str, str]) -> subprocess.Popen[bytes]:  # fmt: skip
    """ansible-playbook on the run's hosts, its output into RUN_DIR/<run>.log, what it did into <run>.json."""
    limit = run_dir / f"{run.name}.hosts"
    limit.write_text("".join(f"{host}\n" for host in run.hosts))
    # The stage's variables last: of two -e setting one name, Ansible keeps the last.
    command = [
        args.ansible_playbook, *inventory_args(args), str(PLAYBOOK), "--limit", f"@{limit}",
        *(["--forks", str(args.forks)] if args.forks else []), *passthrough, "-e", json.dumps(run.extra_vars),
    ]  # fmt: skip
    print(f"  {run.name}: {len(run.hosts)} host(s), log {run_dir / f'{run.name}.log'}", flush=True)
    with open(run_dir / f"{run.name}.log", "wb") as log:  # the child keeps its own copy of the descriptor
        # A process group of its own: a signal to this script reaches the run through interrupt(), once, and
        # the run's forks with it.
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**env, "ACCELMON_FLEET_SUMMARY": str(run_dir / f"{run.name}.json")},
            start_new_session=True,
        )


def interrupt(processes: list[tuple[Run, subprocess.Popen[bytes]]], grace: float = 60.0) -> list[Run]:
    """Ctrl-C to each run still going (ansible-playbook ends its tasks and exits 99), SIGKILL to any still there
    after `grace` seconds; the runs that were interrupted."""
    live = [(run, process) for run, process in processes if process.poll() is None]
    for _run, process in live:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    try:
        for _run, process in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except SignalError:  # a second Ctrl-C: no more waiting
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_IGN)
    for _run, process in live:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return [run for run, _process in live]


def run_stage(stage: list[Run], args: argparse.Namespace, run_dir: Path, passthrough: list[str],
              env: dict[str, str]) -> None:  # fmt: skip
    began = time.monotonic()
    processes: list[tuple[Run, subprocess.Popen[bytes]]] = []
    try:
        for run in stage:
            processes.append((run, start(run, args, run_dir, passthrough, env)))
        for run, process in processes:
            run.rc = process.wait()
            run.seconds = time.monotonic() - began
    except SignalError as stop:
        stopped = interrupt(processes)
        hosts = [host for run in stopped for host in run.hosts]
        changed = "checks only, none changed" if stage[0].stage == "preflight" else "some maybe half-deployed"
        print(
            f"deploy_fleet: signal {stop.signum}: interrupted {', '.join(run.name for run in stopped) or 'no run'}"
            f" ({len(hosts)} host(s), {changed}: a complete re-run deploys them in full)",
            flush=True,
        )
        raise
    for run, _process in processes:
        summary = run_dir / f"{run.name}.json"
        run.summary = json.loads(summary.read_text()) if summary.exists() else {}
        # The preflight and the canary have no budget: any failed host stops the deploy (main()).
        within = "" if run.stage in ("preflight", "masters_first", "canary") else " within the budget"
        state = "stopped" if run.stopped else (f"failed hosts{within}" if run.failed_hosts else "ok")
        unreachable = set(run.summary.get("unreachable", []))  # type: ignore[call-overload]
        shown = [f"{host} (unreachable)" if host in unreachable else host for host in run.failed_hosts[:20]]
        named = f": {', '.join(shown)}{' ...' if len(run.failed_hosts) > 20 else ''}" if shown else ""
        print(f"  {run.name}: rc {run.rc}, {state}{named} ({run.seconds:.0f} s)", flush=True)
        if run.unreached:
            print(f"  {run.name}: never reached {len(run.unreached)} of its host(s): {', '.join(run.unreached[:20])}")
        if run.stopped and not run.failed_hosts:  # why is in its log, not in a host's result: its errors, or its end
            lines = (run_dir / f"{run.name}.log").read_text(errors="replace").splitlines()
            errors = [line for line in lines if re.match(r"^(\[?ERROR|ERROR!|\S+: error:)", line)]
            print("".join(f"    | {line}\n" for line in (errors or lines)[-8:]), end="", flush=True)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    passthrough: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, passthrough = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", required=True, action="append", help="as ansible-playbook's, repeatable")
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
    for at, word in enumerate(passthrough):
        if word in refused or word.startswith(("--limit=", "--ask-vault-password")):
            parser.error(f"{word} cannot be given to the shards: use this script's --limit, and a vault password file")
        if word in ("-i", "--inventory", "--inventory-file") or word.startswith(("--inventory=", "-i=")):
            parser.error(f"{word} cannot be given to the shards: give it before `--`, where the hosts are listed")
        if word in ("-e", "--extra-vars"):
            given = passthrough[at + 1] if at + 1 < len(passthrough) else ""
        elif word.startswith(("-e", "--extra-vars=")):  # -eNAME=VALUE, --extra-vars=NAME=VALUE
            given = word[2:] if word.startswith("-e") else word.split("=", 1)[1]
        else:
            continue
        readable = given.startswith("@") and Path(given[1:]).is_file()
        named = STAGE_VARS.search(Path(given[1:]).read_text(errors="replace") if readable else given)
        if named:
            parser.error(f"{named.group(0)} is this script's to set, stage by stage: not with -e (see --help)")
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
    argv = sys.argv[1:] if argv is None else argv
    args, passthrough = parse(argv)
    # `ansible` lists the hosts: the one installed beside ansible-playbook, or this Python's.
    tools = {}
    for tool in ("ansible", "ansible-config"):
        beside = [Path(args.ansible_playbook).with_name(tool), Path(sys.executable).with_name(tool)]
        tools[tool] = str(next((path for path in beside if path.exists()), tool))
    env = environment(tools["ansible-config"])
    listing = [*inventory_args(args), *vault_args(passthrough)]
    workers, masters, stores = (
        list_hosts(tools["ansible"], listing, group, args.limit, env) for group in ("worker", "master", "store")
    )
    if not workers + masters + stores:
        print(f"deploy_fleet: no host of [worker], [master] or [store] in {', '.join(args.inventory)}"
              + (f" within --limit {args.limit}" if args.limit else "") + ": nothing deployed")  # fmt: skip
        return 1
    stages = plan(workers, masters, stores, args.shards, args.batches, args.max_fail_percentage)
    run_dir = (args.run_dir or Path.home() / ".ansible" / "accelmon-fleet" / time.strftime("%Y%m%dT%H%M%S")).absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"deploy_fleet: {len(workers)} workers in {args.shards} shard(s), {len(masters)} master(s), "
          f"{len(stores)} store host(s); {env['ANSIBLE_CONFIG']}; logs in {run_dir}", flush=True)  # fmt: skip
    failed: list[str] = []
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, _signalled)
    try:
        for stage in stages:
            print(f"{stage[0].stage}:", flush=True)
            run_stage(stage, args, run_dir, passthrough, env)
            failed += [host for run in stage for host in run.failed_hosts + run.unreached]
            # The preflight and the canary stop at any failed host: nothing else has changed yet, or one host only.
            strict = stage[0].stage in ("preflight", "masters_first", "canary")
            if any(run.stopped or (strict and run.failed_hosts) for run in stage):
                left_out = [host for run in stage for host in run.failed_hosts] if stage[0].stage == "preflight" else []
                return finish(run_dir, failed, argv, stopped_at=stage[0].stage, left_out=left_out)
    except SignalError as stop:
        print(f"deploy_fleet: stopped by signal {stop.signum} at the {stage[0].stage} stage; to go on:\n"
              f"  {rerun(argv)}")  # fmt: skip
        return 128 + stop.signum
    return finish(run_dir, failed, argv, stopped_at=None)


def rerun(argv: list[str], limit: str | None = None) -> str:
    """The command line of this deploy to copy: its own arguments and those after `--`, `limit` for its --limit
    when given, without --run-dir (a new run directory keeps this run's logs and retry file)."""
    at = argv.index("--") if "--" in argv else len(argv)
    ours, rest = argv[:at], argv[at:]
    dropped = ("--run-dir", "--limit") if limit else ("--run-dir",)
    kept, index = [], 0
    while index < len(ours):
        word = ours[index]
        if word in dropped:
            index += 2
            continue
        if not word.startswith(tuple(f"{option}=" for option in dropped)):
            kept.append(word)
        index += 1
    kept += ["--limit", limit] if limit else []
    return shlex.join(["python", str(Path(__file__).resolve()), *kept, *rest])


def limit_of(argv: list[str]) -> str | None:
    """This script's own --limit in `argv`, if given."""
    ours = argv[: argv.index("--")] if "--" in argv else argv
    given = [ours[at + 1] for at, word in enumerate(ours[:-1]) if word == "--limit"]
    given += [word.split("=", 1)[1] for word in ours if word.startswith("--limit=")]
    return given[-1] if given else None


def finish(
    run_dir: Path, failed: list[str], argv: list[str], stopped_at: str | None, left_out: Sequence[str] = ()
) -> int:
    """The retry file, the verdict and the command to run next; `left_out`: hosts whose own results failed the
    preflight, which a re-run may leave out (none when a run failed as a whole)."""
    retry = run_dir / "failed.retry"
    hosts = sorted(set(failed))
    if hosts:
        retry.write_text("".join(f"{host}\n" for host in hosts))
    if stopped_at:
        # The workers deployed before the stop take the fast path at the next run: run the whole deploy again.
        print(
            f"deploy_fleet: stopped at the {stopped_at} stage, no later stage ran (the logs say why)"
            + (f"; failed: {retry} ({len(hosts)} host(s))" if hosts else "")
            + f"; once fixed, run the same command again:\n  {rerun(argv)}"
        )
        if left_out and len(left_out) <= 100:
            # A few dead nodes of thousands are routine: nothing has changed yet, the rest can go without them.
            limit = limit_of(argv) or "all"
            apart = "," if "," in limit else ":"
            exclude = "".join(f"{apart}!{host}" for host in sorted(set(left_out)))
            print(f"  or without them:\n  {rerun(argv, limit + exclude)}")
        return 1
    if hosts:
        print(f"deploy_fleet: done, {len(hosts)} host(s) failed within the budget: {retry}; once fixed:\n"
              f"  {rerun(argv, f'@{retry}')}")  # fmt: skip
        return 2
    print("deploy_fleet: done, every host deployed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
