"""The scheduler collector: Slurm's view of the node as one bounded state, asked off the scrape path; a controller
that does not answer fails the sample (and its series goes, as every stale sample's does)."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from accelmon.collectors.scheduler import SchedulerCollector
from accelmon.exporter.runtime import Exporter, Sampler
from accelmon.host.slurm_nodes import STATES, ledger_state
from tests.support.exposition import check_golden, promtool_check, sample_value, series, text_of
from tests.support.fake_scontrol import Cluster
from tests.support.waiting import wait_until


@pytest.mark.parametrize(
    ("slurm", "served"),
    [
        ("IDLE", "idle"),
        ("ALLOCATED", "allocated"),
        ("COMPLETING", "allocated"),
        ("MIXED", "mixed"),
        ("IDLE+DRAIN", "drained"),
        ("MIXED+DRAIN", "draining"),
        ("ALLOCATED+DRAIN", "draining"),
        ("DOWN*+DRAIN", "down"),
        ("DOWN*", "down"),
        ("IDLE+DRAIN+REBOOT_REQUESTED", "drained"),
        ("IDLE+RESERVED", "reserved"),
        ("MIXED+MAINT", "draining"),  # a maintenance reservation: no new jobs (Slurm before 21.08)
        ("IDLE+MAINTENANCE", "drained"),  # 21.08 and later
        ("IDLE+REBOOT_ISSUED", "drained"),  # being rebooted: no new jobs
        ("MIXED+REBOOT_REQUESTED", "draining"),
        ("IDLE~", "idle"),  # powered down, still schedulable
        ("FUTURE", "unknown"),
        ("SOMETHING_NEW", "unknown"),
    ],
)
def test_slurms_states_map_to_bounded_ones(slurm, served):
    assert ledger_state(slurm) == served and served in STATES


def test_one_series_of_the_nodes_state(tmp_path):
    cluster = Cluster(tmp_path, {"gpu-7": "MIXED+DRAIN|accelmon: GPU 2 xid: reboot_node", "gpu-8": "IDLE"})
    collector = SchedulerCollector(str(cluster.command), "gpu-7")
    text = text_of(collector)
    assert series(text, "accelmon_node_scheduler_state") == [({"scheduler": "slurm", "state": "draining"}, 1.0)]
    assert cluster.calls() == ["show node gpu-7 --json", "show node gpu-7 --oneliner"]  # 22.05: no --json
    since = sample_value(text, "accelmon_node_out_by_accelmon_since_seconds", scheduler="slurm")
    assert since is not None and abs(since - (time.time() - 3600)) < 5  # the reason's stamp (an hour ago here)
    assert sample_value(text, "accelmon_remediation_paused", scheduler="slurm") == 0
    text_of(collector)
    assert cluster.calls()[2:] == ["show node gpu-7 --oneliner"]  # the form is decided once
    promtool_check(text)


def test_the_node_is_slurms_name_for_it(tmp_path, monkeypatch):
    """slurmd's NodeName may differ from the host's name: SLURMD_NODENAME, where the environment has it, is read."""
    cluster = Cluster(tmp_path, {"node-a17": "IDLE+MAINTENANCE", "gpu-8": "IDLE"})
    monkeypatch.setenv("SLURMD_NODENAME", "node-a17")
    text = text_of(SchedulerCollector(str(cluster.command)))
    assert series(text, "accelmon_node_scheduler_state") == [({"scheduler": "slurm", "state": "drained"}, 1.0)]
    assert cluster.calls()[-1] == "show node node-a17 --oneliner"
    assert sample_value(text, "accelmon_node_scheduler_node_info", source="SLURMD_NODENAME") == 1
    monkeypatch.delenv("SLURMD_NODENAME")
    assert SchedulerCollector(str(cluster.command)).node == socket.gethostname().split(".")[0]


def test_the_exporter_finds_its_node_by_its_host_name_and_says_how(tmp_path, monkeypatch):
    """The exporter is not started by slurmd (no SLURMD_NODENAME): a NodeName that is not the host's name is found by
    its NodeHostName, asked for by name from then on, and the info series says which name and why."""
    host = socket.gethostname().split(".")[0]
    cluster = Cluster(tmp_path, {"node-a17": "IDLE+DRAIN|maintenance", "gpu-8": "IDLE"})
    cluster.edit("node-a17", host=host)
    cluster.edit("gpu-8", host="gpu-8.example")
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    collector = SchedulerCollector(str(cluster.command))
    text = text_of(collector)
    assert series(text, "accelmon_node_scheduler_state") == [({"scheduler": "slurm", "state": "drained"}, 1.0)]
    info = series(text, "accelmon_node_scheduler_node_info")
    assert info == [({"scheduler": "slurm", "scheduler_node": "node-a17", "source": "NodeHostName"}, 1.0)]
    text_of(collector)
    assert cluster.calls()[-1] == "show node node-a17 --oneliner"
    # Where no node is this host, the sample fails and says what scontrol said.
    cluster.edit("node-a17", host="elsewhere")
    with pytest.raises(RuntimeError, match=f"scontrol show node {host}: Node {host} not found"):
        SchedulerCollector(str(cluster.command)).sample()


def test_the_pause_switch_is_served_by_the_node_that_carries_it(tmp_path):
    cluster = Cluster(tmp_path, {"gpu-7": "IDLE"})
    cluster.edit("gpu-7", comment="rack 4 accelmon-paused=1795748400:INC-42")
    text = text_of(SchedulerCollector(str(cluster.command), "gpu-7"))
    assert sample_value(text, "accelmon_remediation_paused", scheduler="slurm") == 1


def test_a_controller_that_does_not_answer_fails_the_sample_and_the_state_goes(tmp_path):
    cluster = Cluster(tmp_path, {"gpu-7": "IDLE"})
    collector = SchedulerCollector(str(cluster.command), "gpu-7")
    sampler = Sampler(collector, 0.1)
    exporter = Exporter([sampler], stale_after_intervals=2, drop_after_seconds=0.1)
    exporter.collect_once()
    assert 'accelmon_node_scheduler_state{scheduler="slurm",state="idle"} 1.0' in exporter.exposition().decode()
    cluster.set({"gpu-7": "IDLE"}, fail=("show",))
    failed = exporter.collect_once()[1]
    assert failed == ["scheduler"]
    text = exporter.exposition().decode()
    assert sample_value(text, "accelmon_collector_success", collector="scheduler") == 0
    # The last state is not served on as if it were current (dropped after drop_after_seconds).
    wait_until(lambda: "accelmon_node_scheduler_state{" not in exporter.exposition().decode(), 5, "the state dropped")


def test_a_slow_controller_times_out(tmp_path):
    def slow(command, timeout):
        raise subprocess.TimeoutExpired(command, timeout)

    with pytest.raises(RuntimeError, match="did not answer in 2 s"):
        SchedulerCollector("scontrol", "gpu-7", 2.0, slow).sample()


def test_a_node_slurm_does_not_know_fails_the_sample(tmp_path):
    cluster = Cluster(tmp_path, {"gpu-7": "IDLE"})
    with pytest.raises(RuntimeError, match="Node gpu-9 not found"):
        SchedulerCollector(str(cluster.command), "gpu-9").sample()


def test_golden(tmp_path):
    cluster = Cluster(tmp_path, {"gpu-7": "IDLE+DRAIN|accelmon: GPU 2 xid: reboot_node"}, json_form=True)
    cluster.edit("gpu-7", stamp={"user": "root", "at": "2026-11-27T03:00:00", "epoch": 1795748400})  # stays still
    text = text_of(SchedulerCollector(str(cluster.command), "gpu-7"))
    promtool_check(text)
    check_golden("scheduler_drained.prom", text)
