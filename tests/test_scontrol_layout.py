"""How accelmon reads `scontrol show node(s)`: the one-line text form by Slurm's own layout (slurm_sprint_node_table in
src/api/node_info.c: Slurm's fixed fields, then Reason with its stamp, Comment, Extra and a few later ones, each only
when set; docs/slurm.md), the choice between the JSON and the text form, and where scontrol is found."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from accelmon.host import slurm_nodes
from accelmon.host.slurm_nodes import Listing, field_value, find_scontrol, parse_nodes, run_scontrol
from accelmon.host.slurm_pause import pause_of
from accelmon.schedulers.slurm.fleet import Fleet, Limits
from tests.support.fake_scontrol import Cluster, line, stamp

# The fields of 22.05.8's one-line node in the order slurm_sprint_node_table prints them (those the fake prints).
SLURM_22_05_ORDER = (
    "NodeName", "Arch", "CoresPerSocket", "CPUAlloc", "CPUEfctv", "CPUTot", "CPULoad", "AvailableFeatures",
    "ActiveFeatures", "Gres", "NodeAddr", "NodeHostName", "Version", "OS", "RealMemory", "AllocMem", "FreeMem",
    "Sockets", "Boards", "State", "ThreadsPerCore", "TmpDisk", "Weight", "Owner", "MCS_label", "NextState",
    "Partitions", "BootTime", "SlurmdStartTime", "LastBusyTime", "CfgTRES", "AllocTRES", "CapWatts", "CurrentWatts",
    "AveWatts", "ExtSensorsJoules", "ExtSensorsWatts", "ExtSensorsTemp", "Reason", "Comment", "Extra",
)  # fmt: skip
PAUSE = "accelmon-paused=1795748400:INC-42"


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return run_scontrol(command, 60)


def printed(reason: str = "", comment: str = "", extra: str = "", state: str = "IDLE+DRAIN") -> str:
    """One node as the fake (Slurm 22.05.8's layout) prints it, its reason stamped by root."""
    node = {"state": state, "reason": reason, "comment": comment, "extra": extra, "stamp": stamp(), "gres": "gpu:8"}
    return line("gpu-7", node)


def test_the_fake_prints_slurms_order():
    """The fake's line has 22.05.8's fields in Slurm's order: Reason (stamp after it) before Comment before Extra, the
    free text after every fixed field; NextState only for a node being rebooted."""
    text = printed("maintenance", "rack 4", '{"a": 1}')
    keys = re.findall(r"(?:^|\s)([A-Za-z_]+)=", text)
    assert keys == [key for key in SLURM_22_05_ORDER if key in keys]
    assert keys[-3:] == ["Reason", "Comment", "Extra"] and "NextState" not in keys
    assert re.search(r" Reason=maintenance \[root@[0-9T:-]+\] Comment=rack 4 Extra=", text)
    rebooting = {"state": "DOWN+DRAIN+REBOOT_ISSUED", "reason": "", "next_state": "RESUME", "stamp": stamp()}
    assert " MCS_label=N/A NextState=RESUME Partitions=batch " in line("gpu-7", rebooting)


def test_a_comment_holding_key_value_words_is_kept_whole():
    """Issue 64, point 7: `Comment=rack R12 Asset=SN12345` was read up to ` Asset=`: the asset tag lost, and a pause
    token after it not seen."""
    (node,) = parse_nodes(printed("accelmon: GPU 1 xid: reboot_node", f"rack R12 Asset=SN12345 {PAUSE}"))
    assert node.comment == f"rack R12 Asset=SN12345 {PAUSE}"
    assert node.reason == "accelmon: GPU 1 xid: reboot_node" and node.reason_user == "root"
    found = pause_of([node])
    assert found is not None and (found.since, found.reason) == (1795748400.0, "INC-42")
    assert field_value(printed(comment="rack R12 Asset=SN12345"), "Comment") == "rack R12 Asset=SN12345"


def test_pause_and_resume_keep_the_asset_tag(tmp_path):
    """The pause switch written back into a Comment read whole: `rack R12 Asset=SN12345` keeps its asset tag through
    a pause and a resume (the text form, as 22.05 prints it)."""
    cluster = Cluster(tmp_path, {"a": "IDLE", "b": "IDLE"})
    cluster.edit("a", comment="rack R12 Asset=SN12345")
    switch = Fleet(str(cluster.command), run_scontrol, Limits(), sleep=lambda seconds: None)
    assert "switch on 2 of 2 nodes" in switch.pause("INC-42")
    assert re.fullmatch(r"rack R12 Asset=SN12345 accelmon-paused=\d+:INC-42", cluster.raw("a")["comment"])
    shown = [call for call in cluster.calls() if call.startswith("show")]
    assert switch.listing.json is False and shown[0] == "show nodes --json"
    assert all(call.endswith("--oneliner") for call in shown[1:])
    assert switch.resume() == "resumed: drains and repairs go on"
    assert re.fullmatch(r"rack R12 Asset=SN12345 accelmon-resumed=\d+", cluster.raw("a")["comment"])


def test_a_reason_holding_a_comment_is_no_pause():
    """Issue 64, point 7: a reason holding ` Comment=accelmon-paused=1:x` read as the fleet's pause switch. The reason
    ends at its stamp; the Comment is the one Slurm printed after it."""
    (node,) = parse_nodes(printed("RMA Comment=accelmon-paused=1:x", "rack 4"))
    assert (node.reason, node.comment) == ("RMA Comment=accelmon-paused=1:x", "rack 4")
    assert pause_of([node]) is None
    (bare,) = parse_nodes(printed("RMA Comment=accelmon-paused=1:x"))  # no Comment set at all
    assert (bare.reason, bare.comment, pause_of([bare])) == ("RMA Comment=accelmon-paused=1:x", "", None)


def test_a_stamp_quoted_in_a_reason_is_not_its_end():
    """Nothing Slurm prints after the Reason is stamped: the reason's own stamp is the last one, a stamp quoted
    inside the reason's text is the reason's."""
    quoted = "was: Kill task failed [slurm@2026-11-01T00:00:00] Comment=accelmon-paused=1:x"
    (node,) = parse_nodes(printed(quoted, "rack 4"))
    assert (node.reason, node.reason_user, node.comment, pause_of([node])) == (quoted, "root", "rack 4", None)


def test_a_comment_holding_a_reason_is_no_reason():
    """A node with no reason, its Comment holding ` Reason=accelmon: ...`: Comment comes after Reason in Slurm's
    layout, so there is no reason, and the node is not counted as drained by accelmon."""
    (node,) = parse_nodes(printed(comment="was Reason=accelmon: GPU 1 xid: reboot_node", state="IDLE"))
    assert (node.reason, node.accelmons, node.comment) == ("", False, "was Reason=accelmon: GPU 1 xid: reboot_node")
    assert field_value(printed(comment="x Reason=y"), "Reason") is None


def test_fixed_fields_are_read_before_the_free_text():
    """A Comment holding ` Gres=`, ` State=` or ` NodeHostName=` changes none of Slurm's fixed fields; OS= holds
    spaces and is read whole."""
    text = printed(comment="moved State=DOWN Gres=gpu:0 NodeHostName=elsewhere Partitions=none", state="IDLE")
    (node,) = parse_nodes(text)
    assert (node.state, node.gres, node.host, node.partitions) == ("IDLE", "gpu:8", "gpu-7", ("batch",))
    assert field_value(text, "OS") == "Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)"


def test_the_fields_after_comment():
    """Slurm 23.02 to 25.11 print Extra, InstanceId, InstanceType, ReservationName, the TLS fields, Topology and
    Parameters after the Comment: the Comment ends at the first of them; an unstamped reason ends at the Comment; a
    multi-line reason goes on after its stamp on lines of its own (8 spaces in the one-line form)."""
    text = (
        "NodeName=c1 State=IDLE+DRAIN CurrentWatts=0 AveWatts=0 Reason=first line [root@2026-11-27T03:00:00]"
        '        second line Comment=rack 4 Asset=A1 Extra={"rack": 4} InstanceId=i-0abc InstanceType=p5.48xlarge '
        "ReservationName=maint TLSCertTokenSet=No TLSCertLastRenewal=None Topology=default:s1 Parameters=x"
    )
    (node,) = parse_nodes(text)
    assert (node.reason, node.comment, node.reason_time) == ("first line\nsecond line", "rack 4 Asset=A1", 1795748400)
    assert field_value(text, "Extra") == '{"rack": 4}'
    assert [field_value(text, key) for key in ("InstanceId", "InstanceType", "ReservationName")] == [
        "i-0abc", "p5.48xlarge", "maint",
    ]  # fmt: skip
    assert (field_value(text, "Topology"), field_value(text, "Parameters")) == ("default:s1", "x")
    (unstamped,) = parse_nodes("NodeName=c2 State=DOWN Reason=Not responding Comment=rack 5")
    assert (unstamped.reason, unstamped.reason_time, unstamped.comment) == ("Not responding", None, "rack 5")


def test_a_timed_out_json_call_decides_nothing(tmp_path):
    """Issue 64, point 7: a --json call that timed out (its error text holds the command line, "--json" in it)
    switched the process to the text form for good. It decides nothing: the next listing asks for JSON again."""
    cluster = Cluster(tmp_path, {"a": "IDLE", "b": "IDLE"}, json_form=True)
    timed_out = [False]

    def runner(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        if not timed_out[0]:
            timed_out[0] = True
            raise subprocess.TimeoutExpired(command, timeout)
        return run_scontrol(command, timeout)

    fleet = Fleet(str(cluster.command), runner, Limits())
    assert fleet.nodes() is None and fleet.listing.json is None and "timed out" in fleet.listing.problem
    found = fleet.nodes()
    assert found is not None and [n.name for n in found] == ["a", "b"] and fleet.listing.json is True
    assert cluster.calls() == ["show nodes --json"]


def test_only_scontrols_refusal_decides_the_text_form():
    """The error text of a call that did not finish names the command: no reason to give up JSON. scontrol's own
    refusal does."""
    said = str(subprocess.TimeoutExpired(["scontrol", "show", "nodes", "--json"], 20))
    answers = [subprocess.CompletedProcess([], 1, "", said)]
    listing = Listing("scontrol", lambda command: answers.pop(0))
    assert listing.read() is None and listing.json is None
    refused = "scontrol: unrecognized option '--json'\nTry \"scontrol --help\" for more information"
    answers += [subprocess.CompletedProcess([], 1, "", refused), subprocess.CompletedProcess([], 0, printed(), "")]
    assert [n.name for n in listing.read() or []] == ["gpu-7"] and listing.json is False


@pytest.mark.parametrize(
    "missing", [True, "serializer_required: could not find plugin for application/json"], ids=["23.02", "25.05"]
)
def test_a_scontrol_without_its_json_plugin_reads_text(tmp_path, missing):
    """Issue 64, point 3: a Slurm 23.02+ built without json-c fails every --json with `fatal: JSON plugin load
    failure` (25.05 and later: `serializer_required: could not find plugin for application/json`): the text form,
    for the rest of the process, as 22.05's refusal."""
    cluster = Cluster(tmp_path, {"a": "IDLE", "b": "IDLE+DRAIN|RMA"}, json_form=True)
    cluster.change(json_plugin_missing=missing)
    refused = run([str(cluster.command), "show", "nodes", "--json"])
    assert refused.returncode == 1 and refused.stderr.startswith("scontrol: fatal: ") and not refused.stdout
    listing = Listing(str(cluster.command), run)
    first, again = listing.read(), listing.read("b")
    assert first is not None and [(n.name, n.reason) for n in first] == [("a", ""), ("b", "RMA")]
    assert again is not None and [n.name for n in again] == ["b"] and listing.json is False
    assert cluster.calls()[1:] == ["show nodes --json", "show nodes --oneliner", "show node b --oneliner"]


@pytest.mark.parametrize(
    "said",
    [
        "scontrol: unrecognized option '--json'",
        "scontrol: fatal: JSON plugin load failure",
        "scontrol: fatal: serializer_required: could not find plugin for application/json",
        "scontrol: fatal: serializer_g_init: Unable to load serializer plugins: Plugin loading failed",
        "scontrol: error: data_parser_g_new: failure loading plugins: Plugin loading failed",
        "scontrol: error: data_parser_g_new: plugin data_parser/v0.0.39 not found",
        "scontrol: error: data_parser_g_new: unable to find plugin data_parser/v0.0.40\n"
        "scontrol: error: application/json output not supported by data_parser/v0.0.40",
    ],
)
def test_each_of_slurms_no_json_messages_reads_text(said):
    """What Slurm prints when its scontrol cannot give JSON (docs/slurm.md, from Slurm's source): the text form."""
    answers = [subprocess.CompletedProcess([], 1, "", said), subprocess.CompletedProcess([], 0, printed(), "")]
    listing = Listing("scontrol", lambda command: answers.pop(0))
    assert [n.name for n in listing.read() or []] == ["gpu-7"] and listing.json is False


def test_a_controller_that_does_not_answer_decides_nothing(tmp_path):
    cluster = Cluster(tmp_path, {"a": "IDLE"}, json_form=True)
    cluster.change(fail=["show"])
    listing = Listing(str(cluster.command), run)
    assert listing.read() is None and listing.json is None and "Unable to contact" in listing.problem
    cluster.change(fail=[])
    assert listing.read() is not None and listing.json is True


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_find_scontrol(tmp_path, monkeypatch):
    """scontrol outside the PATH slurmd gives its HealthCheckProgram: the configured path as it is, else the PATH,
    else the usual places, in order (a file that is not executable is passed over), else the bare name."""
    on_path, elsewhere = tmp_path / "bin", tmp_path / "opt" / "slurm" / "bin"
    not_runnable = tmp_path / "usr" / "bin" / "scontrol"
    not_runnable.parent.mkdir(parents=True)
    not_runnable.write_text("")
    monkeypatch.setattr(slurm_nodes, "SCONTROL_PLACES", (str(not_runnable.parent), str(elsewhere)))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert find_scontrol("/usr/site/bin/scontrol") == "/usr/site/bin/scontrol"  # a path, as configured
    assert find_scontrol("scontrol") == "scontrol" == find_scontrol("")  # nowhere: the run fails and says so
    executable(elsewhere / "scontrol")
    assert find_scontrol("scontrol") == str(elsewhere / "scontrol") == find_scontrol("")
    executable(on_path / "scontrol")
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path / "empty"), str(on_path)]))
    assert find_scontrol("scontrol") == str(on_path / "scontrol")


def test_the_usual_places():
    assert slurm_nodes.SCONTROL_PLACES == ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/local/slurm/bin")
