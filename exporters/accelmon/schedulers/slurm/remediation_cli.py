"""accelmon-remediation: the fleet's switch and view of accelmon's drains and repairs on Slurm (docs/health.md).

    accelmon-remediation pause --reason "bad driver roll-out, INC-42"   every node's drains and repairs stop
    accelmon-remediation resume                                         they start again
    accelmon-remediation status                                         the switch, the breaker, the repair pace

The switch lives in Slurm (one node's Comment), which every node's health check reads anyway: it takes effect at
each node's next check (HealthCheckInterval), with no service of accelmon's anywhere. Exit status: 0 done, 1 Slurm
could not be asked or refused, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from accelmon.config import ConfigError, load
from accelmon.host.slurm_nodes import SCONTROL_HELP, find_scontrol, run_scontrol
from accelmon.host.slurm_pause import pause_of
from accelmon.schedulers.slurm.fleet import HOUR, Fleet, Limits, out_by_accelmon, repaired_at, repairing
from accelmon.schedulers.slurm.repair import Options


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accelmon-remediation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="the exporter's config file, for the breaker's and the pace's limits")
    parser.add_argument("--scontrol", default="scontrol", help=SCONTROL_HELP)
    commands = parser.add_subparsers(dest="command", required=True)
    pause = commands.add_parser("pause", help="stop every node's drains and repairs at its next health check")
    pause.add_argument("--reason", required=True, help="why, for whoever reads `status` (a ticket, a name)")
    pause.add_argument("--node", help="only this node's Comment carries the switch (default: every node's)")
    commands.add_parser("resume", help="let drains and repairs go on")
    commands.add_parser("status", help="the switch, the breaker's count and the repairs of the last hour")
    return parser


def status(fleet: Fleet, limits: Limits) -> int:
    nodes = fleet.nodes()
    if nodes is None:
        print("accelmon-remediation: cannot list the nodes (scontrol show nodes failed)", file=sys.stderr)
        return 1
    now = time.time()
    pause = pause_of(nodes)
    print(pause.words() if pause else "remediation: on (not paused)")
    out = [n for n in nodes if out_by_accelmon(n, now, limits.breaker_window_seconds)]
    limit, checked = fleet.limit(nodes, pace=False)
    print(fleet.counts_words(len(out), checked, limit, pace=False))
    for node in out:
        print(f"  {node.name:<24} {node.state:<28} {node.reason}")
    repairs = [n for n in nodes if repairing(n, now) or (repaired_at(n) or 0) >= now - HOUR]
    print(fleet.counts_words(len(repairs), len(nodes), int(limits.max_repairs_per_hour), pace=True))
    for node in repairs:
        print(f"  {node.name:<24} {node.state:<28} {node.reason or 'repaired, back in service'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        limits = Options.of(load(args.config)).limits
    except ConfigError as error:
        print(f"accelmon-remediation: {error}", file=sys.stderr)
        return 2
    fleet = Fleet(find_scontrol(args.scontrol), run_scontrol, limits)
    try:
        if args.command == "pause":
            if not args.reason.strip():
                print("accelmon-remediation: --reason: say why (a ticket, a name)", file=sys.stderr)
                return 2
            print(fleet.pause(args.reason.strip(), args.node))
        elif args.command == "resume":
            print(fleet.resume())
        else:
            return status(fleet, limits)
    except RuntimeError as error:
        print(f"accelmon-remediation: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
