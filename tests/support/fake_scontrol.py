"""A stand-in for Slurm's controller, reached through a fake `scontrol`, for the health check's tests: the cluster's
nodes in a JSON file, answered and changed as Slurm 22.05 answered and changed them on this machine (docs/slurm.md),
every call logged.

Like slurmctld it serialises calls (each holds a lock on the state for its whole run) and stamps every reason it
sets with the real time, to the second, printed as scontrol prints it: in the time zone of the scontrol process
(`[root@2026-11-27T11:54:03]`; accelmon runs it with TZ=UTC). `meet` makes the first N listings wait for each other,
so N health checks started together meet the controller at the same moment, as they do when slurmd starts every
node's HealthCheckProgram in the same instant. Each node has two GPUs (gres `gpu:h100:2`, as the tests' verdicts
hold two) unless given another.

The faults of a loaded controller, as settings (`Cluster.change`):
    latency: S          every call that reaches the controller takes S seconds (holding the controller's lock, as
                        slurmctld's serialised RPCs); the --json refusals below never reach it and take none
    fail: [WORDS]       calls starting so ("show nodes", "update") fail: "Unable to contact slurm controller"
    lose: [ARG]         an update with that argument ("State=DRAIN") is applied, then its answer is lost: it fails
                        with "Socket timed out on send/recv operation", as a client whose RPC outlived its timeout
    refuse: [ARG]       an update with that argument ("State=UNDRAIN") is refused and changes nothing
    keep_reason: true   RESUME and UNDRAIN keep the reason, as Slurm 23.11 to 25.x do without AccountingStorageType
                        (fixed upstream on master only: "Resuming nodes clears reason without database")
    json_plugin_missing: a Slurm 23.02+ built without json-c: every --json call fails, status 1, before any call to
                        the controller, with "scontrol: fatal: JSON plugin load failure" (a string: that message
                        instead, e.g. 25.05's "serializer_required: could not find plugin for application/json")

Every call is logged (`Cluster.calls`) in the order it was answered, beside the state: a refusal scontrol makes by
itself is logged without waiting for the controller's lock.

    show node NAME --oneliner | show nodes --oneliner      one line a node, as 22.05.8 prints it (`line`)
    show node NAME --json | show nodes --json               Slurm 23.02's JSON with `json`, else 22.05's refusal
    update NodeName=NAME State=DRAIN Reason=...            DRAIN added, the reason stamped
    update NodeName=NAME State=UNDRAIN                     DRAIN and the reason gone, the base state kept
    update NodeName=NAME State=RESUME                      DRAIN, DOWN, the reboot flags and the reason gone
    update NodeName=NAME Reason=... | Comment=...          set
    update NodeName=ALL ... | NodeName=gpu-[1-3,7] ...     every node, or those of a range, as Slurm's hostlists
    reboot [ASAP] [nextstate=S] [reason=R] NAME            the reboot issued at once (the node is idle): the node
                                                           DOWN+DRAIN+REBOOT_ISSUED, its reason + " : reboot issued";
                                                           ASAP without nextstate sets NextState=RESUME (as 22.05 does)

`Cluster.boot(name)` is the node registering after its reboot: drained still, unless its NextState was RESUME.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

WRAPPER = """#!/bin/sh
exec "{python}" "{script}" "{state}" "$@"
"""


def stamp(user: str = "root", when: float | None = None) -> dict[str, Any]:
    """A reason's stamp: who and when (epoch seconds, printed in the scontrol process's local time)."""
    return {"user": user, "epoch": int(time.time() if when is None else when)}


class Cluster:
    """`nodes`: name -> state (a reason may follow after '|', e.g. "IDLE+DRAIN|maintenance"; a reason given so is
    stamped an hour ago unless `reason_age` says otherwise)."""

    def __init__(
        self, directory: Path, nodes: dict[str, str], json_form: bool = False, reason_age: float = 3600
    ) -> None:
        self.state = directory / "slurm-state.json"
        self.log = calls_log(self.state)
        self.command = directory / "scontrol"
        self.command.write_text(WRAPPER.format(python=sys.executable, script=__file__, state=self.state))
        self.command.chmod(0o755)
        self.json_form = json_form
        self.set(nodes, reason_age=reason_age)

    def set(self, nodes: dict[str, str], fail: tuple[str, ...] = (), reason_age: float = 3600, **settings: Any) -> None:
        parsed = {}
        for name, value in nodes.items():
            state, reason = [*value.split("|", 1), ""][:2]
            parsed[name] = {
                "state": state, "reason": reason, "comment": "", "next_state": "", "gres": "gpu:h100:2",
                "stamp": stamp(when=time.time() - reason_age),
            }  # fmt: skip
        data = {"nodes": parsed, "fail": list(fail), "json": self.json_form, "listings": 0, **settings}
        with Locked(self.state, fresh=data):
            self.log.write_text("")

    def change(self, **settings: Any) -> None:
        with Locked(self.state) as data:
            data.update(settings)

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()

    def node(self, name: str) -> dict[str, str]:
        node = json.loads(self.state.read_text())["nodes"][name]
        return {"state": node["state"], "reason": node["reason"]}

    def raw(self, name: str) -> dict[str, Any]:
        return json.loads(self.state.read_text())["nodes"][name]

    def nodes(self) -> dict[str, dict[str, str]]:
        return {name: self.node(name) for name in json.loads(self.state.read_text())["nodes"]}

    def edit(self, name: str, **fields: Any) -> None:
        with Locked(self.state) as data:
            data["nodes"][name].update(fields)

    def boot(self, name: str) -> None:
        """The node registers after its reboot (slurmd back, a new boot time)."""
        with Locked(self.state) as data:
            node = data["nodes"][name]
            flags = [f for f in node["state"].split("+") if f not in ("DOWN", "REBOOT_ISSUED", "REBOOT_REQUESTED")]
            if node.get("next_state") == "RESUME":
                flags = [f for f in flags if f != "DRAIN"]
                node["reason"] = ""
            node["state"] = "+".join(["IDLE", *[f for f in flags if f != "IDLE"]])
            node["next_state"] = ""

    def time_out_reboot(self, name: str) -> None:
        """Slurm gives up waiting for the node's reboot (ResumeTimeout): as Slurm 22.05 did in the Molecule cluster
        (docs/slurm.md), the node is DOWN, its drain cleared, its reason kept with ": reboot timed out" appended."""
        with Locked(self.state) as data:
            node = data["nodes"][name]
            node["state"], node["next_state"], node["stamp"] = "DOWN", "", stamp("slurm")
            node["reason"] += " : reboot timed out"


class Locked:
    """The controller's lock over its state, held for one call (slurmctld serialises them)."""

    def __init__(self, path: Path, fresh: dict[str, Any] | None = None) -> None:
        self.path, self.fresh = path, fresh

    def __enter__(self) -> dict[str, Any]:
        self.lock = open(str(self.path) + ".lock", "a")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        self.data: dict[str, Any] = self.fresh if self.fresh is not None else json.loads(self.path.read_text())
        return self.data

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:  # replaced whole: a reader outside the lock (a test, `meet`) never sees half a state
            temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(self.data))
            os.replace(temporary, self.path)
        self.lock.close()


def line(name: str, node: dict[str, Any]) -> str:
    """The node as Slurm 22.05.8's `scontrol show node --oneliner` prints it (slurm_sprint_node_table in
    src/api/node_info.c, docs/slurm.md): every field in Slurm's order, the doubled spaces Slurm's own; NextState only
    for a node being rebooted; then, each only when set, Reason with its stamp after it, Comment, Extra: the free
    text last, after every fixed field."""
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(node["stamp"]["epoch"]))  # scontrol's own time zone
    host = node.get("host") or name
    rebooting = {"REBOOT_REQUESTED", "REBOOT_ISSUED"} & set(node["state"].split("+"))
    next_state = f"NextState={node['next_state']} " if rebooting and node.get("next_state") else ""
    reason = f" Reason={node['reason']} [{node['stamp']['user']}@{at}]" if node["reason"] else ""
    comment = f" Comment={node['comment']}" if node.get("comment") else ""
    extra = f" Extra={node['extra']}" if node.get("extra") else ""
    return (
        f"NodeName={name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=0.00 "
        f"AvailableFeatures=(null) ActiveFeatures=(null) Gres={node.get('gres') or '(null)'} "
        f"NodeAddr={host} NodeHostName={host} Version=22.05.8 "
        "OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)  "
        f"RealMemory=1 AllocMem=0 FreeMem=N/A Sockets=1 Boards=1 State={node['state']} ThreadsPerCore=1 TmpDisk=0 "
        f"Weight=1 Owner=N/A MCS_label=N/A {next_state}Partitions=batch  BootTime=2026-11-27T11:50:26 "
        "SlurmdStartTime=2026-11-27T11:50:30 LastBusyTime=2026-11-27T11:50:30 CfgTRES=cpu=1,mem=1M,billing=1 "
        f"AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
        f"ExtSensorsTemp=n/s{reason}{comment}{extra}"
    )


def as_json(name: str, node: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "state": node["state"].split("+"),
        "reason": node["reason"],
        "reason_changed_at": {
            "set": True,
            "infinite": False,
            "number": node["stamp"]["epoch"] if node["reason"] else 0,
        },
        "reason_set_by_user": node["stamp"]["user"] if node["reason"] else "",
        "comment": node.get("comment", ""),
        "hostname": node.get("host") or name,
        "gres": node.get("gres", ""),
        "partitions": ["batch"],
    }


def update(node: dict[str, Any], fields: dict[str, str], data: dict[str, Any]) -> None:
    """`scontrol update` of one node, as 22.05 applies it (23.11+ keeping the reason where `keep_reason`)."""
    flags = node["state"].split("+")
    if fields.get("State") == "DRAIN":
        node["state"] = "+".join([*[f for f in flags if f != "DRAIN"], "DRAIN"])
    elif fields.get("State") == "UNDRAIN":
        node["state"] = "+".join(f for f in flags if f != "DRAIN") or "IDLE"
        node["reason"] = node["reason"] if data.get("keep_reason") else ""
    elif fields.get("State") == "RESUME":
        gone = ("DRAIN", "DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED")
        node["state"] = "+".join(f for f in flags if f not in gone) or "IDLE"
        node["reason"] = node["reason"] if data.get("keep_reason") else ""
    if "Reason" in fields:
        node["reason"], node["stamp"] = fields["Reason"], stamp()
    if "Comment" in fields:
        node["comment"] = fields["Comment"]


def hostlist(expression: str, known: list[str]) -> list[str]:
    """Slurm's node expressions as `update NodeName=` takes them: ALL, a name, comma lists and ranges
    (gpu-[1-3,7])."""
    if expression == "ALL":
        return known
    names = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", expression):
        found = re.fullmatch(r"(.*)\[([^\]]*)\]", part)
        if found is None:
            names.append(part)
            continue
        prefix, ranges = found.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            width = len(low)
            names += [f"{prefix}{n:0{width}d}" for n in range(int(low), int(high or low) + 1)]
    return names


def calls_log(state: Path) -> Path:
    return state.with_name("slurm-calls.log")


def log_call(state: Path, args: list[str]) -> None:
    """One line appended (O_APPEND: whole lines, whoever else writes at the same moment)."""
    with open(calls_log(state), "a") as log:
        log.write(" ".join(args) + "\n")


def refused_by_scontrol(path: Path, args: list[str]) -> int | None:
    """A --json scontrol cannot give, refused as scontrol itself refuses it, before any call to the controller: 22.05
    rejects the unknown option at getopt_long in main() (src/scontrol/scontrol.c: "Try "scontrol --help"..." and
    exit 1), 23.02+ without its JSON plugin fails at loading it; neither waits on slurmctld. The status, or None for
    a call that goes to the controller."""
    if "--json" not in args:
        return None
    data = json.loads(path.read_text())  # replaced whole under the lock: read outside it, never half written
    if data.get("json_plugin_missing"):
        missing = data["json_plugin_missing"]
        print(
            f"scontrol: fatal: {missing if isinstance(missing, str) else 'JSON plugin load failure'}", file=sys.stderr
        )
    elif not data["json"]:
        print("scontrol: unrecognized option '--json'\nTry \"scontrol --help\" for more information", file=sys.stderr)
    else:
        return None
    log_call(path, args)
    return 1


def meet(path: Path) -> None:
    """The first `meet` listings wait until that many have arrived (outside the controller's lock)."""
    with Locked(path) as data:
        wanted = int(data.get("meet", 0))
        data["listings"] = arrived = int(data.get("listings", 0)) + 1
    if not wanted or arrived > wanted:
        return
    # Bounded under the health check's own timeout on a call (20 s): on a loaded machine the last of N checks may
    # come late, and the others then go on rather than be killed waiting for it.
    deadline = time.time() + 15
    while time.time() < deadline and json.loads(path.read_text())["listings"] < wanted:
        time.sleep(0.02)


def main(state_path: str, args: list[str]) -> int:
    path = Path(state_path)
    refused = refused_by_scontrol(path, args)
    if refused is not None:
        return refused
    if args[:2] == ["show", "nodes"]:
        meet(path)
    lost = False
    with Locked(path) as data:
        time.sleep(float(data.get("latency", 0)))
        log_call(path, args)
        nodes = data["nodes"]
        words = [a for a in args if a not in ("--oneliner", "--json")]
        if (args[:1] and " ".join(words[:2]) in data["fail"]) or (args[:1] and args[0] in data["fail"]):
            print(f"slurm_{args[0]} error: Unable to contact slurm controller (connect failure)", file=sys.stderr)
            return 1
        if words[:2] == ["show", "node"]:
            if words[2] not in nodes:
                print(f"Node {words[2]} not found", file=sys.stderr)
                return 1
            chosen = {words[2]: nodes[words[2]]}
        elif words[:2] == ["show", "nodes"]:
            chosen = nodes
        else:
            chosen = {}
        if chosen and "--json" in args:
            print(json.dumps({"nodes": [as_json(name, node) for name, node in chosen.items()]}))
        elif chosen:
            print("\n".join(line(name, node) for name, node in chosen.items()))
        elif args[:1] == ["update"]:
            if any(arg in data.get("refuse", []) for arg in args):
                print("slurm_update error: Invalid node state specified", file=sys.stderr)
                return 1
            fields = dict(arg.split("=", 1) for arg in args[1:])
            for name in hostlist(fields["NodeName"], list(nodes)):
                update(nodes[name], fields, data)
            if any(arg in data.get("lose", []) for arg in args):
                lost = True
        elif args[:1] == ["reboot"]:
            node = nodes[args[-1]]
            options = dict(arg.split("=", 1) for arg in args[1:-1] if "=" in arg)
            node["next_state"] = options.get("nextstate", "RESUME" if "ASAP" in args else "").upper()
            if "reason" in options:
                node["reason"] = options["reason"]
            node["reason"] += " : reboot issued"
            node["stamp"] = stamp("slurm")
            node["state"] = "DOWN+DRAIN+REBOOT_ISSUED"
    if lost:  # applied (the state is written as the lock is let go), the answer never arrives
        print("slurm_update error: Socket timed out on send/recv operation", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
