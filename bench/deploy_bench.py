"""What a deploy of ansible/deploy.yaml costs the controller and each worker, measured, and a model of a fleet's
deploy time T(N) from it (issue 65).

How it measures: ansible-playbook runs in this process's Python with one change, `WorkerProcess._run` wrapped so
that each task fork (Ansible forks one process per host and task, `ansible.executor.process.worker`) appends, as it
ends, a line: its host, task, play, wall seconds, its own CPU (`getrusage(RUSAGE_SELF)`: Linux resets a child's
counters at fork, so this is the fork's own work, not its parent's) and its children's CPU (`RUSAGE_CHILDREN`: the
module processes it waited for). The main process adds its own CPU and peak RSS at exit. So:

- the controller's CPU = the main process + every fork's own CPU + the children of forks whose task runs on the
  controller (`delegate_to: localhost`: the exporter's --check-config, the PKI, the wheel build);
- the remote CPU = the children of the other forks: with the Molecule podman connection
  (molecule/shared/plugins/connection/podman.py) each module runs in a child that enters the container (nsenter),
  so this is the module's own CPU on the worker;
- a task's latency = its fork's wall time (connection, module, result) on a real systemd worker.

Subcommands:
  playbook LOG -- ARGS...   ansible-playbook ARGS, measured into LOG (JSON lines); `wrapper DIR` writes an
                            `ansible-playbook` script into DIR that does this, for Molecule's converge to find on PATH
  report LOG...             per run: hosts, tasks per host, controller CPU-s and peak RSS per host, remote CPU and
                            latency per task
  model                     T(N) for 100 / 2,000 / 20,000 workers, first deploy and no-change re-run, from the
                            inputs measured (docs/deploying.md, "Sizing the controller"; docs/benchmarks.md)

Run: .venv/bin/python -m bench.deploy_bench wrapper /tmp/m; PATH=/tmp/m:$PATH python -m molecule converge -s cluster
(twice); .venv/bin/python -m bench.deploy_bench report /tmp/m/run-*.jsonl; .venv/bin/python -m bench.deploy_bench model
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parent.parent


def run_playbook(log: Path, args: list[str]) -> int:
    """ansible-playbook `args` in this process, each task fork and the main process measured into `log`."""
    from ansible.cli.playbook import main
    from ansible.executor.process import worker

    original = worker.WorkerProcess._run
    parent = os.getpid()

    def measured(self: Any) -> None:
        host, task, started = self._host.name, self._task, time.monotonic()
        try:
            original(self)
        finally:
            own = resource.getrusage(resource.RUSAGE_SELF)
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            play = getattr(getattr(task, "get_play", lambda: None)(), "name", "")
            record = {
                "host": host,
                "task": task.get_name(),
                "play": play,
                "delegated": bool(task.delegate_to),
                "run_once": bool(task.run_once),
                "wall": round(time.monotonic() - started, 4),
                "cpu": round(own.ru_utime + own.ru_stime, 4),
                "children_cpu": round(children.ru_utime + children.ru_stime, 4),
                "rss_kib": own.ru_maxrss,
            }
            # One write of a short line to a file opened for appending: the forks' lines never interleave.
            with open(log, "a") as out:
                out.write(json.dumps(record) + "\n")

    worker.WorkerProcess._run = measured
    started = time.monotonic()
    code = 1
    try:
        main(["ansible-playbook", *args])
    except SystemExit as done:
        code = int(done.code or 0)
    finally:
        if os.getpid() == parent:
            own = resource.getrusage(resource.RUSAGE_SELF)
            with open(log, "a") as out:
                out.write(json.dumps({"main": True, "wall": round(time.monotonic() - started, 3), "rc": code,
                                      "cpu": round(own.ru_utime + own.ru_stime, 3),
                                      "rss_kib": own.ru_maxrss}) + "\n")  # fmt: skip
    return code


def write_wrapper(directory: Path) -> Path:
    """An `ansible-playbook` in `directory` that runs the measured playbook, each run into its own run-N.jsonl."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "ansible-playbook"
    script.write_text(
        "#!/bin/sh\n"
        f"n=$(ls {directory}/run-*.jsonl 2>/dev/null | wc -l)\n"
        # What the run was given, for another run of the same shape (the aliases' re-run).
        f"env > {directory}/env-$n.txt; printf '%s\\n' \"$@\" > {directory}/args-$n.txt\n"
        f'exec {sys.executable} {Path(__file__).resolve()} playbook "{directory}/run-$n.jsonl" -- "$@"\n'
    )
    script.chmod(0o755)
    return script


@dataclass
class Run:
    """One measured ansible-playbook run, per worker host."""

    hosts: int
    tasks_per_host: float
    preflight_tasks_per_host: float  # of tasks_per_host: in the preflight play, all hosts at once (no serial)
    controller_cpu_per_host: float  # CPU-s: main + forks' own + delegated tasks' children, over the hosts
    main_cpu_per_host_task: float  # CPU-s of the main process (one core: it schedules every task) per host-task
    remote_cpu_per_task: float  # CPU-s of the module on the target
    latency_per_task: float  # s: a remote task's fork, start to end
    main_rss_mib: float
    fork_rss_mib: float
    wall: float
    once_cpu: float  # CPU-s of the run_once tasks (the wheel build, the CA): per run, not per host


def summarise(records: Iterable[dict[str, Any]], hosts: Iterable[str] | None = None) -> Run:
    """A run's figures for the `hosts` (default: every host with a task), from its log's records."""
    records = list(records)
    main = next(r for r in records if r.get("main"))
    tasks = [r for r in records if not r.get("main")]
    chosen = set(hosts) if hosts is not None else {r["host"] for r in tasks}
    once = [r for r in tasks if r["run_once"]]
    mine = [r for r in tasks if r["host"] in chosen and not r["run_once"]]
    remote = [r for r in mine if not r["delegated"]]
    controller = sum(r["cpu"] + (r["children_cpu"] if r["delegated"] else 0.0) for r in mine)
    # The main process serves every host of the run alike (masters too): its share is by host.
    every = {r["host"] for r in tasks}
    controller += main["cpu"] * len(chosen) / max(len(every), 1)
    return Run(
        hosts=len(chosen),
        tasks_per_host=len(mine) / max(len(chosen), 1),
        preflight_tasks_per_host=sum(r["play"] == "Preflight" for r in mine) / max(len(chosen), 1),
        controller_cpu_per_host=controller / max(len(chosen), 1),
        main_cpu_per_host_task=main["cpu"] / max(len(tasks), 1),
        remote_cpu_per_task=sum(r["children_cpu"] for r in remote) / max(len(remote), 1),
        latency_per_task=statistics.fmean(r["wall"] for r in remote) if remote else 0.0,
        main_rss_mib=main["rss_kib"] / 1024,
        fork_rss_mib=max((r["rss_kib"] for r in tasks), default=0) / 1024,
        wall=main["wall"],
        once_cpu=sum(r["cpu"] + r["children_cpu"] for r in once),
    )


def costliest_tasks(records: list[dict[str, Any]], hosts: set[str], top: int) -> list[tuple[str, float]]:
    """The tasks costing the controller most, in CPU-s per host (a task run on the controller counts its module)."""
    cost: dict[str, float] = {}
    for r in records:
        if not r.get("main") and r["host"] in hosts and not r["run_once"]:
            cost[r["task"]] = cost.get(r["task"], 0.0) + r["cpu"] + (r["children_cpu"] if r["delegated"] else 0.0)
    ranked = sorted(cost.items(), key=lambda item: -item[1])[:top]
    return [(task, total / max(len(hosts), 1)) for task, total in ranked]


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# What the model reads, measured (docs/benchmarks.md, "Deploying a fleet"), per worker: tasks and the forks' own and
# controller-side modules' CPU from Molecule's converge run twice on the cluster's two workers (first deploy; no-change
# re-run), the main process's CPU per host-task from the slope between 2 and 40 inventory aliases of those workers
# (7.9 CPU-s for 233 host-tasks, 67.9 for 4,128), latency: the two workers' mean remote task.
MAIN_CPU_PER_HOST_TASK = 0.0154
MEASURED = {
    "first": {"tasks_per_host": 104.0, "preflight_tasks_per_host": 26.0,
              "controller_cpu_per_host": 6.61 + 104.0 * MAIN_CPU_PER_HOST_TASK,
              "main_cpu_per_host_task": MAIN_CPU_PER_HOST_TASK, "latency_per_task": 2.23},
    "nochange": {"tasks_per_host": 100.5, "preflight_tasks_per_host": 24.5,
                 "controller_cpu_per_host": 4.46 + 100.5 * MAIN_CPU_PER_HOST_TASK,
                 "main_cpu_per_host_task": MAIN_CPU_PER_HOST_TASK, "latency_per_task": 1.56},
}  # fmt: skip
BATCHES: list[int | str] = [1, "5%", "25%", "100%"]


def batch_sizes(hosts: int, serial: list[int | str]) -> list[int]:
    """The batches Ansible's `serial` list makes of `hosts`: each entry in turn, the last repeated until none
    is left; a share is of all the play's hosts, rounded down, at least 1 (ansible-core's
    PlaybookExecutor._get_serialized_batches with ansible.utils.helpers.pct_to_int)."""
    sizes, left, index = [], hosts, 0
    while left > 0:
        entry = serial[min(index, len(serial) - 1)]
        size = int(entry) if isinstance(entry, int) or not str(entry).endswith("%") else (
            int(hosts * float(str(entry)[:-1]) / 100.0))  # fmt: skip
        size = min(max(size, 1), left)
        sizes.append(size)
        left -= size
        index += 1
    return sizes


def deploy_seconds(
    hosts: int, *, tasks: float, controller_cpu: float, latency: float, forks: int, cores: int,
    preflight_tasks: float = 0.0, main_cpu: float = 0.0, serial: list[int | str] = BATCHES,
) -> float:  # fmt: skip
    """T(N) of the workers' deploy: the preflight play's tasks on all hosts at once, then the workers' play batch
    after batch, each task of a batch done on all its hosts before the next (the linear strategy). A task on B hosts
    takes the longest of: ceil(B / forks) rounds of the task's latency; the controller's CPU for it (B x controller
    CPU per host-task) over the cores; and the main process's part of it (B x `main_cpu`, CPU-s per host-task), which
    runs on one core whatever the cores. `tasks` and `controller_cpu` are per host, preflight included."""
    per_task_cpu = controller_cpu / tasks if tasks else 0.0

    def task_on(size: int) -> float:
        return max(math.ceil(size / forks) * latency, size * per_task_cpu / cores, size * main_cpu)

    total = preflight_tasks * task_on(hosts)
    for size in batch_sizes(hosts, serial):
        total += (tasks - preflight_tasks) * task_on(size)
    return total


# scripts/deploy_fleet.py's shards roll their share in these batches; its canary is a stage of its own.
SHARD_BATCHES: list[int | str] = ["5%", "25%", "100%"]


def fleet_seconds(
    hosts: int, *, shards: int, tasks: float, controller_cpu: float, latency: float, forks: int, cores: int,
    preflight_tasks: float, main_cpu: float, serial: list[int | str] = SHARD_BATCHES,
) -> float:  # fmt: skip
    """T(N) of the workers' deploy by scripts/deploy_fleet.py: its preflight stage (each shard's preflight play on
    its share, side by side), the canary (every task on one host), then the shards side by side, each running the
    whole playbook on its share of the other workers (the preflight play again, then its batches). Side by side,
    the shards' forks (`forks` each) share the controller's cores, and each shard has a main process of its own: a
    task on B hosts of every shard at once takes the longest of ceil(B / forks) rounds of latency, shards x B x
    controller CPU per host-task over the cores, and B x `main_cpu` on the shard's own core."""
    per_task_cpu = controller_cpu / tasks if tasks else 0.0

    def task_on(size: int, side_by_side: int) -> float:
        return max(math.ceil(size / forks) * latency, side_by_side * size * per_task_cpu / cores, size * main_cpu)

    total = preflight_tasks * task_on(math.ceil(hosts / shards), shards)
    total += tasks * task_on(1, 1)
    share = math.ceil((hosts - 1) / shards)
    total += preflight_tasks * task_on(share, shards)
    for size in batch_sizes(share, serial):
        total += (tasks - preflight_tasks) * task_on(size, shards)
    return total


def fleet_table(measured: dict[str, float], shards_list: list[int], forks: int, cores: int) -> list[tuple]:
    rows = []
    for shards in shards_list:
        for hosts in (100, 2000, 20000):
            seconds = fleet_seconds(
                hosts, shards=shards, tasks=measured["tasks_per_host"], latency=measured["latency_per_task"],
                controller_cpu=measured["controller_cpu_per_host"], forks=forks, cores=cores,
                preflight_tasks=measured["preflight_tasks_per_host"], main_cpu=measured["main_cpu_per_host_task"],
            )  # fmt: skip
            rows.append((shards, forks, cores, hosts, seconds / 60))
    return rows


def model_table(measured: dict[str, dict[str, float]], forks: int, cores_list: list[int]) -> list[tuple]:
    rows = []
    for run in ("first", "nochange"):
        inputs = measured[run]
        for cores in cores_list:
            for hosts in (100, 2000, 20000):
                seconds = deploy_seconds(
                    hosts, tasks=inputs["tasks_per_host"], controller_cpu=inputs["controller_cpu_per_host"],
                    latency=inputs["latency_per_task"], forks=forks, cores=cores,
                    preflight_tasks=inputs["preflight_tasks_per_host"], main_cpu=inputs["main_cpu_per_host_task"],
                )  # fmt: skip
                rows.append((run, cores, forks, hosts, seconds / 60))
    return rows


def print_run(name: str, run: Run) -> None:
    per_task = run.controller_cpu_per_host / max(run.tasks_per_host, 1)
    print(
        f"{name}: {run.hosts} hosts, {run.tasks_per_host:.1f} tasks/host ({run.preflight_tasks_per_host:.1f} "
        f"preflight), controller "
        f"{run.controller_cpu_per_host:.2f} CPU-s/host ({per_task:.3f}/host-task, main process "
        f"{run.main_cpu_per_host_task:.4f}), "
        f"remote {run.remote_cpu_per_task:.3f} CPU-s/task, latency {run.latency_per_task:.3f} s/task, "
        f"main RSS {run.main_rss_mib:.0f} MiB, fork RSS <= {run.fork_rss_mib:.0f} MiB, "
        f"once {run.once_cpu:.1f} CPU-s, wall {run.wall:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["playbook"]:
        # Everything after `--` is ansible-playbook's.
        split = argv.index("--")
        return run_playbook(Path(argv[1]), argv[split + 1 :])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    wrapper = sub.add_parser("wrapper")
    wrapper.add_argument("directory", type=Path)
    report = sub.add_parser("report")
    report.add_argument("logs", type=Path, nargs="+")
    report.add_argument("--hosts", help="comma-separated hosts to count (default: every host with a task)")
    report.add_argument("--top", type=int, default=0, help="also list the N tasks costing the controller most")
    model = sub.add_parser("model")
    model.add_argument("--forks", default="50,500", help="comma-separated forks (ansible.cfg: 50)")
    model.add_argument("--latency", type=float, help="seconds a remote task (default: as measured)")
    model.add_argument("--cores", default="8,32")
    model.add_argument(
        "--shards",
        help="comma-separated: model scripts/deploy_fleet.py's first deploy instead, with --forks and --cores "
        "each shard's forks and the controller's cores (one value each)",
    )
    args = parser.parse_args(argv)
    if args.command == "wrapper":
        print(write_wrapper(args.directory))
    elif args.command == "report":
        hosts = args.hosts.split(",") if args.hosts else None
        for log in args.logs:
            records = read_log(log)
            run = summarise(records, hosts)
            print_run(log.name, run)
            chosen = set(hosts) if hosts else {r["host"] for r in records if not r.get("main")}
            for task, cpu in costliest_tasks(records, chosen, args.top):
                print(f"  {cpu:6.2f} CPU-s/host  {task}")
    else:
        cores = [int(c) for c in args.cores.split(",")]
        measured = {run: {**inputs, **({"latency_per_task": args.latency} if args.latency else {})}
                    for run, inputs in MEASURED.items()}  # fmt: skip
        if args.shards:
            print(f"{'shards':>6} {'forks':>5} {'cores':>5} {'workers':>8} {'minutes':>8}  (first deploy)")
            for row in fleet_table(measured["first"], [int(s) for s in args.shards.split(",")], int(args.forks),
                                   cores[0]):  # fmt: skip
                print("{:6d} {:5d} {:5d} {:8d} {:8.1f}".format(*row))
            return 0
        print(f"{'run':9} {'cores':>5} {'forks':>5} {'workers':>8} {'minutes':>8}")
        for forks in (int(f) for f in args.forks.split(",")):
            for run, c, f, n, minutes in model_table(measured, forks, cores):
                print(f"{run:9} {c:5d} {f:5d} {n:8d} {minutes:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
