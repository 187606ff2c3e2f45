"""The nccl_inspector collector over files as NCCL Inspector's Prometheus mode writes them (NVIDIA/nccl
ext-profiler/inspector/inspector_prom.cc: one file per GPU named by its UUID, three lines per communicator): base
units, bounded labels, the GPU by the driver's procfs, stale files left out, bad lines skipped and counted."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from accelmon.collectors import nccl
from accelmon.collectors.nccl_inspector import MAX_FILE_BYTES, NcclInspectorCollector
from accelmon.exporter import job_series_budget
from tests.support import inspector_corpus
from tests.support.ansible import render_role_template
from tests.support.exposition import check_golden, promtool_check, sample_value, series, text_of
from tests.support.jobs_tree import nvidia_procfs, uuid

COMM = "0xd152c00f111816"


def lines(rank: int, bus_gbs: float, job: str = "4242", comm: str = COMM, collective: str = "AllReduce") -> str:
    """One communicator's three lines as NCCL 2.29 writes them (free text among the labels: hostname, timestamp)."""
    return inspector_corpus.file_2_29(rank, bus_gbs, comm=comm, job=job, collective=collective, cuda_device=rank % 8)


def gpu_file(folder: Path, index: int, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"nccl_inspector_metrics_{uuid(index).removeprefix('GPU-')}.prom"
    path.write_text(text)
    return path


def collector(tmp_path: Path, **options) -> NcclInspectorCollector:
    procfs = nvidia_procfs(tmp_path / "proc", gpus=8)
    return NcclInspectorCollector(str(tmp_path / "dump"), options.get("max_age", 120.0),
                                  options.get("max_communicators", 64), str(procfs))  # fmt: skip


def test_each_ranks_bandwidth_in_base_units_with_its_gpu_and_no_free_text(tmp_path):
    job_dir = tmp_path / "dump" / "4242"  # a directory per job, as accelmon's TaskProlog sets it
    gpu_file(job_dir, 2, lines(4, 485.119))
    gpu_file(job_dir, 5, lines(5, 120.5) + lines(1, 300.0, comm="0x77"))
    text = text_of(collector(tmp_path))
    promtool_check(text)
    labels = {"job_id": "4242", "communicator": COMM, "rank": "4", "collective": "AllReduce", "gpu": "2",
              "uuid": uuid(2)}  # fmt: skip
    assert sample_value(text, "accelmon_nccl_bus_bandwidth_bytes_per_second", **labels) == 485.119e9
    assert abs(sample_value(text, "accelmon_nccl_algorithm_bandwidth_bytes_per_second", **labels) - 258.730e9) < 1e6
    assert sample_value(text, "accelmon_nccl_collective_duration_seconds", **labels) == 0.061974
    assert sample_value(text, "accelmon_nccl_collective_message_bytes", **labels) == 2 * 1024**3
    bus = series(text, "accelmon_nccl_bus_bandwidth_bytes_per_second")
    assert sorted((s["gpu"], s["communicator"], s["rank"], v) for s, v in bus) == [
        ("2", COMM, "4", 485.119e9), ("5", "0x77", "1", 300e9), ("5", COMM, "5", 120.5e9)
    ]  # fmt: skip
    assert "hostname" not in text and "timestamp=" not in text and "coll_sn" not in text
    assert sample_value(text, "accelmon_nccl_inspector_files", state="fresh") == 2
    assert sample_value(text, "accelmon_nccl_inspector_skipped_lines_total") == 0


def test_a_finished_jobs_file_is_left_out(tmp_path):
    old = gpu_file(tmp_path / "dump", 1, lines(0, 400.0, job="77"))
    gpu_file(tmp_path / "dump", 3, lines(3, 410.0))
    os.utime(old, (time.time() - 600, time.time() - 600))
    text = text_of(collector(tmp_path))
    assert [s["job_id"] for s, _ in series(text, "accelmon_nccl_bus_bandwidth_bytes_per_second")] == ["4242"]
    assert sample_value(text, "accelmon_nccl_inspector_files", state="stale") == 1


def test_lines_that_are_not_inspectors_are_skipped_and_counted_and_the_rest_served(tmp_path):
    bad = (
        "garbage {{{\n"
        'nccl_bus_bandwidth_gbs{comm_id="0x1",rank="2",collective="Teleport",slurm_job_id="9"} 1\n'  # not NCCL's
        'nccl_bus_bandwidth_gbs{comm_id="0x1",rank="two",collective="AllReduce",slurm_job_id="9"} 1\n'
        'nccl_something_else{comm_id="0x1",rank="2",collective="AllReduce",slurm_job_id="9"} 1\n'
        'nccl_bus_bandwidth_gbs{comm_id="0x1",rank="2",collective="AllReduce",slurm_job_id="x; rm"} 7\n'
    )
    gpu_file(tmp_path / "dump", 0, bad + lines(0, 350.0))
    source = collector(tmp_path)
    text = text_of(source)
    promtool_check(text)
    assert sample_value(text, "accelmon_nccl_inspector_skipped_lines_total") == 4
    served = {(s["communicator"], s["job_id"]) for s, _ in series(text, "accelmon_nccl_bus_bandwidth_bytes_per_second")}
    assert served == {(COMM, "4242"), ("0x1", "")}  # a job id that is not one is left empty
    assert sample_value(text_of(source), "accelmon_nccl_inspector_skipped_lines_total") == 8  # counted each read


def test_bounded_per_file_and_in_size(tmp_path):
    gpu_file(tmp_path / "dump", 0, "".join(lines(0, 100.0 + i, comm=f"0x{i:x}") for i in range(10)))
    gpu_file(tmp_path / "dump", 1, lines(1, 1.0) + "#" * (MAX_FILE_BYTES + 10) + "\n")
    text = text_of(collector(tmp_path, max_communicators=3))
    bus = series(text, "accelmon_nccl_bus_bandwidth_bytes_per_second")
    assert sorted(s["communicator"] for s, _ in bus) == ["0x0", "0x1", "0x2"]  # the file over the cap: none of it
    assert sample_value(text, "accelmon_nccl_inspector_skipped_lines_total") == 7 * 3 + 3  # + the big file's read


def test_the_same_gpus_file_in_two_places_is_served_once(tmp_path):
    gpu_file(tmp_path / "dump", 4, lines(4, 300.0))
    gpu_file(tmp_path / "dump" / "4242", 4, lines(4, 300.0))
    text = text_of(collector(tmp_path))
    promtool_check(text)
    assert len(series(text, "accelmon_nccl_bus_bandwidth_bytes_per_second")) == 1


def test_no_dump_directory_serves_nothing_and_is_no_error(tmp_path):
    text = text_of(collector(tmp_path))
    assert series(text, "accelmon_nccl_bus_bandwidth_bytes_per_second") == []
    assert sample_value(text, "accelmon_nccl_inspector_files", state="fresh") == 0


@pytest.mark.e2e  # the role's prolog, TaskProlog and epilog, rendered by ansible-playbook
@pytest.mark.skipif(os.geteuid() != 0, reason="the prolog gives the job's directory to the job's user (chown)")
def test_the_roles_prolog_gives_each_job_a_directory_its_inspector_writes_and_the_epilog_removes(tmp_path):
    """With accelmon_exporter_nccl_inspector: the prolog makes <dump_dir>/<job> anew for the job's user (what a
    user left there before is gone), the TaskProlog points a Prometheus-mode Inspector at it unless the job chose
    its own, the collector serves the directory's job id whatever the file says, and the epilog removes it."""
    dump, state = tmp_path / "dump", tmp_path / "jobs"
    dump.mkdir()
    state.mkdir()
    variables = {"__accelmon_exporter_jobs_dir": str(state), "__accelmon_exporter_nccl_inspector_dir": str(dump)}
    for script in ("prolog", "task-prolog", "epilog"):
        render_role_template("accelmon_exporter", f"slurm-{script}.sh.j2", tmp_path / f"{script}.sh", variables)

    def run(script: str, **env: str) -> str:
        done = subprocess.run(["/bin/sh", str(tmp_path / f"{script}.sh")], env={"SLURM_JOB_ID": "4242", **env},
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    planted = dump / "4242"
    planted.mkdir()
    (planted / "forged.prom").write_text("x")  # left by someone before the job
    run("prolog", SLURM_JOB_UID="65534", SLURM_JOB_GPUS="0")
    made = os.stat(planted)
    assert (made.st_uid, made.st_mode & 0o777, os.listdir(planted)) == (65534, 0o755, [])
    port = (tmp_path / "nccl-ras" / "4242").read_text().split()[0]  # the prolog's block (tests/test_nccl.py)
    ras = f"export NCCL_RAS_ADDR=localhost:{port}\n"
    every_30_s = "export NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=30000000\n"  # 2.30 writes at teardown else
    assert run("task-prolog", NCCL_INSPECTOR_PROM_DUMP="1") == (
        ras + f"export NCCL_INSPECTOR_DUMP_DIR={planted}\n" + every_30_s
    )
    assert run("task-prolog") == ras  # Inspector off, or in its JSON mode: nothing of it
    mine = {"NCCL_INSPECTOR_DUMP_DIR": "/scratch/mine", "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS": "60000000"}
    assert run("task-prolog", NCCL_INSPECTOR_PROM_DUMP="1", **mine) == ras
    gpu_file(planted, 3, lines(3, 200.0, job="999"))  # the file says another job: the directory is the job's
    text = text_of(NcclInspectorCollector(str(dump), 120.0, 64, str(nvidia_procfs(tmp_path / "proc", gpus=8))))
    assert [s["job_id"] for s, _ in series(text, "accelmon_nccl_bus_bandwidth_bytes_per_second")] == ["4242"]
    run("epilog")
    assert not planted.exists() and not (state / "slurm-4242").exists()


def test_golden(tmp_path):
    """A job of two communicators on two GPUs, one rank slow, as the collector serves it."""
    gpu_file(tmp_path / "dump" / "4242", 2, lines(4, 485.119) + lines(12, 480.0, comm="0x77", collective="AllGather"))
    gpu_file(tmp_path / "dump" / "4242", 5, lines(5, 120.5))
    text = text_of(collector(tmp_path))
    promtool_check(text)
    check_golden("nccl_inspector_slow_rank.prom", text)


def test_nccl_2_30_buckets_serve_each_communicators_largest_messages_by_gpu(tmp_path):
    """Issue 58, point 1: NCCL 2.30's form (no comm_id, no rank: tests/support/inspector_corpus.py) was read as
    nothing. Now each communicator's collective is served from its bucket of the largest messages, under its name
    made a bounded label value, with the GPU; point to point too; free text (node, the raw name) never."""
    corpus = inspector_corpus
    text = (
        corpus.bucket_2_30(410.0, size=64 << 20, exec_us=310.0)  # smaller messages: not served
        + corpus.bucket_2_30(678.263, size=(4 << 30) + 12345, algo_proto="Ring_LL128", exec_us=9498.47)
        + corpus.bucket_2_30(120.0, comm_name="unknown", nranks=8, collective="AllGather", size=1 << 20)
        + corpus.p2p_bucket_2_30(464.9, operation="Send")
    )
    gpu_file(tmp_path / "dump" / "4242", 3, text)
    exposition = text_of(collector(tmp_path))
    promtool_check(exposition)
    dp = {"job_id": "4242", "communicator": "DP_Group_0/16/2", "rank": "", "collective": "AllReduce", "gpu": "3",
          "uuid": uuid(3), "message_size": str(4 << 30), "algorithm": "Ring_LL128"}  # fmt: skip
    assert sample_value(exposition, "accelmon_nccl_bus_bandwidth_bytes_per_second", **dp) == 678.263e9
    assert sample_value(exposition, "accelmon_nccl_collective_duration_seconds", **dp) == 9498.47e-6
    assert sample_value(exposition, "accelmon_nccl_collective_message_bytes", **dp) == 4 * 1024**3  # "4-5GB"
    bus = series(exposition, "accelmon_nccl_bus_bandwidth_bytes_per_second")
    assert sorted((s["communicator"], s["collective"], v) for s, v in bus) == [
        ("DP_Group_0/16/2", "AllReduce", 678.263e9), ("PP_Group_0/16/2", "Send", 464.9e9),
        ("unknown/8/2", "AllGather", 120e9),
    ]  # fmt: skip
    assert series(exposition, "accelmon_nccl_algorithm_bandwidth_bytes_per_second") == []  # 2.30 has none
    assert "pool0-0002" not in exposition and "DP Group 0" not in exposition
    assert sample_value(exposition, "accelmon_nccl_inspector_skipped_lines_total") == 0


def test_a_communicator_name_is_a_bounded_label_value():
    from accelmon.collectors.nccl_inspector import communicator_of

    assert communicator_of("DP Group 0", "16") == "DP_Group_0/16"
    assert communicator_of("unknown", "8") == "unknown/8"
    long = communicator_of("x" * 200, "4")
    assert long.startswith("name-") and len(long) == len("name-") + 12 + 2
    assert communicator_of('"}\n', "2").startswith("name-")  # nothing left but replacements: hashed


def test_files_of_every_release_are_read(tmp_path):
    """The corpus: 2.29's and 2.30's files side by side on one node (two jobs on different releases)."""
    gpu_file(tmp_path / "dump" / "4242", 0, inspector_corpus.file_2_29(0, 350.0))
    gpu_file(tmp_path / "dump" / "5151", 1, inspector_corpus.bucket_2_30(340.0, job="5151"))
    exposition = text_of(collector(tmp_path))
    bus = series(exposition, "accelmon_nccl_bus_bandwidth_bytes_per_second")
    assert sorted((s["job_id"], s["rank"], s["gpu"]) for s, _ in bus) == [("4242", "0", "0"), ("5151", "", "1")]


def test_ranks_are_labelled_by_message_size_and_a_cpu_timed_line_is_skipped(tmp_path):
    """Issue 67, point 6: NCCL 2.29 writes each rank's latest collective, whatever its size, and times it by the CPU
    where the GPU's timestamps are missing (calculateMaxKernelExecTimeUsecs). Each series now carries its size class
    (a power of two, bytes) so that the slow-rank rule compares like with like; a line that says it was timed other
    than by the GPU (`coll_timing_source`) is skipped and counted (before: served, and compared)."""
    corpus = inspector_corpus
    cpu = corpus.file_2_29(1, 900.0, comm="0x9", cuda_device=1).replace(
        'rank="1",', 'rank="1",coll_timing_source="kernel_cpu",'
    )
    gpu = corpus.file_2_29(2, 400.0, comm="0x9", cuda_device=2, size=(3 << 20) + 7)
    gpu = gpu.replace('rank="2",', 'rank="2",coll_timing_source="kernel_gpu",')
    gpu_file(tmp_path / "dump" / "4242", 1, cpu)
    gpu_file(tmp_path / "dump" / "4242", 2, gpu)
    text = text_of(collector(tmp_path))
    promtool_check(text)
    bus = series(text, "accelmon_nccl_bus_bandwidth_bytes_per_second")
    assert [(s["rank"], s["message_size"], s["algorithm"], v) for s, v in bus] == [("2", str(2 << 20), "", 400e9)]
    assert sample_value(text, "accelmon_nccl_inspector_skipped_lines_total") == 3


def test_nccl_2_30_buckets_are_kept_whole_by_algorithm_and_node_count(tmp_path):
    """2.30 keys its buckets by node count and algorithm too (inspector_prom.cc v2.30.7-1:41-80): the largest
    messages of each algorithm are served apart (before, one algorithm's bucket stood for all, and a communicator's
    name and size on 2 nodes and on 4 were one)."""
    corpus = inspector_corpus
    text = (
        corpus.bucket_2_30(600.0, size=1 << 30, algo_proto="Ring_LL128")
        + corpus.bucket_2_30(300.0, size=1 << 30, algo_proto="Tree_Simple")
        + corpus.bucket_2_30(500.0, size=1 << 30, n_nodes=4, algo_proto="Ring_LL128")
    )
    gpu_file(tmp_path / "dump" / "4242", 0, text)
    bus = series(text_of(collector(tmp_path)), "accelmon_nccl_bus_bandwidth_bytes_per_second")
    assert sorted((s["communicator"], s["algorithm"], s["message_size"], v) for s, v in bus) == [
        ("DP_Group_0/16/2", "Ring_LL128", str(1 << 30), 600e9), ("DP_Group_0/16/2", "Tree_Simple", str(1 << 30), 300e9),
        ("DP_Group_0/16/4", "Ring_LL128", str(1 << 30), 500e9),
    ]  # fmt: skip


def test_message_sizes_no_nccl_writes_are_skipped_and_the_other_files_served(tmp_path):
    """A job's user writes its directory's files: a message size past any size_t (2.29's "1e400TB" is infinite; 2.30's
    range likewise) raised OverflowError out of the sample, emptying the collector for every job of the node; one of
    200 digits became a 300-digit message_size label. Such lines are skipped and counted."""
    job_dir = tmp_path / "dump" / "4242"
    huge, long = "1" + "0" * 400, "1" + "0" * 200
    hostile = (
        f'nccl_bus_bandwidth_gbs{{comm_id="0x1",rank="1",collective="AllReduce",message_size="{huge}TB"}} 1\n'
        f'nccl_bus_bandwidth_gbs{{comm_id="0x2",rank="1",collective="AllReduce",message_size="{long}TB"}} 1\n'
        f'nccl_bus_bandwidth_gbs{{comm_name="a",nranks="8",collective="AllReduce",message_size="{huge}-2TB"}} 1\n'
        f'nccl_bus_bandwidth_gbs{{comm_name="b",nranks="8",collective="AllReduce",message_size="{long}-2TB"}} 1\n'
    )
    gpu_file(job_dir, 0, hostile + lines(0, 350.0))
    gpu_file(job_dir, 1, lines(1, 340.0))
    text = text_of(collector(tmp_path))
    promtool_check(text)
    bus = series(text, "accelmon_nccl_bus_bandwidth_bytes_per_second")
    assert sorted((s["rank"], s["communicator"]) for s, _ in bus) == [("0", COMM), ("1", COMM)]
    assert all(len(s["message_size"]) <= 20 for s, _ in bus)
    assert sample_value(text, "accelmon_nccl_inspector_skipped_lines_total") == 4


def test_a_file_swapped_for_a_fifo_never_hangs_the_collector(tmp_path):
    """A job's directory is its user's: between the listing and the read they may put a FIFO (or a symlink to
    one, or to a file only the exporter may read) in place of their GPU's file. Opening a FIFO waits for a writer:
    the collector's sample hung for good, every job's bandwidth with it. Only a regular file is read, never
    through a link, without waiting."""
    job_dir = tmp_path / "dump" / "4242"
    swapped = gpu_file(job_dir, 0, lines(0, 350.0))
    gpu_file(job_dir, 1, lines(1, 340.0))
    source = collector(tmp_path)
    listed = source.files()  # the listing, taken before the swap

    class Raced(NcclInspectorCollector):
        def files(self):
            return listed

    raced = Raced(source.dump_dir, source.max_age, source.max_communicators, source.procfs)
    swapped.unlink()
    os.mkfifo(swapped)
    os.utime(swapped)
    done: list[str] = []
    worker = threading.Thread(target=lambda: done.append(text_of(raced)), daemon=True)
    worker.start()
    worker.join(5)
    if worker.is_alive():  # unblock the hung open() so that the thread ends
        with open(swapped, "wb"):
            pass
        worker.join(5)
        pytest.fail("the sample waited on a FIFO")
    bus = series(done[0], "accelmon_nccl_bus_bandwidth_bytes_per_second")
    assert [s["rank"] for s, _ in bus] == ["1"]


def test_files_of_gpus_this_node_does_not_have_are_not_served(tmp_path):
    """The file's name gives the GPU's UUID, and a job's user names their files: 500 files named by made-up UUIDs
    were 500 more `uuid` label values of their choosing (times 64 communicators each), read every interval. Only
    the files of this node's GPUs (the driver's procfs) are read; the others are counted, never served."""
    job_dir = tmp_path / "dump" / "4242"
    gpu_file(job_dir, 3, lines(3, 350.0))
    for index in range(500):
        gpu_file(job_dir, 1000 + index, lines(index % 16, 340.0))  # GPUs of no node here
    text = text_of(collector(tmp_path))
    bus = series(text, "accelmon_nccl_bus_bandwidth_bytes_per_second")
    assert [(s["gpu"], s["uuid"]) for s, _ in bus] == [("3", uuid(3))]
    assert sample_value(text, "accelmon_nccl_inspector_files", state="unknown_gpu") == 500


def budget_node(tmp_path: Path) -> None:
    """Three jobs' directories: job 1 one GPU of 10 communicators (40 series), job 2 eight GPUs of 10 (320), job 3
    eight GPUs of 64 (2,048)."""
    for job, gpus, comms in (("1", 1, 10), ("2", 8, 10), ("3", 8, 64)):
        for gpu in range(gpus):
            text = "".join(lines(gpu, 300.0, job=job, comm=f"0x{job}{c:04x}") for c in range(comms))
            gpu_file(tmp_path / "dump" / job, gpu, text)


def test_the_nodes_budget_drops_the_largest_jobs_series_whole_and_counts_them(tmp_path):
    """Inspector's series are jobs' too: a node's jobs past max_job_series (with the nccl collector's) failed the
    node's whole scrape at the master's sample_limit. The largest job is dropped whole, the others served."""
    budget_node(tmp_path)
    procfs = nvidia_procfs(tmp_path / "proc", gpus=8)
    text = text_of(NcclInspectorCollector(str(tmp_path / "dump"), 120.0, 64, str(procfs), max_job_series=1000))
    promtool_check(text)
    served = series(text, "accelmon_nccl_bus_bandwidth_bytes_per_second")
    assert sorted({s["job_id"] for s, _ in served}) == ["1", "2"] and len(served) == 90
    assert sample_value(text, "accelmon_nccl_inspector_series_dropped_total", reason="node_budget") == 2048


def test_the_budget_is_shared_with_the_nccl_collectors_series(tmp_path):
    """RAS and Inspector together: what the nccl collector serves now is left to it
    (accelmon.exporter.job_series_budget)."""
    budget_node(tmp_path)
    ledger = job_series_budget.Ledger()
    ras = job_series_budget.Samples()
    for number in range(700):
        ras.add(nccl.COMM_SIZE, ("9", f"0x{number:x}"), 8)
    ledger.fit("nccl", 1000, {"9": (ras, job_series_budget.Samples())})  # 700 series of RAS summary
    procfs = nvidia_procfs(tmp_path / "proc", gpus=8)
    collector = NcclInspectorCollector(str(tmp_path / "dump"), 120.0, 64, str(procfs), max_job_series=1000,
                                       ledger=ledger)  # fmt: skip
    text = text_of(collector)
    assert {s["job_id"] for s, _ in series(text, "accelmon_nccl_bus_bandwidth_bytes_per_second")} == {"1"}
    assert sample_value(text, "accelmon_nccl_inspector_series_dropped_total", reason="node_budget") == 2048 + 320
