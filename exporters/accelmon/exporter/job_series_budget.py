"""The node's budget for its job-level NCCL series: the nccl collector's (RAS) and the nccl_inspector collector's
together. What the two share is here, in the exporter's machinery beside the sampler that serves them (a collector
never imports another, and a host library turns no reading into a series: docs/architecture.md; docs/jobs.md, "One
node's NCCL series, bounded").

Why a budget of the node: the master takes a worker's scrape whole or not at all. Prometheus fails the whole scrape
of a target that returns more samples than its `sample_limit` (scrape/target.go: errSampleLimit; the master role's
accelmon_master_scrape_sample_limit, 20,000), and with it every GPU series of the node. Each job's NCCL series are
bounded (max_communicators, max_ranks: up to about 1,900 an answer, one answer a step port, four ports a job), but the
jobs of a node are not: 12 jobs of 4 steps at the bounds were 89,000 series. So every sample, the job-level series of
both collectors are fitted in `max_job_series`: each job's summary is always served (a few series: its communicators by
status, its most ranks missing, what RAS left out), and where the jobs' detail (per communicator, per rank) does not
fit, the largest jobs' detail is dropped whole, the smallest kept first, ties by job id: the same jobs on every
sample of the same answers. Device series are never in it: they are other collectors'.
"""

from __future__ import annotations

import threading

from accelmon.exporter.metrics import Samples
from accelmon.exporter.registry import Option

# An 8-GPU node serves about 1,900 series besides NCCL's (measured on the Molecule cluster's 8-GPU workers:
# 1,862-1,872 a scrape; tests/test_nccl.py checks this default against the master role's sample_limit): 8,000 keeps the
# node under half the master's 20,000 and gives one job's four steps their whole detail (4 x 1,920 at the defaults).
DEFAULT = 8000
MAXIMUM = 18000  # the master's default sample_limit less about what the node serves besides
MAX_JOB_SERIES = Option(
    "max_job_series", float(DEFAULT),
    "job-level NCCL series this node serves, the nccl and nccl_inspector collectors together (keep it under the "
    "master's sample_limit less the node's other series): past it, each job's summary is kept and the largest jobs' "
    "per-communicator and per-rank series dropped and counted", minimum=100, maximum=MAXIMUM, whole=True, shared=True,
)  # fmt: skip
REASONS = ("node_budget",)  # why a job's detail was not served: the node's max_job_series


def size(samples: Samples) -> int:
    return sum(len(rows) for rows in samples.rows.values())


class Ledger:
    """What each collector of the budget serves now: they sample on threads of their own, each fitting its jobs in
    what the other's latest sample left (so the two together never pass the budget)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def fit(self, source: str, budget: int, jobs: dict[str, tuple[Samples, Samples]]) -> tuple[Samples, int, int]:
        """`jobs`: job id -> (its summary, its detail). Returns what is served, the series dropped and the jobs whose
        detail was dropped."""
        out = Samples()
        for summary, _ in jobs.values():
            out.extend(summary)
        served, dropped, cut = size(out), 0, 0
        with self._lock:
            room = budget - sum(held for name, held in self._held.items() if name != source) - served
            for job in sorted(jobs, key=lambda job: (size(jobs[job][1]), job)):
                detail = jobs[job][1]
                if not detail.rows:
                    continue
                if cut or size(detail) > room:  # this one and every larger one after it
                    dropped, cut = dropped + size(detail), cut + 1
                    continue
                out.extend(detail)
                room -= size(detail)
                served += size(detail)
            self._held[source] = served
        return out, dropped, cut


LEDGER = Ledger()  # the exporter's one: the collectors it builds share it
