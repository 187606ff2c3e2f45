"""accelmon-drill: rehearse a GPU fault end to end, with nothing on the node fooled.

    accelmon-drill [--config FILE] start --gpu INDEX (--xid CODE | --check NAME) [--minutes N]
    accelmon-drill [--config FILE] nccl --job JOB [--gpu INDEX] [--dead] [--minutes N]   (accelmon.drills.nccl_drill)
    accelmon-drill [--config FILE] nic --device NAME [--port N] [--minutes N]
    accelmon-drill [--config FILE] stop [--gpu INDEX] [--check NAME] [--device NAME]
    accelmon-drill [--config FILE] status [--json]

A drill is a small JSON file in the health collector's `drill_dir` (one setting of the exporter's config, default
/run/accelmon/drills: it survives an exporter restart, not a reboot). The exporter's health checks (served, in
`--scan`, in the Slurm and OAR hooks) read the drills in force and judge the drilled GPU as if the fault were real:
the collector that owns the check writes the fault into the samples it judges (`accelmon.exporter.checks.Drill`), so the
verdict, the action, the alerts and the scheduler's drain follow from the real check and catalogue. Everything a
person sees says DRILL: the check's detail, the drain reason, the alert (label drill="true" and its summary).
Nothing is written to the kernel log or the driver, and the served device series stay as they are: other tools on
the node see no fault. A drill ends by itself (30 minutes by default, so a forgotten one cannot keep a node
drained) or at `stop`; accelmon never resumes a node, whoever drained it (docs/health.md, "Game day").

A NIC drill (`nic`) marks one InfiniBand or RoCE port as at fault: the infiniband collector serves
`accelmon_infiniband_drill_active{device, port}` while it is in force, and the master's rules treat the port as a NIC
at fault (accelmon:gpu_path_fault, reason drill): the straggler whose traffic leaves by it is explained by it, and
AccelmonNcclSlowPath names it, each labelled drill="true". The port's real counters and state are served untouched.

start, nic and stop need root (the directory is root's; the exporter only reads it). A GPU index the node does not have,
a check no collector drills and an XID outside 1-65535 are refused before anything is written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Optional

from accelmon.collectors import collectors
from accelmon.collectors.infiniband import NCCL_CONF
from accelmon.config import load
from accelmon.drills import nccl_drill
from accelmon.exporter.checks import ActiveDrill, Drill
from accelmon.exporter.validation import ConfigError
from accelmon.health import drill_store
from accelmon.health.drill_store import DRILL_DIR, nic_drills, read, remove, write
from accelmon.host import nccl_nics
from accelmon.scan import scan_health

log = logging.getLogger("accelmon.drill")

DEFAULT_MINUTES = 30
MAX_MINUTES = 24 * 60
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # an RDMA device's name, before it names a path


def declared() -> dict[str, Drill]:
    """Every drill the collectors declare, by the check it rehearses."""
    return {drill.check: drill for registration in collectors().values() for drill in registration.drills}


def node_gpus(config: Optional[str]) -> list[str]:
    """The GPU indices this node's checks judge (a health scan's GPUs, as the exporter sees them)."""
    return [gpu.index for gpu in scan_health(load(config)).gpus]


def drill_dir_of(config: Optional[str]) -> str:
    return str(load(config).collector("health").options.get("drill_dir", DRILL_DIR.default))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="accelmon-drill",
        description="Rehearse a GPU fault: the exporter's checks, alerts and scheduler hooks treat the GPU as "
        "failed, and say DRILL; nothing else on the node is touched. Ends by itself.",
    )
    p.add_argument("--config", help="the exporter's config file (the same one), for drill_dir and the GPUs")
    commands = p.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start a drill on one GPU")
    start.add_argument("--gpu", required=True, help="the GPU's index, as the exporter's gpu label says")
    fault = start.add_mutually_exclusive_group(required=True)
    fault.add_argument("--xid", type=int, help="rehearse this XID (the xid check, the XID catalogue's action)")
    fault.add_argument("--check", help="rehearse the failure of this check: " + ", ".join(sorted(declared())))
    start.add_argument(
        "--minutes", type=float, default=DEFAULT_MINUTES, help="how long until it ends by itself (default 30)"
    )
    nccl = commands.add_parser(
        "nccl",
        help="rehearse a hung NCCL job: stand in for the job's RAS socket with the rank on one GPU missing (runs in "
        "the foreground until it ends)",
    )
    nccl.add_argument("--job", required=True, help="the Slurm job id (running on this node, its first node)")
    nccl.add_argument("--gpu", help="the GPU (index) whose rank stops answering (default: the job's first here)")
    nccl.add_argument("--dead", action="store_true", help="RAS considers the rank dead at once (else after 60 s)")
    nccl.add_argument(
        "--minutes", type=float, default=DEFAULT_MINUTES, help="how long until it ends by itself (default 30)"
    )
    nic = commands.add_parser(
        "nic", help="rehearse a fault of a NIC port: the rules treat it as at fault, saying DRILL (ends by itself)"
    )
    nic.add_argument("--device", required=True, help="the RDMA device (mlx5_0), as class/infiniband names it")
    nic.add_argument("--port", default="1", help="the port number (default 1)")
    nic.add_argument(
        "--minutes", type=float, default=DEFAULT_MINUTES, help="how long until it ends by itself (default 30)"
    )
    stop = commands.add_parser("stop", help="end drills now: all of them, or those of one GPU, check or NIC")
    stop.add_argument("--gpu")
    stop.add_argument("--check")
    stop.add_argument("--device")
    status = commands.add_parser("status", help="the drills in force")
    status.add_argument("--json", action="store_true")
    return p


def start(args: argparse.Namespace, now: float) -> int:
    drills = declared()
    check = "xid" if args.xid is not None else args.check
    if check not in drills:
        return refuse(f"no check {check!r} can be drilled; these can: {', '.join(sorted(drills))}")
    if args.xid is not None and not 1 <= args.xid <= 65535:
        return refuse(f"--xid {args.xid}: an XID is a number from 1 to 65535")
    if not 0 < args.minutes <= MAX_MINUTES:
        return refuse(f"--minutes {args.minutes:g}: from more than 0 to {MAX_MINUTES}")
    gpus = node_gpus(args.config)
    if args.gpu not in gpus:
        return refuse(f"--gpu {args.gpu}: this node's GPUs are {', '.join(gpus) or 'none'}")
    drill = ActiveDrill(args.gpu, check, now, now + args.minutes * 60, args.xid or 0)
    path = write(drill_dir_of(args.config), drill)
    what = f"XID {args.xid}" if args.xid is not None else f"a {check} failure"
    print(f"drill started: GPU {args.gpu}, {what}, until {clock(drill.expires)} ({path}).")
    print("The exporter judges it within its health interval; `accelmon-drill stop` ends it now.")
    return 0


def start_nccl(args: argparse.Namespace, now: float) -> int:
    if not 0 < args.minutes <= MAX_MINUTES:
        return refuse(f"--minutes {args.minutes:g}: from more than 0 to {MAX_MINUTES}")
    settings = load(args.config)
    options = {**settings.collector("jobs").options, **settings.collector("nccl").options}
    try:
        drill = nccl_drill.plan(
            args.job, args.gpu, args.dead, args.minutes, nccl_drill.state_dir_of(options), settings.paths.procfs,
            node_gpus(args.config), now,
        )  # fmt: skip
        return nccl_drill.run(drill, drill_dir_of(args.config))
    except nccl_drill.DrillRefusedError as error:
        return refuse(str(error))


def start_nic(args: argparse.Namespace, now: float) -> int:
    if not 0 < args.minutes <= MAX_MINUTES:
        return refuse(f"--minutes {args.minutes:g}: from more than 0 to {MAX_MINUTES}")
    settings = load(args.config)
    ports = os.path.join(settings.paths.sysfs, "class", "infiniband")
    if not NAME.fullmatch(args.device) or not os.path.isdir(os.path.join(ports, args.device)):
        found = sorted(os.listdir(ports)) if os.path.isdir(ports) else []
        return refuse(f"--device {args.device!r}: this node's RDMA devices are {', '.join(found) or 'none'}")
    if not args.port.isdigit() or not os.path.isdir(os.path.join(ports, args.device, "ports", args.port)):
        return refuse(f"--port {args.port!r}: {args.device} has no such port")
    # Which GPUs' traffic leaves by it, as NCCL chooses and the infiniband collector shows it (accelmon.host
    # .nccl_nics: NCCL_TOPO_FILE, NVLink bridges): a drill of a port no GPU uses (a storage HCA, an uncabled second
    # port) would rehearse nothing the rules show.
    sysfs, procfs = settings.paths.sysfs, settings.paths.procfs
    topo_file = str(settings.collector("infiniband").options.get("nccl_topo_file") or "")
    chosen = nccl_nics.node_choice(sysfs, procfs, nccl_nics.settings(NCCL_CONF, topo_file))
    users = sorted({local.gpu for local in chosen if (local.device, local.port) == (args.device, args.port)}, key=int)
    if chosen and not users:
        used = ", ".join(sorted({f"{local.device} port {local.port}" for local in chosen}))
        return refuse(f"--device {args.device} --port {args.port}: no GPU's traffic leaves by it (NCCL's: {used})")
    drill_dir = drill_dir_of(args.config)  # one setting: the infiniband collector reads the same (drill_store)
    record = {"device": args.device, "port": args.port, "started": now, "expires": now + args.minutes * 60}
    path = drill_store.write_record(drill_dir, drill_store.nic_file_name(args.device, args.port), record)
    print(f"drill started: {args.device} port {args.port} at fault, until {clock(record['expires'])} ({path}).")
    if users:
        print(f"GPU {', '.join(users)} use it: their NCCL jobs' stragglers are explained by it, saying DRILL.")
    else:
        print("No GPU was found beside it (no NVIDIA driver listing GPUs here): the rules may show nothing.")
    print("The exporter serves it within its interval; `accelmon-drill stop` ends it now.")
    return 0


def stop(args: argparse.Namespace) -> int:
    drill_dir = drill_dir_of(args.config)
    # NIC drills: those of --device, or every one when nothing narrows the stop.
    everything = args.device is None and args.gpu is None and args.check is None
    nics = [nic for nic in nic_drills(drill_dir) if everything or nic.device == args.device]
    for nic in nics:
        drill_store.remove_nic(drill_dir, nic)
    if args.device is not None:  # a NIC's drills only
        print(f"{len(nics)} drill(s) ended.")
        return 0
    ended = [d for d in read(drill_dir) if args.gpu in (None, d.gpu) and args.check in (None, d.check)]
    for drill in ended:
        remove(drill_dir, drill)
    nccl = [r for r in nccl_drill.read_files(drill_dir)
            if args.gpu in (None, str(r.get("gpu"))) and args.check in (None, nccl_drill.CHECK)]  # fmt: skip
    for record in nccl:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(record["path"])  # its stand-in sees its file gone and ends within a second
    drained = " A node the drill drained stays drained: resume it" if ended else ""
    print(f"{len(ended) + len(nccl) + len(nics)} drill(s) ended.{drained}")
    if ended:
        print("  (Slurm: scontrol update NodeName=<node> State=RESUME; OAR: oarnodecheckquery and the log's removal).")
    return 0


def status(args: argparse.Namespace, now: float) -> int:
    drill_dir = drill_dir_of(args.config)
    drills = read(drill_dir)
    nccl = nccl_drill.read_files(drill_dir)
    nics = nic_drills(drill_dir)
    if args.json:
        found = [{**asdict(d), "in_force": d.started <= now < d.expires} for d in drills]
        found += [{k: v for k, v in r.items() if k != "path"} for r in nccl]
        found += [{**asdict(n), "in_force": n.started <= now < n.expires} for n in nics]
        print(json.dumps(found, indent=2))
        return 0
    if not drills and not nccl and not nics:
        print(f"no drill ({drill_dir})")
    for n in nics:
        state = f"until {clock(n.expires)}" if now < n.expires else f"ended by itself at {clock(n.expires)}"
        print(f"NIC {n.device} port {n.port}: at fault, started {clock(n.started)}, {state}")
    for d in drills:
        what = f"XID {d.xid}" if d.check == "xid" else d.check
        state = f"until {clock(d.expires)}" if now < d.expires else f"ended by itself at {clock(d.expires)}"
        print(f"GPU {d.gpu}: {what}, started {clock(d.started)}, {state}")
    for r in nccl:
        print(f"GPU {r['gpu']}: NCCL rank {r['rank']} of job {r['job']} missing (localhost:{r['port']}, process "
              f"{r['pid']}), started {clock(r['started'])}, until {clock(r['expires'])}")  # fmt: skip
    return 0


def clock(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


def refuse(message: str) -> int:
    print(f"accelmon-drill: {message}; nothing changed", file=sys.stderr)
    return 2


def main(argv: Optional[Sequence[str]] = None, now: Optional[float] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parser().parse_args(argv)
    moment = time.time() if now is None else now
    try:
        if args.command != "status" and os.geteuid() != 0:
            return refuse(f"{args.command} needs root (the drill directory is root's)")
        if args.command == "start":
            return start(args, moment)
        if args.command == "nccl":
            return start_nccl(args, moment)
        if args.command == "nic":
            return start_nic(args, moment)
        if args.command == "stop":
            return stop(args)
        return status(args, moment)
    except ConfigError as error:
        return refuse(str(error))


if __name__ == "__main__":
    sys.exit(main())
