"""OAR's jobs on this node (OAR 2.5, Debian's packages), from the files OAR keeps for each.

OAR's job resource manager (`job_resource_manager_cgroups.pl`) runs on every node of a job at its start and end,
and writes there, in OAR's runtime directory (oar.conf OAR_RUNTIME_DIRECTORY, by default /var/lib/oar,
world-readable), `<user>_<job id>.env` (OAR_JOBID, OAR_USER, OAR_PROJECT_NAME as `export KEY='VALUE'`) and
`<job id>_resources` (one line per resource of the job, `property = 'value' ,` pairs); both are removed when the job
ends. The GPUs on this node are the `gpudevice` property (the device minor number, the property OAR's own device
cgroup reads) of the job's resources whose `network_address` is this host (docs/jobs.md). Measured with OAR 2.5.9
in the Molecule `oar` scenario.
"""

from __future__ import annotations

import logging
import os
import re
import socket

from accelmon.exporter.validation import Option
from accelmon.job_sources.records import MAX_RECORD_BYTES, clean

log = logging.getLogger("accelmon.jobs")

OAR_RUNTIME_DIR = Option(
    "oar_runtime_dir",
    "/var/lib/oar",
    "OAR's runtime directory (oar.conf OAR_RUNTIME_DIRECTORY), where OAR keeps a file per job on each of its nodes; "
    "empty: OAR jobs are not read",
    empty=True,
    shared=True,
)
OAR_ENV_FILE = re.compile(r"^(?P<user>.+)_(?P<job>\d+)\.env$")
OAR_ENV_LINE = re.compile(r"^export (OAR_[A-Z_]+)='([^']*)'$")
OAR_PROPERTY = re.compile(r"\s*(\w+) = '([^']*)' ?,?")


def oar_record_names(runtime_dir: str) -> list[str]:
    """OAR's per-job files on this node (`<user>_<job id>.env`); none where OAR is not read."""
    if not runtime_dir:
        return []
    try:
        return sorted(name for name in os.listdir(runtime_dir) if OAR_ENV_FILE.match(name))
    except OSError:
        return []


def read_oar_record(runtime_dir: str, name: str, node: str, gpu_property: str) -> tuple[dict[str, str], int]:
    """An OAR job's record on this node, in the keys of a Slurm one, from OAR's own files (the module's docstring), and
    how many of their lines were malformed; OSError if the job ended meanwhile (OAR removed its files)."""
    match = OAR_ENV_FILE.match(name)
    if match is None:
        return {}, 1
    job = match.group("job")
    with open(os.path.join(runtime_dir, name), encoding="utf-8", errors="replace") as stream:
        lines = stream.read(MAX_RECORD_BYTES).splitlines()
    env: dict[str, str] = {}
    for found in filter(None, map(OAR_ENV_LINE.match, lines)):
        env[found.group(1)] = found.group(2)
    if env.get("OAR_JOBID") != job:
        return {}, 1  # not the file OAR writes for this job
    bad = 0
    gpus: list[str] = []
    try:
        with open(os.path.join(runtime_dir, job + "_resources"), encoding="utf-8", errors="replace") as stream:
            for line in stream:  # one line per resource of the job, on every node: a large job's file is large
                if not line.strip():
                    continue
                properties = dict(OAR_PROPERTY.findall(line)) if len(line) <= MAX_RECORD_BYTES else {}
                if "network_address" not in properties:
                    bad += 1
                    continue
                if properties.get("type", "default") != "default" or _short(properties["network_address"]) != node:
                    continue
                gpu = properties.get(gpu_property, "")
                if gpu and gpu not in gpus:
                    gpus.append(gpu)
    except FileNotFoundError:
        pass  # OAR writes it before the .env and removes it after: a job without it has no GPUs to name
    record = {
        "scheduler": "oar",
        "job_id": job,
        "user": clean(env.get("OAR_USER", match.group("user"))),
        "account": clean(env.get("OAR_PROJECT_NAME", "")),
        "gpus": clean(",".join(gpus)),
    }
    return record, bad


def job_of_file(name: str) -> str:
    """The job id in the name of OAR's `<user>_<job id>.env`."""
    match = OAR_ENV_FILE.match(name)
    return match.group("job") if match else ""


def _short(host: str) -> str:
    return host.split(".")[0].lower()


class OarJobs:
    """OAR's jobs on this node, from the files OAR keeps for each (the module's docstring). A file is parsed again only
    when it changed, so its malformed lines are counted once and a large job's resource list is not re-read."""

    def __init__(self, runtime_dir: str, node_name: str = "", gpu_property: str = "gpudevice") -> None:
        self.runtime_dir = runtime_dir
        self.node = _short(node_name or socket.gethostname())
        self.gpu_property = gpu_property
        self.malformed = 0
        self._parsed: dict[str, tuple[tuple[int, ...], dict[str, str]]] = {}  # name -> (files' versions, record)

    def records(self) -> list[dict[str, str]]:
        records = []
        parsed = {}
        for name in oar_record_names(self.runtime_dir):
            path = os.path.join(self.runtime_dir, name)
            resources = os.path.join(self.runtime_dir, job_of_file(name) + "_resources")
            try:
                version = _version(path) + _version(resources)
                if name in self._parsed and self._parsed[name][0] == version:
                    record = self._parsed[name][1]
                else:
                    record, bad = read_oar_record(self.runtime_dir, name, self.node, self.gpu_property)
                    if bad:
                        self.malformed += bad
                        log.warning("OAR job files %s: %d malformed line(s) skipped", path, bad)
            except OSError:
                continue  # the job ended while being read
            parsed[name] = (version, record)
            if record:
                records.append(record)
        self._parsed = parsed
        return records


def _version(path: str) -> tuple[int, ...]:
    """A file's (mtime, size), or () for a file that is not there."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return ()
    return (status.st_mtime_ns, status.st_size)
