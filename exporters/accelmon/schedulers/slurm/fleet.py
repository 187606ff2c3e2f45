"""The fleet-wide limits every node's health check keeps, through the controller alone (docs/health.md, "Holding
when every node checks at once" and "Converging under faults"): no service of accelmon's runs anywhere but on the
nodes themselves.

Slurm starts every node's HealthCheckProgram in the same instant, so "count, then drain" is a race: twenty checks
that all count two nodes out under a limit of three all drain. Here a node claims its place and then verifies it by
the order Slurm itself recorded:

1. it counts what is out (a pause switch on, or as many as the limit already out: it holds, nothing changed); with
   too little of the check's time left to verify a claim (slurmd kills a check at 60 s), it holds too;
2. it claims (drains, or marks its repair in its reason): slurmctld serialises updates and stamps each reason with
   its own clock, to the second. A claim whose answer was lost (a timeout, "Socket timed out on send/recv") may have
   been applied: the next listing says;
3. it waits SETTLE_SECONDS: by then the controller's clock has passed the second of its stamp, so every claim
   stamped at or before its own is in the next listing;
4. it lists again and ranks the drains by when each node first went out (`out_since`: the stamp of its first drain,
   which accelmon writes into every later reason of its own, so repair claims, escalations and Slurm's own
   ": reboot issued" never move it), then name: a node ranked at or past the limit takes its own claim back, only
   while its reason is still the one it wrote, and says so.

That is a one-shot argument, and checks do not always finish: slurmd kills them, answers are lost, an UNDRAIN fails.
So at every check of a node out by a drain that was never verified (its answer lost, its take-back failed, its check
killed before it ranked: the journal says `unverified`) the same rank is taken again (`keep`), and a node ranked at or
past the limit takes its drain back: after any round of faults, the next round of checks that completes leaves no more
than the limit out of those. A drain verified within the limit at its time is never taken back, whatever the limit
becomes later (nodes powered down or removed): it stays until its node passes, as NHC's would.

The limit is a share of the nodes accelmon checks (`breaker_nodes`: nodes with a GPU gres by default), not of every
node Slurm lists; powered-down nodes, FUTURE nodes and nodes down for another reason are not in it. When the
controller cannot be read, nothing is claimed (fail closed: a controller loaded by every node at once is exactly
when counting fails).

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

from accelmon.host.slurm_nodes import DRAINED, Listing, SlurmNode, keyed_reason
from accelmon.host.slurm_pause import (
    PAUSED,
    RESUMED,
    Pause,
    PauseMemory,
    current_token,
    pause_of,
    resumed,
    with_token,
    without_resume,
)  # fmt: skip

log = logging.getLogger("accelmon.slurm")

# Reasons are stamped to the second by the controller's clock: after this long past our own update's answer, the
# controller's clock has passed that second (with room for a slow answer), so every update stamped at or before ours
# has been applied and shows in a listing.
SETTLE_SECONDS = 2.5
HOUR = 3600.0
CALL_TIMEOUT_SECONDS = 20.0  # one scontrol call at most
# slurmd kills a HealthCheckProgram that runs past 60 s (slurm.conf(5), HealthCheckProgram): the whole check, its
# scan included, ends within this, with room to exit.
CHECK_BUDGET_SECONDS = 50.0
MIN_CALL_SECONDS = 2.0  # a call left less time than this is not made: it would only be killed
REPAIRING = ("accelmon: reboot pending", "accelmon: resetting")  # the reasons of a repair under way
REPAIRED = re.compile(r"accelmon-repaired=(\d+(?:\.\d+)?)")
SELECTOR = re.compile(r"(gres|partition|feature):(\S+)")

# scontrol and the other commands a check runs: (command, timeout in seconds) -> the result.
Run = Callable[[list[str], float], "subprocess.CompletedProcess[str]"]


class Budget:
    """The time a run has left, on a monotonic clock (`seconds` from its creation)."""

    def __init__(self, seconds: float = math.inf, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.ends = clock() + seconds

    def left(self) -> float:
        return self.ends - self.clock()


@dataclass(frozen=True)
class Limits:
    breaker_min_nodes: float = 3
    breaker_fraction: float = 0.1
    breaker_window_seconds: float = 24 * HOUR
    max_repairs_per_hour: float = 3
    breaker_nodes: str = "gres:gpu"
    breaker_max_nodes: float = 1_000_000

    def breaker_limit(self, checked: int) -> int:
        share = max(int(self.breaker_min_nodes), math.ceil(self.breaker_fraction * checked))
        return min(share, int(self.breaker_max_nodes))

    def in_scope(self, node: SlurmNode) -> bool:
        """Whether `node` is one the breaker's share is of (breaker_nodes: any selector matches)."""
        for word in self.breaker_nodes.split():
            if word == "all":
                return True
            found = SELECTOR.fullmatch(word)
            if found is None:
                continue
            kind, name = found.groups()
            if kind == "gres" and any(g.split(":")[0] == name for g in gres_names(node.gres)):
                return True
            if (kind == "partition" and name in node.partitions) or (kind == "feature" and name in node.features):
                return True
        return False


def gres_names(gres: str) -> list[str]:
    """`gpu:h100:8(S:0-1),nic:1` as its parts (the socket binding in brackets is not a separator)."""
    return [part for part in re.split(r",(?![^(]*\))", gres) if part]


@dataclass(frozen=True)
class Decision:
    """What a claim came to. `outcome`: claimed (the node is out / the repair may start); held (the limit was
    reached before: nothing changed); ranked_out (claimed, then ranked past the limit: taken back); paused;
    uncounted (the controller could not be read, or too little time was left: nothing claimed); failed (Slurm
    refused the update). `still_out`: the node is out by accelmon's drain after all (a take-back that failed, a claim
    that could not be verified): the next check ranks it again."""

    outcome: str
    words: str
    out: int = 0  # what counted against the limit
    listed: int = 0  # the nodes the limit is a share of
    limit: int = 0
    still_out: bool = False
    stamped: Optional[float] = None  # claimed: the controller's stamp of the claim (its clock, not this node's)

    @property
    def claimed(self) -> bool:
        return self.outcome == "claimed"

    @property
    def counts(self) -> tuple[int, int, int]:
        return (self.out, self.listed, self.limit)


def repaired_at(node: SlurmNode) -> Optional[float]:
    found = REPAIRED.search(node.comment)
    return float(found.group(1)) if found else None


def drained_by_accelmon(node: SlurmNode) -> bool:
    """Drained (or in a reboot) with a reason accelmon wrote: accelmon always drains. A node DOWN without a drain
    whose reason is accelmon's is not out by it: Slurm 23.11 to 25.x without accounting keep the reason of a node
    accelmon resumed, and a node that later stops responding keeps that reason (docs/slurm.md)."""
    return node.accelmons and bool(node.flags & DRAINED or node.reboot_pending)


def out_by_accelmon(node: SlurmNode, now: float, window: float) -> bool:
    """Out by accelmon's drain, first out within the window (a node out for weeks, sent for service, no longer uses
    the budget). A reason without a stamp counts: unsure, it holds."""
    since = node.out_since
    return drained_by_accelmon(node) and (since is None or since >= now - window)


def repairing(node: SlurmNode, now: float) -> bool:
    """A repair under way: the node out with a repair's reason of the last hour. Out: Slurm 23.11 to 25.x without
    AccountingStorageType keep the reason on RESUME, so the reason alone says nothing on a node that takes jobs."""
    return (
        node.out and node.reason.startswith(REPAIRING)
        and (node.reason_time is None or node.reason_time >= now - HOUR)
    )  # fmt: skip


def out_order(node: SlurmNode) -> tuple[float, str]:
    """The breaker's rank: when the node first went out, then its name."""
    since = node.out_since
    return (since if since is not None else -math.inf, node.name)


def claim_order(node: SlurmNode) -> tuple[float, str]:
    """The repair pace's rank: when the repair was claimed (the reason's stamp), then the name."""
    return (node.reason_time if node.reason_time is not None else -math.inf, node.name)


class Fleet:
    """The controller as every node's check uses it: listing, updates, and the claims above, within `budget`."""

    def __init__(
        self, scontrol: str, runner: Run, limits: Limits, now: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep, settle: float = SETTLE_SECONDS, dry_run: bool = False,
        budget: Optional[Budget] = None, memory: Optional[PauseMemory] = None,
    ) -> None:  # fmt: skip
        self.scontrol, self.runner, self.limits = scontrol, runner, limits
        self.memory = None if dry_run else memory  # a node's check remembers the pause; the command line does not
        self.now, self.sleep, self.settle, self.dry_run = now, sleep, settle, dry_run
        self.budget = budget or Budget()
        self.slowest = 0.0  # the longest a call took in this run: what the next ones are expected to take
        self.listing = Listing(scontrol, self.call)

    def call(self, command: list[str]) -> subprocess.CompletedProcess[str]:
        """`command`, its timeout cut to what is left of the run's budget; not run at all when too little is."""
        timeout = min(CALL_TIMEOUT_SECONDS, self.budget.left())
        if timeout < MIN_CALL_SECONDS:
            log.error("no time left in this check for %s", " ".join(command[1:3]))
            return subprocess.CompletedProcess(command, 1, "", "no time left in this health check's 60 s")
        started = time.monotonic()
        try:
            return self.runner(command, timeout)
        except (OSError, subprocess.TimeoutExpired) as error:
            what = "scontrol" if command[0] == self.scontrol else command[0].rsplit("/", 1)[-1]
            log.error("%s failed (%s): %s", what, " ".join(command[1:3]), error)
            return subprocess.CompletedProcess(command, 1, "", str(error))
        finally:
            self.slowest = max(self.slowest, time.monotonic() - started)

    def room_to_claim(self) -> bool:
        """Whether a claim started now can be verified and, if need be, taken back before the budget ends: the
        update, the wait, the listing and the take-back's read and update, each as slow as the slowest call yet."""
        call = max(MIN_CALL_SECONDS, 1.5 * self.slowest)
        return self.budget.left() >= self.settle + 4 * call

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

    def clear(self, name: str, written: str, *fields: str) -> str:
        """Undoes accelmon's own change on `name` with `fields` (State=UNDRAIN, State=RESUME, the reason as it was)
        only while its reason is still `written`, read just before: someone else's drain (an administrator's, slurmd's
        "Kill task failed") set since is never undone. Slurm has no compare-and-set, so this narrows the window to
        one call; it cannot close it. Retried once. "done", "not_ours" (why is logged) or "failed: WHY"."""
        node = self.node(name)
        if node is None:
            return f"failed: cannot read node {name} ({self.listing.problem or 'no answer'})"
        if node.reason.strip() != written.strip():
            log.warning("node %s's reason is now %r (set by %s), not accelmon's: left as it is", name, node.reason,
                        node.reason_user or "someone")  # fmt: skip
            return "not_ours"
        failed = self.update(name, *fields)
        if failed and not self.dry_run:
            failed = self.update(name, *fields)
        return f"failed: {failed}" if failed else "done"

    def paused(self, nodes: list[SlurmNode]) -> Optional[Pause]:
        """The pause switch as Slurm shows it, or as this node last saw it where it vanished without a resume."""
        pause = pause_of(nodes)
        if self.memory is None:
            return pause
        if pause is not None:
            self.memory.keep(pause, vanished=False)
            return pause
        seen = self.memory.read()
        if seen is None:
            return None
        since = float(seen["since"])  # type: ignore[arg-type]
        if resumed(nodes):
            self.memory.forget()
            return None
        remembered = Pause(str(seen.get("node", "")), since, str(seen.get("reason", "")))
        self.memory.keep(remembered, vanished=True)
        log.error("the pause switch vanished from Slurm without accelmon-remediation resume: still paused here")
        return Pause(remembered.node, since, f"{remembered.reason} [the switch vanished from every Comment without "
                     "accelmon-remediation resume: still paused; run it to end the pause]")  # fmt: skip

    def remember_pause(self, node: SlurmNode) -> None:
        """What a healthy node's check sees of the switch in its own Comment, kept: the pause it carries remembered, a
        resume marker forgotten. Never judged vanished from one node's Comment (an edit of that one node is no end
        of the pause): that takes the fleet's listing (`paused`)."""
        if self.memory is None:
            return
        pause = pause_of([node])
        if pause is not None:
            self.memory.keep(pause, vanished=False)
        elif RESUMED.search(node.comment):
            self.memory.forget()

    def checked(self, nodes: list[SlurmNode]) -> int:
        """How many nodes the breaker's share is of: those in breaker_nodes, less those powered down or down for a
        reason not accelmon's (no check runs there), plus any node out by accelmon outside them."""
        count = 0
        for node in nodes:
            ours = drained_by_accelmon(node)
            # FUTURE: defined in slurm.conf, not yet in service (no slurmd, no check).
            running = not node.powered_down and not (node.flags & {"DOWN", "FAIL", "FUTURE"})
            count += 1 if ours or (self.limits.in_scope(node) and running) else 0
        return count

    # --- the circuit breaker --------------------------------------------------------------------------------------
    def drain(self, name: str, reason: str, claiming: Callable[[], None] = lambda: None) -> Decision:
        """Drains `name` with `reason` within the breaker (see the module's text); `claiming` is called just before the
        drain (the journal's record of the claim: a check killed after it still left a trace)."""
        now = self.now()
        window = self.limits.breaker_window_seconds
        counted = lambda nodes: [n for n in nodes if out_by_accelmon(n, now, window)]  # noqa: E731
        nodes = self.nodes()
        before = self.held(nodes, counted, "drain") or self.capped(nodes or [])
        if before is not None:
            return before
        if not self.room_to_claim():
            return Decision("uncounted", self.no_time("drain"))
        claiming()
        failed = self.update(name, "State=DRAIN", f"Reason={reason}")
        ahead = lambda n, mine: out_by_accelmon(n, now, window) and out_order(n) < out_order(mine)  # noqa: E731
        take_back = lambda: self.clear(name, reason, "State=UNDRAIN")  # noqa: E731
        return self.verify(name, reason, failed, ahead, take_back, "drain")

    def capped(self, nodes: list[SlurmNode]) -> Optional[Decision]:
        """breaker_max_nodes counts every node out by accelmon, whatever the window: a false verdict that recurs
        daily must not drain a few more nodes every day."""
        out = sum(1 for node in nodes if drained_by_accelmon(node))
        cap = int(self.limits.breaker_max_nodes)
        if out < cap:
            return None
        words = f"circuit breaker: {out} node(s) out by accelmon in all, breaker_max_nodes {cap}: no drain"
        return Decision("held", words, out, self.checked(nodes), cap)

    def keep(self, name: str) -> Optional[Decision]:
        """At a check of `name` while it is out by an unverified drain of accelmon's (the repair loop asks only then):
        None while this cannot be told (nothing changes); `claimed` while it ranks within the limit (the caller
        journals the drain as granted: it stays until its node passes); else its drain taken back (the decision says
        whether that worked). A node in a reboot or down is left: taking its drain back would return it
        to service unchecked."""
        now = self.now()
        window = self.limits.breaker_window_seconds
        nodes = self.nodes()
        if not nodes or self.paused(nodes) is not None:
            return None
        mine = next((n for n in nodes if n.name == name), None)
        if mine is None or not out_by_accelmon(mine, now, window) or mine.reboot_pending or "DOWN" in mine.flags:
            return None
        ahead = sum(1 for n in nodes if n.name != name and out_by_accelmon(n, now, window) and out_order(n) <
                    out_order(mine))  # fmt: skip
        checked = self.checked(nodes)
        limit = self.limits.breaker_limit(checked)
        words = f"{self.counts_words(ahead, checked, limit, False)} out before {name}"
        if ahead < limit:  # ranked within the limit: granted now, never taken back later
            return Decision("claimed", f"{words}: the drain kept", ahead, checked, limit)
        return self.taken_back(self.clear(name, mine.reason, "State=UNDRAIN"), name, "drain", words, ahead, checked,
                               limit)  # fmt: skip

    # --- the repair pace ------------------------------------------------------------------------------------------
    def claim_repair(self, node: SlurmNode, reason: str) -> Decision:
        """Marks `node`'s repair in its reason (`reason` starts with one of REPAIRING; it is given the time the node
        first went out) within max_repairs_per_hour over the fleet; on a claim kept, its Comment records the repair
        for the hour's count."""
        now = self.now()
        reason = keyed_reason(reason, node.out_since)

        def recent(node: SlurmNode, at: float = now) -> bool:  # repaired (started) within the hour, by its Comment
            return (repaired_at(node) or 0) >= at - HOUR

        def counted(nodes: list[SlurmNode]) -> list[SlurmNode]:
            return [n for n in nodes if repairing(n, now) or recent(n)]

        def ahead(other: SlurmNode, mine: SlurmNode) -> bool:
            # Judged on the controller's clock, which just stamped this claim: a node whose own clock runs ahead
            # (at boot, before chrony) would see the resets under way as older than an hour.
            at = mine.reason_time or now
            return recent(other, at) or (repairing(other, at) and claim_order(other) < claim_order(mine))

        before = self.held(self.nodes(), counted, "repair", pace=True)
        if before is not None:
            return before
        if not self.room_to_claim():
            return Decision("uncounted", self.no_time("repair"))
        failed = self.update(node.name, "State=DRAIN", f"Reason={reason}")
        as_it_was = keyed_reason(node.reason, node.out_since)
        back = lambda: self.clear(node.name, reason, "State=DRAIN", f"Reason={as_it_was}")  # noqa: E731
        decision = self.verify(node.name, reason, failed, ahead, back, "repair", pace=True,
                               own=1 if recent(node) else 0)  # fmt: skip
        if decision.claimed:
            comment = with_token(node.comment, REPAIRED, f"accelmon-repaired={int(decision.stamped or now)}")
            failed = self.update(node.name, f"Comment={comment}")
            if failed:  # the repair is still visible by its reason while it runs; the hour's count loses it after
                log.error("scontrol could not note the repair in %s's Comment: %s", node.name, failed)
        return decision

    # --- both -----------------------------------------------------------------------------------------------------
    def limit(self, nodes: list[SlurmNode], pace: bool) -> tuple[int, int]:
        """(the limit, the nodes it is a share of)."""
        if pace:
            return int(self.limits.max_repairs_per_hour), len(nodes)
        checked = self.checked(nodes)
        return self.limits.breaker_limit(checked), checked

    def no_time(self, what: str) -> str:
        return (
            f"{self.budget.left():.0f} s left in this check, too little to verify a {what} against a controller that "
            f"took {self.slowest:.0f} s to answer: no {what}, holding"
        )

    def held(
        self, nodes: Optional[list[SlurmNode]], counted: Callable[[list[SlurmNode]], list[SlurmNode]], what: str,
        pace: bool = False,
    ) -> Optional[Decision]:  # fmt: skip
        """Why the claim is not even tried (the count failed, the switch is on, the limit is reached), or None."""
        if not nodes:
            return Decision("uncounted", f"cannot count the nodes (scontrol show nodes failed): no {what}, holding")
        pause = self.paused(nodes)
        if pause is not None:
            return Decision("paused", f"{pause.words()}: no {what}")
        out = len(counted(nodes))
        limit, listed = self.limit(nodes, pace)
        if out >= limit:
            return Decision("held", f"{self.counts_words(out, listed, limit, pace)}: no {what}", out, listed, limit)
        return None

    def verify(
        self, name: str, written: str, failed: Optional[str], ahead_of: Callable[[SlurmNode, SlurmNode], bool],
        take_back: Callable[[], str], what: str, pace: bool = False, own: int = 0,
    ) -> Decision:  # fmt: skip
        """After a claim (`written`: the reason it set; `failed`: why its update failed, None if it answered): wait
        for the stamps to settle, rank, and keep the claim or take it back. A claim whose answer was lost counts as
        made when the listing shows it. `ahead_of(other, mine)`: whether another node's claim counts before this
        one; `own`: this node's own count (a repair of the hour already)."""
        self.sleep(self.settle)
        nodes = self.nodes()
        mine = next((n for n in nodes or [] if n.name == name), None)
        if not nodes or mine is None:
            result = take_back()
            return self.taken_back(result, name, what, f"cannot verify the {what} (scontrol show nodes failed)")
        if failed is not None:
            if mine.reason.strip() != written.strip():
                return Decision("failed", f"scontrol could not {'drain' if what == 'drain' else 'claim the repair of'} "
                                          f"{name}: {failed}")  # fmt: skip
            log.warning("the %s of %s was applied though scontrol answered: %s", what, name, failed)
        pause = self.paused(nodes)
        if pause is not None:
            return self.taken_back(take_back(), name, what, pause.words(), outcome="paused")
        ahead = own + sum(1 for n in nodes if n.name != name and ahead_of(n, mine))
        limit, listed = self.limit(nodes, pace)
        words = f"{self.counts_words(ahead, listed, limit, pace)} ahead of {name}"
        if ahead >= limit:
            return self.taken_back(take_back(), name, what, words, ahead, listed, limit)
        return Decision("claimed", f"{words}: {what} allowed", ahead, listed, limit, stamped=mine.reason_time)

    def taken_back(
        self, result: str, name: str, what: str, words: str, out: int = 0, listed: int = 0, limit: int = 0,
        outcome: str = "",
    ) -> Decision:  # fmt: skip
        """The decision once a claim was taken back (`result` of Fleet.clear): said as it went."""
        outcome = outcome or ("ranked_out" if limit else "uncounted")
        if result == "done":
            return Decision(outcome, f"{words}: the {what} taken back", out, listed, limit)
        if result == "not_ours":
            return Decision(outcome, f"{words}: not taken back, someone else has changed {name} since", out, listed,
                            limit)  # fmt: skip
        log.error("could not take back the %s of %s: %s", what, name, result)
        return Decision(outcome, f"{words}: the {what} could NOT be taken back ({result}); the next check tries again",
                        out, listed, limit, still_out=True)  # fmt: skip

    def counts_words(self, out: int, listed: int, limit: int, pace: bool) -> str:
        if pace:
            return f"repair pace: {out} repair(s) in the last hour, limit {limit}"
        hours = self.limits.breaker_window_seconds / HOUR
        return f"circuit breaker: {out} node(s) out by accelmon in {hours:g} h of {listed} checked, limit {limit}"

    # --- the pause switch -----------------------------------------------------------------------------------------
    def pause(self, reason: str, carrier: Optional[str] = None) -> str:
        """Sets the switch in every node's Comment (or only `carrier`'s): any node that carries it pauses the fleet,
        so one `scontrol update Comment=` on a node, or a node taken out of slurm.conf, does not end the pause; a node
        without it while others have it is served as such (AccelmonRemediationPauseIncomplete). What was done."""
        nodes = self.nodes()
        if not nodes:
            raise RuntimeError("cannot list the nodes (scontrol show nodes failed): not paused")
        current = pause_of(nodes)
        if carrier and not any(n.name == carrier for n in nodes):
            raise RuntimeError(f"Slurm lists no node {carrier}: not paused")
        chosen = [n for n in nodes if not carrier or n.name == carrier]
        token = (
            current_token(current)
            if current
            else f"accelmon-paused={int(self.now())}:{urllib.parse.quote(reason, safe='')}"
        )
        missing = [n for n in chosen if token not in n.comment]
        # A resume marker left from an earlier resume gives its place to the switch.
        failed = [
            n.name
            for n in missing
            if self.update(n.name, f"Comment={with_token(without_resume(n.comment), PAUSED, token)}")
        ]
        # Every resume marker goes, carriers or not: a node that remembers this pause ends it only on a later resume.
        for node in nodes:
            if node not in chosen and RESUMED.search(node.comment):
                self.update(node.name, f"Comment={without_resume(node.comment)}")
        carried = len(chosen) - len(failed)
        if carried == 0:
            raise RuntimeError(f"scontrol could not set the switch on {', '.join(failed[:5])}: not paused")
        said = f"already {current.words()}; " if current else "paused: "
        where = f"node {carrier}" if carrier else f"{carried} of {len(chosen)} nodes"
        words = f"{said}every node's drains and repairs stop at its next health check (switch on {where})"
        if failed:
            words += f"; not set on {len(failed)}: {', '.join(failed[:5])} (run it again)"
        return words

    def resume(self) -> str:
        """Clears the switch, leaving `accelmon-resumed=NOW` in its place (on every node where no carrier is left): a
        node that remembers a pause whose carriers vanished (PauseMemory) ends it only on such a marker."""
        nodes = self.nodes()
        if nodes is None:
            raise RuntimeError("cannot list the nodes (scontrol show nodes failed): still paused")
        carriers = [n.name for n in nodes if PAUSED.search(n.comment)]
        marker = f"accelmon-resumed={int(self.now())}"
        # The marker takes the switch's place on its carriers; where none is left (erased), it goes on every node.
        marked = [n for n in nodes if n.name in carriers] if carriers else nodes
        failed = []
        for node in marked:
            comment = with_token(with_token(node.comment, PAUSED, ""), RESUMED, marker)
            if self.update(node.name, f"Comment={comment}"):
                failed.append(node.name)
        stuck = [name for name in failed if name in carriers]
        if stuck:
            raise RuntimeError(f"scontrol could not clear the switch on {', '.join(stuck[:5])}: still paused")
        words = "resumed: drains and repairs go on" if carriers else "not paused in Slurm: resume marked on every node"
        if failed:
            words += (f"; {len(failed)} node(s) not marked ({', '.join(failed[:5])}): a node that remembers a vanished "
                      "pause stays paused until it is (run it again)")  # fmt: skip
        return words
