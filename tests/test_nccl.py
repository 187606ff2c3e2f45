"""The nccl collector over stand-ins for NCCL's RAS socket on loopback (tests/support/fake_ras.py): what a job's
communicators say (JSON from NCCL 2.28.7, the text answer before), the rank the others wait for, one node asking per
job, and every way a socket can misbehave, bounded in time and memory and counted."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from accelmon.collectors import nccl
from accelmon.collectors.nccl import NcclCollector, local_addresses
from accelmon.exporter import job_series_budget
from accelmon.host import nccl_ras
from accelmon.host.nccl_ras import RasError
from tests.support.ansible import render_role_template
from tests.support.exposition import check_golden, promtool_check, sample_value, series, text_of
from tests.support.fake_ras import TEXT_ANSWER, FakeRas, communicator, json_answer, listen, missing_rank, rank
from tests.support.paths import ROOT
from tests.support.ras_corpus import TextComm, text_answer

HERE = "10.0.0.12"  # this node's address in the fixture procfs
SHORT = ["CLIENT PROTOCOL 2", "TIMEOUT 1", "STATUS"]  # the short text form: what a job not sized yet is asked


class Gpus:
    """NVML's index -> UUID, as NvmlSession.gpus() answers."""

    def gpus(self):
        return [(i, object(), f"GPU-{i:08d}") for i in range(8)]

    def close(self):
        pass


def procfs(root: Path, listening: dict[int, int] | None = None) -> Path:
    """A procfs whose net/fib_trie shows this node's LOCAL addresses (10.0.0.12) as Linux prints them, and whose
    net/tcp the sockets listening on loopback (port -> its owner's uid)."""
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "net" / "fib_trie").write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 10.0.0.0\n        /24 link UNICAST\n     |-- 10.0.0.12\n"
        "        /32 host LOCAL\n     |-- 127.0.0.1\n        /32 host LOCAL\n"
    )
    listen(root, listening or {})
    return root


def job_record(state: Path, job: str, port: int | None, query: str = "1", uid: int | None = None) -> None:
    """A job's record as the prolog writes it; `uid` its user's (SLURM_JOB_UID), this test's by default."""
    state.mkdir(exist_ok=True)
    lines = ["scheduler=slurm", f"job_id={job}", "user=ann", f"uid={os.getuid() if uid is None else uid}",
             "account=ml", "gpus=0,1"]  # fmt: skip
    if port is not None:
        lines += [f"nccl_ras_port={port}", f"nccl_ras_query={query}"]
    (state / f"slurm-{job}").write_text("\n".join(lines) + "\n")


@pytest.fixture
def node(tmp_path):
    servers: list[FakeRas] = []

    def make(*, max_ranks: int = 8, timeout: float = 5.0, addresses: str = "") -> NcclCollector:
        """The collector, the stand-ins started so far listening as this test's user (net/tcp)."""
        root = procfs(tmp_path / "proc", {server.port: os.getuid() for server in servers})
        return NcclCollector(str(tmp_path / "jobs"), addresses, timeout, max_ranks, str(root), Gpus())

    def serve(**options) -> FakeRas:
        server = FakeRas(**options)
        servers.append(server)
        return server

    yield make, serve, tmp_path / "jobs"
    for server in servers:
        server.stop()


def stuck_job() -> str:
    """A 4-rank communicator: rank 3 (this node, GPU 3) stuck at 100 AllReduces while the others launched 250;
    rank 1 (another node) missing and considered dead."""
    ranks = [rank(0, 250, HERE, dev=0), rank(2, 250, "10.0.0.13", dev=2), rank(3, 100, HERE, dev=3)]
    return json_answer([communicator("0xae94423cfbb2ef4a", ranks, [missing_rank(1, "10.0.0.13", 7001, 1, True)])])


def test_json_names_the_missing_rank_and_the_rank_behind(node):
    make, serve, state = node
    server = serve(answer=stuck_job())
    job_record(state, "4242", server.port)
    text = text_of(make())
    comm = {"job_id": "4242", "communicator": "0xae94423cfbb2ef4a"}
    assert sample_value(text, "accelmon_nccl_communicator_size", **comm) == 4
    assert sample_value(text, "accelmon_nccl_communicator_ranks", **comm, state="answering") == 3
    assert sample_value(text, "accelmon_nccl_communicator_ranks", **comm, state="missing") == 1
    assert series(text, "accelmon_nccl_communicator_status") == [({**comm, "status": "incomplete"}, 1.0)]
    assert sample_value(text, "accelmon_nccl_communicator_collectives_max", **comm) == 250
    assert series(text, "accelmon_nccl_rank_missing") == [(
        {**comm, "rank": "1", "host": "10.0.0.13", "pid": "7001", "nvml_dev": "1", "uuid": "", "dead": "true"}, 1.0
    )]  # fmt: skip
    behind = {**comm, "rank": "3", "host": HERE, "pid": "1003", "nvml_dev": "3", "uuid": "GPU-00000003"}
    assert series(text, "accelmon_nccl_rank_collectives_behind") == [(behind, 150.0)]  # its GPU's UUID: on this node
    assert series(text, "accelmon_nccl_rank_collectives") == [(behind, 100.0)]
    assert sample_value(text, "accelmon_nccl_queries_total", result="ok") == 1
    # A job not sized yet: the short text first (its summary sizes it), then JSON at once (small).
    assert server.commands == [*SHORT, "CLIENT PROTOCOL 2", "TIMEOUT 1", "SET FORMAT json", "STATUS"]
    promtool_check(text)


def test_the_text_answer_before_2_28_7(node):
    """NCCL 2.24-2.28 refuse SET FORMAT: the text answer's Errors and Warnings are read on the same connection."""
    make, serve, state = node
    server = serve(answer=TEXT_ANSWER, json_format=False)
    job_record(state, "77", server.port)
    text = text_of(make())
    assert server.commands == [*SHORT, "CLIENT PROTOCOL 2", "TIMEOUT 1", "SET FORMAT json", "VERBOSE STATUS"]
    statuses = {c["communicator"]: c["status"] for c, _ in series(text, "accelmon_nccl_communicator_status")}
    assert statuses == {"0xcf264af53edbe986": "incomplete", "0x27a079b828ff1a75": "mismatch"}  # as JSON labels them
    missing = series(text, "accelmon_nccl_rank_missing")
    assert [(m["rank"], m["dead"]) for m, _ in missing] == [("21", "false")]
    assert sample_value(text, "accelmon_nccl_communicator_ranks", job_id="77", communicator="0xcf264af53edbe986",
                        state="missing") == 1  # fmt: skip
    behind = series(text, "accelmon_nccl_rank_collectives_behind")
    assert [(b["rank"], b["pid"], b["host"], v) for b, v in behind] == [
        (r, str(483072 + int(r)), "172.16.64.210", 1.0) for r in ("0", "2", "3", "4", "5", "7")
    ]
    assert series(text, "accelmon_nccl_process_dead") == [(
        {"job_id": "77", "host": "172.16.64.213", "pid": "3487984", "nvml_dev": "5", "uuid": ""}, 1.0
    )]  # fmt: skip
    promtool_check(text)


def test_a_4096_rank_job_serves_summaries_and_outliers(node):
    make, serve, state = node
    ranks = [rank(n, 900 if n % 512 else 880, f"10.1.{n // 256}.{n % 256}", dev=n % 8) for n in range(4096)]
    missing = [missing_rank(n, "10.2.0.1", 9000 + n, 0, False) for n in range(4096, 4096 + 20)]
    server = serve(answer=json_answer([communicator("0x1", ranks, missing)]))
    job_record(state, "5", server.port)
    text = text_of(make(max_ranks=4))
    assert len(series(text, "accelmon_nccl_rank_missing")) == 4
    behind = series(text, "accelmon_nccl_rank_collectives_behind")
    assert [(b["rank"], v) for b, v in behind] == [("0", 20.0), ("512", 20.0), ("1024", 20.0), ("1536", 20.0)]
    assert sample_value(text, "accelmon_nccl_communicator_ranks", job_id="5", communicator="0x1", state="missing") == 20
    assert len(text.splitlines()) < 80  # no series per rank of the 4,116


def test_every_node_asks_the_steps_its_nccl_runs_and_one_node_keeps_asking(node, tmp_path):
    """Issue 67, point 7: only the job's first node asked (the prolog's nccl_ras_query=1), so a step that did not
    run on it, or a first node without NCCL, was never seen. Now every node asks the steps whose NCCL listens on it
    (the first node at once, the others within SPREAD_ROUNDS intervals), and the node of the lowest address among
    the hosts RAS names for the step's ranks keeps asking; the others ask again only every RECHECK_ROUNDS."""
    make, serve, state = node
    led = serve(answer=json_answer([communicator("0x1", [rank(0, 5, HERE), rank(1, 5, "10.0.0.13")], [])]))
    other = serve(answer=json_answer([communicator("0x2", [rank(0, 5, "10.0.0.5"), rank(1, 5, HERE)], [])]))
    job_record(state, "21", led.port, query="0")  # this is not the job's first node: before, never asked
    job_record(state, "22", other.port, query="0")
    job_record(state, "23", 28100, query="1")  # its first node, but no NCCL of it listens here: not asked
    collector = make()
    rounds = [text_of(collector) for _ in range(nccl.SPREAD_ROUNDS + 3)]
    assert other.connections == 2  # once (the short form, then JSON), to learn that 10.0.0.5 asks
    before = led.connections
    rounds.append(text_of(collector))
    assert led.connections == before + 1  # this node is the step's lowest host: it asks every interval (JSON)
    jobs = {labels["job_id"] for labels, _ in series(rounds[-1], "accelmon_nccl_communicator_status")}
    assert jobs == {"21"}
    assert sample_value(rounds[-1], "accelmon_nccl_queries_total", result="refused") == 0
    collector.rounds += nccl.RECHECK_ROUNDS  # an hour on: every node asks again, so a step is never left unread
    text_of(collector)
    assert other.connections == 3  # in the form it is sized for: JSON


def test_the_other_nodes_of_a_2000_node_job_ask_again_rarely(node):
    """Each node that is not a step's asker asked again every RECHECK_ROUNDS intervals: a 2,000-node job's RAS was
    asked 1 + 1,999 / 60, about 34 full collections from every one of its processes an interval (each gathering
    every rank's data to the node that asks), for one answer's worth of news. Now each such node asks again every
    RECHECK_ROUNDS or twice the job's node count intervals (the text's Job summary, JSON's hosts), whichever is
    longer: half a collection an interval job-wide."""
    make, serve, state = node
    answer = text_answer([TextComm(0xA0, 8000)], tag="v2.26.2-1", nodes=2000)
    server = serve(answer=answer, text=answer, json_format=False)
    job_record(state, "2000", server.port, query="0")  # not its first node: this node is no asker
    collector = make()
    for _ in range(nccl.SPREAD_ROUNDS + 1):
        text_of(collector)
    asked = server.connections
    assert asked >= 1
    collector.rounds += nccl.RECHECK_ROUNDS
    text_of(collector)
    assert server.connections == asked
    collector.rounds += 2 * 2000
    text_of(collector)
    assert server.connections > asked
    two_hosts = json_answer([communicator("0x1", [rank(0, 5, HERE), rank(1, 5, "10.0.0.13")], [])])
    assert nccl_ras.parse("json", two_hosts, 8).nodes == 2  # JSON says no node count: its distinct hosts


def test_two_jobs_on_one_node_each_on_its_own_port(node):
    make, serve, state = node
    first, second = serve(answer=stuck_job()), serve(answer=json_answer([communicator("0x2", [rank(0, 5)], [])]))
    job_record(state, "1", first.port)
    job_record(state, "2", second.port)
    text = text_of(make())
    found = {(labels["job_id"], labels["communicator"], labels["status"])
             for labels, _ in series(text, "accelmon_nccl_communicator_status")}  # fmt: skip
    assert found == {("1", "0xae94423cfbb2ef4a", "incomplete"), ("2", "0x2", "ok")}


def test_the_default_port_counts_for_the_nodes_only_job(node):
    """Without the TaskProlog, `addresses` (NCCL's default localhost:28028 here on another port) is asked and what
    it says is the node's one job's."""
    make, serve, state = node
    server = serve(answer=stuck_job())
    job_record(state, "31", None)
    text = text_of(make(addresses=f"127.0.0.1:{server.port}"))
    assert {labels["job_id"] for labels, _ in series(text, "accelmon_nccl_communicator_status")} == {"31"}


def test_no_nccl_job_serves_nothing_and_is_no_error(node, tmp_path):
    """Issue 67, point 7: a port nothing listens on here (a job, or a step, without NCCL on this node, or not yet)
    is not asked and is no error; a port where the job's user's socket was seen listening and that refuses the
    connection (its NCCL's RAS thread gone) is `refused`, an error (before, both were `refused`, and no error)."""
    make, _, state = node
    text = text_of(make())
    assert sample_value(text, "accelmon_nccl_jobs_asked") == 0
    closed = FakeRas()
    port = closed.port
    closed.stop()  # nothing listens there now
    job_record(state, "8", port)
    text = text_of(make())
    assert sample_value(text, "accelmon_nccl_queries_total", result="refused") == 0
    assert sample_value(text, "accelmon_nccl_jobs_asked") == 0
    assert series(text, "accelmon_nccl_communicator_status") == []
    root = procfs(tmp_path / "proc-listening", {port: os.getuid()})  # net/tcp says the job's socket listens
    text = text_of(NcclCollector(str(state), "", 5.0, 8, str(root), Gpus()))
    assert sample_value(text, "accelmon_nccl_queries_total", result="refused") == 1


@pytest.mark.parametrize(
    ("options", "result"),
    [
        ({"behaviour": "silent"}, "timeout"),  # accepts, never answers
        ({"behaviour": "cut"}, "cut_short"),  # closes before its first reply
        ({"answer": '{"communicators": [{"hash": "0x1", "ranks": ['}, "malformed"),  # an answer cut short
        ({"answer": "not json at all"}, "malformed"),
        ({"answer": stuck_job(), "protocol": 9}, "protocol"),  # a version this does not read
        ({"behaviour": "flood"}, "too_large"),  # 100 MiB
    ],
    ids=["silent", "cut", "truncated-json", "not-json", "unknown-protocol", "100-MiB"],
)
def test_a_misbehaving_socket_is_bounded_and_counted(node, options, result):
    make, serve, state = node
    server = serve(**options)
    job_record(state, "9", server.port)
    collector = make(timeout=2.0)
    began = time.monotonic()
    text = text_of(collector)
    assert time.monotonic() - began < 5  # within the timeout and the answer cap, never a stalled sample
    assert sample_value(text, "accelmon_nccl_queries_total", result=result) == 1
    assert sample_value(text, "accelmon_nccl_queries_total", result="ok") == 0
    assert series(text, "accelmon_nccl_communicator_status") == []


def test_the_answer_is_capped_in_memory():
    server = FakeRas(behaviour="flood")
    try:
        with pytest.raises(RasError) as raised:
            nccl_ras.ask("127.0.0.1", server.port, 10.0, 4 * 1024 * 1024)
        assert raised.value.kind == "too_large"
    finally:
        server.stop()


def test_this_nodes_addresses_come_from_procfs(tmp_path):
    assert {"10.0.0.12", "127.0.0.1"} <= local_addresses(str(procfs(tmp_path)))
    assert "10.0.0.0" not in local_addresses(str(procfs(tmp_path / "again")))


def test_golden(node):
    make, serve, state = node
    server = serve(answer=stuck_job())
    job_record(state, "4242", server.port)
    text = text_of(make())
    promtool_check(text)
    check_golden("nccl_stuck_job.prom", text)


@pytest.mark.e2e  # the role's prolog, TaskProlog and epilog, rendered by ansible-playbook
def test_each_job_on_a_node_gets_a_ras_port_of_its_own_and_the_collector_asks_the_one_it_uses(tmp_path):
    """Issue 58, point 5: jobs 4242 and 5242 (equal modulo 1000, which once gave them one port) get ports of their
    own, never one a socket of the host holds; the TaskProlog gives each job its port; the epilog frees it. A job
    that set NCCL_RAS_ADDR itself keeps it and the collector asks that port, unless another job holds it."""
    state = tmp_path / "run" / "jobs"
    state.mkdir(parents=True)
    scripts = {}
    for script in ("prolog", "task-prolog", "epilog"):
        scripts[script] = tmp_path / f"{script}.sh"
        render_role_template("accelmon_exporter", f"slurm-{script}.sh.j2", scripts[script],
                             {"__accelmon_exporter_jobs_dir": str(state)})  # fmt: skip
    text = scripts["prolog"].read_text()
    assert f"STEP_PORTS={nccl_ras.STEP_PORTS}\n" in text
    assert f"RAS_FIRST={nccl_ras.JOB_PORT_BASE}\n" in text
    assert f"RAS_LAST={nccl_ras.JOB_PORT_BASE + nccl_ras.JOB_PORTS - 1}\n" in text

    user = 4321  # the jobs' user (SLURM_JOB_UID), not this test's

    def run(script: str, job: str, **env: str) -> str:
        done = subprocess.run(["/bin/sh", str(scripts[script])],
                              env={"SLURM_JOB_ID": job, "SLURM_JOB_UID": str(user), **env},
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    def port(job: str) -> int:
        record = dict(line.split("=", 1) for line in (state / f"slurm-{job}").read_text().splitlines())
        assert record["nccl_ras_query"] == "1"  # no node list here: it asks
        assert record["uid"] == str(user)
        return int(record["nccl_ras_port"])

    squatter = None  # a process that outlived its job, on the lowest port of the range this host leaves free
    for candidate in range(nccl_ras.JOB_PORT_BASE, nccl_ras.JOB_PORT_BASE + 50):
        try:
            squatter = FakeRas(answer=stuck_job(), port=candidate)
            break
        except OSError:
            continue
    assert squatter is not None
    try:
        run("prolog", "4242")
        run("prolog", "5242")
        ports = {job: port(job) for job in ("4242", "5242")}
        blocks = {job: range(first, first + nccl_ras.STEP_PORTS) for job, first in ports.items()}
        assert not set(blocks["4242"]) & set(blocks["5242"]), ports  # a block of ports each, one a step
        assert all(nccl_ras.JOB_PORT_BASE <= p < nccl_ras.JOB_PORT_BASE + nccl_ras.JOB_PORTS for p in ports.values())
        assert all(squatter.port not in block for block in blocks.values())
        # Issue 67, point 8: the port file is the job's user's and root's alone: no one else learns the port first.
        held = (state.parent / "nccl-ras" / "5242").stat()
        assert (held.st_uid, stat.S_IMODE(held.st_mode)) == (user, 0o400)
        # ... in a directory no one else lists: a listing would say when each job starts (0755 before).
        assert stat.S_IMODE((state.parent / "nccl-ras").stat().st_mode) == 0o711
        assert run("task-prolog", "5242") == f"export NCCL_RAS_ADDR=localhost:{ports['5242']}\n"
        # Steps that run at once: a port each; the batch script (Slurm's 4294967291) the block's first.
        assert run("task-prolog", "5242", SLURM_STEP_ID="1") == f"export NCCL_RAS_ADDR=localhost:{ports['5242'] + 1}\n"
        assert run("task-prolog", "5242", SLURM_STEP_ID="6") == f"export NCCL_RAS_ADDR=localhost:{ports['5242'] + 2}\n"
        assert (
            run("task-prolog", "5242", SLURM_STEP_ID="4294967291")
            == f"export NCCL_RAS_ADDR=localhost:{ports['5242']}\n"
        )
        asked = NcclCollector(str(state), "", 5.0, 8, str(procfs(tmp_path / "proc0")), Gpus()).targets()
        assert sorted(p for job, _, p in asked if job == "5242") == list(blocks["5242"])
        run("epilog", "4242")
        assert not (state / "slurm-4242").exists() and not (state.parent / "nccl-ras" / "4242").exists()
        run("prolog", "6242")  # the freed port is the lowest free one again
        assert port("6242") == ports["4242"], ports
    finally:
        squatter.stop()

    # Job 5242 set NCCL_RAS_ADDR itself: the TaskProlog keeps it and writes its port for the collector.
    server = FakeRas(answer=stuck_job())
    try:
        assert run("task-prolog", "5242", NCCL_RAS_ADDR=f"localhost:{server.port}") == ""
        assert (state.parent / "nccl-ras" / "5242.own").read_text() == f"{server.port}\n"
        root = procfs(tmp_path / "proc", {server.port: user})  # the job's user's socket
        collector = NcclCollector(str(state), "", 5.0, 8, str(root), Gpus())
        assert [t for t in collector.targets() if t[0] == "5242"] == [("5242", "localhost", server.port)]
        assert {labels["job_id"] for labels, _ in series(text_of(collector), "accelmon_nccl_communicator_status")} == {
            "5242"
        }
        # A port another job of the node holds is never taken from the job's own file.
        (state.parent / "nccl-ras" / "5242.own").write_text(f"{port('6242')}\n")
        assert [p for job, _, p in collector.targets() if job == "5242"] == list(blocks["5242"])
    finally:
        server.stop()


def test_the_text_answer_can_be_asked_for():
    """bench/nccl_ras_probe.py keeps both of a real job's answers: the text one is asked without SET FORMAT."""
    server = FakeRas(answer=TEXT_ANSWER)
    try:
        form, text = nccl_ras.ask("127.0.0.1", server.port, 5.0, 1 << 20, want="text")
        assert (form, server.commands) == ("text", ["CLIENT PROTOCOL 2", "TIMEOUT 1", "VERBOSE STATUS"])
        assert len(nccl_ras.parse(form, text, 8).communicators) == 2
    finally:
        server.stop()


def test_the_real_job_probe_says_when_it_cannot_run(tmp_path):
    """bench/nccl_ras_probe.py, for the next session with a GPU: without PyTorch or a GPU it asks nothing, says so
    and exits 2 (CI never runs it on a GPU)."""
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed here: the probe would start a real job")
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-m", "bench.nccl_ras_probe", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=60, cwd=root)  # fmt: skip
    assert result.returncode == 2 and "nothing to ask" in result.stderr
    assert not (tmp_path / "ras.json").exists()


def test_a_squatter_on_the_jobs_port_is_never_believed(node, tmp_path):
    """Issue 67, point 8: another user binds the job's port before the job's NCCL (which then runs without RAS) and
    answers a forged critical answer. The socket's owner (net/tcp's uid) is not the job's user: nothing asked,
    nothing served, counted. The same answer from the job's user's socket is served."""
    _, serve, state = node
    squatter = serve(answer=stuck_job())
    job_record(state, "4242", squatter.port, uid=1000)
    root = procfs(tmp_path / "proc", {squatter.port: 2000})
    collector = NcclCollector(str(state), "", 5.0, 8, str(root), Gpus())
    text = text_of(collector)
    assert squatter.commands == []
    assert series(text, "accelmon_nccl_rank_missing") == []
    assert sample_value(text, "accelmon_nccl_queries_total", result="foreign_socket") == 1
    assert sample_value(text, "accelmon_nccl_queries_total", result="ok") == 0
    listen(root, {squatter.port: 1000})  # the job's user's own socket
    text = text_of(collector)
    assert sample_value(text, "accelmon_nccl_queries_total", result="ok") == 1
    assert len(series(text, "accelmon_nccl_rank_missing")) == 1


def test_a_squatter_on_the_other_loopback_is_never_asked(node, tmp_path):
    """NCCL binds the one address NCCL_RAS_ADDR=localhost:PORT resolves to first (rasClientInitSocket,
    src/ras/client_support.cc v2.28.7-1:163-190), 127.0.0.1 here; another user may bind [::1]:PORT (no conflict
    across families) and listen only for an instant at a time. Where /etc/hosts also names ::1 localhost (Debian's
    default), connecting to "localhost" tries ::1 first: the squatter's forged answer, while procfs, read just before
    and after, shows only the job's socket. The socket asked is the address the job's user's socket listens on."""
    _, serve, state = node
    job = serve(answer=json_answer([communicator("0x2", [rank(0, 5)], [])]))
    squatter = serve(answer=stuck_job(), host="::1", port=job.port)
    job_record(state, "4244", job.port)
    root = procfs(tmp_path / "proc", {job.port: os.getuid()})  # the squatter was not listening when procfs was read
    asked = []

    def debian_hosts(host, port, *args, **options):
        """nccl_ras.ask where getaddrinfo("localhost") gives ::1, then 127.0.0.1 (socket.create_connection's order)."""
        asked.append(host)
        for address in ("::1", "127.0.0.1") if host == "localhost" else (host,):
            try:
                return nccl_ras.ask(address, port, *args, **options)
            except RasError as error:
                if error.kind != "refused":
                    raise
        raise RasError("refused", "nothing listening")

    text = text_of(NcclCollector(str(state), "", 5.0, 8, str(root), Gpus(), asker=debian_hosts))
    assert asked and set(asked) == {"127.0.0.1"}
    assert squatter.commands == []
    assert {s["communicator"] for s, _ in series(text, "accelmon_nccl_communicator_status")} == {"0x2"}


def test_a_job_without_a_known_user_is_not_believed(node, tmp_path):
    make, serve, state = node
    server = serve(answer=stuck_job())
    job_record(state, "4243", server.port)
    record = state / "slurm-4243"
    record.write_text("".join(line for line in record.read_text().splitlines(True) if not line.startswith("uid=")))
    text = text_of(make())
    assert server.commands == [] and series(text, "accelmon_nccl_communicator_status") == []
    assert sample_value(text, "accelmon_nccl_queries_total", result="owner_unknown") == 1


def test_a_jobs_own_port_must_be_its_users_socket(node, tmp_path):
    """`JOB.own` is the job's user's to write: a port named there is asked only while the user's own socket listens
    on it, never one another user's process holds (their answers served as the job's)."""
    _, _, state = node
    job_record(state, "7", 28100, uid=1000)
    ras = tmp_path / "nccl-ras"
    ras.mkdir()
    (ras / "7.own").write_text("31337\n")
    root = procfs(tmp_path / "proc", {31337: 2000})
    collector = NcclCollector(str(state), "", 5.0, 8, str(root), Gpus())
    assert [port for _, _, port in collector.targets()] == [28100]
    listen(root, {31337: 1000})
    assert [port for _, _, port in collector.targets()] == [31337]
    listen(root, {})  # nothing listens there (yet): the block
    assert [port for _, _, port in collector.targets()] == [28100]


def flood(count: int) -> str:
    """`count` communicators laid out as NCCL writes one with no rank (rasClientRunComms' JSON, v2.29.2-1
    client_support.cc:1953-1958: indented, every field), then one missing a rank: what a job that makes communicators
    without end, or a socket that answers as it likes, may give (a denser flood is no NCCL's: malformed)."""
    troubled = communicator("0xbad", [rank(0, 5)], [missing_rank(1, "10.0.0.13", 7001, 1, True)])
    flooded = "".join(
        f'    {{\n      "hash": "0x{n:x}",\n      "secondary_hash": "0x1:0x2",\n      "size": 1,\n'
        '      "ranks_count": 0,\n      "missing_ranks_count": 0,\n      "ranks": [\n      ],\n'
        '      "missing_ranks": [\n      ]\n    },\n'
        for n in range(count)
    )
    return '{\n  "communicators": [\n' + flooded + json.dumps(troubled) + "\n  ]\n}"


def test_a_flood_of_communicators_is_parsed_one_at_a_time():
    """40,000 communicators held whole as Python objects took 27 MiB (400,000: 266 MiB, past the unit's memory
    limit once near the 16 MiB answer cap): now a few MiB whatever their number."""
    answer = flood(40_000)
    tracemalloc.start()
    try:
        status = nccl_ras.parse("json", answer, 8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20 and len(status.communicators) == 64 and status.dropped == 40_001 - 64


def test_a_flood_of_communicators_is_bounded(node):
    """Issue 67, point 8: 400,000 communicators in 7.9 MB became 400,008 series: now the 64 most troubled are
    served, the rest counted (40,000 as NCCL lays them out: 7.6 MB, under the 8 MiB cap)."""
    make, serve, state = node
    small = text_answer([TextComm(0xBAD, 2)], tag="v2.29.2-1")  # its short text says a small job: JSON is asked
    server = serve(answer=flood(40_000), text=small)
    job_record(state, "99", server.port)
    text = text_of(make(timeout=30.0))
    assert len(series(text, "accelmon_nccl_communicator_status")) == 64
    assert sample_value(text, "accelmon_nccl_communicators_dropped", job_id="99") == 40_001 - 64
    assert sample_value(text, "accelmon_nccl_communicator_status", job_id="99", communicator="0xbad",
                        status="incomplete") == 1  # fmt: skip


def sixteen_k_job() -> str:
    """NCCL's short text STATUS of a 16,384-rank job with six communicators of all its ranks, one rank missing in
    the first (tests/support/ras_corpus.py renders v2.29.2's strings): a few KiB, where its JSON is about 50 MiB."""
    comms = [TextComm(0xA0 + n, 16384) for n in range(6)]
    comms[0] = TextComm(0xA0, 16384, errors="INCOMPLETE", missing=[(4097, 1, 5001, "10.0.16.1")])
    return text_answer(comms, tag="v2.29.2-1")


def test_a_16k_rank_job_is_read_within_its_interval_in_the_short_form(node):
    """Issue 67, point 1: NCCL makes its JSON whole before sending it (quadratic: a 16k-rank job's ~50 MiB takes
    minutes), on the job's one RAS thread. Here the JSON comes only after 40 s and the stand-in answers one query at
    a time: the collector asked JSON, gave up at 20 s as `timeout`, and the job was never seen. Now a job not sized
    yet is asked the short text form, whose summary shows it too large for JSON: JSON is never asked."""
    make, serve, state = node
    server = serve(answer=json_answer([]), text=sixteen_k_job(), json_seconds=40)
    job_record(state, "16384", server.port)
    collector = make(timeout=20.0)
    began = time.monotonic()
    first, second = text_of(collector), text_of(collector)
    assert time.monotonic() - began < 5
    assert server.commands == [*SHORT[:1], "TIMEOUT 13", "STATUS"] * 2  # the short form each time, never JSON
    comm = {"job_id": "16384", "communicator": "0xa0"}
    for text in (first, second):
        assert sample_value(text, "accelmon_nccl_communicator_size", **comm) == 16384
        assert sample_value(text, "accelmon_nccl_communicator_ranks", **comm, state="missing") == 1
        assert [m["rank"] for m, _ in series(text, "accelmon_nccl_rank_missing")] == ["4097"]
        assert len(series(text, "accelmon_nccl_communicator_status")) == 1  # the text form names the troubled
    assert sample_value(second, "accelmon_nccl_queries_total", result="ok") == 2


@pytest.mark.parametrize(("ranks", "late"), [(8, "timeout"), (400, "too_large")])
def test_a_query_past_its_deadline_holds_the_next_until_nccl_answers(node, ranks, late):
    """A query that timed out is still being answered by NCCL's one RAS thread: the job is not asked again until
    that answer has come (counted `pending` meanwhile; before, a second query queued behind it every interval). The
    late answer is measured: over the cap it counts `too_large` (before: `timeout` alone, and the text fallback
    never reached), and the job is asked the text form next."""
    make, serve, state = node
    answer = json_answer([communicator("0x5", [rank(n, 10) for n in range(ranks)], [])])
    server = serve(answer=answer, json_seconds=2)
    job_record(state, "5", server.port)
    collector = make(timeout=1.0)
    collector.max_bytes = 100_000  # the 400-rank answer is over it, the 8-rank one under
    text_of(collector)  # the short form sizes the job: JSON, which NCCL answers after 2 s
    assert server.commands[-2:] == ["SET FORMAT json", "STATUS"] and server.connections == 2
    text = text_of(collector)
    assert server.connections == 2  # not asked again while NCCL makes the answer
    assert sample_value(text, "accelmon_nccl_queries_total", result="pending") == 1
    assert server.answered.wait(10)
    text = text_of(collector)
    assert server.commands[-1] == "VERBOSE STATUS" and server.connections == 3
    assert sample_value(text, "accelmon_nccl_queries_total", result="timeout") == 1
    assert sample_value(text, "accelmon_nccl_queries_total", result="too_large") == (late == "too_large")
    assert sample_value(text, "accelmon_nccl_queries_total", result="ok") == 1  # read in the text form


@pytest.mark.parametrize(
    "hostile",
    [
        '{"communicators": ' + "[" * 100_000 + "]" * 100_000 + "}",  # nesting past the decoder's recursion limit
        '{"communicators": [{"hash": "0x1", "size": ' + "9" * 100_000 + "}]}",  # a number no uint64 is
        TEXT_ANSWER.replace("Process 3487984", "Process " + "9" * 100_000),  # a pid no process has, in the text
        TEXT_ANSWER.replace("(cf264af53edbe986)", "(" + "f" * 5000 + ")"),  # a hash longer than NCCL's %016lx
    ],
    ids=["deep-nesting", "huge-json-number", "huge-text-number", "long-text-hash"],
)
def test_a_hostile_answer_is_malformed_and_another_jobs_is_still_served(node, hostile):
    """A user's own job answers what it likes on its own port (its socket passes the owner check): an answer no NCCL
    writes is that job's `malformed`, never an exception that empties the collector for every job of the node (before:
    RecursionError, ValueError out of sample(); a 5,000-character communicator label)."""
    make, serve, state = node
    as_text = not hostile.startswith("{")  # NCCL before 2.28.7: the text form only
    bad = serve(answer=hostile, text=hostile if as_text else "", json_format=not as_text)
    good = serve(answer=json_answer([communicator("0x2", [rank(0, 5)], [])]))
    job_record(state, "1", bad.port)
    job_record(state, "2", good.port)
    text = text_of(make())
    found = {
        (labels["job_id"], labels["communicator"]) for labels, _ in series(text, "accelmon_nccl_communicator_status")
    }
    assert ("2", "0x2") in found
    assert all(len(communicator) <= 40 for _, communicator in found)
    if not as_text:  # in the text, a line NCCL never writes is left out, as any line not recognised
        assert sample_value(text, "accelmon_nccl_queries_total", result="malformed") >= 1


def test_silent_sockets_of_one_user_do_not_hold_the_other_jobs_reads(node):
    """A user's jobs (or one job's four step ports) whose sockets accept and never answer each took timeout_seconds,
    one after the other, every interval they were asked: 8 of them at the default 20 s held the node's sample 160 s,
    every other user's job unread meanwhile. Now a sample starts no query past timeout_seconds but those of jobs
    whose latest query was answered (asked first), the others in turn by their latest query, the rest
    `deferred` to the next interval."""
    make, serve, state = node
    for job in ("1", "2", "3"):
        job_record(state, job, serve(behaviour="silent").port)
    good = serve(answer=json_answer([communicator("0x2", [rank(0, 5)], [])]))
    job_record(state, "4", good.port)
    collector = make(timeout=2.0)
    timings, texts = [], []
    for _ in range(5):
        began = time.monotonic()
        texts.append(text_of(collector))
        timings.append(time.monotonic() - began)
    assert max(timings) < 4.0  # before: 6 s, three silent sockets one after the other
    assert sample_value(texts[0], "accelmon_nccl_queries_total", result="deferred") >= 1
    for text in texts[3:]:  # its turn after the three silent ones' first; then asked every interval, first
        assert ("4", "0x2") in {
            (s["job_id"], s["communicator"]) for s, _ in series(text, "accelmon_nccl_communicator_status")
        }


def test_a_2000_node_steps_start_is_asked_by_few_nodes_an_interval(node):
    """Every node asked a step once within its first SPREAD_ROUNDS intervals (to learn who keeps asking): a
    2,000-node step starting was asked 200 times an interval, each a collection from every one of its processes. A
    job of more nodes (the prolog's nccl_ras_nodes) spreads them over its node count / SPREAD_NODES intervals."""
    make, serve, state = node
    server = serve(answer=json_answer([]))
    job_record(state, "77", server.port, query="0")
    record = state / "slurm-77"
    record.write_text(record.read_text() + "nccl_ras_nodes=2000\n")
    collector = make()
    collector.targets()
    key = ("77", "localhost", server.port)
    early = 0
    for host in range(200):  # 200 of the job's nodes, each with its own address
        local = {f"10.1.{host // 250}.{host % 250}"}
        collector.seen.clear()
        collector.rounds = 0
        collector.due(key, local)
        collector.rounds = nccl.SPREAD_ROUNDS - 1
        early += collector.due(key, local)
    assert early <= 200 * 2 * nccl.SPREAD_ROUNDS * nccl.SPREAD_NODES // 2000  # about 10 (before: all 200)


@pytest.mark.parametrize("form", ["json", "text"])
def test_an_answer_near_the_cap_stays_within_the_units_memory(form):
    """A job's own socket may answer what it likes up to the cap (16 MiB then, 8 MiB now): 1.5 million small keys in
    JSON made 220 MiB of objects, 330,000 rank lines of text 133 MiB, past the unit's MemoryMax=256M with the
    exporter's own (killed and restarted in a loop, every job of the node unread). NCCL's JSON has a value every 30
    bytes or so, its text for a job of up to 8,192 rank places a few MiB: denser JSON is malformed, a text over 4 MiB
    too_large, before anything is built of them; 8 MiB of values 16 bytes apart (the densest allowed) stays under
    96 MiB (measured: 70.3 MiB on Python 3.9, whose objects are larger than 3.11's), with the exporter's own well
    within the unit's 256 MiB."""
    if form == "json":
        answer = '{"communicators": [], "x": {' + ",".join(f'"{i}":1' for i in range(750_000)) + "}}"
        kind = "malformed"
    else:
        answer = (
            "NCCL version 2.29.2 compiled with CUDA 12.8\n\nCommunicators\n\nWarnings\n========\n\n"
            "#1-0 (27a079b828ff1a75) MISMATCH\n  Communicator ranks have different collective operation counts\n"
            "  26 ranks have launched up to operation 6650\n"
        ) + "".join(f"  Rank {i} -- GPU 0 managed by process {i} on node h\n" for i in range(150_000))
        kind = "too_large"
    tracemalloc.start()
    try:
        with pytest.raises(RasError) as raised:
            nccl_ras.parse(form, answer, 8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert raised.value.kind == kind
    assert peak < 16 << 20
    if form == "json":  # the densest NCCL-like answer allowed, at the cap: parsed, within bounds
        densest = '{"communicators": [], "x": {' + ",".join(f'"k{i:011d}":1' for i in range((8 << 20) // 17)) + "}}"
        tracemalloc.start()
        try:
            nccl_ras.parse(form, densest, 8)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 96 << 20


def test_two_steps_of_one_job_on_a_node_serve_each_job_series_once(node):
    """Two steps of a job run at once on a node, each on its port of the job's block: each answer added the job's
    own series (communicators dropped, garbled, RAS's timeouts) again, two series of one name and labels in one
    exposition (promtool: duplicate; Prometheus keeps one value of the two). Each is served once, summed over the
    job's answers."""
    make, serve, state = node

    def answer(hash_: str, timeouts: int) -> str:
        text = json_answer([communicator(hash_, [rank(0, 5)], [])])
        return text.replace('"timeouts_count": 0', f'"timeouts_count": {timeouts}')

    for base in range(41000, 41200, 2):  # the job's block: two adjacent ports, one a step
        try:
            first = serve(answer=answer("0x1", 2), port=base)
            serve(answer=answer("0x2", 3), port=base + 1)
            break
        except OSError:
            continue
    job_record(state, "5", first.port)
    record = state / "slurm-5"
    record.write_text(record.read_text() + "nccl_ras_ports=2\n")
    text = text_of(make())
    promtool_check(text)
    assert {s["communicator"] for s, _ in series(text, "accelmon_nccl_communicator_status")} == {"0x1", "0x2"}
    assert series(text, "accelmon_nccl_collection_timeouts") == [({"job_id": "5"}, 5.0)]


def crowded_answer(job: int, step: int) -> str:
    """A step's RAS answer at the collector's bounds: 64 communicators (max_communicators; 16 for every third job),
    each with 8 ranks missing and 8 behind (max_ranks): 29 series a communicator, about 1,900 an answer."""
    comms = []
    for number in range(64 if job % 3 else 16):
        ranks = [rank(n, 100 if n < 8 else 90) for n in range(16)]
        missing = [missing_rank(n, "10.2.0.1", 9000 + n, 0, False) for n in range(16, 24)]
        comms.append(communicator(f"0x{job:04x}{step:02x}{number:04x}", ranks, missing))
    return json_answer(comms)


def crowded_node(tmp_path: Path, jobs: int, ledger=None) -> NcclCollector:
    """`jobs` jobs on one node, each with its block of four step ports, every step answering at the bounds."""
    state, ports, answers = tmp_path / "jobs", {}, {}
    state.mkdir()
    for job in range(jobs):
        first = nccl_ras.JOB_PORT_BASE + nccl_ras.STEP_PORTS * job
        (state / f"slurm-{100 + job}").write_text(
            f"scheduler=slurm\njob_id={100 + job}\nuser=ann\nuid={os.getuid()}\nnccl_ras_port={first}\n"
            f"nccl_ras_ports={nccl_ras.STEP_PORTS}\nnccl_ras_query=1\n"
        )
        for step in range(nccl_ras.STEP_PORTS):
            ports[first + step] = os.getuid()
            answers[first + step] = crowded_answer(job, step)

    def asker(host, port, timeout, max_bytes, *, want, factor, keep):
        return "json", answers[port]

    root = procfs(tmp_path / "proc", ports)
    # A timeout of a minute: the answers come at once, and reading 48 of them at the bounds on a loaded machine (CI's
    # parallel tiers) can outlast 5 s, after which the rest would be deferred to the next interval (not this test's).
    return NcclCollector(str(state), "", 60.0, 8, str(root), Gpus(), asker=asker, ledger=ledger)


def test_a_crowded_node_stays_within_its_budget_and_keeps_every_jobs_summary(tmp_path):
    """12 jobs of 4 steps on one node, each step's answer about 1,900 series: 91,000 series, past the master's
    sample_limit (20,000), which fails the node's whole scrape, its GPU series with it. The node's budget serves every
    job's summary and the smallest jobs' detail, drops the largest jobs' detail whole, and counts what it drops."""
    collector = crowded_node(tmp_path, 12)
    text = text_of(collector)
    promtool_check(text)
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    job_series = [line for line in samples if 'job_id="' in line]
    assert len(job_series) <= job_series_budget.DEFAULT
    # Every job's summary: its communicators by status and its most ranks missing (8 of 24 in each).
    assert len(series(text, "accelmon_nccl_job_ranks_missing")) == 12
    assert {v for _, v in series(text, "accelmon_nccl_job_ranks_missing")} == {8.0}
    assert sample_value(text, "accelmon_nccl_job_communicators", job_id="111", status="incomplete") == 256
    # The detail of whole jobs, the largest dropped first: the four small jobs' (4 steps x 16 communicators x 29
    # series each) fit, the eight large ones' are dropped whole and counted.
    detailed = {labels["job_id"] for labels, _ in series(text, "accelmon_nccl_communicator_size")}
    assert detailed == {"100", "103", "106", "109"}
    assert len(series(text, "accelmon_nccl_communicator_size")) == 4 * 4 * 16
    demand = 8 * 4 * 64 * 29 + 4 * 4 * 16 * 29
    kept = 4 * 4 * 16 * 29
    assert sample_value(text, "accelmon_nccl_series_dropped_total", reason="node_budget") == demand - kept
    assert sample_value(text, "accelmon_nccl_jobs_detail_dropped") == 8
    # The device series of an 8-GPU node (its golden scrape) and all of this fit the master's default sample_limit.
    assert len(samples) + node_series_besides_nccl() < master_sample_limit()
    text = text_of(collector)  # the counter counts every interval's drops
    assert sample_value(text, "accelmon_nccl_series_dropped_total", reason="node_budget") == 2 * (demand - kept)


def test_the_budget_is_shared_with_what_inspector_serves(tmp_path):
    """RAS and Inspector together: what the other collector of the budget serves now is left to it."""
    ledger = job_series_budget.Ledger()
    ledger.fit("nccl_inspector", job_series_budget.DEFAULT, {"7": (job_series_budget.Samples(), big_detail(5000))})
    text = text_of(crowded_node(tmp_path, 2, ledger=ledger))
    # 3,000 left: the jobs' details (job 100's 4 x 16 communicators: 1,856; job 101's 4 x 64: 7,424): the smaller fits.
    assert {labels["job_id"] for labels, _ in series(text, "accelmon_nccl_communicator_size")} == {"100"}
    assert sample_value(text, "accelmon_nccl_jobs_detail_dropped") == 1
    assert len(series(text, "accelmon_nccl_job_ranks_missing")) == 2


def big_detail(count: int) -> job_series_budget.Samples:
    detail = job_series_budget.Samples()
    for number in range(count):
        detail.add(nccl.COMM_SIZE, ("7", f"0x{number:x}"), 1)
    return detail


def master_sample_limit() -> int:
    """The master role's default sample_limit, from its defaults file."""
    defaults = yaml.safe_load((ROOT / "ansible/roles/accelmon_master/defaults/main.yml").read_text())
    return int(defaults["accelmon_master_scrape_sample_limit"])


# What the Molecule cluster's 8-GPU workers served a scrape, NCCL aside (the master role's defaults, beside
# accelmon_master_scrape_sample_limit): more than the fixtures' 8-GPU golden scrape, which has no NVLink or HCA.
MOLECULE_8_GPU_SAMPLES = 1872


def node_series_besides_nccl() -> int:
    """An 8-GPU node's samples without NCCL's: its golden scrape (tests/golden/nvml_h100x8), or what the Molecule
    cluster's 8-GPU workers served, whichever is more."""
    golden = "".join(path.read_text() for path in (ROOT / "tests/golden/nvml_h100x8").glob("*.prom"))
    samples = [line for line in golden.splitlines() if line and not line.startswith("#")]
    return max(len(samples), MOLECULE_8_GPU_SAMPLES)


def test_the_default_budget_and_an_8_gpu_nodes_series_fit_the_masters_sample_limit():
    """Read from where each is set: a change to the budget's default, the master's limit or the node's golden scrape
    that would let one node's scrape pass the limit fails here. Well under: half the limit at most."""
    default = int(job_series_budget.MAX_JOB_SERIES.default)
    assert default + node_series_besides_nccl() <= master_sample_limit() // 2
    assert job_series_budget.MAXIMUM + node_series_besides_nccl() < master_sample_limit()


@pytest.mark.parametrize("value", [0, 50, 1e6, 1000.5, "many"])
def test_a_bad_budget_is_refused_when_the_config_is_read(tmp_path, value):
    from accelmon.cli import parser, settings_from
    from accelmon.config import ConfigError

    config = tmp_path / "accelmon.yml"
    config.write_text(f"collectors:\n  nccl:\n    max_job_series: {value}\n")
    with pytest.raises(ConfigError, match=r"collectors\.nccl\.max_job_series: expected"):
        settings_from(parser().parse_args(["--config", str(config)]))
