"""Never return a broken GPU to service (issue 64): the drain and repair path read as a Slurm administrator who has run
NHC for years would. Each test is a reproduction that failed before the change, on the fake controller
(tests/support/fake_scontrol.py) and hand-made verdicts:

- a drain granted within the limit stays until its node passes, whatever the limit becomes;
- a rescan after a repair that could not read the GPUs (or lost one, or found no driver) is no pass;
- a check that cannot read Slurm journals it, and the exporter serves it;
- a reason Slurm keeps on RESUME (23.11 to 25.x without accounting) is not taken for accelmon's reboot;
- a reason an administrator edited makes the node theirs;
- FUTURE nodes are no part of the share; breaker_max_nodes counts every node out; a node's clock ahead of the
  controller's does not let a fourth repair through.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from accelmon import health
from accelmon.config import load
from accelmon.exporter.checks import Check
from accelmon.exporter.metrics import Samples
from accelmon.exporter.runtime import Collector, Sampler
from accelmon.health import remediation
from accelmon.health.remediation import Journal
from accelmon.scan import sample_within, scan_health
from accelmon.schedulers.slurm.evidence import gres_gpus, not_back
from accelmon.schedulers.slurm.fleet import Limits
from accelmon.schedulers.slurm.repair import Options, SlurmRepair
from tests.support.exposition import sample_value, text_of
from tests.support.fake_scontrol import Cluster
from tests.support.jobs_tree import scan_config
from tests.test_fleet import run
from tests.test_remediation import failing, health_samples, healthy

DAY = 86400.0


def loop_on(tmp_path: Path, cluster: Cluster, node: str, now: float | None = None, **chosen) -> SlurmRepair:
    options = Options(
        str(chosen.pop("mode", "act")), str(tmp_path / f"{node}.jsonl"), 7 * DAY,
        Limits(chosen.get("min_nodes", 3), chosen.get("fraction", 0.1), 24 * 3600.0, chosen.get("repairs", 3),
               "gres:gpu", chosen.get("max_nodes", 1_000_000)),
        "true {pci_bus_id}",
    )  # fmt: skip
    loop = SlurmRepair(options, node, str(cluster.command), run, now=now)
    loop.fleet.sleep = lambda seconds: None
    return loop


def check(
    tmp_path: Path, cluster: Cluster, node: str, verdict: health.NodeHealth, after=None, now=None, **chosen
) -> list[str]:
    """One health check of `node`; what it said."""
    loop = loop_on(tmp_path, cluster, node, now, **chosen)
    said: list[str] = []
    loop.say = said.append
    loop.run(verdict, lambda resets: after if after is not None else verdict)
    return said


def erase_every_comment(cluster: Cluster) -> None:
    """An administrator's `scontrol update NodeName=ALL Comment=`, through the fake's scontrol."""
    subprocess.run([str(cluster.command), "update", "NodeName=ALL", "Comment="], check=True, timeout=30)
    assert not any(cluster.raw(node)["comment"] for node in cluster.nodes())


def test_the_fakes_hostlists_are_slurms():
    from tests.support.fake_scontrol import hostlist

    known = ["gpu-01", "gpu-02", "gpu-03", "gpu-07"]
    assert hostlist("ALL", known) == known
    assert hostlist("gpu-[01-03],gpu-07", known) == ["gpu-01", "gpu-02", "gpu-03", "gpu-07"]
    assert hostlist("gpu-7", known) == ["gpu-7"]


def records(tmp_path: Path, node: str) -> list[tuple[str, str]]:
    return [(r.event, r.outcome) for r in Journal.read(str(tmp_path / f"{node}.jsonl")).records]


def drained(cluster: Cluster, node: str) -> bool:
    return "DRAIN" in cluster.node(node)["state"]


# --- 1. a shrinking limit ----------------------------------------------------------------------------------------
def test_a_shrinking_limit_never_undrains_a_node_whose_gpu_still_fails(tmp_path):
    """40 GPU nodes, 4 drained for a failing GPU (limit 4); 20 nodes then power down and the limit becomes 3. The
    drains were granted within the limit at their time: each stays until its node passes (NHC never undrains a failed
    node); the lower limit only gates new drains."""
    nodes = [f"gpu-{n:02d}" for n in range(40)]
    cluster = Cluster(tmp_path, {node: "IDLE" for node in nodes})
    out = nodes[:4]
    for node in out:
        check(tmp_path, cluster, node, failing("reboot_node"), mode="observe")
    assert all(drained(cluster, node) for node in out)
    for node in nodes[20:]:  # power saving takes 20 idle nodes down
        cluster.edit(node, state="IDLE+POWERED_DOWN")
    for node in out:
        check(tmp_path, cluster, node, failing("hardware_service"))
    assert all(drained(cluster, node) for node in out), cluster.nodes()
    assert not [call for call in cluster.calls() if "State=UNDRAIN" in call]
    # The new limit (3 of 24) gates a new drain: a fifth failing node keeps taking jobs, saying why.
    said = check(tmp_path, cluster, nodes[5], failing("reboot_node"))
    assert not drained(cluster, nodes[5]) and any("not drained" in line for line in said), said


# --- 2. a rescan that could not read the GPUs ---------------------------------------------------------------------
def rescan_without(verdict: health.NodeHealth, **change: object) -> health.NodeHealth:
    gpus = [health.GpuHealth(**{**vars(gpu), **change}) for gpu in verdict.gpus]  # type: ignore[arg-type]
    return health.NodeHealth(gpus, verdict.checks)


def test_a_reset_whose_rescan_cannot_read_nvml_leaves_the_node_drained_saying_why(tmp_path):
    """After the reset NVML cannot start while the driver still lists the GPUs: each GPU shows its checks passed,
    over no data. That is no pass: the node stays drained, its reason saying why."""
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    check(tmp_path, cluster, "gpu-7", failing("reset_gpu", "ecc"))
    said = check(tmp_path, cluster, "gpu-7", failing("reset_gpu", "ecc"), rescan_without(healthy("ecc"), answers=False))
    node = cluster.node("gpu-7")
    assert drained(cluster, "gpu-7") and "not answering its driver library" in node["reason"], (node, said)
    assert not [call for call in cluster.calls() if "State=RESUME" in call]


def test_a_reset_gpu_missing_from_the_rescan_is_no_pass(tmp_path):
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    check(tmp_path, cluster, "gpu-7", failing("reset_gpu", "ecc"))
    only_gpu_0 = health.NodeHealth(healthy("ecc").gpus[:1], [])
    check(tmp_path, cluster, "gpu-7", failing("reset_gpu", "ecc"), only_gpu_0)
    assert drained(cluster, "gpu-7") and "00000000:2A:00.0 missing" in cluster.node("gpu-7")["reason"]


def test_a_node_back_from_its_reboot_without_a_driver_stays_drained(tmp_path):
    """accelmon's reboot comes back with no driver loaded: zero GPUs is no pass. The node stays drained and says
    why; once the GPUs answer again, a passing check resumes it."""
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))  # the reboot asked of Slurm
    cluster.boot("gpu-7")
    no_driver = health.NodeHealth([], [])
    said = check(tmp_path, cluster, "gpu-7", no_driver)
    assert drained(cluster, "gpu-7"), said
    assert any("no GPU found" in line for line in said), said
    assert records(tmp_path, "gpu-7")[-1] == ("left_for_person", "none")
    check(tmp_path, cluster, "gpu-7", healthy())
    assert cluster.node("gpu-7") == {"state": "IDLE", "reason": ""}


def test_what_a_rescan_must_show_after_a_repair():
    before = ((("00000000:18:00.0", "GPU-0")), ("00000000:2A:00.0", "GPU-2"))
    assert not_back(before, healthy(), 2) == ""
    assert "Slurm's gres has 8" in not_back(before, healthy(), 8)
    swapped = health.NodeHealth([healthy().gpus[0], health.GpuHealth("2", "GPU-9", [], "S9", "00000000:2a:00.0")], [])
    assert "another GPU at 00000000:2A:00.0" in not_back(before, swapped, 2)
    unsampled = health.NodeHealth(healthy().gpus, [], unsampled=("nvml",))
    assert "nvml did not sample" in not_back(before, unsampled, 2)
    assert gres_gpus("gpu:h100:8(S:0-1),nic:1") == 8 and gres_gpus("gpu:2,gpu:a100:2") == 4 and gres_gpus("") is None


# --- 3. could not act -----------------------------------------------------------------------------------------------
def test_a_check_that_cannot_read_slurm_journals_it_and_the_exporter_serves_it(tmp_path):
    """Every `scontrol show` failing (the controller down or failing over): the check used to print "nothing done"
    and leave no trace, so no alert could fire. Now it is journalled once while it lasts, and served."""
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    cluster.change(fail=["show node", "show nodes"])
    said = check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    assert any("Unable to contact slurm controller" in line for line in said), said
    assert records(tmp_path, "gpu-7") == [("breaker_held", "uncounted")] * 2  # at every run while it lasts
    journal = Journal.read(str(tmp_path / "gpu-7.jsonl"))
    assert sample_value(health_samples(journal, True), "accelmon_node_remediation_held", why="uncounted") == 1
    # Served whatever the exporter's own verdict (the check's scan may fail where the exporter's does not), while
    # fresh: a record of an outage long over says nothing now.
    assert sample_value(health_samples(journal, False), "accelmon_node_remediation_held", why="uncounted") == 1
    later = time.time() + 3600
    from accelmon.collectors.health import serve_journal
    from accelmon.exporter.metrics import Samples

    out = Samples()
    serve_journal(out, journal, False, "act", later)
    assert sample_value(text_of(out), "accelmon_node_remediation_held", why="uncounted") == 0


# --- 4. Slurm 23.11 keeps the reason on RESUME ------------------------------------------------------------------------
def test_a_reason_slurm_keeps_after_a_resume_is_not_taken_for_accelmons_reboot(tmp_path):
    """Slurm 23.11 to 25.x without AccountingStorageType keep the reason on RESUME: a node resumed after accelmon's
    reboot still reads "accelmon: reboot pending". Its next, unrelated failure used to be taken for a timed-out
    reboot and drained past the pause switch. Now it goes through the breaker like any drain: paused, it is not."""
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    cluster.change(keep_reason=True)
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    cluster.boot("gpu-7")
    check(tmp_path, cluster, "gpu-7", healthy())
    node = cluster.node("gpu-7")
    assert node["state"] == "IDLE" and node["reason"].startswith("accelmon: reboot pending"), node
    cluster.edit("gpu-3", comment="accelmon-paused=1:drill")
    before = len(cluster.calls())
    check(tmp_path, cluster, "gpu-7", failing("reset_gpu", "ecc"))
    assert not [call for call in cluster.calls()[before:] if "State=DRAIN" in call]
    assert records(tmp_path, "gpu-7")[-1] == ("breaker_held", "paused")


# --- 5. an administrator's edit ---------------------------------------------------------------------------------------
def test_an_administrators_edit_of_accelmons_reason_makes_the_node_theirs(tmp_path):
    """An administrator annotates a drained node "... -- RMA INC-881, do not resume (jdoe)", dropping the
    "(out since ...)" key. It is neither undrained (ranked last) nor resumed when its check passes: the reason is no
    longer the one accelmon wrote, as its journal recorded it."""
    cluster = Cluster(tmp_path, {f"gpu-{n:02d}": "IDLE" for n in range(40)})
    check(tmp_path, cluster, "gpu-07", failing("reboot_node"), mode="observe")
    edited = f"{cluster.node('gpu-07')['reason']} -- RMA INC-881, do not resume (jdoe)"
    cluster.edit("gpu-07", reason=edited, stamp={"user": "jdoe", "epoch": int(time.time())})
    said = check(tmp_path, cluster, "gpu-07", healthy())
    said += check(tmp_path, cluster, "gpu-07", failing("reboot_node"), min_nodes=1, fraction=0.0)
    assert cluster.node("gpu-07") == {"state": "IDLE+DRAIN", "reason": edited}
    assert any("reason edited by jdoe" in line for line in said), said
    assert records(tmp_path, "gpu-07")[-1] == ("left_for_person", "none")


def test_slurms_own_suffixes_and_accelmons_key_keep_a_reason_accelmons(tmp_path):
    """Slurm appends " : reboot issued" to a reboot's reason, and accelmon keys a reason with when the node first
    went out: the node is still accelmon's, and its reboot is carried through to the resume."""
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    assert cluster.node("gpu-7")["reason"].endswith(" : reboot issued")
    cluster.boot("gpu-7")
    check(tmp_path, cluster, "gpu-7", healthy())
    assert cluster.node("gpu-7") == {"state": "IDLE", "reason": ""}


# --- 8. counts ------------------------------------------------------------------------------------------------------
def test_future_nodes_are_no_part_of_the_share(tmp_path):
    """10 GPU nodes beside 90 FUTURE ones (defined in slurm.conf, not yet in service): the limit is a share of the 10
    (3), not of 100 (10)."""
    nodes = {f"gpu-{n:03d}": "IDLE" for n in range(10)}
    cluster = Cluster(tmp_path, {**nodes, **{f"new-{n:03d}": "FUTURE" for n in range(90)}})
    for node in nodes:
        check(tmp_path, cluster, node, failing("reboot_node"), mode="observe")
    assert sum(drained(cluster, node) for node in nodes) == 3


def test_breaker_max_nodes_counts_every_node_out_whatever_the_window(tmp_path):
    """A false verdict that recurs daily: nodes drained three days ago are outside the 24 h window, yet
    breaker_max_nodes (here 2) counts them: no third drain."""
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    for node in ("gpu-1", "gpu-2"):
        cluster.edit(node, state="IDLE+DRAIN", reason="accelmon: GPU 2 xid: reboot_node",
                     stamp={"user": "root", "epoch": int(time.time() - 3 * DAY)})  # fmt: skip
    said = check(tmp_path, cluster, "gpu-7", failing("reboot_node"), max_nodes=2)
    assert not drained(cluster, "gpu-7") and any("breaker_max_nodes 2" in line for line in said), said


# --- 9. clock skew ----------------------------------------------------------------------------------------------------
def test_a_node_whose_clock_runs_ahead_still_counts_the_resets_under_way(tmp_path):
    """Three GPU resets under way (max_repairs_per_hour 3); a node 70 minutes ahead of the controller (at boot, before
    chrony) used to see them as older than an hour and start a fourth. The claim is judged on the controller's clock,
    which stamped it: the fourth is taken back."""
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    for node in ("gpu-1", "gpu-2", "gpu-3"):
        cluster.edit(node, state="IDLE+DRAIN", reason="accelmon: resetting GPU 2 (reset_gpu)",
                     stamp={"user": "root", "epoch": int(time.time() - 60)})  # fmt: skip
    ahead = time.time() + 70 * 60
    check(tmp_path, cluster, "gpu-7", failing("reset_gpu", "ecc"), now=ahead, min_nodes=10)  # drained
    said = check(tmp_path, cluster, "gpu-7", failing("reset_gpu", "ecc"), now=ahead, min_nodes=10)
    assert not [call for call in cluster.calls() if "Comment=accelmon-repaired" in call], said
    assert any("repair pace" in line for line in said), said
    assert cluster.node("gpu-7")["reason"].startswith("accelmon: GPU 2 ecc: reset_gpu")


def test_every_check_that_judged_nothing_is_no_pass_in_a_real_scan():
    """A GPU the driver lists but NVML does not answer for (accelmon_gpu_up absent) is marked as not answering by
    the evaluation itself, not only in hand-made verdicts."""
    from accelmon.collectors import collectors
    from accelmon.exporter.metrics import Samples
    from accelmon.health.gpu_metrics import UP

    samples = Samples()
    samples.add(UP, ["0", "GPU-0"], 1)
    registrations = [collectors()["nvml"]]
    node = health.evaluate([samples], time.time(), registrations)
    assert [(gpu.index, gpu.answers) for gpu in node.gpus] == [("0", True)]
    samples = Samples()
    samples.add(UP, ["0", "GPU-0"], 0)
    node = health.evaluate([samples], time.time(), registrations)
    assert [(gpu.index, gpu.answers) for gpu in node.gpus] == [("0", False)]


# --- 10. the journal ------------------------------------------------------------------------------------------------
def test_a_compacted_journal_is_on_disk_before_its_name_replaces_the_old_one(tmp_path, monkeypatch):
    """Compaction replaces the journal with a new file: the new file's records and the rename (its directory) are
    fsynced, or a power cut right after could leave an empty journal and lose every repair it recorded."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(descriptor: int) -> None:
        synced.append("directory" if stat.S_ISDIR(os.fstat(descriptor).st_mode) else "file")
        real_fsync(descriptor)

    monkeypatch.setattr(remediation, "MAX_RECORDS", 3)
    monkeypatch.setattr(os, "fsync", fsync)
    journal = Journal.read(str(tmp_path / "j.jsonl"))
    for n in range(30):
        assert journal.append(remediation.Record(float(n), "gpu-7", "drained")) is None
    assert "directory" in synced
    # Every compaction synced its new file before the directory: as many file syncs beyond the appends' own.
    assert synced.count("file") == 30 + synced.count("directory")


# --- 3. a scan with a deadline ---------------------------------------------------------------------------------------
class Sleepy(Collector):
    """A collector whose hardware answers in `seconds` (NVML at 0.2 s a call over 300 calls: 61.5 s, measured)."""

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds = name, seconds

    def sample(self) -> Samples:
        time.sleep(self.seconds)
        return Samples()


def test_a_scan_past_its_deadline_names_the_collectors_that_did_not_answer():
    """The scan used to have no deadline: slurmd killed the whole check at 60 s, nothing drained, nothing logged.
    Within the deadline the collectors that answered are judged; the others are named, in order."""
    samplers = [Sampler(Sleepy("kernel_log", 0.0), 60), Sampler(Sleepy("nvml", 5.0), 60), Sampler(Sleepy("x", 0), 60)]
    started = time.monotonic()
    assert sample_within(samplers, 0.5) == ["nvml", "x"]
    assert time.monotonic() - started < 2.0
    assert samplers[0].state().success


# --- 9. the pause switch erased from every Comment --------------------------------------------------------------------
def test_a_pause_erased_from_every_comment_holds_on_the_nodes_that_saw_it_until_resume(tmp_path):
    """`scontrol update NodeName=ALL Comment=...` erases every carrier of the switch at once: the pause used to end
    silently, and drains started again mid-incident. A node whose check saw the pause keeps holding, says so, and
    its exporter serves it; `accelmon-remediation resume` ends it."""
    from accelmon.collectors.health import HealthCollector
    from accelmon.schedulers.slurm.fleet import Fleet, Limits

    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    cluster.edit("gpu-3", comment="rack R12 Asset=SN12345")
    Fleet(str(cluster.command), run, Limits()).pause("bad driver, INC-42")
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))  # held: paused
    assert not drained(cluster, "gpu-7") and records(tmp_path, "gpu-7")[-1] == ("breaker_held", "paused")
    erase_every_comment(cluster)
    said = check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    assert not drained(cluster, "gpu-7"), said
    assert any("vanished" in line for line in said), said
    served = text_of(HealthCollector(journal=str(tmp_path / "gpu-7.jsonl")).sample())
    assert sample_value(served, "accelmon_remediation_pause_vanished") == 1
    assert "not paused in Slurm" in Fleet(str(cluster.command), run, Limits()).resume()
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    assert drained(cluster, "gpu-7")
    served = text_of(HealthCollector(journal=str(tmp_path / "gpu-7.jsonl")).sample())
    assert sample_value(served, "accelmon_remediation_pause_vanished") == 0


def test_the_health_check_finds_scontrol_outside_the_path_slurmd_gives_it(tmp_path, monkeypatch):
    """slurmd gives a HealthCheckProgram little more than SLURMD_NODENAME: scontrol in /opt/slurm/bin was never
    found, every call failed and the check said "nothing done". It is looked for where sites install it."""
    from accelmon.host import slurm_nodes as nodes
    from accelmon.schedulers.slurm import health as slurm_health

    place = tmp_path / "opt-slurm-bin"
    place.mkdir()
    (place / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    (place / "scontrol").chmod(0o755)
    monkeypatch.setattr(nodes, "SCONTROL_PLACES", (str(place),))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    asked: list[str] = []

    def runner(command: list[str], timeout: float = 20):
        asked.append(command[0])
        return subprocess.CompletedProcess(command, 1, "", "down")

    config = tmp_path / "exporter.yml"
    config.write_text(f"collectors:\n  health:\n    remediation_journal: {tmp_path / 'j.jsonl'}\n")
    monkeypatch.setattr(slurm_health, "hook_scan", lambda *args: (None, failing("reboot_node")))
    assert slurm_health.main(["--config", str(config), "--node", "gpu-7"], runner) == 0
    assert asked and set(asked) == {str(place / "scontrol")}
    assert records(tmp_path, "j") == [("breaker_held", "uncounted")]


def test_a_real_rescan_whose_nvml_cannot_start_after_the_reset_keeps_the_node_drained(tmp_path, fake_nvml):
    """End to end through the real scan: NVML answers before the reset, and after it cannot start (the fake library
    refuses nvmlInit while the driver's procfs still lists both GPUs). The scan's checks judged nothing and said "ok";
    the node is not resumed, its reason says why."""
    config = scan_config(tmp_path, fake_nvml)
    before = scan_health(load(str(config)))
    assert [gpu.answers for gpu in before.gpus] == [True, True] and before.verdict != "failure"
    ecc = Check("ecc", "failure", "2 uncorrectable ECC errors", "reset_gpu")
    verdict = health.NodeHealth([before.gpus[0], replace(before.gpus[1], checks=[ecc])], before.checks)
    reset = tmp_path / "reset"  # the reset stands in for the driver's, and leaves NVML unable to start
    reset.write_text(f"#!/bin/sh\necho 'init_error 999' >> {fake_nvml.config}\n")
    reset.chmod(0o755)
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    options = Options("act", str(tmp_path / "gpu-7.jsonl"), 7 * DAY, Limits(), f"{reset} {{pci_bus_ids}}", ())
    for _ in range(2):  # the drain, then the repair
        loop = SlurmRepair(options, "gpu-7", str(cluster.command), run)
        loop.fleet.sleep = lambda seconds: None
        loop.run(verdict, lambda resets: scan_health(load(str(config)), resets))
    node = cluster.node("gpu-7")
    assert "DRAIN" in node["state"], node
    assert "the rescan cannot vouch for it: fabric, nvml did not sample; GPU 0, 1 not answering" in node["reason"]
    assert not [call for call in cluster.calls() if "State=RESUME" in call]


# --- issue 64's review: what a second look found ------------------------------------------------------------------
def test_an_adopted_drain_ranked_within_the_limit_is_granted_and_survives_a_shrinking_limit(tmp_path):
    """A check killed after its drain leaves it unverified; the next check ranks it within the limit (4th of 4).
    That rank grants it: when 20 nodes power down later (limit 3), it is not taken back while its GPU fails."""
    nodes = [f"gpu-{n:02d}" for n in range(40)]
    cluster = Cluster(tmp_path, {node: "IDLE" for node in nodes})
    for node in nodes[:3]:
        check(tmp_path, cluster, node, failing("reboot_node"), mode="observe")
    killed = loop_on(tmp_path, cluster, nodes[3], mode="observe")
    killed.fleet.sleep = lambda seconds: (_ for _ in ()).throw(KeyboardInterrupt())
    try:
        killed.run(failing("reboot_node"), lambda resets: failing("reboot_node"))
    except KeyboardInterrupt:
        pass
    check(tmp_path, cluster, nodes[3], failing("reboot_node"), mode="observe")  # adopted, ranked 4th: granted
    kept = records(tmp_path, nodes[3])
    assert kept.index(("drained", "unverified")) < kept.index(("drained", "none")), kept
    for node in nodes[20:]:
        cluster.edit(node, state="IDLE+POWERED_DOWN")
    check(tmp_path, cluster, nodes[3], failing("reboot_node"), mode="observe")
    assert drained(cluster, nodes[3]) and not [call for call in cluster.calls() if "State=UNDRAIN" in call]


def test_a_node_drained_for_a_reset_is_not_resumed_on_a_scan_that_read_nothing(tmp_path):
    """Every check "passes" once NVML cannot start (an NVIDIA library upgraded without a reboot): the GPUs answered
    nothing. The plain resume ("every check passes now") used to follow; now the scan must vouch for the node."""
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    check(tmp_path, cluster, "gpu-7", failing("restart_app"))
    said = check(tmp_path, cluster, "gpu-7", rescan_without(healthy(), answers=False))
    assert drained(cluster, "gpu-7"), said
    assert any("not answering its driver library" in line for line in said), said
    check(tmp_path, cluster, "gpu-7", healthy())
    assert cluster.node("gpu-7") == {"state": "IDLE", "reason": ""}


def test_a_reboot_slurm_timed_out_is_drained_again_even_without_the_journal(tmp_path):
    """A timed-out reboot leaves the node DOWN without its drain (22.05); with the journal gone (a diskless node)
    the node used to be left to return to service unchecked. DOWN with accelmon's reboot reason is enough."""
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    cluster.time_out_reboot("gpu-7")
    (tmp_path / "gpu-7.jsonl").unlink()
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    assert "DRAIN" in cluster.node("gpu-7")["state"]


def test_after_accelmons_reboot_the_gpus_of_before_must_answer(tmp_path):
    """GPU 2 gone after the reboot and another board at another bus (still two GPUs, as gres says): resumed as
    "every check passed" before; the inventory journalled at the drain and the reboot's start now says no."""
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    cluster.boot("gpu-7")
    other = health.GpuHealth("5", "GPU-5", [], "S5", "00000000:5A:00.0")
    said = check(tmp_path, cluster, "gpu-7", health.NodeHealth([healthy().gpus[0], other], []))
    assert drained(cluster, "gpu-7") and any("00000000:2A:00.0 missing" in line for line in said), said


def test_a_pause_erased_while_every_node_was_healthy_still_holds(tmp_path):
    """The pause set while every check was healthy (none listed the fleet), then `NodeName=ALL Comment=`: a healthy
    check reads its own node and remembers the pause its Comment carried, so the first failure still holds."""
    from accelmon.schedulers.slurm.fleet import Fleet, Limits

    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    Fleet(str(cluster.command), run, Limits()).pause("INC-42")
    check(tmp_path, cluster, "gpu-7", healthy())
    erase_every_comment(cluster)
    said = check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    assert not drained(cluster, "gpu-7") and any("vanished" in line for line in said), said


def test_a_resume_from_a_host_behind_the_pausers_clock_ends_the_pause(tmp_path):
    """Paused from a host 10 minutes ahead, resumed 5 minutes later from one on time: the nodes that remembered the
    pause used to hold it, comparing the two hosts' clocks. Any resume marker ends it (a pause removes them all)."""
    from accelmon.schedulers.slurm.fleet import Fleet, Limits

    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    Fleet(str(cluster.command), run, Limits(), now=lambda: time.time() + 600).pause("INC-42")
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))  # held, remembered
    Fleet(str(cluster.command), run, Limits(), now=lambda: time.time() + 300).resume()
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    assert drained(cluster, "gpu-7")


def test_a_repair_claim_whose_take_back_failed_is_still_accelmons(tmp_path):
    """The controller applied a repair claim, then stopped answering: the take-back failed, the journal never
    recorded the claim. The next check found "accelmon: resetting GPU 2" and called it an administrator's edit."""
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    check(tmp_path, cluster, "gpu-7", failing("reset_gpu", "ecc"), mode="observe")
    since = cluster.node("gpu-7")["reason"]
    cluster.edit("gpu-7", reason="accelmon: resetting GPU 2 (reset_gpu)")
    said = check(tmp_path, cluster, "gpu-7", failing("reset_gpu", "ecc"), mode="observe")
    assert not any("edited" in line for line in said), (since, said)


def test_a_node_down_with_a_reason_slurm_kept_is_not_out_by_accelmon(tmp_path):
    """Slurm 23.11+ without accounting keep the reason of a node accelmon resumed; one that later stops responding
    is DOWN with it. Three such nodes used to hold back a real drain (3 out, limit 3)."""
    cluster = Cluster(tmp_path, {f"gpu-{n}": "IDLE" for n in range(20)})
    for node in ("gpu-1", "gpu-2", "gpu-3"):
        cluster.edit(node, state="DOWN", reason="accelmon: reboot pending: reboot_node for GPU 2")
    check(tmp_path, cluster, "gpu-7", failing("reboot_node"))
    assert drained(cluster, "gpu-7")


def test_the_prologs_diagnostic_that_drains_nothing_is_journalled(tmp_path):
    """A failing diagnostic on a reserved node runs the job (no drain), but the periodic check never runs the
    diagnostic: it was said in slurmd's log only. Now journalled, for a person."""
    from tests.test_slurm_health import failing_prolog

    cluster = Cluster(tmp_path, {"gpu-7": "MIXED+RESERVED", **{f"gpu-{n}": "IDLE" for n in range(10, 20)}})
    result = failing_prolog(tmp_path, cluster.command)
    assert result.returncode == 0, result.stderr
    assert records(tmp_path, "j") == [("left_for_person", "none")]
