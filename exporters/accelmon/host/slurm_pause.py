"""The pause switch over every node's drains and repairs (`accelmon-remediation pause`, docs/health.md, "Pause and
resume"): `accelmon-paused=EPOCH:REASON` in the nodes' Slurm Comments, which every check's listing reads anyway, and
what each node remembers of it (PauseMemory), so that one command erasing every Comment does not end it unseen.
accelmon writes only its own tokens of a Comment; the rest is kept as it was. accelmon.schedulers.slurm.fleet sets and
reads it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.parse
from dataclasses import dataclass
from typing import Optional

from accelmon.host.slurm_nodes import SlurmNode

log = logging.getLogger("accelmon.slurm")

PAUSED = re.compile(r"accelmon-paused=(\d+(?:\.\d+)?):(\S*)")
# What `accelmon-remediation resume` leaves in every Comment: a node that remembers a pause forgets it only for this.
RESUMED = re.compile(r"accelmon-resumed=(\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class Pause:
    node: str  # the node whose Comment carries the switch
    since: float
    reason: str

    def words(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.since))
        return f"remediation paused since {when} (on node {self.node}): {self.reason}"


class PauseMemory:
    """The pause this node's check last saw, kept beside its journal. `scontrol update NodeName=ALL Comment=...` erases
    the switch from every carrier at once; a pause that vanishes so, without `accelmon-remediation resume` (which
    leaves `accelmon-resumed=EPOCH` in every Comment), still holds on every node that saw it, and says so (the
    exporter serves it: accelmon_remediation_pause_vanished, AccelmonRemediationPauseVanished)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> Optional[dict[str, object]]:
        try:
            with open(self.path, encoding="utf-8") as stream:
                data = json.load(stream)
            return data if isinstance(data, dict) and isinstance(data.get("since"), (int, float)) else None
        except (OSError, ValueError):
            return None

    def keep(self, pause: Pause, vanished: bool) -> None:
        data = {"node": pause.node, "since": pause.since, "reason": pause.reason, "vanished": vanished}
        if self.read() == data:
            return
        temporary = f"{self.path}.tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as stream:
                json.dump(data, stream)
                stream.flush()
                os.fsync(stream.fileno())
            os.chmod(temporary, 0o644)  # the exporter (another user) reads it; no secret in it
            os.replace(temporary, self.path)
        except OSError as error:
            log.error("cannot remember the pause in %s: %s", self.path, error)

    def forget(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as error:
            log.error("cannot forget the pause in %s: %s", self.path, error)


def without_resume(comment: str) -> str:
    return with_token(comment, RESUMED, "")


def paused_path(journal: str) -> str:
    """Where a node remembers the pause: beside its journal."""
    return os.path.join(os.path.dirname(journal) or ".", "remediation.paused")


def resumed(nodes: list[SlurmNode]) -> bool:
    """Whether `accelmon-remediation resume` ran since the last pause: `pause` removes every resume marker and
    `resume` leaves one, so any marker says so, whatever the clocks of the hosts that ran them."""
    return any(RESUMED.search(node.comment) for node in nodes)


def pause_of(nodes: list[SlurmNode]) -> Optional[Pause]:
    for node in sorted(nodes, key=lambda n: n.name):
        found = PAUSED.search(node.comment)
        if found:
            return Pause(node.name, float(found.group(1)), urllib.parse.unquote(found.group(2)))
    return None


def with_token(comment: str, pattern: re.Pattern[str], token: str) -> str:
    """`comment` with accelmon's token of this kind replaced by `token` ("" removes it); the rest as it was."""
    kept = " ".join(pattern.sub("", comment).split())
    return " ".join(part for part in (kept, token) if part)


def current_token(pause: Pause) -> str:
    """The switch's token as it is set (pausing again spreads the same switch, its time and reason kept)."""
    return f"accelmon-paused={int(pause.since)}:{urllib.parse.quote(pause.reason, safe='')}"
