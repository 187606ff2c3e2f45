"""Where the drills in force are kept (accelmon-drill writes them, the health checks and the infiniband collector
read them): one small JSON file per drilled GPU and check, or NIC port, in `drill_dir` (default /run/accelmon/drills:
it survives an exporter restart, not a reboot). Root's directory; the exporter only reads it."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from typing import Any, Optional

from accelmon.exporter.checks import ActiveDrill
from accelmon.exporter.validation import Option

log = logging.getLogger("accelmon.drill")

DRILL_DIR = Option(
    "drill_dir",
    "/run/accelmon/drills",
    "where accelmon-drill keeps the drills in force (root's; the exporter reads them): a drilled GPU is judged as "
    "if the fault were real, a drilled NIC port is served as a drill",
    shared=True,
)
MAX_DRILL_BYTES = 4096


def file_name(gpu: str, check: str) -> str:
    return f"gpu{gpu}-{check}.json"


def files(drill_dir: str, prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, record) of each drill file in `drill_dir` whose name starts with `prefix` (`gpu`: a GPU's drills,
    gpuN-CHECK.json; `nccl-job`: accelmon.drills.nccl_drill's). A file that is not JSON is skipped and logged: a stray
    file never stops the checks."""
    try:
        names = sorted(name for name in os.listdir(drill_dir) if name.startswith(prefix) and name.endswith(".json"))
    except OSError:
        return []
    found = []
    for name in names:
        try:
            with open(os.path.join(drill_dir, name), "rb") as handle:
                record = json.loads(handle.read(MAX_DRILL_BYTES))
        except (OSError, ValueError) as error:
            log.warning("drill file %s skipped: %s", name, error)
            continue
        if isinstance(record, dict):
            found.append((name, record))
    return found


def read(drill_dir: str, now: Optional[float] = None) -> list[ActiveDrill]:
    """The GPU drills in `drill_dir` (expired ones when `now` is None, too), sorted by GPU and check. A file that is
    not a drill is skipped and logged."""
    found = []
    for name, record in files(drill_dir, "gpu"):
        try:
            drill = ActiveDrill(
                gpu=str(record["gpu"]),
                check=str(record["check"]),
                started=float(record["started"]),
                expires=float(record["expires"]),
                xid=int(record.get("xid", 0)),
            )
        except (ValueError, KeyError, TypeError) as error:
            log.warning("drill file %s skipped: %s", name, error)
            continue
        if now is None or drill.started <= now < drill.expires:
            found.append(drill)
    return sorted(found, key=lambda d: (int(d.gpu) if d.gpu.isdigit() else 1 << 30, d.check))


def write(drill_dir: str, drill: ActiveDrill) -> str:
    return write_record(drill_dir, file_name(drill.gpu, drill.check), asdict(drill))


def write_record(drill_dir: str, name: str, record: dict[str, Any]) -> str:
    """Writes a drill's file atomically (a reader never sees half a file); the directory is made root's, 0755."""
    os.makedirs(drill_dir, mode=0o755, exist_ok=True)
    path = os.path.join(drill_dir, name)
    handle, temporary = tempfile.mkstemp(dir=drill_dir, prefix=".drill-")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(record, out)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return path


def nic_file_name(device: str, port: str) -> str:
    return f"nic-{device}-{port}.json"


@dataclass(frozen=True)
class NicDrill:
    """A NIC port rehearsed as at fault (accelmon-drill nic)."""

    device: str
    port: str
    started: float
    expires: float


def nic_drills(drill_dir: str, now: Optional[float] = None) -> list[NicDrill]:
    """The NIC port drills in `drill_dir`, those in force at `now` (every one when None), by device and port. A file
    that is not one is skipped and logged."""
    found = []
    for name, record in files(drill_dir, "nic-"):
        try:
            drill = NicDrill(str(record["device"]), str(record["port"]), float(record["started"]),
                             float(record["expires"]))  # fmt: skip
        except (ValueError, KeyError, TypeError) as error:
            log.warning("drill file %s skipped: %s", name, error)
            continue
        if now is None or drill.started <= now < drill.expires:
            found.append(drill)
    return sorted(found, key=lambda d: (d.device, d.port))


def remove_nic(drill_dir: str, drill: NicDrill) -> None:
    try:
        os.unlink(os.path.join(drill_dir, nic_file_name(drill.device, drill.port)))
    except FileNotFoundError:
        pass


def remove(drill_dir: str, drill: ActiveDrill) -> None:
    try:
        os.unlink(os.path.join(drill_dir, file_name(drill.gpu, drill.check)))
    except FileNotFoundError:
        pass
