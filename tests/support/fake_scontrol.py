"""A stateful stand-in for Slurm's scontrol, for the health check's tests: the cluster's nodes (state and reason) in a
JSON file, answered and changed as scontrol answers and changes them, every call logged.

    show node NAME --oneliner     NodeName=NAME ... State=STATE ... Reason=REASON [root@...]
    show nodes --oneliner         one such line a node
    update NodeName=NAME State=DRAIN Reason=...    DRAIN added (IDLE+DRAIN, or MIXED+DRAIN for a busy node)
    update NodeName=NAME State=RESUME              DRAIN and the reason gone
    update NodeName=NAME Reason=...                the reason replaced
    reboot ASAP nextstate=RESUME reason=... NAME   REBOOT_REQUESTED added

`Cluster` writes the state and the wrapper script and reads back the calls and the nodes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WRAPPER = """#!/bin/sh
exec "{python}" "{script}" "{state}" "$@"
"""


class Cluster:
    """`nodes`: name -> state (a reason may follow after '|', e.g. "IDLE+DRAIN|maintenance")."""

    def __init__(self, directory: Path, nodes: dict[str, str]) -> None:
        self.state = directory / "slurm-state.json"
        self.command = directory / "scontrol"
        self.command.write_text(WRAPPER.format(python=sys.executable, script=__file__, state=self.state))
        self.command.chmod(0o755)
        self.set(nodes)

    def set(self, nodes: dict[str, str], fail: tuple[str, ...] = ()) -> None:
        parsed = {name: dict(zip(("state", "reason"), [*value.split("|", 1), ""][:2])) for name, value in nodes.items()}
        self.state.write_text(json.dumps({"nodes": parsed, "calls": [], "fail": list(fail)}))

    def calls(self) -> list[str]:
        return json.loads(self.state.read_text())["calls"]

    def node(self, name: str) -> dict[str, str]:
        return json.loads(self.state.read_text())["nodes"][name]


def line(name: str, node: dict[str, str]) -> str:
    reason = f" Reason={node['reason']} [root@2026-11-27T03:00:00]" if node["reason"] else ""
    return f"NodeName={name} Arch=x86_64 CoresPerSocket=1 State={node['state']} ThreadsPerCore=1{reason}"


def main(state_path: str, args: list[str]) -> int:
    path = Path(state_path)
    data = json.loads(path.read_text())
    data["calls"].append(" ".join(args))
    nodes = data["nodes"]
    status = 0
    if args[:1] and args[0] in data["fail"]:
        print(f"slurm_{args[0]} error: Unable to contact slurm controller", file=sys.stderr)
        status = 1
    elif args[:2] == ["show", "node"]:
        if args[2] in nodes:
            print(line(args[2], nodes[args[2]]))
        else:
            print(f"Node {args[2]} not found", file=sys.stderr)
            status = 1
    elif args[:2] == ["show", "nodes"]:
        for name, node in nodes.items():
            print(line(name, node))
    elif args[:1] == ["update"]:
        fields = dict(arg.split("=", 1) for arg in args[1:])
        node = nodes[fields["NodeName"]]
        flags = node["state"].split("+")
        if fields.get("State") == "DRAIN":
            node["state"] = "+".join([*[f for f in flags if f != "DRAIN"], "DRAIN"])
        elif fields.get("State") == "RESUME":
            node["state"] = "+".join(f for f in flags if f not in ("DRAIN", "REBOOT_REQUESTED")) or "IDLE"
            node["reason"] = ""
        if "Reason" in fields:
            node["reason"] = fields["Reason"]
    elif args[:1] == ["reboot"]:
        node = nodes[args[-1]]
        node["state"] += "+REBOOT_REQUESTED"
    path.write_text(json.dumps(data))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
