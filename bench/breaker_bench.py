"""The circuit breaker when every node checks at once: N health checks with the same failing verdict meet a fake
controller (tests/support/fake_scontrol.py: it serialises calls as slurmctld does and stamps reasons with the real
time) at the same moment; how many nodes end up drained, for "count, then drain" (what accelmon shipped before
issue 48) and for accelmon.schedulers.slurm.fleet's claim-and-verify, side by side.

    python -m bench.breaker_bench [--nodes 20] [--rounds 3] [--limit 3]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tests.support.fake_scontrol import Cluster

from accelmon.host.slurm_nodes import run_scontrol
from accelmon.schedulers.slurm.fleet import Fleet, Limits, out_by_accelmon


def run(command: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_scontrol(command, timeout)


def count_then_drain(fleet: Fleet, node: str, reason: str) -> None:
    """The shipped breaker: count the nodes out, drain while under the limit."""
    nodes = fleet.nodes() or []
    out = [n for n in nodes if out_by_accelmon(n, time.time(), fleet.limits.breaker_window_seconds)]
    if len(out) < fleet.limits.breaker_limit(len(nodes)):
        fleet.update(node, "State=DRAIN", f"Reason={reason}")


def one_round(nodes: int, limit: int, verify: bool) -> tuple[int, float]:
    """Drained nodes and seconds for one round of `nodes` checks at once."""
    with tempfile.TemporaryDirectory() as directory:
        names = [f"gpu-{n:03d}" for n in range(nodes)]
        cluster = Cluster(Path(directory), {name: "IDLE" for name in names})
        cluster.change(meet=nodes, listings=0)
        limits = Limits(breaker_min_nodes=limit, breaker_fraction=0.01)
        reason = "accelmon: GPU 2 xid: reboot_node"

        def check(name: str) -> None:
            fleet = Fleet(str(cluster.command), run, limits)
            if verify:
                fleet.drain(name, reason)
            else:
                count_then_drain(fleet, name, reason)

        started = time.monotonic()
        threads = [threading.Thread(target=check, args=(name,)) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        drained = sum(1 for node in cluster.nodes().values() if "DRAIN" in node["state"])
        return drained, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.nodes} checks at once, the same failing verdict, limit {args.limit}")
    print(f"{'breaker':<22} {'drained (each round)':<28} {'seconds a round':>16}")
    for verify, name in ((False, "count, then drain"), (True, "claim and verify")):
        results = [one_round(args.nodes, args.limit, verify) for _ in range(args.rounds)]
        drained = ", ".join(str(d) for d, _ in results)
        seconds = sum(s for _, s in results) / len(results)
        print(f"{name:<22} {drained:<28} {seconds:>16.1f}")


if __name__ == "__main__":
    main()
