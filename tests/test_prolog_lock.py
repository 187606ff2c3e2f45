"""The role's Slurm prolog under its ports' lock (issue 64, point 13): the lock lives in a directory only root can
open, so no user can hold it; a prolog that cannot take it (another prolog's, a directory someone else could open)
still records the job, without an NCCL RAS port, and logs why."""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.ansible import render_role_template

pytestmark = pytest.mark.e2e  # the role's prolog, rendered by ansible-playbook

NOBODY = 65534


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    """The role's prolog, its state directory under `run`: a symlink each test points at its own tree."""
    where = tmp_path_factory.mktemp("prolog")
    render_role_template(
        "accelmon_exporter", "slurm-prolog.sh.j2", where / "prolog.sh",
        {"__accelmon_exporter_jobs_dir": str(where / "run" / "jobs")},
    )  # fmt: skip
    return where


@pytest.fixture
def prolog(rendered, tmp_path):
    """(run, run dir, logged): the prolog run as slurmd runs it (no PATH, the job's SLURM_* variables), its state
    under tmp_path/run, waiting 1 s for a held lock instead of 10, `logger` a stand-in that keeps what it is given
    (the paths in it those of tmp_path/run)."""
    run_dir = tmp_path / "run"
    (run_dir / "jobs").mkdir(parents=True)
    link = rendered / "run"
    link.unlink(missing_ok=True)
    link.symlink_to(run_dir)
    bin_dir, logged = tmp_path / "bin", tmp_path / "logged"
    bin_dir.mkdir()
    (bin_dir / "logger").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {logged}\n")
    (bin_dir / "logger").chmod(0o755)
    text = (rendered / "prolog.sh").read_text()
    assert text.count("\nLOCK_WAIT=10\n") == 1 and text.count("\nPATH=/usr/sbin:") == 1
    script = tmp_path / "prolog.sh"
    script.write_text(text.replace("\nLOCK_WAIT=10\n", "\nLOCK_WAIT=1\n").replace("\nPATH=", f"\nPATH={bin_dir}:"))

    def said() -> list[str]:
        return logged.read_text().replace(str(link), str(run_dir)).splitlines() if logged.exists() else []

    def run(job: str) -> dict[str, str]:
        env = {"SLURM_JOB_ID": job, "SLURM_JOB_USER": "alice", "SLURM_JOB_GPUS": "0,1"}
        done = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        record = run_dir / "jobs" / f"slurm-{job}"
        assert record.exists(), said()
        return dict(line.split("=", 1) for line in record.read_text().splitlines())

    return run, run_dir, said


def test_a_held_lock_costs_the_job_its_port_never_its_record(prolog):
    run, run_dir, said = prolog
    first = run("4242")
    assert "nccl_ras_port" in first
    lock_dir, lock = run_dir / "prolog-lock", run_dir / "prolog-lock" / "lock"
    made = os.lstat(lock_dir)
    assert stat.S_ISDIR(made.st_mode) and (made.st_uid, stat.S_IMODE(made.st_mode)) == (os.geteuid(), 0o700)
    assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600
    with open(lock, "a") as holder:  # another prolog that holds it
        fcntl.flock(holder, fcntl.LOCK_EX)
        second = run("5242")
    assert second == {"scheduler": "slurm", "job_id": "5242", "user": "alice", "account": "", "gpus": "0,1",
                      "nccl_ras_query": "1"}  # fmt: skip
    assert not (run_dir / "nccl-ras" / "5242").exists()
    assert said() == [
        f"-t accelmon-prolog -- no lock on {lock} within 1 s",
        "job 5242 recorded without an NCCL RAS port",
    ]
    assert "nccl_ras_port" in run("6242")  # let go: the next job gets its port again


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's open is refused only when the prolog runs as root")
def test_no_other_user_can_open_the_lock(prolog):
    """What any user could do before: open the world-readable lock read-only and hold a shared flock on it."""
    run, run_dir, _ = prolog
    run("4242")
    held = subprocess.run(["flock", "-n", "-s", str(run_dir / "prolog-lock" / "lock"), "true"], user=NOBODY,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert held.returncode != 0 and "Permission denied" in held.stderr, held


def wider(lock_dir: Path) -> None:
    lock_dir.mkdir(mode=0o755)
    lock_dir.chmod(0o755)


def nobodys(lock_dir: Path) -> None:
    lock_dir.mkdir(mode=0o700)
    os.chown(lock_dir, NOBODY, NOBODY)


def linked(lock_dir: Path) -> None:
    target = lock_dir.parent / "elsewhere"
    target.mkdir(mode=0o700)
    lock_dir.symlink_to(target)


@pytest.mark.parametrize("make", [wider, nobodys, linked], ids=["mode-0755", "another-owner", "symlink"])
def test_a_lock_directory_someone_else_could_open_is_not_used(prolog, make):
    if make is nobodys and os.geteuid() != 0:
        pytest.skip("giving a directory to another user takes root")
    run, run_dir, said = prolog
    lock_dir = run_dir / "prolog-lock"
    make(lock_dir)
    before = os.lstat(lock_dir)
    record = run("4242")
    assert "nccl_ras_port" not in record and record["gpus"] == "0,1"
    assert not (lock_dir / "lock").exists()
    after = os.lstat(lock_dir)
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)  # left as it was, for a person to look
    logged = said()
    assert logged[0].startswith(f"-t accelmon-prolog -- {lock_dir} is not root's alone (owner and mode "), logged
    assert logged[1:] == ["job 4242 recorded without an NCCL RAS port"]
