"""Builds the accelmon wheel on the controller, one build at a time per source tree: `build_wheel.py SOURCE WHEELS
PIP-ARGS...`.

setuptools builds in SOURCE/build and never deletes from it (a module removed from the tree would still be packaged),
so each build starts by removing it; two deploys from one checkout at once (parallel Molecule scenarios, two
operators) removed each other's files mid-build ("rmtree failed: No such file or directory"). An exclusive lock on
SOURCE/.accelmon-build.lock makes the removal and the build one step. Exits with pip's status.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys


def main(argv: list[str]) -> int:
    source, wheels, *pip_args = argv
    with open(os.path.join(source, ".accelmon-build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        shutil.rmtree(os.path.join(source, "build"), ignore_errors=True)
        command = [sys.executable, "-m", "pip", "wheel", *pip_args, "--wheel-dir", wheels, source]
        return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
