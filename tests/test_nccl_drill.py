"""accelmon-drill nccl: on the node that asks RAS for a job, a stand-in on the job's own RAS socket makes the real
exporter serve the rank on one GPU as missing (then dead), with that GPU's UUID and the drill's mark; it refuses
what it cannot rehearse before anything is written, never takes a port a real NCCL holds, and ends at `stop`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest

from accelmon.drills import nccl_drill
from accelmon.health import drill_store
from accelmon.host import nccl_ras
from tests.support.fake_ras import listen
from tests.support.jobs_tree import nvidia_procfs, uuid
from tests.support.processes import exporter_env, free_port, start_exporter, stop, wait_until_serving
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="accelmon-drill nccl needs root")

JOB = "4242"


@pytest.fixture
def node(tmp_path, fake_nvml_dir):
    """A node of 4 fake GPUs running job 4242 on the GPUs of device minors 0 and 3 (NVML indices 1 and 2), its
    record as accelmon's Slurm prolog writes it on the job's first node, with a RAS port free now."""
    procfs = nvidia_procfs(tmp_path / "proc", gpus=4)
    (tmp_path / "nvml.conf").write_text("gpus 4\n")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    port = free_port()
    listen(procfs, {port: 0})  # the drill's socket (root's; the job's NCCL would be uid 1000's)
    record = f"scheduler=slurm\njob_id={JOB}\nuser=alice\nuid=1000\naccount=physics\ngpus=0,3\n"
    (jobs / f"slurm-{JOB}").write_text(record + f"nccl_ras_port={port}\nnccl_ras_query=1\n")
    config = tmp_path / "exporter.yml"
    config.write_text(
        f"paths: {{procfs: {procfs}}}\n"
        f"collectors:\n"
        f"  health: {{drill_dir: {tmp_path / 'drills'}}}\n"
        f"  jobs: {{state_dir: {jobs}}}\n"
        f"  nccl: {{enabled: true, state_dir: {jobs}, interval_seconds: 0.3, timeout_seconds: 13}}\n"
    )
    return {"config": config, "env": exporter_env(fake_nvml_dir, tmp_path / "nvml.conf"), "port": port,
            "jobs": jobs, "drills": tmp_path / "drills"}  # fmt: skip


def drill_command(node, *args: str) -> list[str]:
    return [sys.executable, "-m", "accelmon.drills.drill", "--config", str(node["config"]), *args]


def run_drill(node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(drill_command(node, *args), env=node["env"], capture_output=True, text=True, timeout=60)


def served(port: int, line: str) -> str | None:
    """The exporter's page once it holds `line`."""
    text = metrics(port)
    return text if line in text else None


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_the_exporter_serves_the_drilled_rank_as_missing_then_stop_ends_it(node):
    web = free_port()
    exporter = start_exporter(
        ["--config", str(node["config"]), "--web.listen-address", f"127.0.0.1:{web}"], node["env"]
    )
    drill = subprocess.Popen(
        drill_command(node, "nccl", "--job", JOB, "--gpu", "2", "--dead", "--minutes", "5"),
        env=node["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until_serving(web)
        missing = (
            f'accelmon_nccl_rank_missing{{communicator="0x{int(JOB):016x}",dead="true",host="127.0.0.1",'
            f'job_id="{JOB}",nvml_dev="2",pid="{drill.pid}",rank="1",uuid="{uuid(2)}"}} 1.0'
        )
        text = wait_until(lambda: served(web, missing), 30, "the drilled rank served")
        assert f'accelmon_nccl_drill_active{{job_id="{JOB}"}} 1.0' in text
        assert (
            f'accelmon_nccl_communicator_ranks{{communicator="0x{int(JOB):016x}",job_id="{JOB}",state="missing"}} 1.0'
            in text
        )
        assert "accelmon_nccl_rank_collectives_behind{" not in text  # the rank on GPU 1 answers and moves on
        (listed,) = json.loads(run_drill(node, "status", "--json").stdout)
        assert (listed["check"], listed["job"], listed["gpu"], listed["rank"]) == ("nccl", JOB, "2", 1)
        assert f"GPU 2: NCCL rank 1 of job {JOB} missing (localhost:{node['port']}, process {drill.pid})" in (
            run_drill(node, "status").stdout
        )
        stopped = run_drill(node, "stop", "--check", "nccl")
        assert stopped.returncode == 0 and "1 drill(s) ended" in stopped.stdout
        out, err = drill.communicate(timeout=10)
        assert drill.returncode == 0, err
        assert "rank 1 (GPU 2," in out and "ended: stopped (accelmon-drill stop)" in out
        assert os.listdir(node["drills"]) == []
        wait_until(lambda: "accelmon_nccl_rank_missing{" not in metrics(web), 15, "the drilled rank gone")
        assert 'accelmon_nccl_queries_total{result="refused"}' in metrics(web)  # nothing listens now: not asked
    finally:
        stop(drill)  # type: ignore[arg-type]
        stop(exporter)


@pytest.mark.parametrize(
    ("args", "record", "message"),
    [
        (["--job", "77", "--gpu", "1"], None, "no record of that job on this node"),
        (["--job", JOB, "--gpu", "0"], None, "job 4242's GPUs on this node are 1, 2"),
        (["--job", JOB, "--gpu", "1"], "nccl_ras_query=0", "its first node does: run the drill there"),
        (["--job", JOB, "--gpu", "1"], "no port", "has no RAS port in its record"),
        (["--job", JOB, "--gpu", "1", "--minutes", "0"], None, "--minutes 0"),
        (["--job", "x", "--gpu", "1"], None, "a job id is a number"),
    ],
)
def test_what_cannot_be_rehearsed_is_refused_and_nothing_is_written(node, args, record, message):
    path = node["jobs"] / f"slurm-{JOB}"
    if record == "nccl_ras_query=0":
        path.write_text(path.read_text().replace("nccl_ras_query=1", record))
    elif record == "no port":
        path.write_text("".join(line for line in path.read_text().splitlines(True) if "port" not in line))
    result = run_drill(node, "nccl", *args)
    assert result.returncode == 2 and message in result.stderr and "nothing changed" in result.stderr
    assert not node["drills"].exists()


def test_without_gpu_the_jobs_first_gpu_here_is_drilled(node):
    drill = subprocess.Popen(
        drill_command(node, "nccl", "--job", JOB, "--minutes", "0.02"), env=node["env"], stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    out, _ = drill.communicate(timeout=30)
    assert drill.returncode == 0 and "rank 0 (GPU 1," in out and "ended: expired" in out
    assert os.listdir(node["drills"]) == []


def test_a_port_a_real_nccl_holds_is_never_taken(node):
    with socket.create_server(("127.0.0.1", node["port"])):  # the job's own NCCL answers there
        result = run_drill(node, "nccl", "--job", JOB, "--gpu", "1")
    assert result.returncode == 2 and f"localhost:{node['port']} (127.0.0.1) is taken" in result.stderr
    assert not node["drills"].exists()


def test_the_rank_is_dead_after_60_seconds_and_the_others_move_on():
    drill = nccl_drill.NcclDrill(JOB, "2", ("1", "2", "5"), 28142, "10.0.0.7", 1000.0, 2800.0)
    early, late = (nccl_ras.parse_json(nccl_drill.answer(drill, now, q), 8) for now, q in ((1059.0, 0), (1060.0, 1)))
    ((comm_early,), (comm_late,)) = early.communicators, late.communicators
    assert [(r.rank, r.nvml_dev, r.dead) for r in comm_early.missing] == [(1, 2, False)]
    assert [(r.rank, r.nvml_dev, r.dead) for r in comm_late.missing] == [(1, 2, True)]
    assert (comm_late.size, comm_late.answering, comm_late.status, comm_late.behind) == (3, 2, "incomplete", [])
    assert comm_late.max_collectives > comm_early.max_collectives and late.drill and early.drill


def test_an_ncclsanswer_is_no_drill_and_a_gpu_drill_reader_skips_nccl_files(tmp_path, caplog):
    from tests.support.fake_ras import communicator, json_answer, rank

    assert not nccl_ras.parse_json(json_answer([communicator("0x1", [rank(0, 5)], [])]), 8).drill
    drill = nccl_drill.NcclDrill(JOB, "1", ("1",), 28142, "127.0.0.1", 0.0, 1e12)
    nccl_drill.write_file(str(tmp_path), drill)
    assert drill_store.read(str(tmp_path)) == [] and "skipped" not in caplog.text
    assert [r["job"] for r in nccl_drill.read_files(str(tmp_path))] == [JOB]


LOCALHOST_BOTH = [
    (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
    (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0)),
]


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="this host has no IPv6 loopback")
def test_the_drill_stands_in_on_every_address_localhost_resolves_to(monkeypatch):
    """Where localhost is ::1 first (many hosts), NCCL binds ::1 and the collector tries ::1 first: a drill on
    127.0.0.1 alone could start beside a real RAS on ::1, and was never reached. It binds both, and refuses where
    either is held."""
    port = free_port()

    def resolved(host, wanted_port, *args, **kwargs):
        return [(f, k, p, c, (a[0], wanted_port, *a[2:])) for f, k, p, c, a in LOCALHOST_BOTH]

    monkeypatch.setattr(nccl_drill.socket, "getaddrinfo", resolved)
    servers = nccl_drill.bind(port)
    try:
        assert sorted(s.getsockname()[0] for s in servers) == ["127.0.0.1", "::1"]
    finally:
        for server in servers:
            server.close()
    with socket.socket(socket.AF_INET6) as real_ras:  # the job's NCCL on ::1 only
        real_ras.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        real_ras.bind(("::1", port))
        real_ras.listen(1)
        with pytest.raises(nccl_drill.DrillRefusedError, match=r"\(::1\) is taken: the job's own NCCL answers there"):
            nccl_drill.bind(port)
