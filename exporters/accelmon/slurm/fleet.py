"""The fleet-wide limits every node's health check keeps, through the controller alone (docs/health.md, "Holding
when every node checks at once"): no service of accelmon's runs anywhere but on the nodes themselves.

Slurm starts every node's HealthCheckProgram in the same instant, so "count, then drain" is a race: twenty checks
that all count two nodes out under a limit of three all drain. Here a node claims its place and then verifies it by
the order Slurm itself recorded:

1. it counts what is out (a pause switch on, or as many as the limit already out: it holds, nothing changed);
2. it claims (drains, or marks its repair in its reason): slurmctld serialises updates and stamps each reason with
   its own clock, to the second;
3. it waits SETTLE_SECONDS: by then the controller's clock has passed the second of its stamp, so every claim
   stamped at or before its own is in the next listing;
4. it lists again and ranks the claims by (stamp, node name): a node ranked at or past the limit takes its own claim
   back and says so.

A node that keeps its claim saw, complete, every claim ranked before its own; so the (limit + 1)-th claim in that
order always sees the limit reached, and no more than the limit stay out however the checks interleave (the proof is
in docs/health.md). The first claim in that order always stays: a fleet-wide false verdict still takes one node out.
When the controller cannot be read, nothing is claimed (fail closed: a controller loaded by every node at once is
exactly when counting fails).

The repair pace (at most max_repairs_per_hour reboots and resets over the fleet) is the same claim over repair
reasons, plus the repairs of the last hour that ended: each repaired node keeps `accelmon-repaired=EPOCH` in its
Comment. The pause switch is `accelmon-paused=EPOCH:REASON` in one node's Comment (`accelmon-remediation pause`): any
node's check sees it in the listing it reads anyway. accelmon writes only its own part of a Comment; the rest is
kept as it was.
"""

from __future__ import annotations

import logging
import math
import re
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from typing import Callable, Optional

from accelmon.slurm.nodes import Listing, Run, SlurmNode

log = logging.getLogger("accelmon.slurm")

# Reasons are stamped to the second by the controller's clock: after this long past our own update's answer, the
# controller's clock has passed that second (with room for a slow answer), so every update stamped at or before ours
# has been applied and shows in a listing.
SETTLE_SECONDS = 2.5
HOUR = 3600.0
REPAIRING = ("accelmon: reboot pending", "accelmon: resetting")  # the reasons of a repair under way
PAUSED = re.compile(r"accelmon-paused=(\d+(?:\.\d+)?):(\S*)")
REPAIRED = re.compile(r"accelmon-repaired=(\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class Limits:
    breaker_min_nodes: float = 3
    breaker_fraction: float = 0.1
    breaker_window_seconds: float = 24 * HOUR
    max_repairs_per_hour: float = 3

    def breaker_limit(self, listed: int) -> int:
        return max(int(self.breaker_min_nodes), math.ceil(self.breaker_fraction * listed))


@dataclass(frozen=True)
class Pause:
    node: str  # the node whose Comment carries the switch
    since: float
    reason: str

    def words(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.since))
        return f"remediation paused since {when} (on node {self.node}): {self.reason}"


@dataclass(frozen=True)
class Decision:
    """What a claim came to. `outcome`: claimed (the node is out / the repair may start); held (the limit was
    reached before: nothing changed); ranked_out (claimed, then ranked past the limit: taken back); paused;
    uncounted (the controller could not be read: nothing claimed); failed (Slurm refused the update)."""

    outcome: str
    words: str
    out: int = 0  # what counted against the limit
    listed: int = 0
    limit: int = 0

    @property
    def claimed(self) -> bool:
        return self.outcome == "claimed"

    @property
    def counts(self) -> tuple[int, int, int]:
        return (self.out, self.listed, self.limit)


def pause_of(nodes: list[SlurmNode]) -> Optional[Pause]:
    for node in sorted(nodes, key=lambda n: n.name):
        found = PAUSED.search(node.comment)
        if found:
            return Pause(node.name, float(found.group(1)), urllib.parse.unquote(found.group(2)))
    return None


def repaired_at(node: SlurmNode) -> Optional[float]:
    found = REPAIRED.search(node.comment)
    return float(found.group(1)) if found else None


def with_token(comment: str, pattern: re.Pattern[str], token: str) -> str:
    """`comment` with accelmon's token of this kind replaced by `token` ("" removes it); the rest as it was."""
    kept = " ".join(pattern.sub("", comment).split())
    return " ".join(part for part in (kept, token) if part)


def out_by_accelmon(node: SlurmNode, now: float, window: float) -> bool:
    """Out with a reason accelmon wrote within the window (a node out for weeks, sent for service, no longer uses the
    budget). A reason without a stamp counts: unsure, it holds."""
    return node.out and node.accelmons and (node.reason_time is None or node.reason_time >= now - window)


def repairing(node: SlurmNode, now: float) -> bool:
    return node.reason.startswith(REPAIRING) and (node.reason_time is None or node.reason_time >= now - HOUR)


def order(node: SlurmNode) -> tuple[float, str]:
    return (node.reason_time if node.reason_time is not None else -math.inf, node.name)


class Fleet:
    """The controller as every node's check uses it: listing, updates, and the claims above."""

    def __init__(
        self, scontrol: str, runner: Run, limits: Limits, now: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep, settle: float = SETTLE_SECONDS, dry_run: bool = False,
    ) -> None:  # fmt: skip
        self.scontrol, self.runner, self.limits = scontrol, runner, limits
        self.now, self.sleep, self.settle, self.dry_run = now, sleep, settle, dry_run
        self.listing = Listing(scontrol, self.call)

    def call(self, command: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            return self.runner(command)
        except (OSError, subprocess.TimeoutExpired) as error:
            log.error("scontrol failed (%s): %s", " ".join(command[1:3]), error)
            return subprocess.CompletedProcess(command, 1, "", str(error))

    def nodes(self) -> Optional[list[SlurmNode]]:
        return self.listing.read()

    def node(self, name: str) -> Optional[SlurmNode]:
        found = self.listing.read(name)
        if not found:
            return None
        return next((n for n in found if n.name == name), found[0])

    def update(self, name: str, *fields: str) -> Optional[str]:
        """scontrol update NodeName=NAME FIELDS...; why it failed, or None."""
        if self.dry_run:
            log.warning("would run: scontrol update NodeName=%s %s", name, " ".join(fields))
            return "dry run"
        result = self.call([self.scontrol, "update", f"NodeName={name}", *fields])
        if result.returncode != 0:
            return (result.stderr or result.stdout).strip()[-200:] or f"status {result.returncode}"
        return None

    # --- the circuit breaker --------------------------------------------------------------------------------------
    def drain(self, name: str, reason: str) -> Decision:
        """Drains `name` with `reason` within the breaker (see the module's text)."""
        now = self.now()
        window = self.limits.breaker_window_seconds
        counted = lambda nodes: [n for n in nodes if out_by_accelmon(n, now, window)]  # noqa: E731
        before = self.held(self.nodes(), counted, "drain")
        if before is not None:
            return before
        failed = self.update(name, "State=DRAIN", f"Reason={reason}")
        if failed:
            return Decision("failed", f"scontrol could not drain {name}: {failed}")
        ahead = lambda n, mine: out_by_accelmon(n, now, window) and order(n) < order(mine)  # noqa: E731
        return self.verify(name, ahead, lambda: self.update(name, "State=UNDRAIN"), "drain")

    # --- the repair pace ------------------------------------------------------------------------------------------
    def claim_repair(self, node: SlurmNode, reason: str) -> Decision:
        """Marks `node`'s repair in its reason (`reason` starts with one of REPAIRING) within max_repairs_per_hour
        over the fleet; on a claim kept, its Comment records the repair for the hour's count."""
        now = self.now()

        def recent(node: SlurmNode) -> bool:  # repaired (started) within the hour, by its Comment
            return (repaired_at(node) or 0) >= now - HOUR

        def counted(nodes: list[SlurmNode]) -> list[SlurmNode]:
            return [n for n in nodes if repairing(n, now) or recent(n)]

        def ahead(other: SlurmNode, mine: SlurmNode) -> bool:
            return recent(other) or (repairing(other, now) and order(other) < order(mine))

        before = self.held(self.nodes(), counted, "repair", pace=True)
        if before is not None:
            return before
        failed = self.update(node.name, "State=DRAIN", f"Reason={reason}")
        if failed:
            return Decision("failed", f"scontrol could not mark the repair of {node.name}: {failed}")
        back = lambda: self.update(node.name, "State=DRAIN", f"Reason={node.reason}")  # noqa: E731
        decision = self.verify(node.name, ahead, back, "repair", pace=True, own=1 if recent(node) else 0)
        if decision.claimed:
            comment = with_token(node.comment, REPAIRED, f"accelmon-repaired={int(now)}")
            failed = self.update(node.name, f"Comment={comment}")
            if failed:  # the repair is still visible by its reason while it runs; the hour's count loses it after
                log.error("scontrol could not note the repair in %s's Comment: %s", node.name, failed)
        return decision

    # --- both -----------------------------------------------------------------------------------------------------
    def limit(self, listed: int, pace: bool) -> int:
        return int(self.limits.max_repairs_per_hour) if pace else self.limits.breaker_limit(listed)

    def held(
        self, nodes: Optional[list[SlurmNode]], counted: Callable[[list[SlurmNode]], list[SlurmNode]], what: str,
        pace: bool = False,
    ) -> Optional[Decision]:  # fmt: skip
        """Why the claim is not even tried (the count failed, the switch is on, the limit is reached), or None."""
        if not nodes:
            return Decision("uncounted", f"cannot count the nodes (scontrol show nodes failed): no {what}, holding")
        pause = pause_of(nodes)
        if pause is not None:
            return Decision("paused", f"{pause.words()}: no {what}")
        out, limit = len(counted(nodes)), self.limit(len(nodes), pace)
        if out >= limit:
            return Decision("held", f"{self.counts_words(out, len(nodes), limit, pace)}: no {what}", out, len(nodes),
                            limit)  # fmt: skip
        return None

    def verify(
        self, name: str, ahead_of: Callable[[SlurmNode, SlurmNode], bool], take_back: Callable[[], Optional[str]],
        what: str, pace: bool = False, own: int = 0,
    ) -> Decision:  # fmt: skip
        """After a claim: wait for the stamps to settle, rank, and keep the claim or take it back. `ahead_of(other,
        mine)`: whether another node's claim counts before this one; `own`: this node's own count (a repair of the
        hour already)."""
        self.sleep(self.settle)
        nodes = self.nodes()
        mine = next((n for n in nodes or [] if n.name == name), None)
        if not nodes or mine is None:
            self.give_back(take_back, name)
            return Decision("uncounted", f"cannot verify the {what} (scontrol show nodes failed): taken back, holding")
        pause = pause_of(nodes)
        if pause is not None:
            self.give_back(take_back, name)
            return Decision("paused", f"{pause.words()}: the {what} taken back")
        ahead = own + sum(1 for n in nodes if n.name != name and ahead_of(n, mine))
        limit = self.limit(len(nodes), pace)
        words = self.counts_words(ahead, len(nodes), limit, pace)
        if ahead >= limit:
            self.give_back(take_back, name)
            return Decision("ranked_out", f"{words} ahead of {name}: the {what} taken back", ahead, len(nodes), limit)
        return Decision("claimed", f"{words} ahead of {name}: {what} allowed", ahead, len(nodes), limit)

    def give_back(self, take_back: Callable[[], Optional[str]], name: str) -> None:
        failed = take_back()
        if failed:
            log.error("could not take back the claim on %s: %s", name, failed)

    def counts_words(self, out: int, listed: int, limit: int, pace: bool) -> str:
        if pace:
            return f"repair pace: {out} repair(s) in the last hour, limit {limit}"
        hours = self.limits.breaker_window_seconds / HOUR
        return f"circuit breaker: {out} node(s) out by accelmon in {hours:g} h of {listed}, limit {limit}"

    # --- the pause switch -----------------------------------------------------------------------------------------
    def pause(self, reason: str, carrier: Optional[str] = None) -> str:
        """Sets the switch in one node's Comment (`carrier`, else the first node by name); what was done."""
        nodes = self.nodes()
        if not nodes:
            raise RuntimeError("cannot list the nodes (scontrol show nodes failed): not paused")
        current = pause_of(nodes)
        if current is not None:
            return f"already {current.words()}"
        chosen = next((n for n in nodes if n.name == carrier), None) if carrier else min(nodes, key=lambda n: n.name)
        if chosen is None:
            raise RuntimeError(f"Slurm lists no node {carrier}: not paused")
        token = f"accelmon-paused={int(self.now())}:{urllib.parse.quote(reason, safe='')}"
        failed = self.update(chosen.name, f"Comment={with_token(chosen.comment, PAUSED, token)}")
        if failed:
            raise RuntimeError(f"scontrol could not set the switch on {chosen.name}: {failed}")
        return f"paused: every node's drains and repairs stop at its next health check (switch on node {chosen.name})"

    def resume(self) -> str:
        nodes = self.nodes()
        if nodes is None:
            raise RuntimeError("cannot list the nodes (scontrol show nodes failed): still paused")
        carriers = [n for n in nodes if PAUSED.search(n.comment)]
        for node in carriers:
            failed = self.update(node.name, f"Comment={with_token(node.comment, PAUSED, '')}")
            if failed:
                raise RuntimeError(f"scontrol could not clear the switch on {node.name}: {failed}")
        return "resumed: drains and repairs go on" if carriers else "not paused: nothing to do"
