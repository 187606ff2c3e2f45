"""DCGM's diagnostic as the Slurm side runs it (`dcgmi diag -r LEVEL -j`): level 1 in the prolog before each job,
level 2 after a GPU reset (accelmon.schedulers.slurm.repair); which tests failed, or that it could not run."""

from __future__ import annotations

import json
import logging
import subprocess
import time
from typing import Any, Callable, Optional

log = logging.getLogger("accelmon.slurm")

DIAG_TIMEOUT_SECONDS = 600  # dcgmi diag -r 2: a few minutes on an H100
# DCGM's host engine restarts with the units stopped around a reset: its diagnostic is asked again for this long
# before "could not run" leaves the node for a person (never a pass).
DIAG_READY_SECONDS = 60.0


def run_long(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=DIAG_TIMEOUT_SECONDS, check=False)


def failed_tests(report: Any) -> list[str]:
    """The names of the tests that failed in `dcgmi diag -j`'s report: every object with a `name` and `results`
    whose result status is Fail (DCGM 3 and 4 nest them differently; both keep these keys)."""
    failed: list[str] = []
    if isinstance(report, dict):
        results = report.get("results")
        if isinstance(report.get("name"), str) and isinstance(results, list):
            statuses = [str(r.get("status", "")).lower() for r in results if isinstance(r, dict)]
            if "fail" in statuses:
                failed.append(report["name"])
        for value in report.values():
            failed += failed_tests(value)
    elif isinstance(report, list):
        for value in report:
            failed += failed_tests(value)
    return failed


def diagnose(
    dcgmi: str, runner: Callable[[list[str]], subprocess.CompletedProcess[str]], level: str = "1"
) -> Optional[list[str]]:
    """The tests `dcgmi diag -r LEVEL` failed ([] when all passed), or None when the diagnostic could not run."""
    try:
        result = runner([dcgmi, "diag", "-r", level, "-j"])
    except (OSError, subprocess.TimeoutExpired) as error:
        log.info("dcgmi diag could not run: %s", error)
        return None
    try:
        report = json.loads(result.stdout)
    except ValueError:
        log.info(
            "dcgmi diag gave no report (status %d): %s", result.returncode, (result.stderr or result.stdout)[-300:]
        )
        return None
    failed = sorted(set(failed_tests(report)))
    if result.returncode != 0 and not failed:
        log.info("dcgmi diag ended with status %d and no failed test: not judged", result.returncode)
        return None
    return failed


def diagnose_when_ready(dcgmi: str, sleep: Callable[[float], None]) -> Optional[list[str]]:
    """`dcgmi diag -r 2` after a reset, asked again while it cannot run (its host engine, stopped around the reset,
    not listening yet) for up to DIAG_READY_SECONDS; None if it never could."""
    deadline = time.monotonic() + DIAG_READY_SECONDS
    while True:
        tests = diagnose(dcgmi, run_long, level="2")
        if tests is not None or time.monotonic() >= deadline:
            return tests
        sleep(5.0)
