"""The fleet-wide limits (accelmon.schedulers.slurm.fleet) as Slurm really runs the health checks: all at once. A fake
controller (tests/support/fake_scontrol.py) serialises calls as slurmctld does and stamps each reason with the real
time; N checks meet it at the same moment. Each check here is the repair loop of its own node, in its own thread,
calling the fake scontrol as a process, with the real settle wait."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from accelmon import health
from accelmon.health.remediation import Journal
from accelmon.host.slurm_nodes import parse_json, parse_nodes, run_scontrol
from accelmon.host.slurm_pause import pause_of
from accelmon.schedulers.slurm.fleet import Fleet, Limits
from accelmon.schedulers.slurm.repair import Options, SlurmRepair
from tests.support.exposition import sample_value
from tests.support.fake_scontrol import Cluster
from tests.test_remediation import failing, health_samples
from tests.test_remediation import healthy as passing

# The checks of a whole fleet at once (a process a call, from up to 20 threads) on one pytest-xdist worker, one
# module after the other: beside each other their bursts starved the slow-controller test's calls past its
# budget (scripts/test.sh runs the tier on parallel workers).
pytestmark = pytest.mark.xdist_group("fleet-checks")
NODES = [f"gpu-{n:02d}" for n in range(20)]
DAY = 86400.0


def run(command: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_scontrol(command, timeout)


def loop_on(tmp_path: Path, cluster: Cluster, node: str, **chosen: float) -> SlurmRepair:
    options = Options(
        mode=str(chosen.pop("mode", "act")),
        journal=str(tmp_path / f"{node}.jsonl"),
        repeat_window_seconds=7 * DAY,
        limits=Limits(
            chosen.get("breaker_min_nodes", 3),
            chosen.get("breaker_fraction", 0.1),
            chosen.get("breaker_window_hours", 24) * 3600,
            chosen.get("max_repairs_per_hour", 3),
        ),
        reset_command="true {pci_bus_id}",
    )
    return SlurmRepair(options, node, str(cluster.command), run)


def all_at_once(tmp_path: Path, cluster: Cluster, verdict: health.NodeHealth, **chosen: float) -> dict[str, str]:
    """Every node's check at the same moment (their first listings meet at the controller); what each printed."""
    cluster.change(meet=len(NODES), listings=0)
    said: dict[str, str] = {}

    def check(node: str) -> None:
        loop = loop_on(tmp_path, cluster, node, **chosen)
        lines: list[str] = []
        loop.say = lines.append
        loop.run(verdict, lambda resets: verdict)
        said[node] = "\n".join(lines)

    together(check, NODES)
    return said


def together(check: Callable[[str], None], nodes: list[str]) -> None:
    """`check(node)` for every node, each in its own thread, all started at once."""
    threads = [threading.Thread(target=check, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)


def out_by_accelmon(cluster: Cluster) -> list[str]:
    return [name for name, node in cluster.nodes().items() if "DRAIN" in node["state"] and node["reason"]]


@pytest.fixture
def fleet_of_20(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path, {node: "IDLE" for node in NODES})


def test_twenty_checks_at_once_with_the_same_false_verdict_drain_no_more_than_the_limit(tmp_path, fleet_of_20):
    """The measured failure: 20 checks together, limit 3, drained 10. Now: at most 3 out, at least 1, twice in a row,
    and every node held back says why in its output and its journal."""
    cluster = fleet_of_20
    for round_ in (1, 2):
        said = all_at_once(tmp_path, cluster, failing("reboot_node"))
        out = out_by_accelmon(cluster)
        assert 1 <= len(out) <= 3, (round_, out, said)
        for node in NODES:
            if node in out:
                continue
            assert f"node {node} not drained, it keeps taking jobs" in said[node], said[node]
            record = Journal.read(str(tmp_path / f"{node}.jsonl")).records[-1]
            assert record.event == "breaker_held" and record.outcome in ("held", "ranked_out"), record
    # Those that claimed and were ranked past the limit took their own drain back, and said so.
    taken_back = [node for node in NODES if "taken back" in said[node]]
    assert all(cluster.node(node) == {"state": "IDLE", "reason": ""} for node in taken_back)


def test_a_controller_that_cannot_list_drains_nobody(tmp_path, fleet_of_20):
    """In the measured run, a controller slow to answer the listing sent every node down "drain anyway": all 20
    drained. Fail closed: none is, and each says it could not count."""
    cluster = fleet_of_20
    cluster.set({node: "IDLE" for node in NODES}, fail=("show nodes",))
    said = all_at_once(tmp_path, cluster, failing("reboot_node"))
    assert out_by_accelmon(cluster) == []
    assert all("cannot count the nodes" in said[node] for node in NODES)


def test_old_drains_leave_the_budget(tmp_path):
    """Drains older than breaker_window_hours (nodes sent for service weeks ago) no longer count."""
    old = {node: "IDLE+DRAIN|accelmon: GPU 1 xid: hardware_service" for node in NODES[:5]}
    cluster = Cluster(tmp_path, {**{node: "IDLE" for node in NODES}, **old}, reason_age=3 * DAY)
    loop = loop_on(tmp_path, cluster, NODES[10])
    loop.fleet.sleep = lambda seconds: None
    loop.run(failing("reboot_node"), lambda resets: failing("reboot_node"))
    assert "DRAIN" in cluster.node(NODES[10])["state"]
    # The same drains an hour old count: 5 out, limit 3, held.
    cluster.set({**{node: "IDLE" for node in NODES}, **old}, reason_age=3600)
    loop = loop_on(tmp_path, cluster, NODES[11])
    loop.fleet.sleep = lambda seconds: None
    loop.run(failing("reboot_node"), lambda resets: failing("reboot_node"))
    assert cluster.node(NODES[11]) == {"state": "IDLE", "reason": ""}


def drained_idle_by_accelmon(tmp_path: Path, cluster: Cluster, nodes: list[str]) -> None:
    """`nodes` drained by their own check for a reset_gpu failure (journals and Slurm as the loop leaves them)."""
    for node in nodes:
        loop = loop_on(tmp_path, cluster, node, breaker_min_nodes=20)
        loop.fleet.sleep = lambda seconds: None
        loop.run(failing("reset_gpu", "ecc"), lambda resets: failing("reset_gpu", "ecc"))
        assert "DRAIN" in cluster.node(node)["state"], node


def test_repairs_keep_the_fleets_pace(tmp_path, fleet_of_20):
    """Eight drained nodes repaired at once, max_repairs_per_hour 3: three repairs start; the others wait, saying
    so; the hour's count holds after the repairs end (each repaired node's Comment keeps it)."""
    cluster = fleet_of_20
    chosen = NODES[:8]
    drained_idle_by_accelmon(tmp_path, cluster, chosen)
    first_out = {node: cluster.raw(node)["stamp"]["epoch"] for node in chosen}
    said: dict[str, str] = {}
    healthy = passing("ecc")
    cluster.change(meet=len(chosen), listings=0)

    def repair(node: str) -> None:
        loop = loop_on(tmp_path, cluster, node, breaker_min_nodes=20)
        lines: list[str] = []
        loop.say = lines.append
        loop.run(failing("reset_gpu", "ecc"), lambda resets: healthy)
        said[node] = "\n".join(lines)

    together(repair, chosen)
    repaired = [node for node in chosen if "DRAIN" not in cluster.node(node)["state"]]
    assert 1 <= len(repaired) <= 3, said
    waiting = [node for node in chosen if node not in repaired]
    assert all("repair pace" in said[node] for node in waiting), said
    # Held before it claimed, its reason as it was; claimed then taken back, the same reason carrying when the node
    # first went out (its first drain's stamp), which no later edit moves.
    for node in waiting:
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(first_out[node]))
        reason = "accelmon: GPU 2 ecc: reset_gpu"
        assert cluster.node(node)["reason"] in (reason, f"{reason} (out since {since}Z)"), said[node]
        assert ("taken back" in said[node]) is ("out since" in cluster.node(node)["reason"]), said[node]
    # The hour's repairs are still counted once they have ended: a waiting node asked again is held before claiming.
    if len(repaired) == 3:
        loop = loop_on(tmp_path, cluster, waiting[0], breaker_min_nodes=20)
        loop.fleet.sleep = lambda seconds: None
        loop.run(failing("reset_gpu", "ecc"), lambda resets: healthy)
        record = Journal.read(loop.options.journal).records[-1]
        assert (record.event, record.outcome) == ("repair_held", "held")
        assert sample_value(health_samples(Journal.read(loop.options.journal), True), "accelmon_node_remediation_held",
                            why="pace") == 1  # fmt: skip


def test_pause_stops_drains_and_repairs_and_resume_starts_them(tmp_path, fleet_of_20, capsys):
    cluster = fleet_of_20
    switch = Fleet(str(cluster.command), run, Limits(), sleep=lambda s: None)
    assert "paused" in switch.pause("bad driver roll-out, INC-42")
    carrier = cluster.raw(NODES[0])["comment"]
    assert carrier.startswith("accelmon-paused=") and "bad%20driver" in carrier
    nodes = switch.nodes()
    assert nodes is not None
    pause = pause_of(nodes)
    assert pause is not None and pause.reason == "bad driver roll-out, INC-42" and pause.node == NODES[0]
    loop = loop_on(tmp_path, cluster, NODES[5])
    loop.fleet.sleep = lambda seconds: None
    loop.run(failing("reboot_node"), lambda resets: failing("reboot_node"))
    assert cluster.node(NODES[5]) == {"state": "IDLE", "reason": ""}
    assert "remediation paused since" in capsys.readouterr().out
    record = Journal.read(loop.options.journal).records[-1]
    assert (record.event, record.outcome) == ("breaker_held", "paused")
    assert switch.resume() == "resumed: drains and repairs go on"
    assert re.fullmatch(r"accelmon-resumed=\d+", cluster.raw(NODES[0])["comment"])  # the switch's place
    loop = loop_on(tmp_path, cluster, NODES[5])
    loop.fleet.sleep = lambda seconds: None
    loop.run(failing("reboot_node"), lambda resets: failing("reboot_node"))
    assert "DRAIN" in cluster.node(NODES[5])["state"]


def test_a_pause_set_during_a_claim_takes_it_back(tmp_path, fleet_of_20):
    cluster = fleet_of_20
    loop = loop_on(tmp_path, cluster, NODES[3])
    loop.fleet.sleep = lambda seconds: cluster.edit(NODES[0], comment="accelmon-paused=1764200000:drill")
    loop.run(failing("reboot_node"), lambda resets: failing("reboot_node"))
    assert cluster.node(NODES[3]) == {"state": "IDLE", "reason": ""}


def test_the_comment_keeps_what_the_administrator_wrote(tmp_path, fleet_of_20):
    cluster = fleet_of_20
    cluster.edit(NODES[0], comment="rack 4, PSU swapped")
    switch = Fleet(str(cluster.command), run, Limits(), sleep=lambda s: None)
    switch.pause("x")
    assert cluster.raw(NODES[0])["comment"].startswith("rack 4, PSU swapped accelmon-paused=")
    switch.resume()
    assert re.fullmatch(r"rack 4, PSU swapped accelmon-resumed=\d+", cluster.raw(NODES[0])["comment"])
    switch.pause("y")
    assert re.fullmatch(r"rack 4, PSU swapped accelmon-paused=\d+:y", cluster.raw(NODES[0])["comment"])


def test_slurms_json_is_preferred_where_scontrol_has_it(tmp_path):
    cluster = Cluster(tmp_path, {"a": "IDLE+DRAIN|accelmon: GPU 1 xid: reboot_node", "b": "IDLE"}, json_form=True)
    fleet = Fleet(str(cluster.command), run, Limits(), sleep=lambda s: None)
    nodes = fleet.nodes()
    assert nodes is not None and fleet.listing.json is True
    assert cluster.calls() == ["show nodes --json"]
    assert nodes[0].reason == "accelmon: GPU 1 xid: reboot_node" and nodes[0].reason_time is not None
    older = Cluster(tmp_path, {"a": "IDLE"})  # 22.05: --json refused, the text form from then on
    fleet = Fleet(str(older.command), run, Limits(), sleep=lambda s: None)
    fleet.nodes()
    fleet.nodes()
    assert older.calls() == ["show nodes --json", "show nodes --oneliner", "show nodes --oneliner"]


def test_slurms_json_shapes_from_22_05_to_24_11():
    v22 = '{"nodes": [{"name": "a", "state": "idle", "state_flags": ["DRAIN"], "reason": "x", "reason_changed_at": 5}]}'
    v24 = (
        '{"nodes": [{"name": "a", "state": ["IDLE", "DRAIN", "MAINTENANCE"], "reason": "x", '
        '"reason_changed_at": {"set": true, "infinite": false, "number": 5}, "comment": "c"}]}'
    )
    assert [(n.state, n.reason_time) for n in parse_json(v22)] == [("IDLE+DRAIN", 5.0)]
    (node,) = parse_json(v24)
    assert (node.state, node.reason_time, node.comment, node.takes_jobs) == ("IDLE+DRAIN+MAINTENANCE", 5.0, "c", False)
    with pytest.raises(ValueError):
        parse_json("[]")


def test_slurms_text_as_22_05_prints_it():
    """A line as Slurm 22.05 printed it on this machine (docs/slurm.md): the reason ends at its stamp; the Comment that
    follows is not part of it; MAINTENANCE (21.08+) takes no jobs."""
    text = (
        "NodeName=vm Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=p "
        "BootTime=2026-11-27T11:50:26 CapWatts=n/a Reason=accelmon: test [root@2026-11-27T11:54:03] "
        "Comment=accelmon-paused=1764244443:bad%20driver"
    )
    (node,) = parse_nodes(text)
    assert (node.reason, node.reason_user, node.comment) == (
        "accelmon: test",
        "root",
        "accelmon-paused=1764244443:bad%20driver",
    )
    assert parse_nodes("NodeName=m State=IDLE+MAINTENANCE")[0].takes_jobs is False
    assert pause_of([node]) is not None and pause_of([node]).reason == "bad driver"  # type: ignore[union-attr]


def test_the_command_pauses_shows_and_resumes(tmp_path):
    """accelmon-remediation as an operator runs it: pause, status (the switch, the breaker's count, the hour's
    repairs), resume; bad arguments fail before Slurm is asked."""
    cluster = Cluster(tmp_path, {"a": "IDLE+DRAIN|accelmon: GPU 1 xid: reboot_node", "b": "IDLE", "c": "IDLE"})
    command = [sys.executable, "-m", "accelmon.schedulers.slurm.remediation_cli", "--scontrol", str(cluster.command)]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)

    paused = cli("pause", "--reason", "bad driver roll-out, INC-42")
    assert paused.returncode == 0 and "switch on 3 of 3 nodes" in paused.stdout
    shown = cli("status")
    assert shown.returncode == 0, shown.stderr
    assert "remediation paused since" in shown.stdout and "bad driver roll-out, INC-42" in shown.stdout
    assert "circuit breaker: 1 node(s) out by accelmon in 24 h of 3 checked, limit 3" in shown.stdout
    assert "repair pace: 0 repair(s) in the last hour, limit 3" in shown.stdout
    assert cli("resume").stdout.strip() == "resumed: drains and repairs go on"
    assert "remediation: on (not paused)" in cli("status").stdout
    before = len(cluster.calls())
    assert cli("pause", "--reason", " ").returncode == 2 and len(cluster.calls()) == before
    cluster.change(fail=["show"])
    failed = cli("status")
    assert failed.returncode == 1 and "cannot list the nodes" in failed.stderr


def test_an_unrelated_comment_edit_does_not_end_a_pause(tmp_path, fleet_of_20):
    """The switch lived in one node's Comment: any `scontrol update NodeName=gpu-00 Comment=...` (or that node taken
    out of slurm.conf) ended the pause silently. It is on every node now: an edit removes one carrier, the fleet stays
    paused, and that node serves 0 beside the others' 1 (AccelmonRemediationPauseIncomplete); pausing again puts it
    back with the same time and reason."""
    cluster = fleet_of_20
    switch = Fleet(str(cluster.command), run, Limits(), sleep=lambda s: None)
    assert "switch on 20 of 20 nodes" in switch.pause("INC-42")
    cluster.edit(NODES[0], comment="rack 4")  # an administrator's edit, unaware of the switch
    nodes = switch.nodes()
    assert nodes is not None and pause_of(nodes) is not None and pause_of(nodes).reason == "INC-42"  # type: ignore[union-attr]
    loop = loop_on(tmp_path, cluster, NODES[5])
    loop.fleet.sleep = lambda seconds: None
    loop.run(failing("reboot_node"), lambda resets: failing("reboot_node"))
    assert cluster.node(NODES[5]) == {"state": "IDLE", "reason": ""}  # still paused: no drain
    since = cluster.raw(NODES[1])["comment"]
    again = switch.pause("another reason")
    assert (
        again.startswith("already remediation paused since") and cluster.raw(NODES[0])["comment"] == f"rack 4 {since}"
    )
    assert switch.resume() == "resumed: drains and repairs go on"
    assert all("accelmon-paused" not in cluster.raw(node)["comment"] for node in NODES)
