"""NCCL RAS's JSON answers as each release writes them (tests/support/ras_corpus.py: rendered from each tag's format
strings, citing the lines), read as NCCL itself judges them (issue 58, points 2 and 4)."""

from __future__ import annotations

import json
import os

import pytest

from accelmon.collectors.nccl import NcclCollector
from accelmon.host import nccl_ras
from tests.support.exposition import sample_value, series, text_of
from tests.support.fake_ras import TEXT_ANSWER, FakeRas
from tests.support.ras_corpus import (
    BROKEN_MISSING_RANK,
    GARBLED_WALK,
    LIST_RELEASES,
    RELEASES,
    Comm,
    Kind,
    MissingRank,
    RankData,
    TextComm,
    answer,
    text_answer,
    walked,
)  # fmt: skip
from tests.test_nccl import Gpus, job_record, procfs

HERE = "10.0.0.12"


def ranks(*counts: tuple[int, int, int, int, int], **status: int) -> list[RankData]:
    return [RankData(n, HERE if n % 2 == 0 else "10.0.0.13", 1000 + n, n, c, **status) for n, c in enumerate(counts)]


STEADY = (5, 0, 0, 0, 1000)  # 5 broadcasts, then 1000 all-reduces


def served(tmp_path, job: str, server: FakeRas) -> str:
    """What the nccl collector serves for `job` whose RAS socket is `server` (stopped after)."""
    try:
        job_record(tmp_path / "jobs", job, server.port)
        root = procfs(tmp_path / "proc", {server.port: os.getuid()})
        return text_of(NcclCollector(str(tmp_path / "jobs"), "", 5.0, 8, str(root), Gpus()))
    finally:
        server.stop()


@pytest.mark.parametrize("tag", RELEASES)
def test_a_missing_rank_is_read_from_every_release(tag):
    """2.28.7-2.28.9 wrote no comma after a missing rank's nvml_dev: invalid JSON exactly when a rank is missing, so
    the job's answer counted as malformed and AccelmonNcclRankMissing could not fire. The comma is put back."""
    comm = Comm(0xAE94423CFBB2EF4A, 0x11, 0x22, 4, ranks(STEADY, STEADY, STEADY),
                [MissingRank(3, "10.0.0.13", 7003, 3, dead=True)])  # fmt: skip
    text = answer(tag, [comm], timeouts=2)
    if tag in BROKEN_MISSING_RANK:
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
    status = nccl_ras.parse_json(text, 8)
    assert status.repaired is (tag in BROKEN_MISSING_RANK) and status.timeouts == 2
    (read,) = status.communicators
    assert (read.hash, read.size, read.answering, read.status) == ("0xae94423cfbb2ef4a", 4, 3, "incomplete")
    assert [(r.rank, r.host, r.pid, r.nvml_dev, r.dead) for r in read.missing] == [(3, "10.0.0.13", 7003, 3, True)]


@pytest.mark.parametrize("tag", RELEASES)
def test_a_rank_that_left_its_communicator_is_a_mismatch_not_a_missing_rank(tag):
    """`unresponsive: false`: the process answered RAS but no longer has the communicator (NCCL's NOCOMM, after a
    partial ncclCommDestroy): NCCL says MISMATCH. Read as missing, it raised the critical alert for a healthy job."""
    comm = Comm(0x5, 0x1, 0x2, 4, ranks(STEADY, STEADY, STEADY), [MissingRank(3, HERE, 1003, 3, unresponsive=False)])
    (read,) = nccl_ras.parse_json(answer(tag, [comm]), 8).communicators
    assert (read.missing, read.left, read.status) == ([], 1, "mismatch")


def test_in_progress_is_no_error():
    """ncclInProgress (7) in async_error or init_state is a non-blocking call under way; any other non-zero code is
    an error."""
    in_progress = Comm(0x6, 0x1, 0x2, 2, ranks(STEADY, STEADY, async_error=7))
    failed = Comm(0x7, 0x1, 0x2, 2, ranks(STEADY, STEADY, async_error=5))  # ncclInvalidUsage
    starting = Comm(0x8, 0x1, 0x2, 2, ranks(STEADY, STEADY, init_state=7))
    read = nccl_ras.parse_json(answer("v2.29.2-1", [in_progress, failed, starting]), 8).communicators
    assert [c.status for c in read] == ["ok", "error", "init"]


def test_two_communicators_of_one_hash_are_told_apart():
    """The hash alone is not unique (src/ras/ras_internal.h): two communicators of one hash gave one series."""
    first = Comm(0x9, 0x1, 0x2, 2, ranks(STEADY, STEADY))
    second = Comm(0x9, 0x3, 0x4, 2, ranks(STEADY, STEADY))
    other = Comm(0xA, 0x1, 0x2, 2, ranks(STEADY, STEADY))
    read = nccl_ras.parse_json(answer("v2.30.7-1", [first, second, other]), 8).communicators
    assert [c.hash for c in read] == ["0x9:0x1:0x2", "0x9:0x3:0x4", "0xa"]


def test_a_rank_behind_is_judged_kind_by_kind():
    """Rank 3 launched its next Broadcast early but is 3 AllReduces behind: summed over kinds it read 2 behind, its
    AllReduce shortfall hidden; each of the others is one Broadcast behind it."""
    comm = Comm(0xB, 0x1, 0x2, 4, ranks(STEADY, STEADY, STEADY, (6, 0, 0, 0, 997)))
    (read,) = nccl_ras.parse_json(answer("v2.29.2-1", [comm]), 8).communicators
    assert [(r.rank, r.behind_by) for r in read.behind] == [(3, 3), (0, 1), (1, 1), (2, 1)]
    assert read.status == "mismatch"


def test_the_collector_serves_the_missing_rank_of_a_2_28_7_answer(tmp_path):
    """End to end: the job's socket answers as NCCL 2.28.7 does with a rank missing; the rank is served (it was a
    `malformed` query before), and a rank that left its communicator is counted apart."""
    missing = [MissingRank(3, "10.0.0.13", 7003, 3, dead=True), MissingRank(4, HERE, 1004, 4, unresponsive=False)]
    comm = Comm(0xC, 0x1, 0x2, 5, ranks(STEADY, STEADY, STEADY), missing)
    text = served(tmp_path, "77", FakeRas(answer=answer("v2.28.7-1", [comm])))
    labels = {"job_id": "77", "communicator": "0xc"}
    assert sample_value(text, "accelmon_nccl_queries_total", result="ok") == 1
    assert [s[0]["rank"] for s in series(text, "accelmon_nccl_rank_missing")] == ["3"]
    assert sample_value(text, "accelmon_nccl_communicator_ranks", **labels, state="missing") == 1
    assert sample_value(text, "accelmon_nccl_communicator_ranks", **labels, state="left") == 1


A = "10.0.0.12"  # the hosts of the text answers
B = "10.0.0.13"


def test_the_text_form_of_2_26_names_its_missing_ranks_by_line():
    """From 2.26 an INCOMPLETE communicator lists its missing ranks as `Rank N -- GPU g managed by process P on node
    H`; only 2.24/2.25's `The missing rank: N` was known, so none was found. The summary's combined errors
    (INCOMPLETE,MISMATCH) failed its pattern, and with it the communicator's size."""
    comm = TextComm(0x00AE94423CFBB2EF, 8, errors="INCOMPLETE,MISMATCH", missing=[(5, 5, 2005, B), (6, 6, 2006, B)])
    status = nccl_ras.parse_text(text_answer([comm]), 8)
    (read,) = status.communicators
    assert (read.hash, read.size, read.answering, read.status) == ("0xae94423cfbb2ef", 8, 6, "incomplete")
    assert [(r.rank, r.nvml_dev, r.pid, r.host) for r in read.missing] == [(5, 5, 2005, B), (6, 6, 2006, B)]


def test_the_text_form_names_a_single_straggler_and_resets_counts_between_groups():
    """The commonest case, one rank behind, is `Rank 3 has launched up to operation 997 -- ...`: no pattern took it.
    `N ranks have not launched any operations` did not reset the count, so the ranks listed after it got the
    previous group's."""
    allreduce = Kind("AllReduce", [(6, 1000, []), (1, 997, [(3, 3, 1003, A)])])
    broadcast = Kind("Broadcast", [(5, 5, []), (2, 0, [(6, 6, 2006, B), (7, 7, 2007, B)])])
    (read,) = nccl_ras.parse_text(
        text_answer([TextComm(0xB, 8, errors="MISMATCH", kinds=[allreduce, broadcast])]), 8
    ).communicators
    assert read.status == "mismatch"
    assert [(r.rank, r.collectives, r.behind_by, r.pid) for r in read.behind] == [
        (6, 0, 5, 2006), (7, 0, 5, 2007), (3, 997, 3, 1003),
    ]  # fmt: skip


def test_the_text_form_judges_each_kind_against_its_own_top():
    """Counts are printed kind by kind; one maximum over all kinds set a rank's Broadcast count against the
    AllReduce maximum (a rank read 497 behind) and hid its real AllReduce shortfall."""
    allreduce = Kind("AllReduce", [(7, 500, []), (1, 498, [(2, 2, 1002, A)])])
    broadcast = Kind("Broadcast", [(7, 3, []), (1, 2, [(2, 2, 1002, A)])])
    (read,) = nccl_ras.parse_text(
        text_answer([TextComm(0xC, 8, errors="MISMATCH", kinds=[allreduce, broadcast])]), 8
    ).communicators
    assert [(r.rank, r.behind_by) for r in read.behind] == [(2, 2)]  # 2 AllReduces behind, not 498


def test_a_dead_process_managing_several_gpus_is_read():
    """`managing GPUs 0,1` (a process driving two GPUs) failed the process pattern: dead multi-GPU processes were
    lost."""
    text = text_answer([TextComm(0xD, 8)], dead=((4242, B, [0, 1]), (4243, B, [2])))
    status = nccl_ras.parse_text(text, 8)
    assert [(d.pid, d.host, d.nvml_dev) for d in status.dead_processes] == [(4242, B, 0), (4243, B, 2)]


def test_an_answer_too_large_to_parse_is_asked_again_in_the_text_form():
    """A 16k-rank job with six communicators answers about 50 MiB of JSON: past the cap, the text form (the ranks that
    stand out only) is asked on a new connection, and read."""
    big = answer("v2.29.2-1", [Comm(0xE, 0x1, 0x2, 64, ranks(*[STEADY] * 64))])
    text = text_answer([TextComm(0xE, 64, errors="INCOMPLETE", missing=[(5, 5, 2005, B)])])
    server = FakeRas(answer=big, text=text)
    try:
        form, said = nccl_ras.ask("127.0.0.1", server.port, 20.0, len(big) // 2)
    finally:
        server.stop()
    assert form == "text" and server.commands[-1] == "VERBOSE STATUS"
    (read,) = nccl_ras.parse(form, said, 8).communicators
    assert [r.rank for r in read.missing] == [5]


@pytest.mark.parametrize(
    ("timeout", "factor", "sent"), [(20, 1, 13), (13, 1, 6), (30, 1, 23), (8, 1, 1), (20, 2, 8), (5, 1, 1)]
)
def test_the_timeout_sent_is_what_ras_does_with_it(timeout, factor, sent):
    """Issue 67, point 5: a STATUS makes one collection at every tag (the RAS network's is compiled out, `#if 0` in
    rasClientRun, v2.24.3-1:426-436 to v2.30.7-1:523-532), aborted TIMEOUT + 5 s x NCCL_RAS_TIMEOUT_FACTOR after
    it starts (rasCollsHandleTimeouts). Two were assumed: RAS was given 4 s of 20, and slow legs read as missing."""
    assert nccl_ras.ras_timeout(timeout, factor) == sent
    assert timeout < 8 * factor or sent + nccl_ras.RAS_EXTRA_SECONDS * factor + nccl_ras.MARGIN_SECONDS <= timeout


@pytest.mark.parametrize("form", ["json", "text"])
def test_rass_own_timeouts_are_served(tmp_path, form):
    """RAS's count of legs that timed out (JSON `timeouts_count`; text `Encountered 2 communication timeouts while
    gathering communicator data`, v2.26.2-1:1336-1338) was read and never served: a missing rank could not be told
    from a slow leg."""
    comm = Comm(0xC, 0x1, 0x2, 4, ranks(STEADY, STEADY, STEADY), [MissingRank(3, B, 7003, 3)])
    said = answer("v2.29.2-1", [comm], timeouts=2) if form == "json" else TEXT_ANSWER
    assert nccl_ras.parse(form, said, 8).timeouts == 2
    text = served(tmp_path, "12", FakeRas(answer=said, json_format=form == "json"))
    assert sample_value(text, "accelmon_nccl_collection_timeouts", job_id="12") == 2


def test_text_counts_are_nccls_own_not_the_listed_ranks(tmp_path):
    """Issue 67, point 3: 64 ranks with 20 missing. VERBOSE STATUS lists all 20; the reader cut the list to max_ranks
    (8) before deriving its counts and served 56 answering / 8 missing. NCCL prints the true count ("Missing
    communicator data from 20 ranks", v2.26.2-1 client_support.cc:1272-1274): 44 / 20, as JSON says."""
    missing = [(n, n % 8, 3000 + n, B) for n in range(40, 60)]
    said = text_answer([TextComm(0x64, 64, errors="INCOMPLETE", missing=missing)])
    text = served(tmp_path, "64", FakeRas(answer=said, json_format=False))
    labels = {"job_id": "64", "communicator": "0x64"}
    assert sample_value(text, "accelmon_nccl_communicator_ranks", **labels, state="answering") == 44
    assert sample_value(text, "accelmon_nccl_communicator_ranks", **labels, state="missing") == 20
    assert len(series(text, "accelmon_nccl_rank_missing")) == 8  # the ranks themselves: max_ranks of them


@pytest.mark.parametrize("tag", LIST_RELEASES)
def test_a_missing_rank_list_cut_by_nccls_buffer_serves_no_cut_number(tag):
    """2.24/2.25 print the missing ranks from a 1,024-byte buffer (v2.24.3-1:82, 1162-1173): 1,000 missing ranks of
    five digits end `...,10169,101`, the last number cut. It was served as rank 101, a rank that answers."""
    missing = [(n, 0, 0, B) for n in range(10000, 11000)]
    said = text_answer([TextComm(0xF, 16384, errors="INCOMPLETE", missing=missing)], tag=tag)
    assert "The missing ranks: 10000,10001," in said and ",10169,101\n" in said
    (read,) = nccl_ras.parse_text(said, 1024).communicators
    assert [r.rank for r in read.missing] == list(range(10000, 10170))
    assert (read.size, read.answering) == (16384, 16384 - 1000)


def test_a_dead_process_is_placed_on_its_nvml_gpu(tmp_path):
    """Issue 67, point 4: a job run with CUDA_VISIBLE_DEVICES=5 is `managing GPU 0 (NVML 5)` (rasGpuDevsToString,
    v2.26.2-1:1826-1845). It was read as GPU 0, the CUDA index, and named GPU 0's UUID: another job's GPU."""
    said = text_answer([TextComm(0x10, 8)], dead=((4242, HERE, [0], [5]), (4243, HERE, [0, 1], [2, 3])))
    assert "managing GPU 0 (NVML 5)\n" in said and "managing GPUs 0,1 (NVML 2,3)\n" in said
    read = nccl_ras.parse_text(said, 8).dead_processes
    assert [(d.pid, d.nvml_dev) for d in read] == [(4242, 5), (4243, 2)]
    text = served(tmp_path, "5", FakeRas(answer=said, json_format=False))
    assert [(d["pid"], d["nvml_dev"], d["uuid"]) for d, _ in series(text, "accelmon_nccl_process_dead")] == [
        ("4242", "5", "GPU-00000005"), ("4243", "2", "GPU-00000002"),
    ]  # fmt: skip


@pytest.mark.parametrize("tag", (*GARBLED_WALK, "v2.29.2-1"))
def test_a_phantom_communicator_of_the_garbled_walk_is_never_served(tmp_path, tag):
    """Issue 67, point 2: 2.26.2-2.28.9's text answer walks the communicators without stepping over a missing-rank
    array (client_support.cc v2.26.2-1:939-945; fixed v2.29.2-1:1035-1041): after a communicator with a missing rank
    on GPU 3 comes a phantom (hash: rank 3, AF_INET, the port; 0 ranks; 771 missing) and the last real one is never
    read. The phantom was served as an incomplete communicator of 0 ranks with 771 missing."""
    hurt = TextComm(0x1111, 4, errors="INCOMPLETE", missing=[(3, 3, 7003, B)])
    later = TextComm(0x9999, 8, kinds=[Kind("AllReduce", [(7, 1000, []), (1, 990, [(5, 5, 7005, B)])])])
    comms = walked([hurt, later], tag)
    said = text_answer(comms, tag=tag)
    read = nccl_ras.parse_text(said, 8)
    assert [c.hash for c in read.communicators] == ["0x1111"] + (["0x9999"] if tag not in GARBLED_WALK else [])
    assert read.communicators[0].missing_count == 1 and read.communicators[0].size == 4
    if tag in GARBLED_WALK:
        assert "(7c6d000200000003) INCOMPLETE\n  Missing communicator data from 771 ranks\n" in said
        assert read.phantoms == 1
        text = served(tmp_path, "6", FakeRas(answer=said, json_format=False))
        assert sample_value(text, "accelmon_nccl_communicators_garbled", job_id="6", reason="missing_rank_walk") == 1
        assert {d["communicator"] for d, _ in series(text, "accelmon_nccl_communicator_size")} == {"0x1111"}
    else:
        assert read.phantoms == 0 and "7c6d" not in said


def test_a_real_communicator_is_not_a_phantom_on_other_releases():
    """The phantom's marks are judged only where NCCL made phantoms: a 2.24 answer whose hash looks like one stays."""
    comm = TextComm(0x7C6D000200000003, 4, errors="INCOMPLETE", missing=[(3, 3, 7003, B)])
    (read,) = nccl_ras.parse_text(text_answer([comm], tag="v2.24.3-1"), 8).communicators
    assert read.hash == "0x7c6d000200000003"
