"""Slurm's jobs on this node: the role's prolog writes a small `KEY=VALUE` record per job into `state_dir` and its
epilog removes it (`scheduler`, `job_id`, `user`, `account`, `gpus`, comma-separated indices or UUIDs)."""

from __future__ import annotations

import os

from accelmon.exporter.validation import Option
from accelmon.job_sources.records import KEYS, MAX_RECORD_BYTES, clean

# The job records' directory: one declaration, which job_resources and job_perf share and the role reads through
# `--check-config --json` (and renders into the prolog and epilog).
STATE_DIR = Option(
    "state_dir", "/run/accelmon/jobs", "where the scheduler's prolog writes one record per job", shared=True
)


def read_record(path: str) -> tuple[dict[str, str], int]:
    """A job record's known keys, and how many lines were malformed; OSError if it is gone."""
    with open(path, encoding="utf-8", errors="replace") as stream:
        text = stream.read(MAX_RECORD_BYTES)
    record: dict[str, str] = {}
    bad = 0
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not line.strip() or line.startswith("#"):
            continue
        if not sep or key.strip() not in KEYS:
            bad += 1
            continue
        record[key.strip()] = clean(value.strip())
    return record, bad


def record_names(state_dir: str) -> list[str]:
    """The records in the state directory (a name starting with a dot is one being written)."""
    try:
        return sorted(n for n in os.listdir(state_dir) if not n.startswith("."))
    except OSError:
        return []
