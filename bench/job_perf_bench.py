"""What per-job perf counters cost: the job's slowdown with its counters open (a CPU-bound job, and the worst case, a
job that does nothing but switch context), and the exporter's CPU to read them.

Each workload runs in a real cgroup `job_1` (tests/support/perf_cgroup.py), alternately with the job_perf
collector's counters open on it and with none, `--runs` times each; the figure is the median wall time's change.
Then the collector's sample (read and scale every counter) is timed in a loop: CPU microseconds per counter read.
Whatever events count on this machine are opened (on our VMs: the three software events; a host with a PMU adds the
hardware and FLOPS events).

Run (root, it makes a cgroup): .venv/bin/python -m bench.job_perf_bench [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.perf_cgroup import job_cgroup

from accelmon.collectors.job_perf import JobPerfCollector

WORKLOADS = {
    # A CPU-bound job: arithmetic in one process, few context switches.
    "cpu-bound (2.5e7 multiply-adds)": "s = 0\nfor i in range(25_000_000): s += i * i\n",
    # The worst case for cgroup counters (the kernel switches them at every context switch): two processes passing
    # one byte back and forth through pipes.
    "context switches (2 x 30,000 pipe round trips)": (
        "import os\nr1, w1 = os.pipe(); r2, w2 = os.pipe()\n"
        "if os.fork() == 0:\n    for _ in range(30000): os.read(r1, 1); os.write(w2, b'x')\n    os._exit(0)\n"
        "for _ in range(30000): os.write(w1, b'x'); os.read(r2, 1)\nos.wait()\n"
    ),
}


def run_in(job: Path, code: str) -> float:
    """Wall seconds of `code` run by a Python process placed in the job's cgroup before it starts working."""
    worker = subprocess.Popen(
        [sys.executable, "-c", f"import sys\nsys.stdin.readline()\n{code}"], stdin=subprocess.PIPE
    )
    (job / "cgroup.procs").write_text(str(worker.pid))
    started = time.perf_counter()
    worker.communicate(b"go\n", timeout=600)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="accelmon-perf-bench-") as work:
        root = Path(work)
        (root / "jobs").mkdir()
        (root / "jobs" / "slurm-1").write_text("scheduler=slurm\njob_id=1\nuser=bench\n")
        with job_cgroup(root, 1) as job:
            collector = JobPerfCollector(str(root / "jobs"), str(root / "sys"), "/proc", 8192)
            collector.start()
            counting = sorted(label for label, reason in collector.availability.items() if reason == "counting")
            print(f"events counting here: {', '.join(counting)}")
            for name, code in WORKLOADS.items():
                plain, counted = [], []
                for _ in range(args.runs):
                    collector.stop()  # no counter open
                    plain.append(run_in(job, code))
                    collector.sample()  # opens the job's counters
                    counted.append(run_in(job, code))
                base, with_counters = statistics.median(plain), statistics.median(counted)
                print(
                    f"{name}: {base:.3f} s without counters, {with_counters:.3f} s with "
                    f"({100 * (with_counters / base - 1):+.2f} %, median of {args.runs})"
                )
            collector.sample()
            counters = sum(len(fds) for state in collector.jobs.values() for fds in state.counters.values())
            loops = 2000
            cpu = time.process_time()
            for _ in range(loops):
                collector.sample()
            per_sample = (time.process_time() - cpu) / loops
            print(
                f"exporter: {1e6 * per_sample:.0f} us CPU per sample of {counters} counters "
                f"({1e6 * per_sample / max(counters, 1):.1f} us per counter, cgroup walk included)"
            )
            collector.stop()


if __name__ == "__main__":
    main()
