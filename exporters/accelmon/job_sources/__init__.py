"""Where batch jobs come from, for every collector and hook that needs to know which job is which. The job
collectors (`jobs`, `job_resources`, `job_perf`), the process collectors (`gpu_processes`, `neuron`) and the
scheduler hooks read jobs through this package only; no collector imports another. One module a source:

- `slurm`: the records of Slurm's prolog (which jobs run here, their user, account and GPUs);
- `oar`: OAR's own job files, read into records of the same keys;
- `records`: those keys, and the bounds on their values;
- `cgroups`: which processes and which cgroup directories are a job's, in the cgroups both schedulers make.

Here: what reads both schedulers' records.
"""

from __future__ import annotations

import os
from typing import Any

from accelmon.job_sources.oar import job_of_file, oar_record_names
from accelmon.job_sources.slurm import read_record, record_names


def recorded_job_ids(state_dir: str, oar_runtime_dir: str = "") -> set[str]:
    """The ids of the jobs with a record (Slurm's prolog's, or OAR's own): what bounds every per-job series."""
    ids = {job_of_file(name) for name in oar_record_names(oar_runtime_dir)}
    for name in record_names(state_dir):
        try:
            job = read_record(os.path.join(state_dir, name))[0].get("job_id", "")
        except OSError:
            continue
        if job.isdigit():
            ids.add(job)
    return ids


def has_job_records(paths: Any, options: dict[str, object]) -> bool:
    """Whether this host keeps job records: accelmon's state directory (made by the role for Slurm) or OAR's."""
    return os.path.isdir(str(options["state_dir"])) or (
        bool(options["oar_runtime_dir"]) and os.path.isdir(str(options["oar_runtime_dir"]))
    )
