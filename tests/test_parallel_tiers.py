"""The suite's parallel workers (scripts/test.sh: pytest-xdist, --dist loadgroup) keep a module's tests that share a
module fixture on one worker, which makes the fixture once (tests/conftest.py); the others spread. A pytest or
xdist release that silently loses the groups (pytest-dev/pytest-xdist#1386) fails here, not as a slower CI."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import plain_nodeid
from tests.support.paths import ROOT


def test_tests_sharing_a_module_fixture_run_on_one_worker_and_the_others_spread():
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup", "-v",
         "tests/test_webconfig.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    ran = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", result.stdout, re.MULTILINE)
    grouped = [(worker, test) for worker, test in ran if test.endswith("@tests/test_webconfig.py")]
    # The tests of the module's `pki` fixture (made once a module), on one worker; the module's others, on any.
    assert len(grouped) >= 3 and len({worker for worker, _ in grouped}) == 1, result.stdout[-3000:]
    assert any("test_tls_serves_metrics" in test for _, test in grouped)
    assert any("test_the_remembered_password_is_only_a_digest" in test and "@" not in test for _, test in ran)
    assert len({worker for worker, _ in ran}) > 1


def test_a_grouped_tests_id_is_recorded_without_its_group():
    """--record-passed and --skip-passed compare the plain ids: a test that passed on Python 3.9 in a group is not
    run again on the next Python."""
    assert plain_nodeid("tests/test_a.py::test_b[x]@tests/test_a.py") == "tests/test_a.py::test_b[x]"
    assert plain_nodeid("tests/test_a.py::test_b[user@host]") == "tests/test_a.py::test_b[user@host]"
