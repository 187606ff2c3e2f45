"""From verdict to repair (accelmon.health.remediation, accelmon.schedulers.slurm.repair): the circuit breaker, the
repair loop in observe and act modes, the journal and its repeat offenders, over a stateful stand-in for scontrol
(tests/support/fake_scontrol.py) that answers and changes the cluster as Slurm would."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from accelmon import health
from accelmon.exporter.checks import Check
from accelmon.health import remediation
from accelmon.health.remediation import Journal, Record
from accelmon.host import slurm_nodes
from accelmon.host.slurm_nodes import run_scontrol
from accelmon.schedulers.slurm.fleet import Limits
from accelmon.schedulers.slurm.repair import Options, SlurmRepair
from tests.support.exposition import sample_value, series, text_of
from tests.support.fake_scontrol import Cluster
from tests.support.jobs_tree import bus_id, nvidia_procfs
from tests.support.kernel_log_lines import BOOT, record, xid_line
from tests.support.processes import exporter_env

NODE = "gpu-7"
DAY = 86400.0


def plain(reason: str) -> str:
    """A reason without the time accelmon keeps in it of when the node first went out."""
    return slurm_nodes.OUT_SINCE.sub("", reason)


def run(command: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return run_scontrol(command, timeout)


def failing(action: str, check: str = "xid", index: str = "2", drill: bool = False) -> health.NodeHealth:
    """A node whose GPU `index` fails `check`, asking for `action`; its other GPU passes."""
    bad = Check(check, "failure", f"{check} failed", action, drill=drill)
    return health.NodeHealth(
        [
            health.GpuHealth("0", "GPU-0", [Check(check, "ok", "fine")], "S0", "00000000:18:00.0"),
            health.GpuHealth(index, f"GPU-{index}", [bad], f"S{index}", f"00000000:{index}A:00.0"),
        ],
        [],
    )


def healthy(check: str = "xid") -> health.NodeHealth:
    """The node of `failing` with every check passing: the same GPUs, answering."""
    return health.NodeHealth(
        [
            health.GpuHealth("0", "GPU-0", [Check(check, "ok", "fine")], "S0", "00000000:18:00.0"),
            health.GpuHealth("2", "GPU-2", [Check(check, "ok", "fine")], "S2", "00000000:2A:00.0"),
        ],
        [],
    )


@pytest.fixture
def site(tmp_path: Path):
    """(cluster, make): a cluster of 20 nodes, gpu-7 among them taking jobs, and `make(mode, **options)` the loop."""
    others = {f"gpu-{n}": "IDLE" for n in range(20) if n != 7}
    cluster = Cluster(tmp_path, {NODE: "IDLE", **others})
    resets = tmp_path / "resets"
    script = tmp_path / "reset-gpu"
    script.write_text(f'#!/bin/sh\necho "$1" >> "{resets}"\nexit "${{RESET_STATUS:-0}}"\n')
    script.chmod(0o755)

    def make(mode: str = "act", now: float | None = None, **chosen: float) -> SlurmRepair:
        options = Options(
            mode=mode,
            journal=str(tmp_path / "remediation.jsonl"),
            repeat_window_seconds=chosen.get("repeat_window_days", 7.0) * DAY,
            limits=Limits(
                chosen.get("breaker_min_nodes", 3),
                chosen.get("breaker_fraction", 0.1),
                chosen.get("breaker_window_hours", 24) * 3600,
                chosen.get("max_repairs_per_hour", 3),
            ),
            reset_command=f"{script} {{pci_bus_id}}",
        )
        loop = SlurmRepair(options, NODE, str(cluster.command), run, now=now)
        loop.fleet.sleep = lambda seconds: None  # one check at a time here: nothing to wait for (test_fleet.py does)
        return loop

    return cluster, make, resets


def out_by(reason: str, count: int) -> dict[str, str]:
    """`count` of the other nodes drained with `reason`."""
    others = [f"gpu-{n}" for n in range(20) if f"gpu-{n}" != NODE]
    return {name: f"IDLE+DRAIN|{reason}" for name in others[:count]}


def nodes_with(*outs: dict[str, str]) -> dict[str, str]:
    nodes = {f"gpu-{n}": "IDLE" for n in range(20)}
    for out in outs:
        nodes.update(out)
    return nodes


# --- the circuit breaker ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("others", "drains"),
    [
        (out_by("accelmon: GPU 0 xid: reboot_node", 2), True),  # 2 of 20 out: under max(3, 2): drains
        (out_by("accelmon: GPU 0 xid: reboot_node", 3), False),  # 3 of 20: holds back
        (out_by("maintenance: new PSU", 5), True),  # an administrator's drains do not count
    ],
    ids=["2-of-20-drains", "3-of-20-holds", "5-by-an-administrator-drains"],
)
def test_the_breaker_at_its_edges(site, capsys, others, drains):
    cluster, make, _ = site
    cluster.set(nodes_with(others))
    loop = make()
    loop.run(failing("reboot_node"), lambda resets: healthy())
    node = cluster.node(NODE)
    assert ("DRAIN" in node["state"]) is drains
    said = capsys.readouterr().out
    if drains:
        assert node["reason"] == "accelmon: GPU 2 xid: reboot_node"
        assert loop.journal.records[-1].event == "drained"
    else:
        assert node == {"state": "IDLE", "reason": ""}  # keeps taking jobs
        assert "circuit breaker: 3 node(s) out by accelmon in 24 h of 20 checked, limit 3: no drain" in said
        assert "node gpu-7 not drained, it keeps taking jobs: held" in said
        held = loop.journal.records[-1]
        assert (held.event, held.outcome, held.breaker, held.gpus[0]["serial"]) == (
            "breaker_held", "held", (3, 20, 3), "S2",
        )  # fmt: skip


def test_the_breakers_limit_grows_with_the_fleet(site):
    cluster, make, _ = site
    cluster.set(nodes_with(out_by("accelmon: x", 3)))
    make(breaker_fraction=0.2).run(failing("reboot_node"), lambda resets: healthy())  # limit ceil(0.2 x 20) = 4
    assert "DRAIN" in cluster.node(NODE)["state"]


def test_a_drain_that_cannot_count_holds_and_says_so(site, capsys, tmp_path):
    """Fail closed: a controller that answers one node but not the listing (loaded by every node at once, say) drains
    nothing; the output, the journal and the exporter say why."""
    cluster, make, _ = site
    cluster.set(nodes_with(), fail=("show nodes",))
    make().run(failing("reboot_node"), lambda resets: healthy())
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}
    said = capsys.readouterr().out
    assert "cannot count the nodes (scontrol show nodes failed): no drain, holding" in said
    journal = Journal.read(str(tmp_path / "remediation.jsonl"))
    assert (journal.records[-1].event, journal.records[-1].outcome) == ("breaker_held", "uncounted")
    out = health_samples(journal, failing=True)
    assert sample_value(out, "accelmon_node_remediation_held", why="uncounted") == 1
    assert sample_value(out, "accelmon_node_drain_held_by_breaker") == 0


def test_the_fleet_sees_a_held_drain_and_its_counts(site, tmp_path):
    """The exporter serves the hold while the node fails (one series a node: the alert counts them)."""
    cluster, make, _ = site
    cluster.set(nodes_with(out_by("accelmon: x", 3)))
    make().run(failing("reboot_node"), lambda resets: healthy())
    journal = Journal.read(str(tmp_path / "remediation.jsonl"))
    out = health_samples(journal, failing=True)
    assert sample_value(out, "accelmon_node_drain_held_by_breaker") == 1
    assert sample_value(out, "accelmon_node_drain_breaker_nodes", count="limit") == 3
    assert sample_value(health_samples(journal, failing=False), "accelmon_node_drain_held_by_breaker") == 0


def health_samples(journal: Journal, failing: bool, mode: str = "act") -> str:
    from accelmon.collectors.health import serve_journal
    from accelmon.exporter.metrics import Samples

    out = Samples()
    serve_journal(out, journal, failing, mode)
    return text_of(out)


# --- the repair loop ------------------------------------------------------------------------------------------------
def drained_by_accelmon(cluster: Cluster, make, action: str, check: str = "xid") -> None:
    """The node drained by the loop itself for a failing GPU 2, now running no job."""
    make().run(failing(action, check), lambda resets: healthy())
    assert "DRAIN" in cluster.node(NODE)["state"]


def test_observe_says_what_it_would_do_and_does_nothing(site, capsys):
    cluster, make, resets = site
    drained_by_accelmon(cluster, make, "reset_gpu", "ecc")
    before = cluster.calls()
    loop = make("observe")
    loop.run(failing("reset_gpu", "ecc"), lambda r: healthy())
    assert "remediation (observe): would reset GPU 2 (reset_gpu for GPU 2)" in capsys.readouterr().out
    assert [c for c in cluster.calls()[len(before) :] if not c.startswith("show")] == []
    assert not resets.exists() and "DRAIN" in cluster.node(NODE)["state"]
    # Journalled once, not at every health check.
    make("observe").run(failing("reset_gpu", "ecc"), lambda r: healthy())
    would = [r for r in Journal.read(loop.options.journal).records if r.event == "would_repair"]
    assert [(r.action, r.outcome) for r in would] == [("reset_gpu", "observed")]


def test_act_resets_the_gpu_rescans_and_resumes(site, capsys):
    cluster, make, resets = site
    drained_by_accelmon(cluster, make, "reset_gpu", "ecc")
    seen: list[dict[str, float]] = []
    loop = make()
    loop.run(failing("reset_gpu", "ecc"), lambda given: seen.append(given) or healthy())
    assert resets.read_text() == "00000000:2A:00.0\n"  # the reset command, for GPU 2 only, by its PCI bus id
    assert list(seen[0]) == ["GPU-2"]  # the rescan applies the reset (the xid check clears what it fixed)
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}
    assert cluster.calls()[-1] == f"update NodeName={NODE} State=RESUME"
    events = [(r.event, r.action, r.outcome) for r in Journal.read(loop.options.journal).records]
    assert events[-2:] == [("repair", "reset_gpu", "resolved"), ("resumed", "reset_gpu", "resolved")]
    assert "reset GPU 2, every check passed after it" in capsys.readouterr().out


def holders_and_a_refusing_reset(tmp_path: Path, running: list[str]) -> tuple[Path, Path, Path]:
    """(bin, units, log): a `systemctl` on PATH that keeps each running unit as a file in `units`, and a reset that
    refuses while any unit runs, as `nvidia-smi --gpu-reset` refuses while a process holds the GPU; both write what
    they did to `log` in order."""
    units, log, bin_dir = tmp_path / "units", tmp_path / "order", tmp_path / "bin"
    units.mkdir()
    bin_dir.mkdir()
    for unit in running:
        (units / unit).touch()
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(
        "#!/bin/sh\n"
        f'units="{units}"\n'
        "for unit; do :; done\n"  # the unit is the last argument, after "--"
        'case "$1" in\n'
        '  is-active) test -e "$units/$unit" ;;\n'
        f'  stop) rm -f "$units/$unit"; echo "stop $unit" >> "{log}" ;;\n'
        f'  start) touch "$units/$unit"; echo "start $unit" >> "{log}" ;;\n'
        "esac\n"
    )
    reset = bin_dir / "fake-gpu-reset"
    reset.write_text(
        "#!/bin/sh\n"
        f'if [ -n "$(ls "{units}")" ]; then echo "reset $1 refused: in use by $(ls "{units}")" >> "{log}"; '
        'echo "GPU $1 is in use by another client" >&2; exit 255; fi\n'
        f'echo "reset $1" >> "{log}"\n'
    )
    for script in (systemctl, reset):
        script.chmod(0o755)
    return bin_dir, units, log


def test_a_reset_stops_what_holds_the_gpu_and_starts_it_again(site, tmp_path, monkeypatch):
    """A reset cannot succeed while a process holds the GPU (the exporter's NVML handle, nv-hostengine): the loop stops
    the gpu_holders that run, resets, and starts them again; a holder that was not running stays stopped."""
    cluster, make, _ = site
    bin_dir, units, log = holders_and_a_refusing_reset(tmp_path, ["accelmon-exporter", "nvidia-dcgm"])
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    drained_by_accelmon(cluster, make, "reset_gpu", "ecc")
    loop = make()
    loop.options = dataclasses.replace(
        loop.options,
        reset_command=f"{bin_dir / 'fake-gpu-reset'} {{pci_bus_id}}",
        gpu_holders=("accelmon-exporter", "nvidia-dcgm", "dcgm-exporter"),
    )
    loop.run(failing("reset_gpu", "ecc"), lambda given: healthy())
    assert log.read_text().splitlines() == [
        "stop accelmon-exporter", "stop nvidia-dcgm", "reset 00000000:2A:00.0",
        "start accelmon-exporter", "start nvidia-dcgm",
    ]  # fmt: skip
    assert sorted(p.name for p in units.iterdir()) == ["accelmon-exporter", "nvidia-dcgm"]
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}


def test_a_reset_with_a_holder_left_running_fails_and_the_holders_run_again(site, tmp_path, monkeypatch):
    """Without gpu_holders the reset meets the exporter's hold and fails (what happened before this was built): the
    GPU is left for hardware service, and nothing stopped stays stopped."""
    cluster, make, _ = site
    bin_dir, units, log = holders_and_a_refusing_reset(tmp_path, ["accelmon-exporter"])
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    drained_by_accelmon(cluster, make, "reset_gpu", "ecc")
    loop = make()
    loop.options = dataclasses.replace(loop.options, reset_command=f"{bin_dir / 'fake-gpu-reset'} {{pci_bus_id}}")
    loop.run(failing("reset_gpu", "ecc"), lambda given: healthy())
    assert log.read_text().splitlines() == ["reset 00000000:2A:00.0 refused: in use by accelmon-exporter"]
    node = cluster.node(NODE)
    assert "DRAIN" in node["state"]
    refused = "GPU 2 reset: GPU 00000000:2A:00.0 is in use by another client"
    assert f"reset_gpu did not clear it ({refused})" in node["reason"]
    assert [p.name for p in units.iterdir()] == ["accelmon-exporter"]


def test_a_reset_that_does_not_repair_leaves_the_node_for_hardware_service(site):
    cluster, make, _ = site
    drained_by_accelmon(cluster, make, "reset_gpu", "ecc")
    make().run(failing("reset_gpu", "ecc"), lambda given: failing("reset_gpu", "ecc"))  # still failing after it
    node = cluster.node(NODE)
    assert "DRAIN" in node["state"]
    assert node["reason"].startswith("accelmon: GPU 2 hardware_service: reset_gpu did not clear it (GPU 2 ecc still")


def test_a_reboot_keeps_the_node_out_until_a_check_passes_after_it(site, capsys):
    """Slurm's reboot without nextstate (and without ASAP, which makes Slurm 22.05 set NextState=RESUME by itself):
    the node stays drained through the boot, its reason saying so; after it, a passing check resumes it."""
    cluster, make, _ = site
    drained_by_accelmon(cluster, make, "reboot_node")
    first_out = cluster.raw(NODE)["stamp"]["epoch"]
    make().run(failing("reboot_node"), lambda r: healthy())
    # The reason carries when the node first went out: the reboot's re-stamp does not move its place in the breaker.
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(first_out))
    assert cluster.calls()[-1] == (
        f"reboot reason=accelmon: reboot pending: reboot_node for GPU 2 (out since {since}Z) {NODE}"
    )
    node = cluster.node(NODE)
    assert node["state"] == "DOWN+DRAIN+REBOOT_ISSUED" and node["reason"].startswith("accelmon: reboot pending")
    # While the reboot is under way, nothing more is asked of Slurm but its state.
    before = len(cluster.calls())
    make().run(failing("reboot_node"), lambda r: healthy())
    assert all(call.startswith(f"show node {NODE}") for call in cluster.calls()[before:])
    cluster.boot(NODE)  # slurmd registers after the boot: still drained, as Slurm leaves it without nextstate
    assert cluster.node(NODE)["state"] == "IDLE+DRAIN"
    make().run(healthy(), lambda r: healthy())
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}
    events = [
        (r.event, r.action, r.outcome) for r in Journal.read(str(cluster.state.parent / "remediation.jsonl")).records
    ]
    assert events[-4:] == [
        ("repair", "reboot_node", "started"), ("repair", "reboot_node", "requested"),
        ("repair", "reboot_node", "resolved"), ("resumed", "reboot_node", "resolved"),
    ]  # fmt: skip


@pytest.mark.parametrize("passes_after", [True, False])
def test_a_reboot_slurm_times_out_is_drained_again_before_the_node_can_register(site, passes_after):
    """Slurm 22.05 timing a reboot out clears the drain (DOWN alone: docs/slurm.md), so that the node's next
    registration would return it to service unchecked (ReturnToService=2). The next check, or the one slurmd runs
    before it registers, drains it again; once it is back, it is judged as after any reboot."""
    cluster, make, _ = site
    drained_by_accelmon(cluster, make, "reboot_node")
    make().run(failing("reboot_node"), lambda r: healthy())
    cluster.time_out_reboot(NODE)
    assert cluster.node(NODE)["state"] == "DOWN"
    make().run(healthy(), lambda r: healthy())
    node = cluster.node(NODE)
    assert node["state"] == "DOWN+DRAIN"
    assert node["reason"].startswith("accelmon: reboot pending") and node["reason"].endswith(": reboot timed out")
    assert slurm_nodes.OUT_SINCE.search(node["reason"])  # Slurm's appends kept, and when it first went out
    journal = Journal.read(str(cluster.state.parent / "remediation.jsonl"))
    assert (journal.records[-1].event, journal.records[-1].outcome) == ("repair", "timed_out")
    cluster.boot(NODE)  # it registers at last: still drained
    assert cluster.node(NODE)["state"] == "IDLE+DRAIN"
    make().run(healthy() if passes_after else failing("reboot_node"), lambda r: healthy())
    node = cluster.node(NODE)
    if passes_after:
        assert node == {"state": "IDLE", "reason": ""}
    else:
        assert node["state"] == "IDLE+DRAIN" and "hardware_service (still fails after reboot_node)" in node["reason"]


def test_a_node_held_down_after_a_timed_out_reboot_is_resumed_by_a_passing_check(site):
    """Where ReturnToService is 0 or 1 the node stays DOWN+DRAIN after the reboot timed out: the check on the node
    (which runs, so the node is up) resumes it once everything passes."""
    cluster, make, _ = site
    drained_by_accelmon(cluster, make, "reboot_node")
    make().run(failing("reboot_node"), lambda r: healthy())
    cluster.time_out_reboot(NODE)
    make().run(healthy(), lambda r: healthy())  # drained again
    make().run(healthy(), lambda r: healthy())  # judged: passes
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}


def test_a_check_that_still_fails_after_the_reboot_keeps_the_node_for_hardware_service(site):
    cluster, make, _ = site
    drained_by_accelmon(cluster, make, "reboot_node")
    make().run(failing("reboot_node"), lambda r: healthy())
    cluster.boot(NODE)
    make().run(failing("reboot_node"), lambda r: healthy())
    node = cluster.node(NODE)
    assert node["state"] == "IDLE+DRAIN"
    assert plain(node["reason"]) == "accelmon: GPU 2 xid: hardware_service (still fails after reboot_node)"
    journal = Journal.read(str(cluster.state.parent / "remediation.jsonl"))
    assert [(r.event, r.outcome) for r in journal.records[-2:]] == [("repair", "failed"), ("escalated", "none")]
    # A failed repair is no repair for the repeat rule.
    assert journal.last_repair_of("S2", 0) is not None  # the reboot Slurm took ("requested") counts
    assert all(r.outcome != "failed" for r in [journal.last_repair_of("S2", 0)] if r)


def test_a_reboot_slurm_refuses_is_no_repair(site):
    cluster, make, _ = site
    drained_by_accelmon(cluster, make, "reboot_node")
    cluster.change(fail=["reboot"])
    make().run(failing("reboot_node"), lambda r: healthy())
    journal = Journal.read(str(cluster.state.parent / "remediation.jsonl"))
    assert [(r.event, r.outcome) for r in journal.records[-2:]] == [("repair", "started"), ("repair", "failed")]
    assert journal.last_repair_of("S2", 0) is None
    assert plain(cluster.node(NODE)["reason"]) == "accelmon: GPU 2 xid: reboot_node"  # the drain as it was
    # The next check does not ask again (Slurm would refuse the same way: no RebootProgram, say): a person's now.
    calls = len(cluster.calls())
    make().run(failing("reboot_node"), lambda r: healthy())
    assert not [c for c in cluster.calls()[calls:] if c.startswith("reboot")]
    last = Journal.read(str(cluster.state.parent / "remediation.jsonl")).records[-1]
    assert (last.event, last.action) == ("left_for_person", "reboot_node") and "failed on this drain" in last.detail


def test_restart_app_resumes_once_the_check_passes(site):
    cluster, make, _ = site
    drained_by_accelmon(cluster, make, "restart_app")
    make().run(failing("restart_app"), lambda r: healthy())
    assert "DRAIN" in cluster.node(NODE)["state"]  # still failing: waits
    make().run(healthy(), lambda r: healthy())
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}


@pytest.mark.parametrize("action", ["hardware_service", "check_fabric", "none"])
def test_what_needs_a_person_is_never_acted_on(site, action, capsys):
    cluster, make, resets = site
    drained_by_accelmon(cluster, make, action)
    before = len(cluster.calls())
    make().run(failing(action), lambda r: healthy())
    make().run(healthy(), lambda r: healthy())  # not even once the checks pass: a person looks first
    assert all(call.startswith("show node") for call in cluster.calls()[before:])  # read, never changed
    assert not resets.exists() and "DRAIN" in cluster.node(NODE)["state"]
    assert f"left drained: {action} is a person's" in capsys.readouterr().out


def test_a_drill_in_act_mode_says_drill_and_repairs_nothing(site, capsys):
    cluster, make, resets = site
    make().run(failing("reset_gpu", "ecc", drill=True), lambda r: healthy())  # the drill drains, as a fault does
    make().run(failing("reset_gpu", "ecc", drill=True), lambda r: healthy())
    assert "remediation: DRILL, nothing done: would reset GPU 2" in capsys.readouterr().out
    assert not resets.exists() and "DRAIN" in cluster.node(NODE)["state"]


def test_a_node_drained_by_someone_else_is_left_alone(site):
    cluster, make, resets = site
    cluster.set(nodes_with({NODE: "IDLE+DRAIN|rack 4 maintenance"}))
    make().run(failing("reset_gpu", "ecc"), lambda r: healthy())
    assert cluster.node(NODE)["reason"] == "rack 4 maintenance" and not resets.exists()


def test_a_busy_drained_node_is_not_repaired_until_its_jobs_end(site):
    cluster, make, resets = site
    drained_by_accelmon(cluster, make, "reset_gpu", "ecc")
    data = json.loads(cluster.state.read_text())
    data["nodes"][NODE]["state"] = "MIXED+DRAIN"  # DRAINING: a job still runs
    cluster.state.write_text(json.dumps(data))
    make().run(failing("reset_gpu", "ecc"), lambda r: healthy())
    assert not resets.exists()


# --- repeat offenders ----------------------------------------------------------------------------------------------
def test_a_repeat_within_the_window_is_drained_for_hardware_service(site):
    cluster, make, resets = site
    start = time.time()
    drained_by_accelmon(cluster, make, "reset_gpu", "ecc")
    make(now=start).run(failing("reset_gpu", "ecc"), lambda r: healthy())  # repaired and resumed
    assert cluster.node(NODE)["state"] == "IDLE"
    # The same GPU (serial S2) fails again 3 days later: drained for hardware_service, naming the repair.
    make(now=start + 3 * DAY).run(failing("reset_gpu", "ecc"), lambda r: healthy())
    node = cluster.node(NODE)
    day = time.strftime("%Y-%m-%d", time.gmtime(start))
    assert node["reason"] == f"accelmon: GPU 2 ecc: hardware_service (failed again after reset_gpu on {day})"
    make(now=start + 3 * DAY).run(failing("reset_gpu", "ecc"), lambda r: healthy())
    assert resets.read_text() == "00000000:2A:00.0\n"  # one reset, never a second


def test_a_repeat_after_the_window_is_repaired_again(site):
    cluster, make, resets = site
    start = time.time() - 10 * DAY
    make(now=start).run(failing("reset_gpu", "ecc"), lambda r: healthy())
    make(now=start).run(failing("reset_gpu", "ecc"), lambda r: healthy())
    later = time.time()
    make(now=later).run(failing("reset_gpu", "ecc"), lambda r: healthy())
    assert cluster.node(NODE)["reason"] == "accelmon: GPU 2 ecc: reset_gpu"  # a plain drain
    make(now=later).run(failing("reset_gpu", "ecc"), lambda r: healthy())
    assert resets.read_text() == "00000000:2A:00.0\n" * 2 and cluster.node(NODE)["state"] == "IDLE"


def test_a_swapped_gpu_is_another_gpu(site):
    """The journal is keyed by serial: the board in slot 2 replaced (a new serial) is repaired as new."""
    cluster, make, _ = site
    drained_by_accelmon(cluster, make, "reset_gpu", "ecc")
    make().run(failing("reset_gpu", "ecc"), lambda r: healthy())
    swapped = failing("reset_gpu", "ecc")
    swapped.gpus[1].serial = "S2-new"
    make().run(swapped, lambda r: healthy())
    assert cluster.node(NODE)["reason"] == "accelmon: GPU 2 ecc: reset_gpu"


# --- the journal ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["missing", "empty", "corrupt", "a directory"])
def test_a_journal_that_cannot_be_trusted_repairs_nothing_and_says_why(site, tmp_path, capsys, kind):
    cluster, make, resets = site
    drained_by_accelmon(cluster, make, "reset_gpu", "ecc")
    journal = tmp_path / "remediation.jsonl"
    if kind == "missing":
        journal.unlink()
    elif kind == "empty":
        journal.write_text("")
    elif kind == "corrupt":
        journal.write_text(journal.read_text() + '{"event": "drained", "time": "yesterday"\n\x00\x01garbage\n')
    else:
        journal.unlink()
        journal.mkdir()
    make().run(failing("reset_gpu", "ecc"), lambda r: healthy())
    said = capsys.readouterr().out
    assert not resets.exists() and "DRAIN" in cluster.node(NODE)["state"]
    assert "remediation: no repair: the journal" in said
    if kind == "empty":  # it holds no drain of accelmon's: nothing says what the node was drained for
        assert "holds no open drain of gpu-7" in said
    read = Journal.read(str(journal))
    if kind == "corrupt":
        assert read.malformed == 2 and "not a record" in (read.problem or "")
        assert sample_value(health_samples(read, failing=True), "accelmon_remediation_journal_usable") == 0
        assert sample_value(health_samples(read, failing=True), "accelmon_remediation_journal_malformed_lines") == 2


def test_the_journal_keeps_its_newest_records(tmp_path, monkeypatch):
    monkeypatch.setattr(remediation, "MAX_RECORDS", 3)
    journal = Journal.read(str(tmp_path / "j.jsonl"))
    for n in range(30):
        assert journal.append(Record(float(n), NODE, "drained")) is None
    kept = [r.time for r in Journal.read(str(tmp_path / "j.jsonl")).records]
    assert 3 <= len(kept) < 10 and kept == [float(n) for n in range(30 - len(kept), 30)]
    assert oct((tmp_path / "j.jsonl").stat().st_mode & 0o777) == "0o644"


APPENDER = """
import sys
from accelmon.health.remediation import Journal, Record
journal = Journal(sys.argv[1])
for n in range(100):
    journal.append(Record(float(n), sys.argv[2], "drained"))
"""


def test_two_writers_lose_no_record(tmp_path):
    """The periodic check and a background repair both write: appends under a lock keep every line whole."""
    path = str(tmp_path / "j.jsonl")
    writers = [subprocess.Popen([sys.executable, "-c", APPENDER, path, f"w{n}"]) for n in range(4)]
    assert all(writer.wait(timeout=60) == 0 for writer in writers)
    read = Journal.read(path)
    assert read.malformed == 0 and len(read.records) == 400


def test_repairs_are_served_per_gpu_action_and_outcome(site, tmp_path):
    cluster, make, _ = site
    start = time.time()
    drained_by_accelmon(cluster, make, "reset_gpu", "ecc")
    make(now=start + 60).run(failing("reset_gpu", "ecc"), lambda r: healthy())
    text = health_samples(Journal.read(str(tmp_path / "remediation.jsonl")), failing=False)
    labels = dict(gpu="2", uuid="GPU-2", serial="S2", action="reset_gpu", outcome="resolved")
    assert sample_value(text, "accelmon_gpu_remediation_repairs_total", **labels) == 1
    assert sample_value(text, "accelmon_node_remediation_events_total", event="drained", action="reset_gpu") == 1
    assert sample_value(text, "accelmon_node_remediation_events_total", event="resumed", action="reset_gpu") == 1
    drained_for = sample_value(text, "accelmon_node_remediation_drained_seconds_total")
    assert drained_for is not None and 59 < drained_for < 120
    assert sample_value(text, "accelmon_remediation_mode_info", mode="act") == 1
    assert {labels["event"] for labels, _ in series(text, "accelmon_node_remediation_events_total")} <= set(
        remediation.EVENTS
    )


def test_the_breaker_counts_only_accelmons_reasons_from_scontrols_lines():
    stamp = "[root@2026-11-27T03:00:00] Comment=rack 4"  # the fields that follow a reason are not the reason
    text = "\n".join(
        [
            f"NodeName=a Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 Reason=accelmon: GPU 1 xid: reboot_node {stamp}",
            f"NodeName=b Arch=x86_64 State=DOWN*+DRAIN ThreadsPerCore=1 Reason=accelmon DRILL, no fault: x {stamp}",
            f"NodeName=c Arch=x86_64 State=MIXED+DRAIN ThreadsPerCore=1 Reason=Kill task failed {stamp}",
            "NodeName=d Arch=x86_64 State=ALLOCATED ThreadsPerCore=1",
            "garbage",
        ]
    )
    nodes = slurm_nodes.parse_nodes(text)
    assert [(n.name, n.accelmons, n.out, n.drained_idle) for n in nodes] == [
        ("a", True, True, True),
        ("b", True, True, False),  # down: not the repair loop's (Slurm's, or a person's)
        ("c", False, True, False),
        ("d", False, False, False),
    ]
    assert nodes[0].reason == "accelmon: GPU 1 xid: reboot_node" and nodes[0].comment == "rack 4"
    assert nodes[0].reason_time == time.mktime((2026, 11, 27, 3, 0, 0, 0, 0, -1))


# --- the health check as slurmd runs it ---------------------------------------------------------------------------
def test_the_health_check_resets_a_gpu_whose_xid_a_reset_clears(tmp_path, fake_nvml_dir):
    """accelmon-slurm-health in a process, over the fake driver and a kernel log with XID 48 (a double-bit ECC
    error: critical, reset_gpu) on GPU 2. observe: drains, then says "would reset GPU 2"; act: resets it (the
    reset command runs), the rescan judges the XID acted on, and the node is resumed. The same XID again after the
    reset is a repeat offender: drained for hardware_service."""
    procfs = nvidia_procfs(tmp_path / "proc", gpus=4)
    (procfs / "stat").write_text(f"btime {BOOT}\n")
    (tmp_path / "nvml.conf").write_text("gpus 4\n")
    bus = bus_id(2).rsplit(".", 1)[0]
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(record(1, 5.0, xid_line(bus, 48, "DBE (double bit error) ECC error.")))
    script = tmp_path / "reset-gpu"
    script.write_text(f'#!/bin/sh\necho "$1" >> "{tmp_path / "resets"}"\n')
    script.chmod(0o755)
    cluster = Cluster(tmp_path, {NODE: "IDLE", "gpu-8": "IDLE"})

    def check(mode: str) -> subprocess.CompletedProcess[str]:
        options = {"remediation": mode, "remediation_journal": str(tmp_path / "journal.jsonl"),
                   "gpu_reset_command": f"{script} {{pci_bus_id}}", "gpu_holders": ""}  # fmt: skip
        config = tmp_path / "exporter.yml"
        config.write_text(yaml.safe_dump({"paths": {"procfs": str(procfs), "kmsg": str(kmsg)},
                                          "collectors": {"health": options}}))  # fmt: skip
        env = {**exporter_env(fake_nvml_dir, tmp_path / "nvml.conf"), "SLURMD_NODENAME": NODE}
        command = [sys.executable, "-m", "accelmon.schedulers.slurm.health", "--config", str(config)]
        command += ["--scontrol", str(cluster.command), "--foreground", "--dcgmi", str(tmp_path / "no-dcgmi")]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result

    check("observe")
    assert cluster.node(NODE)["reason"] == "accelmon: GPU 2 xid: reset_gpu"
    said = check("observe").stdout
    assert "remediation (observe): would reset GPU 2" in said
    assert not (tmp_path / "resets").exists()
    said = check("act").stdout
    assert (tmp_path / "resets").read_text() == "0000" + bus_id(2) + "\n"  # by its PCI bus id
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}, said
    after = check("act").stdout
    assert "failure" not in after and "xid" not in after  # the XID before the reset is judged acted on
    # The GPU logs it again, after the reset (seconds since boot, now): within the window.
    again = time.time() - BOOT + 5
    kmsg.write_text(kmsg.read_text() + record(2, again, xid_line(bus, 48, "DBE (double bit error) ECC error.")))
    check("act")
    assert "hardware_service (failed again after reset_gpu" in cluster.node(NODE)["reason"]
    assert (tmp_path / "resets").read_text() == "0000" + bus_id(2) + "\n"
